"""A member's copy of a replicated stream (issue 30): part of
:mod:`amqpd.cluster.stream_group`.

The copy is the stream's own log (:class:`~amqpd.broker.api.StreamLog`) in the very
directory the stream would have on this node (``stream_directory``), so a member
elected leader opens it as its :class:`~amqpd.broker.api.StreamQueue` with every record
at the offset the lost leader gave it. The member appends the leader's records at the
leader's offsets (``append_replica``) and answers, once they are written to the file
(flushed, no fsync: RabbitMQ's rule, docs/streams.md), with the offset below which it
holds everything.

**Epochs.** ``epoch.json`` beside the segments names the last term whose records the
log may hold (written, fsynced, before the first record of a new term is appended).
A leader's ``SSTART`` carries the group's epochs, ``[[term, first offset written in
it], ...]``; the records of this log are a prefix of the leader's up to the start of
the first epoch after its own term (Kafka's leader-epoch rule): anything beyond that is
an uncommitted tail of a lost leader, and the copy starts again (``StreamLog.reset``)
from the leader's first offset, as it does when it lies wholly before what the leader
still keeps.

**Commit point.** The leader tells the member how far the stream is committed
(``SCOMMIT``: :attr:`StreamReplica.committed`); this node's consumers of the stream
read the copy up to there, never beyond (:mod:`amqpd.cluster.stream_local`), and are
woken (:attr:`StreamReplica.watchers`) when it moves, when records are written, and
when the copy starts again or goes (a reader of it must then find its place anew).

**Tracking.** The copy keeps the stream's stored offsets and named producers'
publishing ids (:class:`~amqpd.broker.api.Tracking`, ``tracking.json`` in its
directory) as the leader ships them (``STRACK``): a producer's id is taken once the
copy holds the records up to the offset after that id's records (an entry that comes
before its records waits for them), and written to the file after those records, so
the file never names an id whose records the copy lacks; a copy cut back to what
agrees with its leader drops the entries beyond. Elected leader, this node's stream
takes the copy's tracking (:meth:`StreamQueue.use_tracking`): a producer re-sending ids
the old leader wrote here is confirmed and not stored twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqpd.broker.api import StreamLog, Tracking, stream_directory
from amqpd.cluster.stream_wire import unpack_records

log = logging.getLogger("amqpd.cluster.stream")

EPOCH_FILE = "epoch.json"
SEGMENT_ARG = "x-stream-max-segment-size-bytes"


def read_term(directory: Path) -> int:
    """The last term this log holds records of (0: none recorded)."""
    try:
        return int(json.loads((directory / EPOCH_FILE).read_text()).get("term", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def write_term(directory: Path, term: int) -> None:
    """Record (durably) that this log may hold records of ``term`` from now on."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (EPOCH_FILE + ".tmp")
    tmp.write_text(json.dumps({"term": term}))
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(directory / EPOCH_FILE)


def valid_end(own_term: int, own_next: int, epochs: list[list[int]]) -> int:
    """How far a log whose last term is ``own_term`` agrees with a leader of ``epochs``:
    up to the start of the first epoch of a later term (its records of later terms
    were written by leaders this log never followed)."""
    for term, start in epochs:
        if term > own_term:
            return min(own_next, start)
    return own_next


