"""The leader's side of a replicated stream (issue 30): part of
:mod:`amqpd.cluster.stream_group`.

:class:`StreamLeading` ships the records of the stream this node leads to every other
member on the node link, from the offset each member said it continues from
(``SHAVE``), in order, at most :data:`WINDOW_RECORDS` records and
:data:`INFLIGHT_BYTES` bytes beyond what it acknowledged (``SACK``), and decides when a
confirm may leave: once the records
below its offset are written on a majority of the members, the leader included
(:class:`~amqpd.cluster.replica_core.Majority` over the acknowledged offsets; the
leader's own records are fsynced first, :meth:`StreamQueue.sync_log`). A commit that
no majority acknowledges within ``cluster.mirror_sync_timeout`` is refused (the
publisher gets a nack) instead of waiting for ever.

It also tells each member the commit point as it moves (``SCOMMIT``): a member serves
its own node's consumers up to there (:mod:`amqpd.cluster.stream_local`), and so does
the leader (:attr:`StreamQueue.read_limit`; its stream-protocol subscribers hear of a
move through :meth:`StreamQueue.commit_moved`).

**Tracking.** A named producer's publishing ids and the stored consumer offsets
(:mod:`amqpd.streamproto.tracking`) go to the members on the same link: a batch of
records is preceded by ``STRACK`` with each producer whose latest append ends in it,
``SHAVE`` followed by what the member's log already holds and every stored offset, and
a store-offset by the offsets. A member takes a producer's id once it holds the records
up to the id's end offset, and acknowledges records only after it took every frame sent
before them, so a confirmed id is known wherever its records are committed.

**Catching up off the loop.** A member far behind (its next record is not near the end
of the active segment, where the pages were just written) is fed by reads in a worker
thread (:meth:`StreamLog.read_shared`, one batch of at most :data:`BATCH_RECORDS` /
:data:`WINDOW_BYTES` in flight per member, packed there too), so a cold ``pread`` of
an old segment never stalls the leader's loop and its publishers; a member at the tail
is read in place, as the stream's own consumers are
(:mod:`amqpd.broker.stream_readahead`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import TAIL_BYTES
from amqpd.cluster import link_wire as W
from amqpd.cluster import stream_wire as S
from amqpd.cluster.quorum_state import NoQuorum
from amqpd.cluster.replica_core import Majority

if TYPE_CHECKING:
    from amqpd.broker.api import Record, StreamQueue
    from amqpd.cluster.link import Link
    from amqpd.store.stream_log import Reader

log = logging.getLogger("amqpd.cluster.stream")

WINDOW_RECORDS: Final = 4096  # records sent to a member beyond its acknowledgement
# ... and bytes: without it a member far behind had 4,096 large records (256 MB of
# 64 KiB ones) queued on the link at once, joined into one write on the loop
INFLIGHT_BYTES: Final = 8 << 20
WINDOW_BYTES: Final = 1 << 20  # bytes read per batch shipped at most
BATCH_RECORDS: Final = 512  # records per SREC frame at most
# an SSTART unanswered this long is sent again: a node just starting may take the frame
# before its stream groups listen on its links (it is dropped there)
ANSWER_WAIT: Final = 2.0

Done = Callable[[BaseException | None], None]


class StreamLeading:
    """One stream this node leads: its members' positions and the confirms waiting."""

    def __init__(self, node: str, vhost: str, q: StreamQueue, members: list[str],
                 term: int, epochs: list[list[int]], rids: Callable[[], int],
                 timeout: float) -> None:
        self.node = node
        self.ident = (vhost, q.name)
        self.q = q
        self.members = members
        self.term = term
        self.epochs = epochs
        self.rev = 0  # the group record's revision this leader wrote or read last
        self._rids = rids
        self.timeout = timeout
        self.links: dict[str, Link] = {}  # member -> the link its SSTART went on
        self.rid: dict[str, int] = {}  # member -> its replication stream
        self.acked: dict[str, int] = {}  # member -> every record below is written there
        self.readers: dict[str, Reader] = {}  # member -> where its next SREC reads
        self.asked: dict[str, float] = {}  # member -> when its unanswered SSTART went
        self.loading: set[str] = set()  # members whose next batch a worker reads
        # member -> (end offset, bytes) of each SREC it has not acknowledged yet
        self.unacked: dict[str, deque[tuple[int, int]]] = {}
        self.unacked_bytes: dict[str, int] = {}
        self.told = 0  # the commit point the members were told last (SCOMMIT)
        self.worker_reads = 0  # batches read off the loop (catching-up members)
        self.waiters: deque[tuple[int, float, Done]] = deque()
        self.gone = False
        self.tracking = q.stream_tracking()
        self.offsets_sent: dict[str, int] = {}  # member -> the offsets version it has
        q.commit_gate = self.wait
        q.read_limit = self.commit_point
        q.watchers.append(self.ship)
        self.tracking.watchers.append(self.ship)

    # -- members --------------------------------------------------------------------
    def connect(self, link_of: Callable[[str], Link | None]) -> None:
        """Start the copy of every member whose link is up and has none yet."""
        for member in self.members:
            if member == self.node:
                continue
            link = link_of(member)
            if link is None or (self.links.get(member) is link and (
                    member in self.readers
                    or time.monotonic() - self.asked.get(member, 0.0) < ANSWER_WAIT)):
                continue
            self.forget(member)
            self.asked[member] = time.monotonic()
            rid = self._rids()
            self.links[member] = link
            self.rid[member] = rid
            log_ = self.q.log
            link.send(W.encode(S.SSTART, rid, self.ident[0], self.ident[1], self.term, {
                "epochs": self.epochs, "first": log_.first_offset,
                "next": log_.flushed_offset, "arguments": self.q.arguments}))

    def forget(self, member: str) -> None:
        """The member's copy is not fed any more (its link went, it refused, it left)."""
        self.links.pop(member, None)
        self.rid.pop(member, None)
        self.acked.pop(member, None)
        self.readers.pop(member, None)
        self.asked.pop(member, None)
        self.loading.discard(member)
        self.unacked.pop(member, None)
        self.unacked_bytes.pop(member, None)
        self.offsets_sent.pop(member, None)

    def member_of(self, link: Link, rid: int) -> str | None:
        member = link.peer
        return member if self.links.get(member) is link and self.rid.get(member) == rid \
            else None

    def have(self, member: str, offset: int) -> None:
        """``SHAVE``: the member continues from ``offset``."""
        self.acked[member] = offset
        self.readers[member] = self.q.log.reader(offset)
        self.unacked[member] = deque()
        self.unacked_bytes[member] = 0
        # what it may serve its consumers already (0 at first: nothing, but known)
        link, rid = self.links[member], self.rid[member]
        link.send(W.encode(S.SCOMMIT, rid, self.told))
        # the producers' ids true of what it holds, and the stored offsets
        t = self.tracking
        link.send(W.encode(S.STRACK, rid, {"publishers": t.snapshot(offset),
                                           "offsets": t.offsets}))
        self.offsets_sent[member] = t.offsets_version
        self.ship()

    def ack(self, member: str, offset: int) -> None:
        """``SACK``: every record below ``offset`` is written on the member."""
        if offset > self.acked.get(member, -1):
            self.acked[member] = offset
        sent = self.unacked.get(member)
        if sent:
            done = 0
            while sent and sent[0][0] <= offset:
                done += sent.popleft()[1]
            self.unacked_bytes[member] -= done
        self.ship()  # the commit point too: tell_commit, release

    # -- shipping -------------------------------------------------------------------
    def ship(self) -> None:
        """Send every member what it lacks of what is readable, within its window: in
        place at the tail, through a worker for a member behind (module docstring)."""
        if self.gone:
            return
        end = self.q.log.flushed_offset
        version = self.tracking.offsets_version
        for member, reader in self.readers.items():
            link = self.links.get(member)
            if link is None or link.closed:
                continue
            if self.offsets_sent.get(member) != version:  # an offset was stored
                link.send(W.encode(S.STRACK, self.rid[member],
                                   {"offsets": self.tracking.offsets}))
                self.offsets_sent[member] = version
            if member in self.loading:
                continue
            acked = self.acked.get(member, 0)
            while reader.offset < end and reader.offset - acked < WINDOW_RECORDS and \
                    self.unacked_bytes.get(member, 0) < INFLIGHT_BYTES:
                if not _at_tail(reader):
                    self._read_off_loop(member, reader)
                    break
                start = reader.offset
                if not self._send_batch(member, start, reader.read(BATCH_RECORDS,
                                                                   WINDOW_BYTES)):
                    break
        self.tell_commit()
        self.release()

    def _send_batch(self, member: str, start: int, records: list[Record]) -> bool:
        """Ship ``records`` read from ``start`` to ``member``; False when there is
        nothing to send or retention took what it lacks (it starts again)."""
        if not records:
            return False
        if records[0].offset != start:
            # retention took what the member lacks: it starts again from the oldest
            # kept (SSTART tells it where that is)
            log.warning("stream '%s' in vhost '%s': %s lacks offsets %d..%d, which "
                        "retention deleted here; its copy starts again", self.ident[1],
                        self.ident[0], member, start, records[0].offset - 1)
            self.forget(member)
            return False
        data = S.pack_records(records)
        link, rid = self.links[member], self.rid[member]
        delta = self.tracking.delta(start, records[-1].offset + 1)
        if delta:  # the producers whose ids these records complete (held till they come)
            link.send(W.encode(S.STRACK, rid, {"publishers": delta}))
        link.send(W.encode(S.SREC, rid, data))
        self.unacked.setdefault(member, deque()).append((records[-1].offset + 1, len(data)))
        self.unacked_bytes[member] = self.unacked_bytes.get(member, 0) + len(data)
        return True

    def _read_off_loop(self, member: str, reader: Reader) -> None:
        """Read (and pack) ``member``'s next batch in a worker thread; it is sent, and
        the shipping goes on, when it lands on the loop. Without a running loop (sans-IO
        tests), in place."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._send_batch(member, reader.offset, reader.read(BATCH_RECORDS, WINDOW_BYTES))
            return
        self.loading.add(member)
        self.worker_reads += 1
        start = reader.offset
        log_ = self.q.log
        future = loop.run_in_executor(None, log_.read_shared, reader, BATCH_RECORDS,
                                      WINDOW_BYTES)

        def landed(fut: asyncio.Future[list[Record]]) -> None:
            if member not in self.loading or self.readers.get(member) is not reader:
                return  # forgotten meanwhile (link gone, refused, removed)
            self.loading.discard(member)
            if self.gone:
                return
            error = fut.exception()
            if error is not None:
                log.error("stream '%s' in vhost '%s': reading offset %d for %s failed: "
                          "%s; its copy starts again", self.ident[1], self.ident[0], start,
                          member, error)
                self.forget(member)
                return
            link = self.links.get(member)
            if link is None or link.closed:
                return
            if self._send_batch(member, start, fut.result()):
                self.ship()

        future.add_done_callback(landed)

    def tell_commit(self) -> None:
        """Tell the members the commit point when it moved (``SCOMMIT``)."""
        point = self.commit_point()
        if point <= self.told:
            return
        self.told = point
        if self.q.consumers:  # they read up to the commit point
            self.q.vhost.schedule_dispatch(self.q)
        self.q.commit_moved()  # and so do its stream-protocol subscribers
        for member in self.readers:
            link = self.links.get(member)
            if link is not None and not link.closed:
                link.send(W.encode(S.SCOMMIT, self.rid[member], point))

    # -- commits --------------------------------------------------------------------
    def commit_point(self) -> int:
        """The offset below which every record is written on a majority."""
        others = [m for m in self.members if m != self.node]
        return Majority.of(len(self.members)).commit_point(
            self.q.log.flushed_offset, self.acked, others)

    def wait(self, upto: int, done: Done) -> None:
        """The stream's commit gate: ``done`` once the records below ``upto`` are
        committed (or with :class:`NoQuorum` after the timeout)."""
        if not self.waiters and self.commit_point() >= upto:
            done(None)
            return
        self.waiters.append((upto, time.monotonic(), done))

    def release(self) -> None:
        waiters = self.waiters
        if not waiters:
            return
        point = self.commit_point()
        while waiters and waiters[0][0] <= point:
            waiters.popleft()[2](None)

    def expire(self, now: float) -> int:
        """Refuse the commits older than the timeout; how many."""
        waiters = self.waiters
        n = 0
        while waiters and now - waiters[0][1] > self.timeout:
            waiters.popleft()[2](NoQuorum(
                "a majority of the stream's members did not acknowledge in time"))
            n += 1
        return n

    def stop(self, error: BaseException | None = None) -> None:
        """No longer led here: the gate and the shipping go; confirms waiting fail."""
        self.gone = True
        if self.q.commit_gate == self.wait:
            self.q.commit_gate = None
        if self.q.read_limit == self.commit_point:
            self.q.read_limit = None
        if self.ship in self.q.watchers:
            self.q.watchers.remove(self.ship)
        if self.ship in self.tracking.watchers:
            self.tracking.watchers.remove(self.ship)
        waiters, self.waiters = self.waiters, deque()
        for _upto, _since, done in waiters:
            done(error or NoQuorum("the stream is no longer led here"))

    def offsets(self) -> dict[str, int]:
        """Member -> the offset below which it holds every record (the leader: what is
        written here; a member: what it acknowledged; absent: not connected)."""
        out = {self.node: self.q.log.flushed_offset}
        out.update(self.acked)
        return out

    def record(self) -> dict[str, Any]:
        return {"leader": self.node, "members": list(self.members), "term": self.term,
                "epochs": self.epochs}


def _at_tail(reader: Reader) -> bool:
    """Reading ``reader`` in place is cheap: its next record is near the end of the
    active segment (just written, in the page cache)."""
    behind = reader.bytes_to_end()
    return behind is not None and behind <= TAIL_BYTES


__all__ = ["StreamLeading"]
