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
  (``QueueType.replicated``, as a quorum queue's ``keeps_every_message``). A queue
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
  revision}/{node}`` = the last sequence number it received, whether it is
  synchronised and whether it ever was): a synchronised one always, an unsynchronised
  one only if the record's ``promote_on_failure`` (or, when the record says the
  leader stopped in a controlled way, ``promote_on_shutdown``) allows it
  (:meth:`~amqpd.cluster.replica_core.MirroredPromotion.from_policy`). Once every
  running synchronised mirror did (or after
  :data:`~amqpd.cluster.election.ELECTION_WAIT`), the choice of
  the replica core's :class:`~amqpd.cluster.replica_core.MirroredPromotion` (most up
  to date, synchronised first, then one that was synchronised before one that never
  was) takes over with
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
  for ``x-cancel-on-ha-failover`` (then basic.cancel; cluster_queues.replace_queue);
  publishers get nacks for what was in flight, then confirms from the new leader.
* **Controlled stop.** :meth:`Mirrors.stop` (SIGTERM) first writes ``"shutdown":
  true`` into the record of every queue this node leads, so their mirrors apply
  ``ha-promote-on-shutdown``.

How quorum queues can reuse this: see :mod:`amqpd.cluster.mirror_state`.

Where the parts live (one job a module): :class:`Mirrors` here (lifecycle, the
reconciliation, what this node leads, the records), with its parts
:mod:`~amqpd.cluster.mirror_adopt` (copies kept across a restart),
:mod:`~amqpd.cluster.mirror_frames` (the link protocol) and
:mod:`~amqpd.cluster.mirror_failover` (promotion, through the election round of
:mod:`~amqpd.cluster.election`); :mod:`~amqpd.cluster.mirror_store` (the store
wrapper), :mod:`~amqpd.cluster.mirror_leading` (the leader's streams and catch-up),
:mod:`~amqpd.cluster.mirror_copy` (a mirror's copy); the sans-IO rules in
:mod:`~amqpd.cluster.mirror_state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import NotReplicated
from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.mirror_adopt import CopyAdoption
from amqpd.cluster.mirror_copy import MirrorCopy
from amqpd.cluster.mirror_failover import MirrorFailover
from amqpd.cluster.mirror_frames import STREAM_SPLIT, MirrorFrames
from amqpd.cluster.mirror_leading import HAVE_WAIT, Leading
from amqpd.cluster.mirror_state import TICK, CommitGate, Ident, key_part, mirror_nodes
from amqpd.cluster.mirror_store import ReplicatingStore
from amqpd.cluster.periodic import cancel_all, every
from amqpd.coord.etcd import Compare, EtcdError, Put, delete_own

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType, VHost
    from amqpd.cluster.cluster_queues import ClusterQueues
    from amqpd.cluster.node import Cluster

log = logging.getLogger("amqpd.cluster.mirror")

# seconds a copy started with its queue's declare waits for the queue's definition
LISTING_WAIT: Final = 10.0
# seconds a copy whose leader was replaced waits for the new leader's MSTART
SUCCESSOR_WAIT: Final = 20.0
DECLINED_RETRY: Final = 5.0  # seconds before a mirror that may not take over looks again
SHUTDOWN_MARK: Final = 2.0  # seconds a stopping leader gives etcd to record its stop


# ---------------------------------------------------------------------- the node's part
class Mirrors(CopyAdoption, MirrorFrames, MirrorFailover):
    """This node's part in mirrored queues: what it leads, what it mirrors, the etcd
    records, the failover (module docstring)."""

    # what failover_kept's etcd check logs: the record it reads, what it found missing
    RECORD = "mirror"
    NO_TAKE_OVER = "no mirror can take over"

    def __init__(self, api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> None:
        super().__init__(api, cluster, queues)
        self.api = api
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
        await cancel_all(self._tasks, no_wait=[*self.promoting.values(), *self._checks])
        if self.broker.store is self.store:
            self.broker.store = self.store.inner
        self.gate.fail_all(EtcdError("node stopping"))

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
        cannot be reached.

        The catalogue decides who leads: a node whose leadership the cluster has just
        handed to another (after a partition heals) may still hold its ``Leading`` for
        a moment, and a request done there would be lost with it (seen in CI: "sync (0
        mirror copies)" on the old leader 3 ms before it stopped leading)."""
        ident = (vhost, name)
        lead = self.leading.get(ident)
        leader = self.cluster.catalogue.get(ident)
        if lead is not None and leader in (None, self.node):
            n = lead.sync() if action == "sync" else lead.cancel_sync()
            log.info("queue '%s' in vhost '%s': %s (%d mirror copies)", name, vhost,
                     action, n)
            return True
        link = self.queues.links.link(leader) if leader and leader != self.node else None
        if link is None:
            return False
        link.send(W.encode(M.MSYNCREQ, 0, vhost, name, action))
        return True

    def record_key(self, ident: Ident) -> str:
        return f"{self.root}/mirrors/{key_part(ident[0])}/{key_part(ident[1])}"

    # -- the reconciliation ---------------------------------------------------------------
    async def _loop(self) -> None:
        await every(TICK, self.reconcile, log, "mirrors: reconciliation")

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
                if lead.rs is rs and node not in lead.leaving and \
                        (node in rs.synchronised or node in rs.pending):
                    log.warning("queue '%s' in vhost '%s': mirror on %s has not "
                                "acknowledged within %.1fs", lead.ident[1], lead.ident[0],
                                node, self.gate.timeout)
                    lead.give_up(node, drop=True, why="silent past mirror_sync_timeout")
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

    def _reconcile_queue(self, vh: VHost, q: QueueType, members: list[str],
                         at_declare: bool = False) -> bool:
        """Bring one queue's mirrors in line with its policy: lead it (or stop), start
        and end streams, write the record. False: not a mirrored queue this node leads.
        ``at_declare``: the queue is being declared; a wanted node that runs but whose
        link is not up yet becomes a birth member (:meth:`Leading.born_without`)."""
        if q.forwards_publish or not q.durable or q.exclusive or q.type_name != "classic":
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
                elif at_declare:
                    lead.born_without(node)
        for node in list(lead.rs.pending):
            if node not in lead.streams and (node not in wanted or not view.is_running(node)):
                lead.give_up(node, drop=False, why="no longer wanted" if node not in wanted
                             else "its node is down")
        for node, s in list(lead.streams.items()):
            if node not in wanted:
                lead.give_up(node, drop=True, why="no longer wanted")
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
        reconciliation later, after confirms that only this node's disk holds. A node
        the policy wants that runs but has no link up yet (this node just woke from a
        stall, the peer still refuses the new link) is counted all the same: its copy
        starts when the link is up, and confirms wait for it (:meth:`Leading.born_without`)."""
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused or (vhost, name) in self.promoting:
            return  # (a promotion records the queue it makes, and leads it itself)
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if vh is None or q is None or (vhost, name) in self.leading:
            return
        try:
            self._reconcile_queue(vh, q, list(cluster.nodes()), at_declare=True)
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
        live = dict.fromkeys(q.ready_positions(), False)
        for pos in self._unacked_positions(q):  # handed to consumers, not yet settled
            live[pos] = True
        lead = Leading(self, vh.name, q, live)
        q.replicated(True)  # transient messages are written (and so mirrored) too
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
            for ch in list(session.channels.values() if session is not None else ()):
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
        lead.q.replicated(False)
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


def start(api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> Mirrors:
    """Start this node's part in mirrored queues (``serve`` calls it once the cluster
    and its links are up)."""
    mirrors = Mirrors(api, cluster, queues)
    mirrors.start()
    cluster.mirrors = mirrors
    return mirrors


# Leading, MirrorCopy, ReplicatingStore and STREAM_SPLIT live in their own modules
# (the module docstring names them) and are named here too, for the callers of old
__all__ = ["HAVE_WAIT", "STREAM_SPLIT", "TICK", "Leading", "MirrorCopy", "Mirrors",
           "ReplicatingStore", "start"]