class StreamReplica:
    """This node's copy of one stream, fed by ``leader`` on replication stream ``rid``."""

    def __init__(self, data_dir: str, leader: str, rid: int, vhost: str, name: str,
                 arguments: dict[str, Any]) -> None:
        self.leader = leader
        self.rid = rid
        self.ident = (vhost, name)
        self.directory = stream_directory(Path(data_dir), vhost, name)
        segment = arguments.get(SEGMENT_ARG)
        self.log = StreamLog(self.directory) if not isinstance(segment, int) or \
            isinstance(segment, bool) else StreamLog(self.directory, segment)
        self.log.open()
        (self.directory / "stream.json").write_text(json.dumps({"vhost": vhost,
                                                                 "name": name}))
        self.term = read_term(self.directory)
        self.frozen = False  # offered itself in an election: takes no more records
        self.ack_due = False
        # every record below is on a majority (the leader's SCOMMIT); -1: not told yet
        self.committed = -1
        self.generation = 0  # one more each time the log starts again (reset)
        # the group record's revision this node had read when the leader last started
        # the copy (StreamCopies.clear_removed)
        self.record_revision = 0
        self.closed = False
        # called when what this node's consumers may read changed (stream_local)
        self.watchers: list[Callable[[], None]] = []
        self.tracking = Tracking(self.directory)
        # producer -> [publishing id, end offset] shipped before its records came
        self.tracking_waiting: dict[str, list[int]] = {}
        self.tracking_due = False  # changed since the file was last written

    @property
    def next_offset(self) -> int:
        return self.log.flushed_offset

    def start(self, term: int, info: dict[str, Any]) -> int:
        """The leader of ``term`` starts (again): keep what agrees with its log, start
        again if nothing can; the offset to continue from."""
        first = int(info.get("first", 0))
        leader_next = int(info.get("next", 0))
        epochs = [[int(t), int(s)] for t, s in info.get("epochs", [])]
        log_ = self.log
        have = log_.flushed_offset
        keep = valid_end(self.term, have, epochs) if have > log_.first_offset else have
        if keep < have or have > leader_next or have < first or \
                (have == log_.first_offset and have != first):
            log.warning("stream '%s' in vhost '%s': this copy (offsets %d..%d, term %d) "
                        "is not a prefix of %s's log (term %d, offsets %d..%d): copied "
                        "again from offset %d", self.ident[1], self.ident[0],
                        log_.first_offset, have - 1, self.term, self.leader, term, first,
                        leader_next - 1, first)
            log_.reset(first)
            self.generation += 1
            self.committed = -1
            self.wake()
        # producers' ids of records this copy no longer holds go (the leader's
        # snapshot after SHAVE brings back what is true of what it keeps)
        self.tracking.cut(log_.flushed_offset)
        self.tracking_waiting.clear()
        self.tracking_due = True
        self.save_tracking()
        if self.term != term:
            write_term(self.directory, term)
            self.term = term
        self.frozen = False
        return log_.flushed_offset

    def append(self, data: bytes) -> None:
        """Append an ``SREC``'s records (written at the end of the tick: :meth:`flush`)."""
        log_ = self.log
        for offset, timestamp, flags, payload in unpack_records(data):
            log_.append_replica(offset, timestamp, bool(flags & 1), payload, flags)
        self.ack_due = True
        if self.tracking_waiting:
            self.track({"publishers": self.tracking_waiting})

    def track(self, info: dict[str, Any]) -> None:
        """``STRACK``: take the producers' ids whose records this copy holds (the others
        wait for them: :meth:`append`) and the stored offsets; written to the file
        after the records (:meth:`flush`), or now when no records wait."""
        held = self.log.next_offset
        now: dict[str, list[int]] = {}
        for ref, (pid, end) in dict(info.get("publishers") or {}).items():
            entry = [int(pid), int(end)]
            if entry[1] <= held:
                now[str(ref)] = entry
                self.tracking_waiting.pop(str(ref), None)
            else:
                self.tracking_waiting[str(ref)] = entry
        offsets = info.get("offsets")
        if not now and offsets is None:
            return
        self.tracking.apply(now, dict(offsets) if offsets is not None else None)
        self.tracking_due = True
        if not self.ack_due:  # no records appended and not yet written
            self.save_tracking()

    def save_tracking(self) -> None:
        """Write ``tracking.json`` if it changed (in a worker thread when a loop runs)."""
        if not self.tracking_due:
            return
        self.tracking_due = False
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self.tracking.save(loop)

    def flush(self) -> int:
        """Write what was appended; the offset below which everything is written."""
        self.log.flush()
        self.ack_due = False
        self.save_tracking()  # after the records it names
        if self.committed > 0:
            self.wake()
        return self.log.flushed_offset

    def commit(self, offset: int) -> None:
        """``SCOMMIT``: every record below ``offset`` is committed."""
        if offset > self.committed:
            self.committed = offset
            self.wake()

    def wake(self) -> None:
        for watcher in list(self.watchers):
            watcher()

    def offer(self, term: int) -> int:
        """What this copy offers in an election after the leader of ``term`` was lost:
        how far it holds that leader's log (its next offset), or -1 when it never
        followed that leader (it votes, never leads)."""
        self.flush()
        return self.log.flushed_offset if self.term == term else -1

    def close(self) -> None:
        """Flush, fsync and close the files (the copy is kept on disk)."""
        self.closed = True
        if not self.log.closed:
            self.log.flush()
            self.log.sync()
            self.log.close()
        self.save_tracking()
        self.wake()

    def destroy(self) -> None:
        """The copy goes (stream deleted, or this node no longer a member)."""
        self.closed = True
        self.log.destroy()
        self.wake()


__all__ = ["EPOCH_FILE", "StreamReplica", "read_term", "valid_end", "write_term"]
