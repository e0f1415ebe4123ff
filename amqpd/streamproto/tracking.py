"""What the broker keeps per stream for stream clients: consumer offsets and publisher
sequences, durable in ``tracking.json`` in the stream's directory, on every member.

RabbitMQ keeps both in the stream itself (tracking chunks, and each data chunk's
writer entries), so its replicas hold them by construction. Here they live beside the
segments, so a stream's log holds only messages and its offsets stay contiguous (AMQP
0-9-1 consumers read it too), and replication carries them next to the records:

* ``offsets`` maps a consumer reference to its stored offset (store-offset).
* ``publishers`` maps a producer name to the highest publishing id of it this log
  holds (deduplication) -- on the leader the highest *confirmed* one, on a member the
  highest whose records its copy holds -- and ``ends`` to the offset after that id's
  records, which says for which prefix of the log the entry is true.
* ``recent`` (in memory, the leader's) keeps each producer's last :data:`HISTORY`
  publish frames, each as its publishing ids with the offset after each id's records,
  taken when the records are appended (:meth:`Tracking.wrote`), before any confirm. The
  leader ships with each batch of records (amqpd/cluster/stream_leading.py) every
  producer's last id whose records end inside the batch (:meth:`Tracking.delta`), so a
  member knows an id when it holds that id's records -- a frame cut between two
  batches included -- and a member that starts or continues a copy gets
  :meth:`Tracking.snapshot` of what it holds. The frames are also listed in offset
  order (at most :data:`FRAMES` of them), so a batch finds the producers it completes
  with a bisect, whatever the number of producers the stream has seen. A member
  applies them (:meth:`Tracking.apply`) and writes its ``tracking.json`` after the
  records (amqpd/cluster/stream_replica.py); elected leader, it takes this object as the
  stream's (:meth:`StreamQueue.use_tracking`), so a re-sent id of records it holds --
  confirmed by the old leader or not -- is confirmed and dropped.

:meth:`Tracking.save` writes the file in a worker thread, fsynced and renamed into
place, and calls back once what was set before the call is durable; saves asked for
meanwhile share the next write (group commit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("amqpd.streamproto")

FILE: Final = "tracking.json"
HISTORY: Final = 16  # publish frames per producer the leader remembers for shipping
FRAMES: Final = 65536  # frames of all producers listed in offset order at most


class Tracking:
    """One stream's stored offsets and publisher sequences (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self.offsets: dict[str, int] = {}
        self.publishers: dict[str, int] = {}
        self.ends: dict[str, int] = {}
        # producer -> its last frames: (end offset of each id, the ids), oldest first
        self.recent: dict[str, deque[tuple[list[int], list[int]]]] = {}
        # every remembered frame in offset order: its first and last id's end offset
        # and its producer (the ends grow: frames are appended in order)
        self._first_ends: list[int] = []
        self._last_ends: list[int] = []
        self._frame_refs: list[str] = []
        self.offsets_version = 0  # one more per stored offset (replication sends anew)
        self.watchers: list[Callable[[], None]] = []  # told of a stored offset
        self._saving = False
        self._waiters: list[Callable[[], None]] = []
        self._again = False
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.offsets = {str(k): int(v) for k, v in data.get("offsets", {}).items()}
                self.publishers = {str(k): int(v)
                                   for k, v in data.get("publishers", {}).items()}
                self.ends = {str(k): int(v) for k, v in data.get("ends", {}).items()}
            except (OSError, ValueError, AttributeError) as exc:
                log.error("%s is unreadable (%s): stored offsets and publisher sequences "
                          "of this stream start empty", self.path, exc)
        # a file from before ``ends`` was kept: true of every prefix that is kept (0)
        for ref, pid in sorted(self.publishers.items(),
                               key=lambda kv: self.ends.get(kv[0], 0)):
            self.wrote(ref, [pid], [self.ends.get(ref, 0)])

    # ------------------------------------------------------------------ changes
    def store_offset(self, reference: str, offset: int) -> None:
        """store-offset (the caller saves); replication hears of it."""
        self.offsets[reference] = offset
        self.offsets_version += 1
        for watcher in list(self.watchers):
            watcher()

    def wrote(self, reference: str, ids: list[int], ends: list[int]) -> None:
        """The leader appended a frame of ``reference``'s records: publishing ``ids`` in
        order, the records of ``ids[i]`` ending before offset ``ends[i]`` (not confirmed
        yet)."""
        recent = self.recent.get(reference)
        if recent is None:
            recent = self.recent[reference] = deque(maxlen=HISTORY)
        recent.append((ends, ids))
        first, last = ends[0], ends[-1]
        if self._last_ends and first < self._last_ends[-1]:
            # out of order (a member's snapshot entry): keep the lists sorted
            i = bisect_right(self._first_ends, first)
            self._first_ends.insert(i, first)
            self._last_ends.insert(i, last)
            self._frame_refs.insert(i, reference)
        else:
            self._first_ends.append(first)
            self._last_ends.append(last)
            self._frame_refs.append(reference)
        if len(self._frame_refs) > FRAMES:  # the oldest half goes
            half = FRAMES // 2
            del self._first_ends[:half], self._last_ends[:half], self._frame_refs[:half]

    def confirmed(self, reference: str, publishing_id: int, end: int) -> None:
        """``reference``'s ids up to ``publishing_id`` are confirmed (the caller saves)."""
        if publishing_id > self.publishers.get(reference, 0):
            self.publishers[reference] = publishing_id
            self.ends[reference] = end

    def delta(self, start: int, end: int) -> dict[str, list[int]]:
        """What a member holding the records ``start..end-1`` from now on learns:
        producer -> [publishing id, end offset] for each producer whose latest append
        among :attr:`recent` ends in that range."""
        out: dict[str, list[int]] = {}
        # the frames with an id ending in (start, end]: last end > start, first <= end
        i = bisect_right(self._last_ends, start)
        j = bisect_right(self._first_ends, end)
        for ref in set(self._frame_refs[i:j]):
            found = self._last_at_or_before(ref, end)
            if found is not None and found[1] > start:
                out[ref] = found
        return out

    def snapshot(self, upto: int) -> dict[str, list[int]]:
        """Producer -> [publishing id, end offset] as true of the log below ``upto``
        (a member continuing from there): the latest append ending there or before."""
        out: dict[str, list[int]] = {}
        for ref in self.recent:
            found = self._last_at_or_before(ref, upto)
            if found is not None:
                out[ref] = found
        return out

    def _last_at_or_before(self, ref: str, offset: int) -> list[int] | None:
        """[id, end] of ``ref``'s last remembered id whose records end at or before
        ``offset``."""
        for ends, ids in reversed(self.recent[ref]):
            i = bisect_right(ends, offset)
            if i:
                return [ids[i - 1], ends[i - 1]]
        return None

    def apply(self, publishers: dict[str, Any] | None,
              offsets: dict[str, Any] | None) -> None:
        """A member takes what its leader shipped: a producer's id when higher than the
        one it has; the stored offsets, when sent, as they are (the leader's)."""
        for ref, (pid, end) in (publishers or {}).items():
            pid, end = int(pid), int(end)
            if pid > self.publishers.get(ref, 0):
                self.publishers[ref] = pid
                self.ends[ref] = end
                self.wrote(ref, [pid], [end])
        if offsets is not None:
            self.offsets = {str(k): int(v) for k, v in offsets.items()}
            self.offsets_version += 1

    def cut(self, upto: int) -> None:
        """The log holds nothing from ``upto`` on (a member's copy validated against
        its leader, or started again): producers' entries beyond go."""
        for ref in [r for r, e in self.ends.items() if e > upto]:
            del self.publishers[ref]
            del self.ends[ref]
            self.recent.pop(ref, None)
        keep = [i for i, ref in enumerate(self._frame_refs) if ref in self.recent]
        self._first_ends = [self._first_ends[i] for i in keep]
        self._last_ends = [self._last_ends[i] for i in keep]
        self._frame_refs = [self._frame_refs[i] for i in keep]

    # ------------------------------------------------------------------ the file
    def _text(self) -> str:
        return json.dumps({"offsets": self.offsets, "publishers": self.publishers,
                           "ends": self.ends})

    def _write(self, text: str) -> None:
        if not self.path.parent.exists():  # the stream was deleted meanwhile
            return
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def save(self, loop: asyncio.AbstractEventLoop | None,
             callback: Callable[[], None] | None = None) -> None:
        """Make the current state durable; ``callback`` once it is (also on a write
        error, which is logged: the broker keeps serving from memory). Without a loop
        (sans-IO tests) the file is written at once."""
        if callback is not None:
            self._waiters.append(callback)
        if self._saving:
            self._again = True
            return
        self._saving = True
        self._again = False
        waiters, self._waiters = self._waiters, []
        text = self._text()

        def done(error: BaseException | None) -> None:
            self._saving = False
            if error is not None:
                log.error("cannot write %s: %s", self.path, error)
            for waiter in waiters:
                waiter()
            if self._again or self._waiters:
                self.save(loop)

        if loop is None:
            try:
                self._write(text)
            except OSError as exc:
                done(exc)
            else:
                done(None)
            return
        future = loop.run_in_executor(None, self._write, text)
        future.add_done_callback(lambda fut: done(fut.exception()))


__all__ = ["FILE", "FRAMES", "HISTORY", "Tracking"]
