"""The leader's side of a mirrored queue (issue 16): :class:`Leading` holds the queue's
live messages, one :class:`_Stream` per mirror, its :class:`ReplicaSet` and its mirror
record in etcd.

It turns the store records :class:`amqpd.cluster.mirror_store.ReplicatingStore` hands it
into link frames (:mod:`amqpd.cluster.mirror_wire`), starts a mirror's stream
(``MSTART``, :meth:`Leading.attach`), answers its ``MHAVE`` and copies what it lacks in
the background (the catch-up: :meth:`Leading._backlog`, ``ha-sync-mode``, ``sync_queue``),
counts its acknowledgements for confirms and writes the record under a revision guard
(:meth:`Leading.write`). A quorum queue's leader is a subclass
(:class:`amqpd.cluster.quorum_leading.GroupLeading`). Theory of operation:
:mod:`amqpd.cluster.mirror`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.mirror_state import Ident, ReplicaSet, ha_setting
from amqpd.cluster.replica_core import CatchUp
from amqpd.coord.etcd import Compare, EtcdError, Put

if TYPE_CHECKING:
    from amqpd.broker.api import QueueType, StoredMessage
    from amqpd.cluster.link import Link
    from amqpd.cluster.mirror import Mirrors
    from amqpd.coord.etcd import EtcdClient

log = logging.getLogger("amqpd.cluster.mirror")

HAVE_WAIT: Final = 10.0  # seconds a new stream waits for the mirror's MHAVE
SYNC_BATCH: Final = 1024  # backlog messages per batch (ha-sync-batch-size overrides)
LOW_WATER: Final = 1 << 20  # a backlog batch waits until the link's buffer is below this


@dataclass(eq=False, repr=False)  # each stream is itself (in sets, dicts: by identity)
class _Stream:
    """One mirror's replication stream of a queue this node leads."""

    node: str
    rid: int
    link: Link
    start_seq: int
    synced: bool = False
    closed: bool = False
    backlog_sent: int = 0
    task: asyncio.Task[None] | None = None
    batches_durable: int = 0  # the mirror's MBATCHED so far (backlog flow control)
    batches: int = 0  # backlog batches sent (MBATCH)
    batch_event: asyncio.Event = field(default_factory=asyncio.Event)
    # what the queue held at MSTART (it may lack)
    candidates: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    # what the queue holds that the mirror lacks, in queue order; None until the
    # mirror said what it has (MHAVE)
    missing: dict[int, None] | None = None
    have: bool = False  # the mirror's MHAVE came
    ended: bool = False  # MBACKLOG_END sent: nothing it lacks is left
    # sync_queue came before the mirror's MHAVE: the copy starts with MHAVE (else
    # a manual-mode mirror asked to sync that early would never be synchronised)
    sync_asked: bool = False
    kept: int = 0  # messages the mirror already held (an earlier copy)
    backlog_bytes: int = 0  # bytes of MBACKLOG frames sent


