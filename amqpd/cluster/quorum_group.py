"""Quorum queues across nodes (issue 16's second half): a replica group with majority
commit, elections with terms, membership edits.

Theory of operation. It reuses the mirrored-queue machinery of
:mod:`amqpd.cluster.mirror` (the store wrapper that ships a queue's records, the copy a
member keeps, the background catch-up, the commit gate) with a group's rules in place
of a policy's:

* **Members at declare.** A durable ``x-queue-type: quorum`` queue is created on the
  declaring node (or where the leader locator put it), which leads it. Its leader
  writes the queue's *group record* to etcd, ``{root}/quorum/{vhost}/{queue}`` =
  ``{"leader", "members", "term", "mirrors", "synchronised", "wanted"}``, created once
  (a transaction on the key's absence): ``x-quorum-initial-group-size`` members
  (:func:`amqpd.cluster.quorum_state.initial_members`) among the cluster's members,
  running or not, its first term above any a queue of that name had before (the etcd
  revision + 1). A member that is down at the declare, or whose link is not up yet,
  is a member all the same: :meth:`GroupLeading.connect` starts its copy once its node
  runs and its link is up, and the copy catches up as a returning member's does
  (below). Every write after is a transaction guarded by the record's last revision,
  so a deposed leader cannot overwrite its successor's record. Every node reads the
  records (``/api/queues`` shows ``leader``, ``members``, ``online``; the
  quorum-critical health check).
* **Majority commit.** The leader replicates the queue's records to every other member
  (frames of :mod:`amqpd.cluster.mirror_wire`, on replication streams numbered from
  :data:`amqpd.cluster.mirror.STREAM_SPLIT`), each stream preceded by :data:`QTERM`
  naming the leader's term. A commit (publisher confirm, tx.commit-ok) answers once the
  records are durable on a majority of the members, the leader's own log included
  (:class:`~amqpd.cluster.mirror_state.ReplicaSet` with ``quorum``); a member counts
  once its copy of the backlog is complete. It always copies what it lacks at once
  (:meth:`GroupLeading.sync_mode`: no ``ha-sync-mode`` here); one that returns (its
  link, or its node restarted: :meth:`QuorumGroups.adopts`) keeps what it holds of the
  same leader's log and gets only the rest (``MHAVE``, :mod:`amqpd.cluster.mirror_map`).
  A commit the majority does not acknowledge within ``cluster.mirror_sync_timeout``
  fails (the publisher gets a nack), and while fewer than a majority of members hold
  a complete, connected copy the leader delivers nothing
  (:attr:`amqpd.broker.quorum.QuorumQueue.group`): it never diverges.
* **Terms.** A member refuses a replication stream whose term is older than the
  newest it knows (from an earlier stream or from the record), so a deposed leader's
  records are refused. A term names one sequence space: a node that takes up a record
  naming it (it restarted; :meth:`QuorumGroups._establish`) writes term + 1 before it
  leads, as its sequence numbers start again.
* **Election.** When the view says the leader's node is not running, every member
  offers itself under ``{root}/quorum-candidates/{vhost}/{queue}/{record revision}/``
  with how far it holds the lost leader's log (of the record's term) completely
  (:func:`election_offer`): a complete copy its last sequence number; a copy being
  rebuilt -- its link came back, or its node restarted -- what it held completely
  before (``MirrorCopy.held_seq``; across a restart the durable mark of its map,
  :mod:`amqpd.cluster.mirror_map`, written before each acknowledgement while complete),
  so a member whose acknowledgement made a record committed can always offer it; -1
  when it has nothing of that term (it votes, never leads). Once the running members
  offered (or after :data:`~amqpd.cluster.mirror.ELECTION_WAIT`)
  :func:`~amqpd.cluster.quorum_state.choose_leader` picks the longest log among a
  majority of the members (no majority: nobody; the queue refuses until nodes return).
  The winner takes over with one etcd transaction on the queue's definition (its
  leader node) and the group record (term + 1), guarded by both revisions: never two
  leaders. Its copy becomes a :class:`~amqpd.broker.quorum.QuorumQueue`.
  Consumers elsewhere are kept (:class:`~amqpd.cluster.remote_queue.RemoteQueue`
  follows the catalogue to the new leader) as RabbitMQ's quorum-queue consumers
  survive a leader change.
* **Checkouts.** Every delivery is recorded with the node whose consumer holds it
  (:data:`MHELD`; :meth:`GroupLeading.checked_out`, the holder named by
  ``remote_queue.Served.delivered``) when the queue chooses it, and the delivery itself
  leaves (on this node's channel, or ``DELIVER`` / ``GET_OK`` on the link) only once a
  majority has acknowledged that record (:mod:`amqpd.cluster.handout`, released by
  :meth:`GroupLeading.got_ack`), so the member elected after the leader's loss knows
  every delivery the lost leader made and whose consumers hold it, as RabbitMQ's Raft
  log does: what it handed out comes back redelivered, what it never did does not.
  What consumers on the
  lost node (or a node not running) held comes back at once: redelivered, counted as
  one return (``x-delivery-count``, ``x-delivery-limit``: :mod:`amqpd.broker.quorum`),
  at the front of the queue in its order. What consumers on running nodes hold stays
  checked out to them (:attr:`GroupLeading.checkouts`) until their node reclaims it by
  the lost leader's positions (``RECLAIM``, :meth:`GroupLeading.reclaim`; the elected
  node's own channels at once, :meth:`QuorumGroups._reclaim_here`) -- from then on they
  are that stream's deliveries, and the client's acks by the old tags settle them --
  or says it holds none of it, goes down, or :data:`CHECKOUT_WAIT` passes: then it
  comes back as the lost node's does.
* **Membership.** ``add_member`` / ``delete_member`` / ``grow`` / ``shrink`` edit the
  record's members in etcd (a transaction); the leader adopts the record's members
  when its revision moved: a new member gets a copy in the background and counts once
  it is complete; a removed one gets ``MDROP`` (its copy goes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.message import LoggedMessage
from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.handout import Handouts
from amqpd.cluster.mirror import (
    ELECTION_WAIT,
    HAVE_WAIT,
    STREAM_SPLIT,
    Leading,
    MirrorCopy,
    Mirrors,
)
from amqpd.cluster.quorum_state import (
    MembershipError,
    NoQuorum,
    add_member,
    choose_leader,
    expire_waiters,
    group_size,
    grow_targets,
    initial_members,
    majority,
    quorum_critical,
    remove_member,
)
from amqpd.cluster.takeover_txn import names_this_node, take_over_txn
from amqpd.coord.etcd import Compare, EtcdError, Put

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.broker.queue_type import QueueType
    from amqpd.broker.vhost import VHost
    from amqpd.cluster.link import Link
    from amqpd.cluster.node import Cluster
    from amqpd.cluster.remote_queue import ClusterQueues, RemoteQueue

log = logging.getLogger("amqpd.cluster.quorum")

QTERM: Final = M.QTERM  # leader -> member: the term of the stream about to start
MHELD: Final = M.MHELD  # leader -> member: seq, holder node, positions checked out
# after an election, what consumers on a running node held stays checked out to them
# until that node names it (RECLAIM), says it holds none of it, goes down, or this long
CHECKOUT_WAIT: Final = 30.0

Ident = tuple[str, str]


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def election_offer(copy: MirrorCopy, term: int) -> int:
    """What a member offers in an election after the leader of ``term`` (the group
    record's) was lost: a complete copy its last sequence number, a copy being rebuilt
    (its link came back, or its node restarted: the map's durable mark,
    :mod:`amqpd.cluster.mirror_map`) what it held completely before
    (:attr:`MirrorCopy.held_seq`); each only of that leader's stream, as a sequence
    number of another term is of another sequence space; else -1 (it votes, never
    leads)."""
    if copy.synced and copy.term == term:
        return copy.last_seq
    if copy.held_term == term:
        return copy.held_seq
    return -1


class GroupLeading(Leading):
    """A quorum queue this node leads: :class:`~amqpd.cluster.mirror.Leading` with the
    group's members, its term, and a majority for commits."""

    def __init__(self, groups: QuorumGroups, vhost: str, q: QueueType,
                 live: dict[int, bool], members: list[str], term: int) -> None:
        super().__init__(groups, vhost, q, live)
        self.groups = groups
        self.term = term
        # deliveries waiting for their checkout's commit (amqpd.cluster.handout)
        self.handouts = Handouts(self.rs, lambda: q.vhost.schedule_dispatch(q))
        self.members: list[str] = []
        self.set_members(members)
        self.was_serving = False
        self.fenced = False  # deposed: refuses and holds until the queue is replaced
        # the node whose consumer the delivery being recorded goes to ("": this node's;
        # remote_queue.Served.delivered sets it around the queue's ``delivered``)
        self.holder = ""
        self.holders: dict[int, str] = {}  # position -> node holding it checked out
        # after an election: node -> {lost leader's position: the queue's delivery}
        # kept checked out for that node's consumers until it reclaims them
        self.checkouts: dict[str, dict[int, Any]] = {}
        self.checkouts_from = ""  # the lost leader those positions are of
        self.checkouts_until = 0.0  # monotonic: returned then at the latest

    def set_members(self, members: list[str]) -> None:
        self.members = list(members)
        self.rs.quorum = majority(len(self.members))
        self.wanted = sorted(m for m in self.members if m != self.groups.node)
        for node in list(self.streams):
            if node not in self.wanted:
                self.detach(node, drop=True)
        for node in list(self.rs.synchronised):
            if node not in self.wanted:
                self.rs.leave(node)
        self.dirty = True
        self.handouts.release()  # a smaller majority may hold what waits already

    # -- checkouts --------------------------------------------------------------------------
    def after_commit(self, action: Any) -> None:
        """Run ``action`` (a delivery to another node: remote_queue.Served.hand) once
        every record so far -- the checkout just recorded among them -- is committed.
        Deliveries to this node's channels wait in :attr:`handouts` (QuorumQueue's
        dispatch and basic.get hand them there)."""
        self.handouts.outbox.after_commit(action)

    def got_ack(self, node: str, seq: int) -> None:
        super().got_ack(node, seq)
        self.handouts.release()

    def got_synced(self, node: str, rid: int) -> None:
        super().got_synced(node, rid)
        self.handouts.release()

    def checked_out(self, position: int) -> None:
        """A delivery (ReplicatingStore.delivering): delivered, and held by a consumer
        on ``holder``'s node, told to the members in one record (MHELD), so the member
        elected after this node's loss knows whose consumers hold what."""
        live = self.live
        if position not in live:
            return
        live[position] = True
        holder = self.holder or self.groups.node
        self.holders[position] = holder
        seq = self.rs.next_seq()
        if self.streams:
            self._send(lambda rid: W.encode(MHELD, rid, seq, holder, [position]))

    def settled(self, positions: list[int]) -> None:
        super().settled(positions)
        holders = self.holders
        if holders:
            for p in positions:
                holders.pop(p, None)

    def got_have(self, node: str, rid: int, positions: list[int]) -> None:
        """As :meth:`Leading.got_have`, then who holds what: the member's copy learns
        it for what it kept and for what the backlog brings."""
        s = self.streams.get(node)
        fresh = s is not None and s.rid == rid and not s.have
        super().got_have(node, rid, positions)
        if not fresh or s is None or s.closed:
            return
        by_node: dict[str, list[int]] = {}
        for p, holder in self.holders.items():
            by_node.setdefault(holder, []).append(p)
        for holder, held in by_node.items():
            s.link.send(W.encode(MHELD, rid, s.start_seq, holder, held))

    def reclaim(self, node: str, origin: str, positions: list[int]) -> dict[int, Any]:
        """``node``'s RECLAIM (remote_queue.Served.reclaim): of what this group kept
        checked out for its consumers since the election, the messages it names by
        ``origin``'s (the lost leader's) positions are handed back (position ->
        delivery); the rest it no longer holds: returned to the queue. A RECLAIM of
        another leader's positions hands nothing back (another may follow)."""
        pending = self.checkouts.get(node)
        if pending is None:
            return {}
        got: dict[int, Any] = {}
        if origin == self.checkouts_from:
            got = {p: pending.pop(p) for p in positions if p in pending}
        elif origin:
            return {}
        del self.checkouts[node]
        self.give_back(node, list(pending.values()), "not held there any more")
        log.info("queue '%s' in vhost '%s': %d deliveries held on %s since the election "
                 "handed back to it", self.ident[1], self.ident[0], len(got), node)
        return got

    def give_back(self, node: str, entries: list[Any], why: str) -> None:
        """Checkouts kept for ``node`` come back to the queue (front, redelivered,
        counted once more: QuorumQueue.return_checked_out)."""
        if not entries or self.q.deleted:
            return
        log.info("queue '%s' in vhost '%s': %d deliveries held on %s returned (%s)",
                 self.ident[1], self.ident[0], len(entries), node, why)
        self.q.return_checked_out(entries)  # type: ignore[attr-defined]

    def expire_checkouts(self, now: float) -> None:
        """Checkouts kept for a node that went down, or kept longer than
        :data:`CHECKOUT_WAIT`, come back to the queue."""
        groups = self.groups
        for node in list(self.checkouts):
            if node != groups.node and not groups.cluster.is_running(node):
                self.give_back(node, list(self.checkouts.pop(node).values()),
                               "its node is down")
            elif now >= self.checkouts_until:
                self.give_back(node, list(self.checkouts.pop(node).values()),
                               f"not reclaimed within {CHECKOUT_WAIT:g} s")

    def fence(self) -> None:
        """The cluster elected another leader while this node still holds the queue:
        until the definitions replace it with the remote queue, it delivers nothing and
        every commit after a record of it fails (nack): never two leaders accepting
        publishes. The records stay with the commit gate, which a majority that can
        never answer (one more than the members) makes unsatisfiable."""
        self.fenced = True
        for node in list(self.streams):
            self.detach(node, drop=False)
        self.rs.synchronised.clear()
        self.rs.quorum = len(self.members) + 1

    def attach(self, node: str, link: Link) -> None:
        # a new copy is incomplete until its backlog is: it stops counting for commits
        # at once (stricter, so no etcd write needs to come first as for mirrors)
        self.rs.leave(node)
        self.leaving.discard(node)
        link.send(W.encode(QTERM, self.mirrors.next_rid + 1, self.term))
        super().attach(node, link)

    def connect(self) -> None:
        """Streams to the running members that have none; a stream whose member never
        answered ``MSTART`` (``MHAVE``: it was not ready) starts again."""
        groups = self.groups
        for node in self.wanted:
            if node not in self.streams and groups.cluster.is_running(node):
                link = groups.queues.links.link(node)
                if link is not None:
                    self.attach(node, link)
        for node, s in list(self.streams.items()):
            if not s.have and time.monotonic() - s.started > HAVE_WAIT:
                self.detach(node, drop=False)

    def detach(self, node: str, drop: bool) -> None:
        if node in self.rs.synchronised:
            log.warning("queue '%s' in vhost '%s': member %s's copy is not counted until "
                        "it is complete again", self.ident[1], self.ident[0], node)
        super().detach(node, drop)
        self.rs.leave(node)
        self.leaving.discard(node)

    def serving(self) -> bool:
        """A majority of the members (the leader included) hold a complete copy on a
        live stream: only then does the leader deliver."""
        if self.fenced:
            return False
        complete = sum(1 for s in self.streams.values() if s.synced and not s.closed)
        return 1 + complete >= majority(len(self.members))

    def sync_mode(self) -> str:
        """A member always copies what it lacks at once: quorum queues have no
        ``ha-sync-mode`` (a ``manual`` copy would leave a returning member out of the
        majority until everything it lacks was consumed)."""
        return "automatic"

    def record(self) -> dict[str, Any]:
        rec = super().record()
        rec["members"] = list(self.members)
        rec["term"] = self.term
        # the ha-promote-* keys are mirrored queues' policy: elections follow the term
        # rules (quorum_state.choose_leader) whatever a policy says
        rec.pop("promote_on_failure", None)
        rec.pop("promote_on_shutdown", None)
        return rec

    async def write(self) -> None:
        """As :meth:`Leading.write`, except that a record changed by a membership edit
        (this node still its leader, a newer revision) is adopted first: its members
        replace ours, then ours is written; and no member waits in ``leaving`` (a copy
        stops counting for commits as soon as its stream ends: :meth:`detach`)."""
        if self.writing or self.deposed:
            return
        self.writing = True
        groups = self.groups
        try:
            while self.dirty and not self.gone:
                self.dirty = False
                key = groups.record_key(self.ident)
                etcd = groups.etcd
                if self.rev < 0:
                    kv = await etcd.get(key)
                    if kv is not None:
                        try:
                            old = json.loads(kv.value)
                        except ValueError:
                            old = {}
                        if old.get("leader") not in (None, groups.node):
                            self._deposed(str(old.get("leader")))
                            return
                        members = [str(m) for m in old.get("members") or []]
                        if members and members != self.members:
                            log.info("queue '%s' in vhost '%s': members now %s",
                                     self.ident[1], self.ident[0], members)
                            self.set_members(members)
                    self.rev = kv.mod_revision if kv is not None else 0
                rec = self.record()
                if rec != self.written:
                    result = await etcd.txn([Compare("mod", key, "==", self.rev)],
                                            [Put(key, json.dumps(rec))])
                    if not result.succeeded:
                        self.rev = -1
                        self.dirty = True
                        continue
                    self.rev = result.revision
                    self.written = rec
                groups.gate.release()
        except EtcdError as exc:
            self.dirty = True
            log.warning("queue '%s': group record not written to etcd yet: %s",
                        self.ident[1], exc)
        finally:
            self.writing = False


class QuorumGroups(Mirrors):
    """This node's part in quorum queues' replica groups (module docstring)."""

    RECORD = "group"
    NO_TAKE_OVER = "no majority of its members can elect a new one"

    def __init__(self, api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> None:
        super().__init__(api, cluster, queues)
        self.next_rid = STREAM_SPLIT
        self.stream_terms: dict[tuple[str, int], int] = {}  # (leader, rid) -> its QTERM
        self.known_terms: dict[Ident, int] = {}  # the newest term seen per queue
        self.revisions: dict[Ident, int] = {}  # the records' mod revisions, as last read
        self.establishing: set[Ident] = set()
        # copies (leader, rid) whose member offered itself in an election: they take no
        # more records from that leader (a vote ends its term here, as in Raft)
        self.frozen: set[tuple[str, int]] = set()
        self.elections = 0
        self._spawned: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.broker.store = self.store
        self.queues.extensions.append(self)
        previous = self.queues.failover_expected

        def expected(queue: RemoteQueue) -> bool:
            return self.failover_expected(queue) or previous(queue)

        self.queues.failover_expected = expected
        previous_kept = self.queues.failover_kept

        def kept(queue: RemoteQueue) -> None:  # each acts on its own queue type only
            self.failover_kept(queue)
            previous_kept(queue)

        self.queues.failover_kept = kept
        self._adopt_retired()
        self._tasks = [asyncio.create_task(self._loop(), name="quorum-groups"),
                       asyncio.create_task(self._read_records(), name="quorum-records")]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def record_key(self, ident: Ident) -> str:
        return f"{self.root}/quorum/{_q(ident[0])}/{_q(ident[1])}"

    def adopts(self, type_name: str) -> bool:
        """A member's copy kept across its node's restart (ClusterQueues.retire) is
        taken up again only by this instance: its map holds the leader's positions,
        which the leader reconciles at ``MSTART`` (``MHAVE``) whatever the term."""
        return type_name == "quorum"

    async def _mark_shutdown(self) -> None:
        """Nothing to mark: ``ha-promote-on-shutdown`` is mirrored queues' only; a
        group elects by its term rules however its leader stopped."""

    def owns_stream(self, stream: int) -> bool:
        return stream >= STREAM_SPLIT

    async def _read_records(self) -> None:
        prefix = f"{self.root}/quorum/"
        while True:
            with contextlib.suppress(EtcdError, ValueError):
                _rev, kvs = await self.etcd.range_prefix(prefix)
                records: dict[Ident, dict[str, Any]] = {}
                revisions: dict[Ident, int] = {}
                for kv in kvs:
                    parts = kv.key.decode()[len(prefix):].split("/")
                    if len(parts) == 2:
                        ident = (urllib.parse.unquote(parts[0]),
                                 urllib.parse.unquote(parts[1]))
                        rec = json.loads(kv.value)
                        records[ident] = rec
                        revisions[ident] = kv.mod_revision
                        term = int(rec.get("term", 0))
                        if term > self.known_terms.get(ident, 0):
                            self.known_terms[ident] = term
                self.records = records
                self.revisions = revisions
            await asyncio.sleep(0.5)

    # -- the reconciliation ---------------------------------------------------------------
    def reconcile(self) -> None:
        self._adopt_retired()
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused:
            return
        view = cluster
        loop = asyncio.get_running_loop()
        seen: set[Ident] = set()
        for vh in self.broker.vhosts.values():
            for q in list(vh.queues.values()):
                if q.remote or not q.durable or q.type_name != "quorum":
                    continue
                ident = (vh.name, q.name)
                seen.add(ident)
                lead = self.leading.get(ident)
                if lead is not None and lead.q is not q:
                    self.stop_leading(lead, delete_record=False)
                    lead = None
                if lead is None:
                    if ident not in self.establishing:
                        self.establishing.add(ident)
                        self._spawn(self._establish(vh, q))
                    continue
                assert isinstance(lead, GroupLeading)
                if lead.fenced:
                    continue
                if lead.checkouts:
                    lead.expire_checkouts(time.monotonic())
                lead.handouts.release()
                rev = self.revisions.get(ident)
                if rev is not None and lead.rev > 0 and rev > lead.rev and \
                        self.records.get(ident, {}).get("leader") == self.node:
                    lead.rev = -1  # edited (membership): write() adopts it
                    lead.dirty = True
                lead.connect()
                if lead.dirty and not lead.writing:
                    self._spawn(lead.write())
                serving = lead.serving()
                if serving != lead.was_serving:
                    lead.was_serving = serving
                    if serving:
                        log.info("queue '%s' in vhost '%s': a majority of %s holds it; "
                                 "serving", q.name, vh.name, lead.members)
                        vh.schedule_dispatch(q)
                    else:
                        log.warning("queue '%s' in vhost '%s': fewer than a majority of "
                                    "%s hold it; publishes are refused and nothing is "
                                    "delivered until they do", q.name, vh.name,
                                    lead.members)
        for ident, lead in list(self.leading.items()):
            if ident not in seen and not lead.gone:
                self.stop_leading(lead, delete_record=False)
        expired = expire_waiters(self.gate, time.monotonic(), NoQuorum(
            "a majority of the quorum queue's members did not acknowledge in time"))
        if expired:
            log.warning("%d commits not acknowledged by a majority within %.1fs: "
                        "refused (nack)", expired, self.gate.timeout)
        for ident, copy in list(self.copy_of.items()):
            leader = cluster.catalogue.get(ident)
            if ident in self.promoting:
                continue
            if leader == self.node and copy.election_started and ident not in self.leading:
                # a take-over of this node's that etcd applied late: a round finishes it
                self.promoting[ident] = loop.create_task(self._promote(ident, copy))
                continue
            if leader != copy.leader:
                self._end_copy(copy)
                continue
            if not view.is_running(leader):
                self.promoting[ident] = loop.create_task(self._promote(ident, copy))
            elif (copy.leader, copy.rid) in self.frozen:
                self._thaw(copy)

    def _thaw(self, copy: MirrorCopy) -> None:
        """The leader this copy voted against is back and still leads: the copy missed
        its records since the vote, so it ends, and the leader is told to copy again."""
        self.frozen.discard((copy.leader, copy.rid))
        self._end_copy(copy)
        link = self.queues.links.link(copy.leader)
        if link is not None:
            link.send(W.encode(M.MREFUSE, copy.rid, "an election was held: copy again"))
        log.info("queue '%s' in vhost '%s': leader %s is back; its copy starts again",
                 copy.ident[1], copy.ident[0], copy.leader)

    def _end_copy(self, copy: MirrorCopy) -> None:
        self.frozen.discard((copy.leader, copy.rid))
        super()._end_copy(copy)

    async def _establish(self, vh: VHost, q: QueueType) -> None:
        """Lead a quorum queue this node holds: create its group record (a new queue) or
        take up the one that names this node (a restart)."""
        ident = (vh.name, q.name)
        try:
            key = self.record_key(ident)
            revision, kvs = await self.etcd.range_prefix(key)
            kv = next((k for k in kvs if k.key.decode() == key), None)
            rec: dict[str, Any]
            if kv is None:
                # among the cluster's members, running or not: one that is down (or
                # whose link is not up yet) now is a member all the same, and
                # GroupLeading.connect starts its copy once it is back
                view = self.cluster
                members = initial_members(self.node, group_size(q.arguments),
                                          view.members | {self.node}, view.is_running)
                # the first term is above every term a queue of this name had before
                # (each of its elections was an etcd write, so its term is at most the
                # revision now): members that remember those refuse nothing new
                rec = {"leader": self.node, "members": members, "term": revision + 1,
                       "mirrors": [], "synchronised": [], "wanted": members[1:]}
                result = await self.etcd.txn([Compare("create", key, "==", 0)],
                                             [Put(key, json.dumps(rec))])
                if not result.succeeded:
                    return  # the next reconciliation reads it
                rev = result.revision
                log.info("quorum queue '%s' in vhost '%s': members %s", q.name, vh.name,
                         members)
            else:
                rec = json.loads(kv.value)
                if rec.get("leader") != self.node:
                    log.warning("quorum queue '%s' in vhost '%s' is here but the group "
                                "record names %s its leader: not leading it", q.name,
                                vh.name, rec.get("leader"))
                    return
                # leading it again (this node restarted): a new term, as its sequence
                # numbers start again, so no member's mark or offer of the last term
                # (MirrorCopy.held_seq) is read as a number of this one
                rec = {**rec, "term": int(rec.get("term", 1)) + 1}
                result = await self.etcd.txn([Compare("mod", key, "==", kv.mod_revision)],
                                             [Put(key, json.dumps(rec))])
                if not result.succeeded:
                    return  # the next reconciliation reads it again
                rev = result.revision
            if vh.queues.get(q.name) is not q or ident in self.leading:
                return
            lead = self._lead_group(vh, q, [str(m) for m in rec["members"]],
                                    int(rec.get("term", 1)), None)
            lead.rev = rev
            lead.written = rec
        except (EtcdError, ValueError, KeyError) as exc:
            log.warning("quorum queue '%s': group record not read yet: %s", q.name, exc)
        finally:
            self.establishing.discard(ident)

    def _lead_group(self, vh: VHost, q: QueueType, members: list[str], term: int,
                    live: dict[int, bool] | None) -> GroupLeading:
        if live is None:
            live = {}
            ready = getattr(q, "ready", None)
            if ready is not None:
                positions = ready.positions() if hasattr(ready, "positions") else [
                    e.message.position for e in ready if e.message.position >= 0]
                live = dict.fromkeys(positions, False)
        lead = GroupLeading(self, vh.name, q, live, members, term)
        self.leading[lead.ident] = lead
        self.store.by_key[lead.key] = lead
        self.gate.sets.append(lead.rs)
        self.known_terms[lead.ident] = max(term, self.known_terms.get(lead.ident, 0))
        q.group = lead  # type: ignore[attr-defined]
        log.info("quorum queue '%s' in vhost '%s': leading it (term %d, members %s)",
                 q.name, vh.name, term, members)
        return lead

    def stop_leading(self, lead: Leading, delete_record: bool) -> None:
        vh = self.broker.vhosts.get(lead.ident[0])
        if isinstance(lead, GroupLeading) and lead.deposed and not lead.gone and \
                vh is not None and vh.queues.get(lead.q.name) is lead.q:
            lead.fence()  # stopped for real once the queue is replaced (reconcile)
            return
        if isinstance(lead, GroupLeading) and not lead.gone:
            dropped = lead.handouts.drop()
            if dropped:
                log.warning("queue '%s' in vhost '%s': no longer led here; %d deliveries "
                            "waiting for their checkout's commit not sent", lead.ident[1],
                            lead.ident[0], dropped)
        if getattr(lead.q, "group", None) is lead:
            lead.q.group = None  # type: ignore[attr-defined]
        super().stop_leading(lead, delete_record)

    def record_is_ours(self, lead: Leading, value: bytes) -> bool:
        """A group record is ours only in the term this node led it (a record of a later
        term names this node again only if it was elected again)."""
        if not super().record_is_ours(lead, value) or not isinstance(lead, GroupLeading):
            return False
        try:
            return int(json.loads(value).get("term", 0)) == lead.term
        except (ValueError, TypeError):
            return False

    # -- links ----------------------------------------------------------------------------
    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if kind == QTERM:
            self.stream_terms[(link.peer, stream)] = f[0]
            return
        if kind == MHELD:
            copy = self.copies.get((link.peer, stream))
            if copy is None or (link.peer, stream) in self.frozen:
                return
            copy.seen(f[0])
            copy.hold(f[1], f[2])
            self._schedule_ack(copy, link)
            return
        if not M.is_mirror_frame(kind) or not self.owns_stream(stream):
            return
        if kind == M.MSTART:
            term = self.stream_terms.pop((link.peer, stream), 0)
            ident = (f[0], f[1])
            known = self.known_terms.get(ident, 0)
            if term < known:
                log.warning("queue '%s' in vhost '%s': %s replicates it with term %d, "
                            "older than term %d: refused", f[1], f[0], link.peer, term,
                            known)
                link.send(W.encode(M.MREFUSE, stream, f"term {term} is older than {known}"))
                return
            self.known_terms[ident] = term
            super().frame(link, kind, stream, f)
            copy = self.copies.get((link.peer, stream))
            if copy is not None:
                copy.term = term  # names the leader's sequence space (its marks)
            return
        if kind in M.TO_MIRROR and (link.peer, stream) in self.frozen:
            return  # voted in an election: the old leader's records are refused
        super().frame(link, kind, stream, f)

    # -- the election ---------------------------------------------------------------------
    async def _election_round(self, ident: Ident, copy: MirrorCopy) -> bool:
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
        members = [str(m) for m in rec.get("members", [])]
        if self.node not in members:
            return True
        prefix = f"{self.root}/quorum-candidates/{_q(ident[0])}/{_q(ident[1])}/" \
                 f"{kv.mod_revision}/"
        offer = election_offer(copy, int(rec.get("term", 0)))
        self.frozen.add((copy.leader, copy.rid))
        await self.etcd.put(prefix + self.node, str(offer))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ELECTION_WAIT
        offers: dict[str, int] = {}
        while True:
            for c in await self.etcd.get_prefix(prefix):
                offers[c.key.decode()[len(prefix):]] = int(c.value or b"-1")
            expected = [n for n in members if n != copy.leader and view.is_running(n)]
            if all(n in offers for n in expected) or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        winner = choose_leader(offers, members)
        if winner is None:
            log.warning("queue '%s' in vhost '%s': leader %s lost and no majority of %s "
                        "can elect another (offers %s): the queue waits for members to "
                        "return", ident[1], ident[0], copy.leader, members, offers)
            await asyncio.sleep(1.0)
            return False
        log.info("queue '%s' in vhost '%s': leader %s lost; offers %s; electing %s",
                 ident[1], ident[0], copy.leader, offers, winner)
        if winner == self.node:
            return await self._take_over_group(ident, copy, rec, kv.mod_revision, prefix)
        end = loop.time() + 5.0
        while loop.time() < end:
            now = await self.etcd.get(key)
            if now is None or json.loads(now.value).get("leader") != copy.leader:
                return True
            await asyncio.sleep(0.1)
        return False

    async def _take_over_group(self, ident: Ident, copy: MirrorCopy, rec: dict[str, Any],
                               rec_rev: int, prefix: str) -> bool:
        from amqpd.cluster.definitions import KIND_QUEUE

        vhost, name = ident
        defs_key = self.cluster.mirror.etcd_key(KIND_QUEUE, f"{vhost}\x00{name}")
        kv = await self.etcd.get(defs_key)
        if kv is None:
            return True
        item = json.loads(kv.value)
        if item.get("node") != copy.leader:
            return True
        item["node"] = self.node
        members = [str(m) for m in rec.get("members", [])]
        term = int(rec.get("term", 1)) + 1
        new_rec = {"leader": self.node, "members": members, "term": term, "mirrors": [],
                   "synchronised": [], "wanted": sorted(m for m in members
                                                        if m != self.node)}
        revision = await take_over_txn(
            self.etcd,
            [Compare("mod", defs_key, "==", kv.mod_revision),
             Compare("mod", self.record_key(ident), "==", rec_rev)],
            [Put(defs_key, json.dumps(item, separators=(",", ":"))),
             Put(self.record_key(ident), json.dumps(new_rec))],
            f"queue '{name}' in vhost '{vhost}'")
        if revision is None:
            return False
        self.known_terms[ident] = term
        lead = self._promote_group(ident, copy, item, members, term)
        lead.rev = revision
        lead.written = new_rec
        self.elections += 1
        with contextlib.suppress(EtcdError):
            for c in await self.etcd.get_prefix(prefix):
                await self.etcd.delete(c.key)
        return True

    async def _finish_late_take_over(self, ident: Ident, copy: MirrorCopy,
                                     rec: dict[str, Any], rec_rev: int) -> bool:
        """As the mirrors' (a take-over etcd applied after this node stopped waiting
        for its answer), for the group: lead it at the record's term."""
        from amqpd.cluster.definitions import KIND_QUEUE

        defs_key = self.cluster.mirror.etcd_key(KIND_QUEUE, f"{ident[0]}\x00{ident[1]}")
        dkv = await self.etcd.get(defs_key)
        if dkv is None or not names_this_node(rec, dkv.value, self.node):
            return True
        log.warning("queue '%s' in vhost '%s': etcd names this node its leader (a take-over "
                    "applied after its answer was lost); taking it over now", ident[1],
                    ident[0])
        term = int(rec.get("term", 1))
        self.known_terms[ident] = term
        lead = self._promote_group(ident, copy, json.loads(dkv.value),
                                   [str(m) for m in rec.get("members", [])], term)
        lead.rev = rec_rev
        lead.written = rec
        self.elections += 1
        return True

    def _promote_group(self, ident: Ident, copy: MirrorCopy, item: dict[str, Any],
                       members: list[str], term: int) -> GroupLeading:
        """Turn the copy into the quorum queue, in the remote queue's place.

        What the lost leader had handed out (MHELD: whose consumers hold it) is, in the
        leader's order, at the front: what consumers on the lost node, or on a node not
        running, held is returned at once (redelivered, counted once more:
        broker/quorum.py's rules); what consumers on running nodes hold stays checked
        out to them (:meth:`GroupLeading.reclaim`; this node's own at once,
        :meth:`_reclaim_here`), returned to its place if they do not take it back.
        Then the messages not held, in order (redelivered if they had been before)."""
        from amqpd.broker.quorum import QuorumQueue
        from amqpd.cluster.remote_queue import replace_queue

        vhost, name = ident
        vh = self.broker.vhosts[vhost]
        old = vh.queues.get(name)
        self.cluster.catalogue[ident] = self.node
        q = QuorumQueue(vh, name, durable=True, auto_delete=False,
                        arguments=dict(old.arguments if old is not None
                                       else item.get("arguments") or {}))
        replace_queue(self.queues, vh, old, q)
        self.broker.apply_policies_to(vh, q)
        live: dict[int, bool] = {}
        held: list[tuple[int, int, int, str]] = []  # leader position, local, size, holder
        ready: list[tuple[int, int, bool]] = []
        for lp in sorted(copy.entries):
            local, size, delivered = copy.entries[lp]
            live[local] = bool(delivered)
            holder = copy.holders.get(lp) if delivered else None
            if holder is None:
                ready.append((local, size, bool(delivered)))
            else:
                held.append((lp, local, size, holder))
        self.copies.pop((copy.leader, copy.rid), None)
        self.copy_of.pop(ident, None)
        self.frozen.discard((copy.leader, copy.rid))
        copy.forget_map()  # its messages are the queue's own now
        self.broker.definitions_changed(q)
        lead = self._lead_group(vh, q, members, term, live)
        returned: list[Any] = []
        kept: dict[str, dict[int, Any]] = {}
        for lp, local, size, holder in held:  # their places: ahead of the rest
            entry = q.checked_out_entry(LoggedMessage(self.store, local, size))
            if holder != copy.leader and (holder == self.node or
                                          self.cluster.is_running(holder)):
                kept.setdefault(holder, {})[lp] = entry
                lead.holders[local] = holder
            else:
                returned.append(entry)
        for local, size, redelivered in ready:
            q.restore(LoggedMessage(self.store, local, size), redelivered)
        lead.checkouts = kept
        lead.checkouts_from = copy.leader
        lead.checkouts_until = time.monotonic() + CHECKOUT_WAIT
        q.return_checked_out(returned)
        self._reclaim_here(old, lead)
        self.promotions += 1
        log.warning("queue '%s' in vhost '%s': elected leader on %s (term %d) after the "
                    "loss of %s (%d messages; of those handed out before, %d returned, "
                    "%d kept for consumers on %s)", name, vhost, self.node, term,
                    copy.leader, len(live), len(returned),
                    sum(len(k) for k in kept.values()), sorted(kept) or "no node")
        return lead

    def _reclaim_here(self, old: QueueType | None, lead: GroupLeading) -> None:
        """This node's own consumers followed the promoted queue (replace_queue): what
        their channels hold of the lost leader (the remote queue's held deliveries)
        becomes the new queue's deliveries in place, so the client's acks by the old
        delivery tags settle them; the rest kept for this node is returned."""
        pending = lead.checkouts.pop(self.node, None)
        if pending is None:
            return
        stale = getattr(old, "_stale", None)
        origin = lead.checkouts_from
        if stale:
            for proto in list(self.broker.transports):
                session = proto.session
                for ch in list(getattr(session, "channels", {}).values()):
                    for item in list(ch.unacked.values()):
                        if item.queue is not old:
                            continue
                        held = stale.get(item.entry.seq)
                        if held is None or held.origin != origin or \
                                held.position not in pending:
                            continue
                        del stale[item.entry.seq]
                        item.queue = lead.q
                        item.entry = pending.pop(held.position)
        done = getattr(old, "_held_done", [])
        for held in list(done):  # settled by the client before the election ended
            entry = pending.pop(held.position, None) if held.origin == origin else None
            if entry is None:
                continue
            done.remove(held)
            if held.done == W.SETTLE:
                lead.q.settle([entry])
            else:
                lead.q.reject([entry])
        lead.give_back(self.node, list(pending.values()), "not held here any more")

    def failover_expected(self, queue: QueueType) -> bool:
        """The link to quorum queue ``queue``'s leader went (or its kept consumers have
        waited a while): will the group elect a new leader (its consumers here are then
        kept, remote_queue.RemoteQueue.detach)? Only if a majority of its members, the
        lost leader aside, is running (:func:`~amqpd.cluster.quorum_state.choose_leader`).

        Decided on what this node knows now, whichever of the link's end, the view's
        news and the periodic read of the group records (every 0.5 s) came first: the
        record as last read, else -- no record read yet, the queue declared moments
        before its leader died -- the queue's type: a quorum queue always has a group
        (written at declare), of ``x-quorum-initial-group-size`` members among the
        cluster's nodes, so the running nodes other than the lost leader, this one (a
        member holding a copy here, or not) included, decide. Consumers kept on that
        word are checked against etcd's record at once (:meth:`failover_kept`)."""
        if not self.adopts(str(getattr(queue, "real_type", queue.type_name))):
            return False  # a mirrored queue: amqpd.cluster.mirror decides
        lost = str(getattr(queue, "leader", ""))
        rec = self.records.get((queue.vhost.name, queue.name))
        if rec is not None:
            return self.could_take_over(rec, lost)
        nodes = list(self.cluster.nodes())
        size = min(group_size(dict(getattr(queue, "arguments", None) or {})), len(nodes))
        others = sum(1 for n in nodes if n != lost and self._up(n))
        return min(others, size - 1) >= majority(size)

    def could_take_over(self, rec: dict[str, Any] | None, lost: str) -> bool:
        """Whether the group record ``rec`` of a quorum queue whose leader ``lost`` is
        gone lets a majority of its members (the lost leader aside) elect a new one. A
        record that names another leader already: yes (the catalogue follows). No
        record: the leader died before it wrote one, so there is no group to elect."""
        if rec is None:
            return False
        if rec.get("leader") != lost:
            return True
        members = [str(m) for m in rec.get("members", [])]
        up = [m for m in members if m != lost and self._up(m)]
        return bool(members) and len(up) >= majority(len(members))

    # -- what the API shows ----------------------------------------------------------------
    def queue_fields(self, vhost: str, name: str) -> dict[str, Any]:
        lead = self.leading.get((vhost, name))
        rec = lead.record() if lead is not None else self.records.get((vhost, name))
        if rec is None:
            return {}
        members = [str(m) for m in rec.get("members", [])]
        leader = str(rec.get("leader"))
        online = [m for m in members if m == self.node or self.cluster.is_running(m)]
        return {"leader": leader, "node": leader, "members": members, "online": online}

    def sync_critical(self) -> list[tuple[str, str]]:
        return []  # mirrored queues only (amqpd.cluster.mirror)

    def quorum_critical(self) -> list[tuple[str, str]]:
        records = dict(self.records)
        for ident, lead in self.leading.items():
            records[ident] = lead.record()
        return quorum_critical(records, self.node, self.cluster.is_running)

    # -- membership (amqpctl add_member, delete_member, grow, shrink) ---------------------
    async def edit_members(self, vhost: str, name: str, add: str | None = None,
                           remove: str | None = None) -> list[str]:
        """Add or remove one member in the group record (a transaction on its last
        revision); the leader adopts it. The new members; MembershipError, LookupError
        (no such quorum queue)."""
        key = self.record_key((vhost, name))
        for _attempt in range(20):
            kv = await self.etcd.get(key)
            if kv is None:
                raise LookupError(f"no quorum queue '{name}' in vhost '{vhost}'")
            rec = json.loads(kv.value)
            members = [str(m) for m in rec.get("members", [])]
            if add is not None:
                members = add_member(members, add, self.cluster.nodes())
            if remove is not None:
                members = remove_member(members, remove, str(rec.get("leader")))
            rec["members"] = members
            rec["wanted"] = sorted(m for m in members if m != rec.get("leader"))
            rec["synchronised"] = [m for m in rec.get("synchronised", []) if m in members]
            rec["mirrors"] = [m for m in rec.get("mirrors", []) if m in members]
            result = await self.etcd.txn([Compare("mod", key, "==", kv.mod_revision)],
                                         [Put(key, json.dumps(rec))])
            if result.succeeded:
                self.records[(vhost, name)] = rec
                self.revisions[(vhost, name)] = result.revision
                log.info("quorum queue '%s' in vhost '%s': members now %s", name, vhost,
                         members)
                return members
            await asyncio.sleep(0.05)
        raise MembershipError("the group record kept changing; try again")

    def grow_targets(self, node: str, strategy: str) -> list[Ident]:
        return grow_targets(self.records, node, strategy)

    def shrink_targets(self, node: str) -> list[Ident]:
        return sorted(i for i, r in self.records.items() if node in r.get("members", []))


def start(api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> QuorumGroups:
    """Start this node's part in quorum queues' groups (``serve`` calls it after
    :func:`amqpd.cluster.mirror.start`)."""
    groups = QuorumGroups(api, cluster, queues)
    groups.start()
    cluster.quorum_groups = groups
    return groups


__all__ = ["QTERM", "GroupLeading", "QuorumGroups", "start"]
