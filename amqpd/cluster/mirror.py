"""Mirrored classic queues (issue 16): a queue survives the loss of its node.

Theory of operation.

* **Which queues, where.** A durable, non-exclusive classic queue whose policy has
  ``ha-mode`` (``all`` | ``exactly`` + ``ha-params`` = total replicas | ``nodes`` +
  ``ha-params`` = node list; :func:`amqpd.cluster.mirror_state.mirror_nodes`) keeps
  mirrors on other running nodes: from its declaration on (the definitions' hook,
  :meth:`Mirrors.queue_recorded`, before the declare-ok; a mirror of a queue that holds
  nothing is synchronised from its ``MSTART``: :meth:`Leading.attach`), and as policies
  and nodes change. Its leader decides (every :data:`TICK`) and writes the
  queue's *mirror record* to etcd, ``{root}/mirrors/{vhost}/{queue}`` = ``{"leader",
  "mirrors", "synchronised", "wanted"}``, always as a transaction guarded by the record's
  last revision, so every node reads the same record and a deposed leader cannot
  overwrite its successor's.
* **What is replicated.** The leader's records for the queue, as its store sees them:
  :class:`ReplicatingStore` wraps the node's message store and, for the keys of
  mirrored queues, turns each enqueue (body and properties), settle (ack, reject,
  purge, expiry, drop) and delivery mark (the message comes back redelivered) into a
  frame on the link to each mirror (:mod:`amqpd.cluster.mirror_wire`), numbered by the
  queue's replication sequence. Requeue needs no record: a requeued message is still
  unsettled, and its delivery mark already says redelivered. (A quorum group marks a
  delivery with the node holding it instead, :meth:`Leading.checked_out`:
  amqpd.cluster.quorum_group.) Every message is
  mirrored: while the queue is mirrored it keeps transient messages in the store too
  (``QueueType.mirrored``, as a quorum queue's ``keeps_every_message``). A queue
  that starts being mirrored counts its ready messages and its unacknowledged
  deliveries (local channels and other nodes' consumers) as what the mirror lacks.
* **The mirror** (:class:`MirrorCopy`) writes the records to its own store under the
  queue's store key, in a copy that serves no client, and acknowledges (``MACK``) once
  its store commit made them durable.
* **Confirms.** The wrapped store's ``commit`` -- what publisher confirms, tx.commit-ok
  and every other durability wait of the node go through -- answers once the leader's
  group commit is done AND every synchronised mirror acknowledged every record
  replicated so far (:class:`amqpd.cluster.mirror_state.CommitGate`). A mirror whose
  link goes, or that holds a waiter longer than ``cluster.mirror_sync_timeout``, leaves
  the synchronised set (a log line) once etcd has recorded that, so a confirm never
  counts on a mirror the record still calls synchronised.
* **Catch-up.** A new (or returning) mirror gets ``MSTART`` and answers ``MHAVE``:
  the leader positions it still holds of an earlier copy from this leader (its link
  came back, or its node restarted: :mod:`amqpd.cluster.mirror_map` keeps the copy's
  leader positions, and a quorum member's durable mark, on disk, and
  :meth:`Mirrors._adopt` takes the recovered messages back as the copy). The leader
  settles there what was settled meanwhile; what the queue held at ``MSTART`` that the
  mirror lacks is its *missing* set. ``ha-sync-mode`` ``automatic`` copies it at once, ``manual``
  (the default) only on ``sync_queue`` (:meth:`Leading.sync`, any node:
  ``MSYNCREQ``), otherwise it waits until those messages are settled. The copy
  (``MBACKLOG``, read back from the leader's store, in batches of
  ``ha-sync-batch-size``, each sent once the mirror holds the one before last
  durable: ``MBATCH`` / ``MBATCHED``) runs in the background while the live records
  flow as usual; the queue keeps serving. Once nothing it lacks is left
  (``MBACKLOG_END``) and that is durable on the mirror (``MSYNCED``) it joins the
  synchronised set.
* **Failover.** When the view says the leader's node is not running, each mirror
  holding a copy may offer itself (``{root}/mirror-candidates/{vhost}/{queue}/{record
  revision}/{node}`` = the last sequence number it received and whether it is
  synchronised): a synchronised one always, an unsynchronised one only if the record's
  ``promote_on_failure`` (or, when the record says the leader stopped in a controlled
  way, ``promote_on_shutdown``) allows it
  (:func:`~amqpd.cluster.mirror_state.may_promote_unsynchronised`). Once every
  running synchronised mirror did (or after :data:`ELECTION_WAIT`), the choice of
  :func:`~amqpd.cluster.mirror_state.choose_promotion` (most up to date, synchronised
  first) takes over with
  one etcd transaction on the queue's definition key (its ``node``, the catalogue's
  leader) and its mirror record, guarded by both revisions: never two leaders. The new
  leader turns its copy into a classic queue (unsettled messages come back, those
  handed out before marked redelivered) in the place of the :class:`RemoteQueue`,
  bindings kept; the other nodes' remote queues follow the catalogue to it. It keeps
  the lost leader's positions of what it took over (:attr:`Leading.origin_map`): the
  other copies of the lost leader's log wait for its ``MSTART``
  (:meth:`Mirrors._awaits_successor`), answer ``MHAVE_FROM`` and keep what its
  ``MREKEY`` places (:meth:`MirrorCopy.follow`, :meth:`MirrorCopy.rekey`), as the old
  leader does with its own queue when it returns (:meth:`Mirrors._adopt_own`). Consumers
  that consumed through the old leader consume on from the new one, unless they asked
  for ``x-cancel-on-ha-failover`` (then basic.cancel; remote_queue.replace_queue);
  publishers get nacks for what was in flight, then confirms from the new leader.
* **Controlled stop.** :meth:`Mirrors.stop` (SIGTERM) first writes ``"shutdown":
  true`` into the record of every queue this node leads, so their mirrors apply
  ``ha-promote-on-shutdown``.

How quorum queues can reuse this: see :mod:`amqpd.cluster.mirror_state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import NotReplicated
from amqpd.broker.message import LoggedMessage
from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.mirror_map import CopyMap, map_path
from amqpd.cluster.mirror_state import (
    CommitGate,
    ReplicaSet,
    choose_promotion,
    ha_setting,
    may_promote_unsynchronised,
    mirror_nodes,
)
from amqpd.cluster.takeover_txn import names_this_node, take_over_txn
from amqpd.coord.etcd import Compare, EtcdError, Put, delete_own
from amqpd.store.api import StoredMessage, queue_key

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.broker.queue_type import QueueType
    from amqpd.broker.vhost import VHost
    from amqpd.cluster.link import Link
    from amqpd.cluster.node import Cluster
    from amqpd.cluster.remote_queue import ClusterQueues
    from amqpd.store.api import MessageStore

log = logging.getLogger("amqpd.cluster.mirror")

TICK: Final = 0.25  # seconds between reconciliations (policies, timeouts, failover)
ELECTION_WAIT: Final = 2.0  # seconds a candidate waits for the other candidates
# seconds an unsynchronised mirror's promotion waits for running synchronised mirrors
# to offer themselves (choose_promotion's ``awaited``)
SYNCED_WAIT: Final = 15.0
HAVE_WAIT: Final = 10.0  # seconds a new stream waits for the mirror's MHAVE
# seconds a copy started with its queue's declare waits for the queue's definition
LISTING_WAIT: Final = 10.0
# seconds a copy whose leader was replaced waits for the new leader's MSTART
SUCCESSOR_WAIT: Final = 20.0
KEPT_CHECK_TRIES: Final = 20  # etcd reads of a record to confirm kept consumers
DECLINED_RETRY: Final = 5.0  # seconds before a mirror that may not take over looks again
SHUTDOWN_MARK: Final = 2.0  # seconds a stopping leader gives etcd to record its stop
SYNC_BATCH: Final = 1024  # backlog messages per batch (ha-sync-batch-size overrides)
LOW_WATER: Final = 1 << 20  # a backlog batch waits until the link's buffer is below this
STREAM_SPLIT: Final = 1 << 31  # replication streams from here on: quorum queues'

Ident = tuple[str, str]  # (vhost, queue)


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


# ---------------------------------------------------------------------- the store wrapper
class ReplicatingStore:
    """The node's message store, with the records of mirrored queues this node leads
    replicated, and commits that wait for the synchronised mirrors (module docstring).
    Everything else passes through unchanged."""

    def __init__(self, inner: MessageStore, mirrors: Mirrors) -> None:
        self.inner = inner
        self.mirrors = mirrors
        self.on_disk = inner.on_disk
        self.by_key: dict[str, Leading] = {}

    def __getattr__(self, name: str) -> Any:  # failed, maintain, ... of the real store
        return getattr(self.inner, name)

    def open(self) -> Any:
        return self.inner.open()

    def append_enqueue(self, queues: Sequence[str], message: StoredMessage) -> int:
        position = self.inner.append_enqueue(queues, message)
        if self.by_key:
            for key in queues:
                lead = self.by_key.get(key)
                if lead is not None:
                    lead.enqueued(position, message)
        return position

    def append_settle(self, queue: str, positions: Iterable[int]) -> None:
        lead = self.by_key.get(queue)
        if lead is None:
            self.inner.append_settle(queue, positions)
            return
        positions = list(positions)
        self.inner.append_settle(queue, positions)
        lead.settled(positions)

    def append_delivered(self, queue: str, position: int) -> None:
        self.inner.append_delivered(queue, position)
        lead = self.by_key.get(queue)
        if lead is not None:
            lead.delivered([position])

    def delivering(self, queue: str, position: int) -> None:
        self.inner.delivering(queue, position)
        lead = self.by_key.get(queue)
        if lead is not None:
            lead.checked_out(position)

    def append_delivered_many(self, queue: str, positions: Iterable[int]) -> None:
        lead = self.by_key.get(queue)
        if lead is None:
            self.inner.append_delivered_many(queue, positions)
            return
        positions = list(positions)
        self.inner.append_delivered_many(queue, positions)
        lead.delivered(positions)

    def drop_queue(self, queue: str) -> None:
        self.inner.drop_queue(queue)
        lead = self.by_key.get(queue)
        if lead is not None:
            lead.dropped()

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        self.inner.append_definition(kind, key, body)

    def read(self, position: int) -> StoredMessage:
        return self.inner.read(position)

    def commit(self, callback: Any) -> None:
        gate = self.mirrors.gate
        needs = gate.needs_now()
        if not needs and not gate.waiting:
            self.inner.commit(callback)
            return

        def stored(error: BaseException | None) -> None:
            if error is not None:
                callback(error)
            else:
                gate.wait(needs, time.monotonic(), callback)

        self.inner.commit(stored)

    def stats(self) -> dict[str, int]:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


# ---------------------------------------------------------------------- the leader's side
class _Stream:
    """One mirror's replication stream of a queue this node leads."""

    def __init__(self, node: str, rid: int, link: Link, start_seq: int) -> None:
        self.node = node
        self.rid = rid
        self.link = link
        self.start_seq = start_seq
        self.synced = False
        self.closed = False
        self.backlog_sent = 0
        self.task: asyncio.Task[None] | None = None
        self.batches_durable = 0  # the mirror's MBATCHED so far (backlog flow control)
        self.batches = 0  # backlog batches sent (MBATCH)
        self.batch_event = asyncio.Event()
        self.candidates: list[int] = []  # what the queue held at MSTART (it may lack)
        self.started = time.monotonic()
        # what the queue holds that the mirror lacks, in queue order; None until the
        # mirror said what it has (MHAVE)
        self.missing: dict[int, None] | None = None
        self.have = False  # the mirror's MHAVE came
        self.ended = False  # MBACKLOG_END sent: nothing it lacks is left
        self.kept = 0  # messages the mirror already held (an earlier copy)
        self.backlog_bytes = 0  # bytes of MBACKLOG frames sent


