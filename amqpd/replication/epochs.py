"""Epoch history and the (epoch, sequence) rule that decides who cuts what.

Every leadership change starts an *epoch*: the new active appends ``(epoch, first
sequence it writes)`` to the history in its data directory (``epochs`` beside the log
segments) before it writes anything, and ships the history to its standbys, who keep
a copy. A node that comes back after losing leadership says which epoch its log ends
in and the last sequence it holds; the active looks that epoch up in its own history:
its records after the point where the next epoch began were never seen by the
active, so never confirmed (a confirm waits for the in-sync standby the active was),
and the returning node cuts them (``store/tail.truncate_after``) and then follows.
Never the other way round: a node that claims an epoch newer than the active's is
refused, because then the *active* is the stale one.

File layout: one ``<epoch> <first_seq>`` line per epoch, oldest first, rewritten
atomically (tmp + fsync + rename + directory fsync).
"""

from __future__ import annotations

import os
from pathlib import Path

from amqpd.replication import wire
from amqpd.store.segment import fsync_directory

FILE_NAME = "epochs"


class EpochHistory:
    """``[(epoch, first_seq), ...]`` of one data directory."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / FILE_NAME
        self.entries: list[tuple[int, int]] = []
        self.load()

    def load(self) -> None:
        self.entries = []
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                self.entries.append((int(parts[0]), int(parts[1])))

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, first_seq: int) -> None:
        """This node becomes active in ``epoch``; its first record will be ``first_seq``."""
        if epoch <= self.last_epoch:
            raise ValueError(f"epoch {epoch} is not newer than {self.last_epoch}")
        self.entries.append((epoch, first_seq))
        self._save()

    def replace(self, entries: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> None:
        """Adopt the active's history (a follower does on every WELCOME)."""
        new = [(int(e), int(s)) for e, s in entries]
        if new != self.entries:
            self.entries = new
            self._save()

    def clear(self) -> None:
        self.entries = []
        self.path.unlink(missing_ok=True)

    def end_of(self, epoch: int, last_seq: int) -> int | None:
        """The last sequence written in ``epoch`` according to this history, where
        ``last_seq`` is this node's last sequence; None if the epoch is unknown. Epoch
        0 stands for records written before the first epoch (a node that ran alone)."""
        if epoch == 0:
            return self.entries[0][1] - 1 if self.entries else last_seq
        for i, (e, _first) in enumerate(self.entries):
            if e == epoch:
                return self.entries[i + 1][1] - 1 if i + 1 < len(self.entries) else last_seq
        return None

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with open(tmp, "w") as fh:
            fh.write("".join(f"{e} {s}\n" for e, s in self.entries))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)


def decide(history: EpochHistory, active_epoch: int, active_last_seq: int,
           follower_epoch: int, follower_last_seq: int) -> tuple[int, int]:
    """The epoch part of the active's answer to FOLLOW: (decision, truncate_seq).

    ``wire.CONTINUE`` here means "the epochs agree": the caller then checks the
    position (and may still answer SNAPSHOT when the follower is behind the live
    segments). ``wire.TRUNCATE`` carries the last sequence the follower keeps."""
    if follower_epoch > active_epoch:
        return wire.REFUSE, 0
    if follower_last_seq == 0:
        return wire.CONTINUE, 0
    end = history.end_of(follower_epoch, active_last_seq)
    if end is None:
        return wire.SNAPSHOT, 0  # an epoch this active never knew: start afresh
    if follower_last_seq > end:
        return wire.TRUNCATE, end
    return wire.CONTINUE, 0