class Leading:
    """A mirrored queue this node leads: its live messages, the mirrors' streams, its
    :class:`ReplicaSet` and its mirror record in etcd."""

    RECORD: ClassVar[str] = "mirror"  # the record's kind, and the log it is logged in
    LOG: ClassVar[logging.Logger] = log

    def __init__(self, mirrors: Mirrors, vhost: str, q: QueueType,
                 live: dict[int, bool]) -> None:
        self.mirrors = mirrors
        self.ident: Ident = (vhost, q.name)
        self.q = q
        self.key = q.store_key
        self.rs = ReplicaSet(mirrors.node)
        # the queue's unsettled persistent messages in log order: position -> delivered
        self.live = live
        self.streams: dict[str, _Stream] = {}
        self.wanted: list[str] = []
        self.leaving: set[str] = set()  # mirrors leaving the synchronised set (etcd first)
        # mirrors counted for confirms since their backlog became durable but not yet
        # named synchronised in the record (the one promotion reads): records confirmed
        # while they were out of the set may still be on their way to them. node -> the
        # replica core's catch-up, whose target is the leader's sequence number when
        # they joined (its whole log: at least its commit point then)
        self.catching: dict[str, CatchUp] = {}
        self.rev = -1  # the mod revision of our last write of the record (-1: not read)
        self.written: dict[str, Any] | None = None
        self.dirty = True
        self.writing = False
        self.deposed = False
        self.gone = False
        # promoted after ``origin``: its positions -> this node's of the same messages,
        # for the other copies of origin's log (got_have_from)
        self.origin = ""
        self.origin_map: dict[int, int] = {}

    # -- records ------------------------------------------------------------------------
    def _send(self, build: Any) -> None:
        for s in self.streams.values():
            if not s.closed:
                s.link.send(build(s.rid))

    def enqueued(self, position: int, m: StoredMessage) -> None:
        self.live[position] = False
        seq = self.rs.next_seq()
        if self.streams:
            self._send(lambda rid: W.encode(
                M.MENQ, rid, seq, position, m.exchange, m.routing_key, m.properties, m.body,
                m.published, m.expires, m.priority))

    def settled(self, positions: list[int]) -> None:
        live = self.live
        done = [p for p in positions if live.pop(p, None) is not None]
        if done:
            seq = self.rs.next_seq()
            if self.streams:
                self._send(lambda rid: W.encode(M.MSETTLE, rid, seq, done))
                for s in self.streams.values():
                    if s.missing:  # ha-sync-mode manual: synchronised once they are gone
                        for p in done:
                            s.missing.pop(p, None)
                        if not s.missing:
                            self._maybe_end(s)

    def delivered(self, positions: list[int]) -> None:
        live = self.live
        marked = [p for p in positions if live.get(p) is False]
        if marked:
            for p in marked:
                live[p] = True
            seq = self.rs.next_seq()
            if self.streams:
                self._send(lambda rid: W.encode(M.MDELIV, rid, seq, marked))

    def checked_out(self, position: int) -> None:
        """The message at ``position`` is being handed to a consumer (or basic.get): a
        mirrored queue records only that it was delivered (a quorum group also who
        holds it: amqpd.cluster.quorum_group)."""
        self.delivered([position])

    def dropped(self) -> None:
        """The queue was deleted here: the copies end, the record goes."""
        self.mirrors.stop_leading(self, delete_record=True)

    # -- mirrors ------------------------------------------------------------------------
    def attach(self, node: str, link: Link) -> None:
        self.mirrors.next_rid += 1
        s = _Stream(node, self.mirrors.next_rid, link, self.rs.seq)
        s.candidates = list(self.live)
        self.streams[node] = s
        self.rs.attach(node)
        vhost, name = self.ident
        link.send(W.encode(M.MSTART, s.rid, vhost, name, s.start_seq))
        self.mirrors.by_rid[(node, s.rid)] = self
        self.dirty = True
        born = self.empty()
        if born:
            # nothing to copy: the mirror holds all the queue holds from MSTART on (the
            # link keeps the order), so it counts for confirms at once, as a RabbitMQ
            # mirror created with its queue does; MBACKLOG_END right behind MSTART
            # makes the copy synchronised before any record can need it
            s.missing = {}
            s.ended = True
            s.synced = True
            link.send(W.encode(M.MBACKLOG_END, s.rid, 0))
            self.rs.ack(node, s.start_seq)
            self.rs.join(node)
            self.leaving.discard(node)
            self.rs.pending.discard(node)
        log.info("queue '%s' in vhost '%s': mirror on %s starting (%d messages in the "
                 "queue%s)", name, vhost, node, len(self.live),
                 "; synchronised from the start" if born else "")

    def born_without(self, node: str) -> None:
        """``node`` should have had a mirror from the declare on but has no link yet
        (this node just woke from a stall and the peer still refuses the new link, say):
        a birth member. RabbitMQ creates a queue's mirrors with the queue, so nothing a
        mirror lacks was ever confirmed without it; so here too: every confirm waits for
        it (:attr:`ReplicaSet.pending`) until its copy, made once the link is up
        whatever ha-sync-mode says, is synchronised. It is not named synchronised in
        the record until then, and if it never gets there it stops counting after the
        gate's timeout, like any mirror that does not acknowledge."""
        if node in self.streams or node in self.rs.pending:
            return
        self.rs.pending.add(node)
        vhost, name = self.ident
        log.warning("queue '%s' in vhost '%s': no link to %s at its declare; its mirror "
                    "starts when the link is up, and confirms wait for it", name, vhost,
                    node)

    def empty(self) -> bool:
        """The queue holds no message at all, ready or unacknowledged (transient ones
        included, which ``live`` leaves out before the queue is mirrored)."""
        q = self.q
        return not self.live and q.message_count == 0 and q.unacked_count == 0

    def sync_mode(self) -> str:
        return ha_setting(self.q.policy, "ha-sync-mode")

    def got_have(self, node: str, rid: int, positions: list[int]) -> None:
        """The mirror's answer to MSTART: the positions it still holds. It keeps
        those the queue still holds, drops the others, and lacks the rest."""
        s = self.streams.get(node)
        if s is None or s.rid != rid or s.have:
            return
        s.have = True
        live = self.live
        have = set(positions)
        stale = [p for p in positions if p not in live]
        kept = [p for p in positions if p in live]
        s.kept = len(kept)
        s.missing = {p: None for p in s.candidates if p in live and p not in have}
        s.candidates = []
        if stale:  # settled while it was away
            s.link.send(W.encode(M.MSETTLE, rid, s.start_seq, stale))
        marked = [p for p in kept if live[p]]
        if marked:
            s.link.send(W.encode(M.MDELIV, rid, s.start_seq, marked))
        vhost, name = self.ident
        mode = self.sync_mode()
        log.info("queue '%s' in vhost '%s': mirror on %s holds %d of its messages "
                 "(%d dropped), lacks %d (ha-sync-mode %s)", name, vhost, node, len(kept),
                 len(stale), len(s.missing), mode)
        if (mode == "automatic" or s.sync_asked or node in self.rs.pending) and s.missing:
            self._start_sync(s)
        else:
            self._maybe_end(s)

    def got_have_from(self, node: str, rid: int, positions: list[int], origin: str,
                      old: list[int]) -> None:
        """MHAVE with a copy of ``origin``'s log (the leader this node was promoted
        after): those of ``old`` this node holds are the mirror's under their
        positions here (MREKEY, before anything else of the answer); then as MHAVE."""
        s = self.streams.get(node)
        if s is None or s.rid != rid or s.have:
            return
        live = self.live
        if origin == self.mirrors.node:  # a copy of this node's own log: same positions
            pairs = [(o, o) for o in old if o in live]
        else:
            pairs = [(o, n) for o in old if origin == self.origin
                     and (n := self.origin_map.get(o)) is not None and n in live]
        s.link.send(W.encode(M.MREKEY, rid, [o for o, _n in pairs], [n for _o, n in pairs]))
        self.got_have(node, rid, positions + [n for _o, n in pairs])

    def _start_sync(self, s: _Stream) -> bool:
        if s.closed or s.ended or s.missing is None or \
                (s.task is not None and not s.task.done()):
            return False
        s.task = asyncio.get_running_loop().create_task(self._backlog(s))
        return True

    def _maybe_end(self, s: _Stream, in_task: bool = False) -> None:
        """Nothing the mirror lacks is left: tell it (it then reports synchronised)."""
        if s.closed or s.ended or s.missing is None or s.missing:
            return
        if not in_task and s.task is not None and not s.task.done():
            return
        s.ended = True
        s.link.send(W.encode(M.MBACKLOG_END, s.rid, s.backlog_sent))

    def sync(self) -> int:
        """``sync_queue``: copy what the unsynchronised mirrors lack, in the
        background (the queue keeps serving); how many copies started, or wait for
        the mirror's MHAVE to start (RabbitMQ syncs every unsynchronised mirror)."""
        n = 0
        for s in self.streams.values():
            if s.synced or s.closed:
                continue
            if s.missing is None:  # MHAVE not yet here: got_have starts the copy
                s.sync_asked = True
                n += 1
            else:
                n += self._start_sync(s)
        return n

    def cancel_sync(self) -> int:
        """``cancel_sync_queue``: stop the copies running; what was copied stays."""
        n = 0
        for s in self.streams.values():
            if s.sync_asked and s.missing is None:
                n += 1
            s.sync_asked = False
            if s.task is not None and not s.task.done() and not s.ended:
                s.task.cancel()
                s.task = None
                n += 1
        return n

    async def _backlog(self, s: _Stream) -> None:
        """Copy what the mirror lacks, a batch at a time."""
        store = self.mirrors.store.inner
        policy = self.q.policy or {}
        batch = policy.get("ha-sync-batch-size")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            batch = SYNC_BATCH
        missing = s.missing
        assert missing is not None
        n = 0
        # in queue order from a snapshot: taking the dict's first key after deleting
        # the ones before it rescans the deleted slots each time (quadratic: 60 % of a
        # leader's CPU when a mirror lacked 200,000 messages); settles meanwhile take
        # positions out of ``missing``, so a snapshot position no longer in it is passed
        for pos in list(missing):
            if s.closed:
                break
            if pos not in missing:
                continue
            del missing[pos]
            delivered = self.live.get(pos)
            if delivered is None:
                continue  # settled meanwhile (the mirror saw the settle, or never needs it)
            try:
                m = store.read(pos)
            except Exception as exc:  # a failing disk: the mirror stays unsynchronised
                log.error("queue '%s': backlog read for the mirror on %s failed: %s",
                          self.ident[1], s.node, exc)
                missing[pos] = None
                return
            frame = W.encode(M.MBACKLOG, s.rid, pos, delivered, m.exchange,
                             m.routing_key, m.properties, m.body, m.published,
                             m.expires, m.priority)
            s.backlog_bytes += len(frame)
            s.link.send(frame)
            n += 1
            s.backlog_sent += 1
            if n % batch == 0:
                s.batches += 1
                s.link.send(W.encode(M.MBATCH, s.rid, s.batches))
                await self._drained(s, s.batches - 1)
        self._maybe_end(s, in_task=True)

    @staticmethod
    async def _drained(s: _Stream, durable: int) -> None:
        """Wait until the mirror holds batch ``durable`` (one batch stays in flight)
        and the link's buffer is low: the copy goes as fast as the mirror writes."""
        await asyncio.sleep(0)  # the link flushes at the end of the tick
        while not s.closed and s.batches_durable < durable:
            s.batch_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(s.batch_event.wait(), 1.0)
        transport = s.link.transport
        for _ in range(1000):
            if s.closed or transport is None or \
                    transport.get_write_buffer_size() < LOW_WATER:
                return
            await asyncio.sleep(0.005)

    def detach(self, node: str, drop: bool) -> None:
        """The mirror on ``node`` stops (its link went, or it is no longer wanted):
        it leaves the synchronised set (etcd first, then the confirms stop waiting)."""
        s = self.streams.pop(node, None)
        if s is not None:
            s.closed = True
            if s.task is not None:
                s.task.cancel()
            self.mirrors.by_rid.pop((node, s.rid), None)
            if drop and not s.link.closed:
                s.link.send(W.encode(M.MDROP, s.rid))
        if node in self.rs.synchronised:
            self.leaving.add(node)
        self.catching.pop(node, None)
        self.dirty = True

    def give_up(self, node: str, drop: bool, why: str) -> None:
        """Stop the mirror on ``node`` for good (no longer wanted, not running, silent
        past the gate's timeout): as :meth:`detach`, and a birth member stops holding
        the confirms at once (it was never named synchronised: nothing to record
        first). A plain :meth:`detach` (the link went, the peer refused MSTART for now)
        keeps it a birth member: its next copy is made in full again."""
        if node in self.rs.pending:
            self.rs.pending.discard(node)
            vhost, name = self.ident
            log.warning("queue '%s' in vhost '%s': confirms no longer wait for the mirror "
                        "on %s, which had no copy since the declare: %s", name, vhost,
                        node, why)
        self.detach(node, drop)

    def got_ack(self, node: str, seq: int) -> None:
        self.rs.ack(node, seq)
        due = self.catching.get(node)
        if due is not None and due.done(seq):
            del self.catching[node]  # holds all the leader held when it joined
            self.dirty = True

    def got_batch(self, node: str, rid: int, number: int) -> None:
        s = self.streams.get(node)
        if s is not None and s.rid == rid and number > s.batches_durable:
            s.batches_durable = number
            s.batch_event.set()

    def got_synced(self, node: str, rid: int) -> None:
        s = self.streams.get(node)
        if s is None or s.rid != rid or s.synced:
            return
        s.synced = True
        self.rs.ack(node, s.start_seq)  # the backlog holds everything up to it
        self.rs.join(node)
        self.leaving.discard(node)
        self.rs.pending.discard(node)
        if self.rs.seq > s.start_seq:
            # records after the stream's start may have been confirmed while this
            # mirror was out of the set: it is named synchronised (may be promoted)
            # only once it acknowledges them all
            self.catching[node] = CatchUp(self.rs.seq)
        self.dirty = True
        log.info("queue '%s' in vhost '%s': mirror on %s synchronised (%d messages, "
                 "%d bytes copied in the background; %d it held kept)", self.ident[1],
                 self.ident[0], node, s.backlog_sent, s.backlog_bytes, s.kept)

    # -- the record ---------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        sync = sorted(n for n in self.rs.synchronised
                      if n not in self.leaving and n not in self.catching)
        policy = self.q.policy
        return {"leader": self.mirrors.node, "mirrors": sorted(self.streams),
                "synchronised": sync, "wanted": list(self.wanted),
                "promote_on_failure": ha_setting(policy, "ha-promote-on-failure"),
                "promote_on_shutdown": ha_setting(policy, "ha-promote-on-shutdown")}

    async def write(self) -> None:
        """Bring the etcd record in line, one :meth:`_write_pass` while something
        changed; after each pass that wrote, the commits waiting on the gate are
        looked at again."""
        if self.writing or self.deposed:
            return
        self.writing = True
        try:
            while self.dirty and not self.gone:
                self.dirty = False
                written = await self._write_pass(self.mirrors.record_key(self.ident),
                                                 self.mirrors.etcd)
                if written is None:
                    return
                if written:
                    self.mirrors.gate.release()
        except EtcdError as exc:
            self.dirty = True
            self.LOG.warning("queue '%s': %s record not written to etcd yet: %s",
                             self.ident[1], self.RECORD, exc)
        finally:
            self.writing = False

    async def _write_pass(self, key: str, etcd: EtcdClient) -> bool | None:
        """One pass of :meth:`write`: the record written (True), the write to be tried
        again (False: another writer got there first), or None: this node no longer
        leads the queue. Once written, what left the synchronised set stops counting
        for confirms."""
        rec = self.record()
        leaving = set(self.leaving)
        if self.rev < 0 and await self._read_record(key, etcd) is None:
            return None
        if (rec != self.written or leaving) and not await self._put_record(key, etcd, rec):
            return False
        for node in leaving:
            if node in self.leaving and node not in rec["synchronised"]:
                self.leaving.discard(node)
                self.rs.leave(node)
                log.warning("queue '%s' in vhost '%s': mirror on %s left the "
                            "synchronised set", self.ident[1], self.ident[0], node)
        return True

    async def _read_record(self, key: str, etcd: EtcdClient) -> dict[str, Any] | None:
        """Read the record (its revision guards the next write); None when it names
        another leader: this node stops leading the queue (:meth:`_deposed`)."""
        kv = await etcd.get(key)
        old: dict[str, Any] = {}
        if kv is not None:
            try:
                old = json.loads(kv.value)
            except ValueError:
                old = {}
            if old.get("leader") not in (None, self.mirrors.node):
                self._deposed(str(old.get("leader")))
                return None
        self.rev = kv.mod_revision if kv is not None else 0
        return old

    async def _put_record(self, key: str, etcd: EtcdClient, rec: dict[str, Any]) -> bool:
        """Write ``rec`` guarded by the revision last read or written; False when the
        guard failed (the record is read again before the next try)."""
        result = await etcd.txn([Compare("mod", key, "==", self.rev)],
                                [Put(key, json.dumps(rec))])
        if not result.succeeded:
            self.rev = -1
            self.dirty = True
            return False
        self.rev = result.revision
        self.written = rec
        return True

    def _deposed(self, leader: str) -> None:
        log.error("queue '%s' in vhost '%s': the cluster made %s its leader; this node "
                  "stops leading it", self.ident[1], self.ident[0], leader)
        self.deposed = True
        self.mirrors.stop_leading(self, delete_record=False)


__all__ = ["HAVE_WAIT", "LOW_WATER", "SYNC_BATCH", "Leading"]