class Leading:
    """A mirrored queue this node leads: its live messages, the mirrors' streams, its
    :class:`ReplicaSet` and its mirror record in etcd."""

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
        # sequence number they must acknowledge first (the leader's when they joined)
        self.catching: dict[str, int] = {}
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
        log.info("queue '%s' in vhost '%s': mirror on %s starting (%d messages in the "
                 "queue%s)", name, vhost, node, len(self.live),
                 "; synchronised from the start" if born else "")

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
        if mode == "automatic" and s.missing:
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
        background (the queue keeps serving); how many copies started."""
        return sum(self._start_sync(s) for s in self.streams.values() if not s.synced)

    def cancel_sync(self) -> int:
        """``cancel_sync_queue``: stop the copies running; what was copied stays."""
        n = 0
        for s in self.streams.values():
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
        while missing and not s.closed:
            pos = next(iter(missing))
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

    def got_ack(self, node: str, seq: int) -> None:
        self.rs.ack(node, seq)
        due = self.catching.get(node)
        if due is not None and seq >= due:
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
        if self.rs.seq > s.start_seq:
            # records after the stream's start may have been confirmed while this
            # mirror was out of the set: it is named synchronised (may be promoted)
            # only once it acknowledges them all
            self.catching[node] = self.rs.seq
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
        """Bring the etcd record in line; then what left the synchronised set stops
        counting for confirms."""
        if self.writing or self.deposed:
            return
        self.writing = True
        try:
            while self.dirty and not self.gone:
                self.dirty = False
                rec = self.record()
                leaving = set(self.leaving)
                key = self.mirrors.record_key(self.ident)
                etcd = self.mirrors.etcd
                if self.rev < 0:
                    kv = await etcd.get(key)
                    if kv is not None:
                        try:
                            old = json.loads(kv.value)
                        except ValueError:
                            old = {}
                        if old.get("leader") not in (None, self.mirrors.node):
                            self._deposed(str(old.get("leader")))
                            return
                    self.rev = kv.mod_revision if kv is not None else 0
                if rec != self.written or leaving:
                    result = await etcd.txn([Compare("mod", key, "==", self.rev)],
                                            [Put(key, json.dumps(rec))])
                    if not result.succeeded:
                        self.rev = -1
                        self.dirty = True
                        continue
                    self.rev = result.revision
                    self.written = rec
                for node in leaving:
                    if node in self.leaving and node not in rec["synchronised"]:
                        self.leaving.discard(node)
                        self.rs.leave(node)
                        log.warning("queue '%s' in vhost '%s': mirror on %s left the "
                                    "synchronised set", self.ident[1], self.ident[0], node)
                self.mirrors.gate.release()
        except EtcdError as exc:
            self.dirty = True
            log.warning("queue '%s': mirror record not written to etcd yet: %s",
                        self.ident[1], exc)
        finally:
            self.writing = False

    def _deposed(self, leader: str) -> None:
        log.error("queue '%s' in vhost '%s': the cluster made %s its leader; this node "
                  "stops leading it", self.ident[1], self.ident[0], leader)
        self.deposed = True
        self.mirrors.stop_leading(self, delete_record=False)


# ---------------------------------------------------------------------- the mirror's side
class MirrorCopy:
    """This node's copy of a queue another node leads: the leader's records written to
    this node's store under the queue's key; serves no client until promoted."""

    def __init__(self, store: MessageStore, leader: str, rid: int, vhost: str, name: str,
                 start_seq: int, cmap: CopyMap | None = None) -> None:
        self.store = store
        self.map = cmap  # leader position -> local position on disk (mirror_map)
        self.leader = leader
        self.rid = rid
        self.ident: Ident = (vhost, name)
        self.key = queue_key(vhost, name)
        # leader position -> [local position, size, delivered]
        self.entries: dict[int, list[Any]] = {}
        self.settled_early: set[int] = set()  # settled before their backlog copy came
        self.delivered_early: set[int] = set()
        # a quorum group's checkouts: leader position -> the node whose consumer holds
        # it (amqpd.cluster.quorum_group's MHELD); ..._early: before the backlog copy
        self.holders: dict[int, str] = {}
        self.held_early: dict[int, str] = {}
        self.last_seq = start_seq
        self.backlog_done = False
        self.synced = False  # the backlog is durable here
        # a quorum group's stream: the leader's term (its QTERM; 0: none, mirrored
        # queues), which names the leader's sequence space (quorum_group)
        self.term = 0
        # while a new stream from the same leader rebuilds the copy: the sequence number
        # up to which it held the leader's log of term ``held_term`` completely before
        # (-1: none), which it still holds (restart keeps what it has); a quorum member
        # offers it in an election, so a member that acknowledged a record and then
        # lost its link is not passed over for one that never had the record
        # (quorum_group._election_round). Across a restart of this node it comes from
        # the map's durable mark (mirror_map; Mirrors._adopt)
        self.held_term = 0
        self.held_seq = -1
        self.batch = 0  # the last backlog batch received (MBATCH)
        self.batch_told = 0  # ... and reported durable (MBATCHED)
        self.declined = 0.0  # when it last declined to take over (monotonic)
        self.created = time.monotonic()
        self.election_started = 0.0  # when this copy's current failover began
        self.listed = False  # the catalogue named its leader since it started
        # a copy of ``origin``'s log kept for this leader (origin lost, this leader
        # promoted after it; or this node's own queue before its restart): origin's
        # position -> entry, until the leader says where they are now (MREKEY)
        self.origin = ""
        self.foreign: dict[int, list[Any]] = {}
        self.successor = ""  # the catalogue's new leader whose MSTART it waits for
        self.successor_since = 0.0

    def restart(self, rid: int, start_seq: int) -> None:
        """A new stream from the same leader: what this copy holds is kept (the
        leader drops what was settled meanwhile and sends only what it lacks)."""
        self.rid = rid
        if self.synced:
            self.held_term, self.held_seq = self.term, self.last_seq
        self.last_seq = start_seq
        self.settled_early.clear()
        self.delivered_early.clear()
        self.holders.clear()  # the leader says again who holds what (after MHAVE)
        self.held_early.clear()
        self.backlog_done = False
        self.synced = False
        self.batch = 0
        self.batch_told = 0
        self.declined = 0.0
        if self.map is not None:  # the durable mark still holds: the copy kept it all
            self.map.rewrite(((lp, e[0]) for lp, e in self.entries.items()), self.map.mark)

    def follow(self, leader: str, rid: int, start_seq: int, cmap: CopyMap | None) -> None:
        """Another node leads the queue now (promoted after this copy's leader): what
        this copy holds is kept aside as the old leader's (:meth:`rekey` places it)."""
        if self.entries:
            if self.foreign:  # an older log's, never placed: nobody maps it any more
                self.store.append_settle(self.key, [e[0] for e in self.foreign.values()])
            self.origin = self.leader
            self.foreign = self.entries
        self.entries = {}
        self.leader = leader
        self.successor = ""
        self.forget_map()
        self.map = cmap
        # the old leader's numbers mean nothing to the new one
        self.synced, self.held_term, self.held_seq = False, 0, -1
        self.restart(rid, start_seq)

    def rekey(self, old: list[int], new: list[int]) -> tuple[int, int]:
        """The leader's answer to MHAVE_FROM: the old leader's positions ``old`` are its
        own ``new`` now; the copy keeps those under the new positions (with what the
        live records said of them meanwhile) and drops the rest. (kept, dropped)"""
        foreign, self.foreign = self.foreign, {}
        kept = 0
        for o, n in zip(old, new, strict=True):
            entry = foreign.pop(o, None)
            if entry is None:
                continue
            if n in self.settled_early or n in self.entries:
                self.settled_early.discard(n)
                self.store.append_settle(self.key, [entry[0]])
                continue
            self.entries[n] = entry
            kept += 1
            if self.map is not None:
                self.map.add(n, entry[0])
            if n in self.delivered_early:
                self.deliver([n])
                self.delivered_early.discard(n)
            holder = self.held_early.pop(n, None)
            if holder is not None:
                self.holders[n] = holder
        if foreign:
            self.store.append_settle(self.key, [e[0] for e in foreign.values()])
        self.origin = ""
        return kept, len(foreign)

    def seen(self, seq: int) -> None:
        if seq > self.last_seq:
            self.last_seq = seq

    def enqueue(self, pos: int, delivered: bool, exchange: str, key: str, props: bytes,
                body: bytes, published: int, expires: int, priority: int) -> None:
        if pos in self.settled_early:
            self.settled_early.discard(pos)
            return
        if pos in self.entries:
            return
        local = self.store.append_enqueue([self.key], StoredMessage(
            exchange, key, props, body, published, expires, priority))
        if self.map is not None:
            self.map.add(pos, local)
        if delivered or pos in self.delivered_early:
            self.delivered_early.discard(pos)
            delivered = True
            self.store.append_delivered(self.key, local)
        self.entries[pos] = [local, len(body), delivered]
        holder = self.held_early.pop(pos, None)
        if holder is not None:
            self.holders[pos] = holder

    def settle(self, positions: list[int]) -> None:
        done = []
        for p in positions:
            entry = self.entries.pop(p, None)
            self.holders.pop(p, None)
            if entry is not None:
                done.append(entry[0])
            elif not self.backlog_done:
                self.settled_early.add(p)
        if done:
            self.store.append_settle(self.key, done)

    def deliver(self, positions: list[int]) -> None:
        for p in positions:
            entry = self.entries.get(p)
            if entry is not None:
                if not entry[2]:
                    entry[2] = True
                    self.store.append_delivered(self.key, entry[0])
            elif not self.backlog_done:
                self.delivered_early.add(p)

    def hold(self, node: str, positions: list[int]) -> None:
        """A quorum group's checkout: these messages are delivered, held by a consumer
        on ``node`` (the leader's own name for its local consumers)."""
        self.deliver(positions)
        for p in positions:
            if p in self.entries:
                self.holders[p] = node
            elif not self.backlog_done:
                self.held_early[p] = node

    def backlog_end(self) -> None:
        self.backlog_done = True
        self.settled_early.clear()
        self.delivered_early.clear()
        self.held_early.clear()

    def drop(self) -> None:
        self.entries.clear()
        self.foreign.clear()
        self.store.drop_queue(self.key)
        self.forget_map()

    def forget_map(self) -> None:
        """The copy is no longer a copy (dropped, or promoted: its messages are the
        queue's own now): its map goes."""
        if self.map is not None:
            self.map.remove()
            self.map = None

    def in_order(self) -> list[list[Any]]:
        """The messages in the leader's order (its log positions grow with enqueues)."""
        return [self.entries[p] for p in sorted(self.entries)]


# ---------------------------------------------------------------------- the node's part
class Mirrors:
    """This node's part in mirrored queues: what it leads, what it mirrors, the etcd
    records, the failover (module docstring)."""

    # what failover_kept's etcd check logs: the record it reads, what it found missing
    RECORD = "mirror"
    NO_TAKE_OVER = "no mirror can take over"

    def __init__(self, api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> None:
        self.api = api
        self.broker = api._broker
        self.cluster = cluster
        self.queues = queues
        self.node: str = cluster.node_name
        self.etcd = cluster.etcd
        self.root = cluster.root
        self.gate = CommitGate(cluster.config.mirror_sync_timeout)
        self.store = ReplicatingStore(self.broker.store, self)
        self.leading: dict[Ident, Leading] = {}
        self.by_rid: dict[tuple[str, int], Leading] = {}
        self.next_rid = 0
        self.copies: dict[tuple[str, int], MirrorCopy] = {}  # (leader, rid) -> copy
        self.copy_of: dict[Ident, MirrorCopy] = {}
        self.records: dict[Ident, dict[str, Any]] = {}  # the mirror records, as last read
        self.promoting: dict[Ident, asyncio.Task[None]] = {}
        self.promotions = 0
        self._ack_due: set[MirrorCopy] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._checks: set[asyncio.Task[None]] = set()  # failover_kept's etcd reads

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.broker.store = self.store
        self.queues.extensions.append(self)
        self.queues.failover_expected = self.failover_expected
        self.queues.failover_kept = self.failover_kept
        self.cluster.mirror.queue_listeners.append(self.queue_recorded)
        self._adopt_retired()
        self._tasks = [asyncio.create_task(self._loop(), name="mirrors"),
                       asyncio.create_task(self._read_records(), name="mirror-records")]

    async def stop(self) -> None:
        """A controlled stop (SIGTERM): the records of the queues this node leads say
        so first, so their mirrors apply ``ha-promote-on-shutdown``."""
        with contextlib.suppress(TimeoutError, EtcdError):
            await asyncio.wait_for(self._mark_shutdown(), SHUTDOWN_MARK)
        for task in [*self._tasks, *self.promoting.values(), *self._checks]:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.broker.store is self.store:
            self.broker.store = self.store.inner
        self.gate.fail_all(EtcdError("node stopping"))

    # -- copies kept across a restart of this node -----------------------------------------
    def _new_map(self, ident: Ident, leader: str) -> CopyMap | None:
        if not self.store.on_disk:
            return None
        path = map_path(self.broker.settings.data_dir, queue_key(*ident))
        return CopyMap(path, ident[0], ident[1], leader)

    def _adopt_retired(self) -> None:
        """Queues this node held locally that another node leads (the cluster found
        them at start, remote_queue.ClusterQueues.retire): those that were this node's
        mirror copies become copies again (the leader then sends only what they lack);
        the others are deleted. Only the queues :meth:`adopts`: quorum queues'
        copies are amqpd.cluster.quorum_group's (its own streams and copies), never
        this instance's."""
        retired = self.queues.retired
        for ident, q in list(retired.items()):
            # the cluster's type: the remote queue now in its place says it (a copy
            # recovered without a local definition was recreated as a classic queue)
            vh = self.broker.vhosts.get(ident[0])
            now = vh.queues.get(ident[1]) if vh is not None else None
            if not self.adopts(str(getattr(now, "real_type", q.type_name))):
                continue
            del retired[ident]
            if not self._adopt(ident, q):
                q.delete()

    def adopts(self, type_name: str) -> bool:
        """Whether a retired queue of the cluster's type ``type_name`` is this
        instance's to adopt or delete: every type but quorum queues
        (amqpd.cluster.quorum_group's instance takes those)."""
        return type_name != "quorum"

    def _adopt(self, ident: Ident, q: QueueType) -> bool:
        if not self.store.on_disk or ident in self.copy_of:
            return False
        loaded = CopyMap.load(map_path(self.broker.settings.data_dir, q.store_key))
        if loaded is None:
            return self._adopt_own(ident, q)
        cmap, to_leader = loaded
        leader = self.cluster.catalogue.get(ident)
        if leader is None or leader == self.node or cmap.leader != leader:
            cmap.remove()  # a copy of another leader's log: its positions mean nothing
            return False
        copy = MirrorCopy(self.store.inner, leader, 0, ident[0], ident[1], 0, cmap)
        orphans: list[int] = []
        ready = getattr(q, "ready", None)
        for entry in ready if ready is not None else ():
            local = entry.message.position
            lp = to_leader.get(local)
            if lp is None or lp in copy.entries:
                orphans.append(local)  # its map record was lost: fetched again
                continue
            copy.entries[lp] = [local, entry.message.size, bool(entry.redelivered)]
        q.in_store = False  # the messages stay in the store: they are the copy's now
        q.delete()
        if orphans:
            self.store.inner.append_settle(q.store_key, orphans)
        if cmap.mark is not None:  # it held the leader's log completely up to there
            copy.held_term, copy.held_seq = cmap.mark
        cmap.rewrite(((lp, e[0]) for lp, e in copy.entries.items()), cmap.mark)
        self.copy_of[ident] = copy
        log.info("queue '%s' in vhost '%s': the copy of %s's queue kept across this node's "
                 "restart (%d messages, %d without a map record dropped%s)", ident[1],
                 ident[0], leader, len(copy.entries), len(orphans),
                 f"; complete up to seq {cmap.mark[1]} of term {cmap.mark[0]}"
                 if cmap.mark is not None else "")
        return True

    def _adopt_own(self, ident: Ident, q: QueueType) -> bool:
        """This node led the queue before its restart and another node leads it now
        (promoted after this one was lost): its messages become a copy of this node's
        own log, kept aside until the new leader says which of them it holds and where
        (MHAVE_FROM, MREKEY) -- RabbitMQ throws them away."""
        leader = self.cluster.catalogue.get(ident)
        ready = getattr(q, "ready", None)
        if leader is None or leader == self.node or ready is None:
            return False
        foreign: dict[int, list[Any]] = {}
        for entry in ready:
            pos = entry.message.position
            if pos >= 0:
                foreign[pos] = [pos, entry.message.size, bool(entry.redelivered)]
        if not foreign:
            return False
        cmap = self._new_map(ident, leader)
        if cmap is not None:
            cmap.rewrite(())
        copy = MirrorCopy(self.store.inner, leader, 0, ident[0], ident[1], 0, cmap)
        copy.origin = self.node
        copy.foreign = foreign
        q.in_store = False  # the messages stay in the store: they are the copy's now
        q.delete()
        self.copy_of[ident] = copy
        log.info("queue '%s' in vhost '%s': %d messages this node held as its leader kept "
                 "for %s, which leads it now", ident[1], ident[0], len(foreign), leader)
        return True

    async def _mark_shutdown(self) -> None:
        for lead in list(self.leading.values()):
            lead.deposed = True  # no more writes of the record from here
            if lead.rev <= 0 or lead.gone:
                continue
            rec = {**lead.record(), "shutdown": True}
            key = self.record_key(lead.ident)
            result = await self.etcd.txn([Compare("mod", key, "==", lead.rev)],
                                         [Put(key, json.dumps(rec))])
            if result.succeeded:
                log.info("queue '%s' in vhost '%s': leader stopping (synchronised "
                         "mirrors: %s)", lead.ident[1], lead.ident[0],
                         ", ".join(rec["synchronised"]) or "none")

    def request_sync(self, vhost: str, name: str, action: str) -> bool:
        """``sync_queue`` / ``cancel_sync_queue`` on any node: done here if this node
        leads the queue, else passed to its leader over the link. False: the leader
        cannot be reached."""
        ident = (vhost, name)
        lead = self.leading.get(ident)
        if lead is not None:
            n = lead.sync() if action == "sync" else lead.cancel_sync()
            log.info("queue '%s' in vhost '%s': %s (%d mirror copies)", name, vhost,
                     action, n)
            return True
        leader = self.cluster.catalogue.get(ident)
        link = self.queues.links.link(leader) if leader and leader != self.node else None
        if link is None:
            return False
        link.send(W.encode(M.MSYNCREQ, 0, vhost, name, action))
        return True

    def record_key(self, ident: Ident) -> str:
        return f"{self.root}/mirrors/{_q(ident[0])}/{_q(ident[1])}"

    # -- the reconciliation ---------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self.reconcile()
            except Exception:
                log.exception("mirrors: reconciliation failed")

    def reconcile(self) -> None:
        self._adopt_retired()
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused:
            return
        members = list(cluster.nodes())
        seen: set[Ident] = set()
        for vh in self.broker.vhosts.values():
            for q in list(vh.queues.values()):
                if self._reconcile_queue(vh, q, members):
                    seen.add((vh.name, q.name))
        for ident, lead in list(self.leading.items()):
            if ident not in seen and not lead.gone:
                self.stop_leading(lead, delete_record=False)
        now = time.monotonic()
        for rs, node in self.gate.laggards(now):
            for lead in self.leading.values():
                if lead.rs is rs and node in rs.synchronised and node not in lead.leaving:
                    log.warning("queue '%s' in vhost '%s': mirror on %s has not "
                                "acknowledged within %.1fs", lead.ident[1], lead.ident[0],
                                node, self.gate.timeout)
                    lead.detach(node, drop=True)
                    asyncio.get_running_loop().create_task(lead.write())
        self._watch_leaders(now)

    def _awaits_successor(self, copy: MirrorCopy, leader: str | None, now: float) -> bool:
        """The catalogue names a new leader for ``copy``'s queue: keep the copy (up to
        :data:`SUCCESSOR_WAIT`) until that leader starts its copy here, which then
        keeps what this one holds (MHAVE_FROM, MREKEY)."""
        if leader is None or leader == self.node or not (copy.entries or copy.foreign):
            return False
        if copy.successor != leader:
            copy.successor = leader
            copy.successor_since = now
        return now - copy.successor_since < SUCCESSOR_WAIT

    def _reconcile_queue(self, vh: VHost, q: QueueType, members: list[str]) -> bool:
        """Bring one queue's mirrors in line with its policy: lead it (or stop), start
        and end streams, write the record. False: not a mirrored queue this node leads."""
        if q.remote or not q.durable or q.exclusive or q.type_name != "classic":
            return False
        view = self.cluster
        ident = (vh.name, q.name)
        lead = self.leading.get(ident)
        if lead is not None and lead.q is not q:
            self.stop_leading(lead, delete_record=False)
            lead = None
        current = lead.wanted if lead is not None else []
        wanted = mirror_nodes(q.policy, self.node, members, view.is_running, current)
        if not wanted and lead is None:
            return False
        if lead is None:
            lead = self._lead(vh, q)
        if wanted != lead.wanted:
            lead.wanted = wanted
            lead.dirty = True
        for node in wanted:
            if node not in lead.streams and view.is_running(node):
                link = self.queues.links.link(node)
                if link is not None:
                    lead.attach(node, link)
        for node, s in list(lead.streams.items()):
            if node not in wanted:
                lead.detach(node, drop=True)
            elif not s.have and time.monotonic() - s.started > HAVE_WAIT:
                # no MHAVE: the mirror was not ready for MSTART; start again
                lead.detach(node, drop=False)
        if not wanted and not lead.streams and not lead.rs.synchronised:
            self.stop_leading(lead, delete_record=True)
            return True
        if not lead.dirty and lead.record() != lead.written:
            lead.dirty = True  # e.g. the policy's ha-promote-on-* changed
        if lead.dirty and not lead.writing:
            asyncio.get_running_loop().create_task(lead.write())
        return True

    def queue_recorded(self, vhost: str, name: str) -> None:
        """A durable queue this node leads was declared (the definitions' hook, before
        the declare-ok): under an ``ha-*`` policy its mirrors start now, synchronised
        (it is empty), so its first confirm already waits for them -- not a
        reconciliation later, after confirms that only this node's disk holds."""
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused or (vhost, name) in self.promoting:
            return  # (a promotion records the queue it makes, and leads it itself)
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if vh is None or q is None or (vhost, name) in self.leading:
            return
        try:
            self._reconcile_queue(vh, q, list(cluster.nodes()))
        except Exception:
            log.exception("queue '%s' in vhost '%s': mirrors not started at its declare "
                          "(the next reconciliation starts them)", name, vhost)

    def _watch_leaders(self, now: float) -> None:
        """The copies this node holds: a leader gone from the catalogue ends its copy;
        a leader not running starts the failover."""
        cluster = self.cluster
        for ident, copy in list(self.copy_of.items()):
            leader = cluster.catalogue.get(ident)
            if ident in self.promoting:
                continue
            if leader is None and not copy.listed and now - copy.created < LISTING_WAIT:
                continue  # started with its queue's declare: the definition is on its way
            if leader == self.node and copy.election_started and ident not in self.leading:
                # a take-over of this node's that etcd applied late: a round finishes it
                self.promoting[ident] = asyncio.get_running_loop().create_task(
                    self._promote(ident, copy))
                continue
            if leader != copy.leader:
                if self._awaits_successor(copy, leader, now):
                    continue
                # the queue went, or another node leads it now and never started a
                # copy here: what this one holds is of no use
                self._end_copy(copy)
                continue
            copy.listed = True
            if not cluster.is_running(leader) and now - copy.declined > DECLINED_RETRY:
                self.promoting[ident] = asyncio.get_running_loop().create_task(
                    self._promote(ident, copy))

    def _lead(self, vh: VHost, q: QueueType) -> Leading:
        ready = getattr(q, "ready", None)
        live: dict[int, bool] = {}
        if ready is not None:
            positions = ready.positions() if hasattr(ready, "positions") else [
                e.message.position for e in ready if e.message.position >= 0]
            live = dict.fromkeys(positions, False)
        for pos in self._unacked_positions(q):  # handed to consumers, not yet settled
            live[pos] = True
        lead = Leading(self, vh.name, q, live)
        q.mirrored = True  # transient messages are written (and so mirrored) too
        self.broker.publisher.keeping_queues += 1
        self.leading[lead.ident] = lead
        self.store.by_key[lead.key] = lead
        self.gate.sets.append(lead.rs)
        log.info("queue '%s' in vhost '%s' is mirrored (policy %s)", q.name, vh.name,
                 q.policy_name)
        return lead

    def _unacked_positions(self, q: QueueType) -> list[int]:
        """The log positions of ``q``'s deliveries not yet settled: on this node's
        channels and on the links of consumers on other nodes."""
        out = []
        for proto in list(self.broker.transports):
            session = proto.session
            for ch in list(getattr(session, "channels", {}).values()):
                for u in list(ch.unacked.values()):
                    if u.queue is q and u.entry.message.position >= 0:
                        out.append(u.entry.message.position)
        for streams in self.queues.served.values():
            for served in streams.values():
                if served.queue is q:
                    out += [e.message.position for e in served.unacked.values()
                            if e.message.position >= 0]
        return sorted(out)

    def stop_leading(self, lead: Leading, delete_record: bool) -> None:
        if lead.gone:
            return
        lead.gone = True
        if lead.q.mirrored:
            lead.q.mirrored = False
            self.broker.publisher.keeping_queues -= 1
        for node in list(lead.streams):
            lead.detach(node, drop=True)
        self.leading.pop(lead.ident, None)
        if self.store.by_key.get(lead.key) is lead:
            del self.store.by_key[lead.key]
        # its mirrors' acknowledgements end here: a commit waiting for them must not
        # wait for ever (CommitGate.abandon). Deleted, or no longer mirrored: waived;
        # led elsewhere now (deposed, replaced): what was not acknowledged is nacked
        failed = self.gate.abandon(lead.rs, None if delete_record and not lead.deposed else
                                   NotReplicated(f"queue '{lead.ident[1]}' is no longer "
                                                 "led here; its mirrors' acknowledgements "
                                                 "will not come"))
        if failed:
            log.warning("queue '%s' in vhost '%s': no longer led here; %d commit(s) "
                        "waiting for its mirrors refused (nack)", lead.ident[1],
                        lead.ident[0], failed)
        if delete_record:
            # only the record this node wrote: a successor's stays. A write of ours may
            # still be in flight (lead.rev older than the record, or 0 / -1: none known
            # yet): then the record's value says whether it is still ours. A record
            # left behind would name this node the leader of a queue declared again
            # elsewhere, which would then never lead it.
            key = self.record_key(lead.ident)

            async def delete() -> None:
                with contextlib.suppress(EtcdError):
                    await delete_own(self.etcd, key, lead.rev,
                                     lambda value: self.record_is_ours(lead, value))

            asyncio.get_running_loop().create_task(delete())

    def record_is_ours(self, lead: Leading, value: bytes) -> bool:
        """Whether a record read from etcd is the one ``lead`` (stopped) wrote: it names
        this node the leader and this node has not taken up the queue again since."""
        try:
            rec = json.loads(value)
        except ValueError:
            return False
        return (isinstance(rec, dict) and rec.get("leader") == self.node
                and self.leading.get(lead.ident) in (None, lead))

    async def _read_records(self) -> None:
        prefix = f"{self.root}/mirrors/"
        while True:
            with contextlib.suppress(EtcdError, ValueError):
                _rev, kvs = await self.etcd.range_prefix(prefix)
                records: dict[Ident, dict[str, Any]] = {}
                for kv in kvs:
                    parts = kv.key.decode()[len(prefix):].split("/")
                    if len(parts) == 2:
                        ident = (urllib.parse.unquote(parts[0]), urllib.parse.unquote(parts[1]))
                        records[ident] = json.loads(kv.value)
                self.records = records
            await asyncio.sleep(TICK * 2)

    # -- links ----------------------------------------------------------------------------
    def link_up(self, link: Link) -> None:
        pass  # the next reconciliation starts the mirrors the link's peer should hold

    def link_down(self, link: Link) -> None:
        for lead in list(self.leading.values()):
            s = lead.streams.get(link.peer)
            if s is not None and s.link is link:
                lead.detach(link.peer, drop=False)
                asyncio.get_running_loop().create_task(lead.write())
        # copies of the queues the peer leads are kept: they are what failover promotes

    def owns_stream(self, stream: int) -> bool:
        """Whether a replication stream number is this instance's: quorum queues
        (amqpd.cluster.quorum_group) reuse these frames with numbers from
        :data:`STREAM_SPLIT` on, so the two never take each other's streams."""
        return stream < STREAM_SPLIT

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if not M.is_mirror_frame(kind) or not self.owns_stream(stream):
            return
        peer = link.peer
        if kind in M.TO_LEADER:
            lead = self.by_rid.get((peer, stream))
            if lead is None:
                return
            if kind == M.MACK:
                lead.got_ack(peer, f[0])
                self.gate.release()
            elif kind == M.MBATCHED:
                lead.got_batch(peer, stream, f[0])
            elif kind == M.MHAVE:
                lead.got_have(peer, stream, list(f[0]))
            elif kind == M.MHAVE_FROM:
                lead.got_have_from(peer, stream, list(f[0]), f[1], list(f[2]))
            elif kind == M.MREFUSE:
                log.info("queue '%s' in vhost '%s': %s cannot mirror it yet: %s",
                         lead.ident[1], lead.ident[0], peer, f[0])
                lead.detach(peer, drop=False)  # the next reconciliation tries again
            else:
                lead.got_synced(peer, stream)
                self.gate.release()
                asyncio.get_running_loop().create_task(lead.write())
            return
        if kind == M.MSTART:
            self._start_copy(link, stream, f[0], f[1], f[2])
            return
        if kind == M.MSYNCREQ:
            self.request_sync(f[0], f[1], f[2])
            return
        copy = self.copies.get((peer, stream))
        if copy is None:
            return
        if kind == M.MENQ:
            copy.seen(f[0])
            copy.enqueue(f[1], False, *f[2:])
        elif kind == M.MBACKLOG:
            copy.enqueue(*f)
        elif kind == M.MSETTLE:
            copy.seen(f[0])
            copy.settle(f[1])
        elif kind == M.MDELIV:
            copy.seen(f[0])
            copy.deliver(f[1])
        elif kind == M.MBATCH:
            copy.batch = f[0]
        elif kind == M.MBACKLOG_END:
            copy.backlog_end()
        elif kind == M.MREKEY:
            kept, dropped = copy.rekey(list(f[0]), list(f[1]))
            log.info("queue '%s' in vhost '%s': %d messages of the earlier copy kept for "
                     "%s, %d dropped", copy.ident[1], copy.ident[0], kept, peer, dropped)
        elif kind == M.MDROP:
            self._end_copy(copy)
            return
        self._schedule_ack(copy, link)

    def _start_copy(self, link: Link, rid: int, vhost: str, name: str, seq: int) -> None:
        ident = (vhost, name)
        self._adopt_retired()
        vh = self.broker.vhosts.get(vhost)
        local = vh.queues.get(name) if vh is not None else None
        if local is not None and not local.remote:
            # this node led it before it went down: the cluster's definitions will make
            # it a remote queue in a moment (amqpd.cluster.remote_queue.materialise)
            link.send(W.encode(M.MREFUSE, rid, "it still holds the queue as its leader"))
            return
        listed = self.cluster.catalogue.get(ident)
        if listed is not None and listed != link.peer:
            # a leader deposed meanwhile (woken from a SIGSTOP), or the catalogue here
            # is behind: the sender tries again after its next reconciliation
            link.send(W.encode(M.MREFUSE, rid, f"the catalogue names {listed} its leader"))
            return
        old = self.copy_of.get(ident)
        if old is not None and old.leader == link.peer and ident not in self.promoting:
            # the same leader again (its link came back): keep what the copy holds
            self.copies.pop((old.leader, old.rid), None)
            old.restart(rid, seq)
            copy = old
        elif old is not None:
            # another leader (promoted after the copy's): the copy is kept aside until
            # it says where its messages are (MREKEY); a leader that was not promoted
            # after the copy's leader maps none of them, and they go. (An election of
            # this node still running ends undecided: the record names that leader.)
            self.copies.pop((old.leader, old.rid), None)
            old.follow(link.peer, rid, seq, self._new_map(ident, link.peer))
            copy = old
        else:
            if old is not None:
                self._end_copy(old)
            store = self.store.inner
            store.drop_queue(queue_key(vhost, name))  # what was here is another log's
            copy = MirrorCopy(store, link.peer, rid, vhost, name, seq,
                              self._new_map(ident, link.peer))
            if copy.map is not None:
                copy.map.rewrite(())
        self.copies[(link.peer, rid)] = copy
        self.copy_of[ident] = copy
        if copy.foreign:
            link.send(W.encode(M.MHAVE_FROM, rid, sorted(copy.entries), copy.origin,
                               sorted(copy.foreign)))
        else:
            link.send(W.encode(M.MHAVE, rid, sorted(copy.entries)))
        log.info("queue '%s' in vhost '%s': mirroring it for %s (%d messages held%s)",
                 name, vhost, link.peer, len(copy.entries),
                 f"; {len(copy.foreign)} of {copy.origin}'s" if copy.foreign else "")

    def _end_copy(self, copy: MirrorCopy) -> None:
        self.copies.pop((copy.leader, copy.rid), None)
        if self.copy_of.get(copy.ident) is copy:
            del self.copy_of[copy.ident]
            copy.drop()

    def _schedule_ack(self, copy: MirrorCopy, link: Link) -> None:
        due = self._ack_due
        if not due:
            asyncio.get_running_loop().call_soon(self._send_acks, link)
        due.add(copy)

    def _send_acks(self, _link: Link) -> None:
        due, self._ack_due = self._ack_due, set()
        # (copy, its stream, the seq acknowledged, synchronised by it, the backlog
        # batch, complete up to that seq: the mark may claim it once it is durable)
        marks = []
        for c in due:
            synced_now = c.backlog_done and not c.synced
            if synced_now:
                c.synced = True
            if c.map is not None:
                c.map.flush()
            marks.append((c, c.rid, c.last_seq, synced_now, c.batch, c.synced))

        def durable(error: BaseException | None) -> None:
            if error is not None:
                log.error("mirror copies not durable here: %s", error)
                return
            for c, rid, seq, synced_now, batch, complete in marks:
                link = self.queues.links.link(c.leader)
                if link is None or c.rid != rid or self.copies.get((c.leader, rid)) is not c:
                    continue
                if complete and c.term and c.map is not None:
                    # durable here up to seq, complete: the mark first, then the MACK
                    c.map.add_mark(c.term, seq)
                if c.map is not None and c.map.bloated(len(c.entries)):
                    c.map.rewrite(((lp, e[0]) for lp, e in c.entries.items()), c.map.mark)
                if batch > c.batch_told:
                    c.batch_told = batch
                    link.send(W.encode(M.MBATCHED, c.rid, batch))
                if synced_now:
                    link.send(W.encode(M.MSYNCED, c.rid))
                link.send(W.encode(M.MACK, c.rid, seq))

        self.store.inner.commit(durable)

    # -- failover -------------------------------------------------------------------------
    async def _promote(self, ident: Ident, copy: MirrorCopy) -> None:
        copy.election_started = time.monotonic()
        try:
            for _attempt in range(20):
                if await self._election_round(ident, copy):
                    return
                await asyncio.sleep(0.2)
        except EtcdError as exc:
            log.warning("queue '%s': failover round failed: %s", ident[1], exc)
        finally:
            self.promoting.pop(ident, None)

    async def _election_round(self, ident: Ident, copy: MirrorCopy) -> bool:
        """One round; True when it is decided (promoted here, elsewhere, or not
        possible)."""
        view = self.cluster
        if view.paused:
            return False  # a paused node (minority) never takes a queue over
        key = self.record_key(ident)
        kv = await self.etcd.get(key)
        if kv is None:
            return True
        rec = json.loads(kv.value)
        if rec.get("leader") == self.node and ident not in self.leading:
            return await self._finish_late_take_over(ident, copy, rec, kv.mod_revision)
        if rec.get("leader") != copy.leader or view.is_running(copy.leader):
            return True  # somebody took over, or the leader is back
        synchronised = [str(n) for n in rec.get("synchronised", [])]
        shutdown = bool(rec.get("shutdown"))
        on_failure = str(rec.get("promote_on_failure", "always"))
        on_shutdown = str(rec.get("promote_on_shutdown", "when-synced"))
        unsync_ok = may_promote_unsynchronised(on_failure, on_shutdown, shutdown)
        am_synced = self.node in synchronised and copy.synced
        if not am_synced and not unsync_ok:
            copy.declined = time.monotonic()
            if shutdown:
                log.warning("queue '%s' in vhost '%s': leader %s stopped with no "
                            "synchronised mirror available; this node's mirror is not "
                            "synchronised, so the queue stays down until %s returns "
                            "(ha-promote-on-shutdown %s, ha-promote-on-failure %s)",
                            ident[1], ident[0], copy.leader, copy.leader, on_shutdown,
                            on_failure)
            else:
                log.warning("queue '%s' in vhost '%s': leader %s lost; this node's mirror "
                            "is not synchronised, so it is not promoted "
                            "(ha-promote-on-failure %s)", ident[1], ident[0], copy.leader,
                            on_failure)
            return True
        if not am_synced and copy.leader in self.cluster.records:
            # an unsynchronised copy takes over only once the leader's lease is gone
            # too: late heartbeats of a busy leader must not cost what this copy lacks
            return False
        prefix = f"{self.root}/mirror-candidates/{_q(ident[0])}/{_q(ident[1])}/" \
                 f"{kv.mod_revision}/"
        await self.etcd.put(prefix + self.node, json.dumps(
            {"seq": copy.last_seq, "synced": am_synced}))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ELECTION_WAIT
        candidates: dict[str, int] = {}
        synced_candidates: list[str] = []
        while True:
            for c in await self.etcd.get_prefix(prefix):
                node = c.key.decode()[len(prefix):]
                try:
                    offer = json.loads(c.value)
                    candidates[node] = int(offer["seq"])
                except (ValueError, KeyError, TypeError):
                    continue
                if offer.get("synced") is True and node in synchronised and \
                        node not in synced_candidates:
                    synced_candidates.append(node)
            expected = [n for n in synchronised if view.is_running(n)]
            if not expected and unsync_ok:  # every running mirror may take over
                expected = [str(n) for n in rec.get("mirrors", []) if view.is_running(n)]
            if all(n in candidates for n in expected) or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        # a running synchronised mirror that has not offered itself yet is waited for
        # (SYNCED_WAIT at most: one whose node runs without its copy never offers)
        awaited = synchronised if time.monotonic() - copy.election_started < SYNCED_WAIT \
            else []
        winner = choose_promotion(candidates, synced_candidates, view.is_running, unsync_ok,
                                  awaited=[n for n in awaited if n != self.node])
        if winner is None and unsync_ok:
            log.info("queue '%s' in vhost '%s': leader %s lost; waiting for the "
                     "synchronised mirrors %s to offer themselves (candidates %s)",
                     ident[1], ident[0], copy.leader, synchronised, candidates)
            return False
        log.info("queue '%s' in vhost '%s': leader %s %s; candidates %s (synchronised %s); "
                 "promoting %s", ident[1], ident[0], copy.leader,
                 "stopped" if shutdown else "lost", candidates, synced_candidates, winner)
        if winner == self.node:
            return await self._take_over(ident, copy, rec, kv.mod_revision, prefix)
        end = loop.time() + 5.0
        while loop.time() < end:
            now = await self.etcd.get(key)
            if now is None or json.loads(now.value).get("leader") != copy.leader:
                return True
            await asyncio.sleep(0.1)
        return False  # the chosen one did not take over: another round

    async def _take_over(self, ident: Ident, copy: MirrorCopy, rec: dict[str, Any],
                         rec_rev: int, prefix: str) -> bool:
        vhost, name = ident
        defs = self.cluster.mirror
        defs_key = defs.etcd_key(_KIND_QUEUE, f"{vhost}\x00{name}")
        kv = await self.etcd.get(defs_key)
        if kv is None:
            return True
        item = json.loads(kv.value)
        if item.get("node") != copy.leader:
            return True
        item["node"] = self.node
        mirrors = sorted((set(rec.get("wanted", [])) | {copy.leader}) - {self.node})
        new_rec = {"leader": self.node, "mirrors": [], "synchronised": [],
                   "wanted": mirrors}
        revision = await take_over_txn(
            self.etcd,
            [Compare("mod", defs_key, "==", kv.mod_revision),
             Compare("mod", self.record_key(ident), "==", rec_rev)],
            [Put(defs_key, json.dumps(item, separators=(",", ":"))),
             Put(self.record_key(ident), json.dumps(new_rec))],
            f"queue '{name}' in vhost '{vhost}'")
        if revision is None:
            return False
        self._promote_here(ident, copy, item)
        lead = self.leading.get(ident)
        if lead is not None:
            lead.rev = revision
            lead.written = new_rec
        with contextlib.suppress(EtcdError):
            for c in await self.etcd.get_prefix(prefix):
                await self.etcd.delete(c.key)
        return True

    async def _finish_late_take_over(self, ident: Ident, copy: MirrorCopy,
                                     rec: dict[str, Any], rec_rev: int) -> bool:
        """The record names this node, which does not lead the queue: a take-over of
        this node's that etcd applied after it stopped waiting (amqpd.cluster.
        takeover_txn). Finish it, so the messages this copy holds are served."""
        defs_key = self.cluster.mirror.etcd_key(_KIND_QUEUE, f"{ident[0]}\x00{ident[1]}")
        dkv = await self.etcd.get(defs_key)
        if dkv is None or not names_this_node(rec, dkv.value, self.node):
            return True
        log.warning("queue '%s' in vhost '%s': etcd names this node its leader (a take-over "
                    "applied after its answer was lost); taking it over now", ident[1],
                    ident[0])
        self._promote_here(ident, copy, json.loads(dkv.value))
        lead = self.leading.get(ident)
        if lead is not None:
            lead.rev = rec_rev
            lead.written = rec
        return True

    def _promote_here(self, ident: Ident, copy: MirrorCopy, item: dict[str, Any]) -> None:
        """Turn the copy into the queue, in the remote queue's place."""
        from amqpd.broker.queue import Queue
        from amqpd.cluster.remote_queue import replace_queue

        vhost, name = ident
        vh = self.broker.vhosts[vhost]
        old = vh.queues.get(name)
        self.cluster.catalogue[ident] = self.node
        q = Queue(vh, name, durable=True,
                  auto_delete=bool(old.auto_delete if old is not None
                                   else item.get("auto_delete")),
                  arguments=dict(old.arguments if old is not None
                                 else item.get("arguments") or {}))
        replace_queue(self.queues, vh, old, q)
        self.broker.apply_policies_to(vh, q)
        live: dict[int, bool] = {}
        # Every message comes back redelivered: the lost leader may have handed any of
        # them to a consumer and died before its delivery mark (MDELIV) reached this
        # mirror. (RabbitMQ's promoted mirror requeues every unacknowledged one with
        # redelivered=true; this is a superset, since the mirror cannot tell which were
        # handed out.) A copy of the leader before (not yet placed by this leader's
        # MREKEY: it was lost first) comes after.
        foreign = [(e[0], e[1], True) for _p, e in sorted(copy.foreign.items())]
        marked = 0
        for local, size, delivered in [*copy.in_order(), *foreign]:
            q.restore(LoggedMessage(self.store, local, size), True)
            live[local] = True
            marked += bool(delivered)
        self.copies.pop((copy.leader, copy.rid), None)
        self.copy_of.pop(ident, None)
        copy.forget_map()
        self.broker.definitions_changed(q)  # recorded here (and in etcd: the same)
        lead = self._lead(vh, q)
        lead.live = live
        lead.origin = copy.leader
        lead.origin_map = {lp: e[0] for lp, e in copy.entries.items()}
        self.promotions += 1
        log.warning("queue '%s' in vhost '%s': promoted on %s after the loss of %s "
                    "(%d messages, all marked redelivered; %d known delivered)", name,
                    vhost, self.node, copy.leader, len(live), marked)

    def failover_expected(self, queue: QueueType) -> bool:
        """The link to ``queue``'s leader went (or its kept consumers have waited a
        while): can a mirror take over (its consumers elsewhere are then kept,
        remote_queue.RemoteQueue.detach)?

        Decided on what this node knows now, whichever of the link's end, the view's
        news and the periodic read of the mirror records (every ``2 * TICK``) came
        first: a copy of the lost leader's queue held here (this node takes part in
        the election), else the record as last read, else -- no record read yet --
        the queue's policy (:meth:`failover_kept` then checks etcd's record)."""
        if not self.adopts(str(getattr(queue, "real_type", queue.type_name))):
            return False  # a quorum queue: amqpd.cluster.quorum_group decides
        ident = (queue.vhost.name, queue.name)
        lost = str(getattr(queue, "leader", ""))
        copy = self.copy_of.get(ident)
        if copy is not None and copy.leader == lost and not copy.declined and (
                copy.synced or ha_setting(queue.policy, "ha-promote-on-failure") == "always"):
            return True  # (a copy that declined to take over is no reason: the record)
        rec = self.records.get(ident)
        if rec is None:
            return bool(mirror_nodes(queue.policy, lost, self.cluster.nodes(),
                                     self._up))
        return self.could_take_over(rec, lost)

    def _up(self, node: str) -> bool:
        return node == self.node or self.cluster.is_running(node)

    def could_take_over(self, rec: dict[str, Any] | None, lost: str) -> bool:
        """Whether the mirror record ``rec`` of a queue whose leader ``lost`` is gone
        leaves a mirror that may take over: a synchronised one on a running node, or
        any running one where an unsynchronised mirror may be promoted. A record that
        names another leader already: yes (the catalogue follows). No record: the
        queue has no mirror."""
        if rec is None:
            return False
        if rec.get("leader") != lost:
            return True
        unsync_ok = may_promote_unsynchronised(
            str(rec.get("promote_on_failure", "always")),
            str(rec.get("promote_on_shutdown", "when-synced")), bool(rec.get("shutdown")))
        pool = [str(n) for n in rec.get("synchronised", [])]
        if unsync_ok:
            pool += [str(n) for n in rec.get("mirrors", [])]
        return any(n != lost and self._up(n) for n in pool)

    def failover_kept(self, queue: QueueType) -> None:
        """``queue`` kept its consumers on :meth:`failover_expected`'s word: read the
        queue's record from etcd now, and cancel them if no mirror can take over after
        all (the record read here before was late, or the policy promised mirrors the
        leader never had). Quorum queues are amqpd.cluster.quorum_group's (the same
        check on their group record, with their :meth:`could_take_over`)."""
        if not self.adopts(str(getattr(queue, "real_type", queue.type_name))):
            return
        task = asyncio.get_running_loop().create_task(
            self._check_kept(queue, str(getattr(queue, "leader", ""))))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check_kept(self, queue: Any, lost: str) -> None:
        ident = (queue.vhost.name, queue.name)
        key = self.record_key(ident)
        for _attempt in range(KEPT_CHECK_TRIES):
            try:
                kv = await self.etcd.get(key)
            except EtcdError as exc:
                log.info("queue '%s' in vhost '%s': %s record not read (%s); "
                         "trying again", ident[1], ident[0], self.RECORD, exc)
                await asyncio.sleep(TICK)
                continue
            if queue.link is not None or queue.deleted or queue.leader != lost:
                return  # followed a new leader meanwhile, or the old one is back
            rec = json.loads(kv.value) if kv is not None else None
            if not self.could_take_over(rec, lost):
                log.warning("queue '%s' in vhost '%s': leader %s lost and %s; its "
                            "consumers here are cancelled", ident[1], ident[0], lost,
                            self.NO_TAKE_OVER)
                queue.cancel_kept()
            return
        # etcd out of reach: RemoteQueue._cancel_kept decides after FAILOVER_WAIT

    # -- what the API shows ----------------------------------------------------------------
    def queue_fields(self, vhost: str, name: str) -> dict[str, Any]:
        lead = self.leading.get((vhost, name))
        rec = lead.record() if lead is not None else self.records.get((vhost, name))
        if rec is None:
            return {}
        mirrors = list(rec.get("mirrors", []))
        sync = list(rec.get("synchronised", []))
        return {"mirror_nodes": mirrors, "synchronised_mirror_nodes": sync,
                "slave_nodes": mirrors, "synchronised_slave_nodes": sync,
                "recoverable_slaves": sync}

    def sync_critical(self) -> list[tuple[str, str]]:
        """Mirrored queues that stopping this node would leave without a synchronised
        replica: this node holds the only running synchronised copy (leader or mirror)."""
        out = []
        records = dict(self.records)
        for ident, lead in self.leading.items():
            records[ident] = lead.record()
        for ident, rec in records.items():
            if not rec.get("wanted") and not rec.get("mirrors"):
                continue
            replicas = {str(rec.get("leader")), *map(str, rec.get("synchronised", []))}
            running = [n for n in replicas if n == self.node or self.cluster.is_running(n)]
            if self.node in running and len(running) == 1:
                out.append(ident)
        return sorted(out)


_KIND_QUEUE = 0  # set by start(): the definitions' kind number of a queue
_INSTANCES: dict[int, Mirrors] = {}


def start(api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> Mirrors:
    """Start this node's part in mirrored queues (``serve`` calls it once the cluster
    and its links are up)."""
    global _KIND_QUEUE
    from amqpd.cluster.definitions import KIND_QUEUE

    _KIND_QUEUE = KIND_QUEUE
    mirrors = Mirrors(api, cluster, queues)
    mirrors.start()
    cluster.mirrors = mirrors
    _INSTANCES[id(api)] = mirrors
    return mirrors


__all__ = ["Leading", "MirrorCopy", "Mirrors", "ReplicatingStore", "start"]
