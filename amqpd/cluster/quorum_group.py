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
  :data:`amqpd.cluster.mirror_frames.STREAM_SPLIT`), each stream preceded by :data:`QTERM`
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
  offered (or after :data:`~amqpd.cluster.election.ELECTION_WAIT`)
  the replica core's :class:`~amqpd.cluster.replica_core.MajorityPromotion` picks
  the longest log among a
  majority of the members (no majority: nobody; the queue refuses until nodes return).
  The winner takes over with one etcd transaction on the queue's definition (its
  leader node) and the group record (term + 1), guarded by both revisions: never two
  leaders. Its copy becomes a :class:`~amqpd.broker.quorum.QuorumQueue`.
  Consumers elsewhere are kept (:class:`~amqpd.cluster.remote_queue.RemoteQueue`
  follows the catalogue to the new leader) as RabbitMQ's quorum-queue consumers
  survive a leader change.
* **Checkouts.** Every delivery is recorded with the node whose consumer holds it
  (:data:`MHELD`; :meth:`GroupLeading.checked_out`, the holder named by
  ``remote_served.Served.delivered``) when the queue chooses it, and the delivery itself
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

Where the parts live: :class:`QuorumGroups` here (group records, terms, membership
edits, the reconciliation), :mod:`~amqpd.cluster.quorum_leading` (:class:`GroupLeading`,
its checkouts), :mod:`~amqpd.cluster.quorum_failover` (the election's ballot and the
promotion; the round itself is :mod:`~amqpd.cluster.election`'s, shared with the
mirrored queues); the sans-IO rules in :mod:`~amqpd.cluster.quorum_state`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import QuorumQueue
from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.group_records import edit_group_record, poll_group_records
from amqpd.cluster.group_walk import establish_for_declare, led_queues
from amqpd.cluster.mirror import STREAM_SPLIT, Leading, MirrorCopy, Mirrors
from amqpd.cluster.mirror_state import Ident, key_part
from amqpd.cluster.quorum_failover import GroupFailover, election_offer
from amqpd.cluster.quorum_leading import CHECKOUT_WAIT, GroupLeading
from amqpd.cluster.quorum_state import (
    NoQuorum,
    add_member,
    expire_waiters,
    grow_targets,
    initial_members,
    quorum_critical,
    remove_member,
)
from amqpd.cluster.quorum_voter import lost_without_copy, vote_without_copy
from amqpd.cluster.remote_state import RemoteQueueState
from amqpd.coord.etcd import Compare, EtcdError, Put

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType, VHost
    from amqpd.cluster.cluster_queues import ClusterQueues
    from amqpd.cluster.link import Link
    from amqpd.cluster.node import Cluster

log = logging.getLogger("amqpd.cluster.quorum")

QTERM: Final = M.QTERM  # leader -> member: the term of the stream about to start
MHELD: Final = M.MHELD  # leader -> member: seq, holder node, positions checked out

class QuorumGroups(GroupFailover, Mirrors):
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

        def expected(queue: RemoteQueueState) -> bool:
            return self.failover_expected(queue) or previous(queue)

        self.queues.failover_expected = expected
        previous_kept = self.queues.failover_kept

        def kept(queue: RemoteQueueState) -> None:  # each acts on its own queue type only
            self.failover_kept(queue)
            previous_kept(queue)

        self.queues.failover_kept = kept
        self.cluster.mirror.queue_listeners.append(self.group_recorded)
        self._adopt_retired()
        self._tasks = [asyncio.create_task(self._loop(), name="quorum-groups"),
                       asyncio.create_task(self._read_records(), name="quorum-records")]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def record_key(self, ident: Ident) -> str:
        return f"{self.root}/quorum/{key_part(ident[0])}/{key_part(ident[1])}"

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
        await poll_group_records(self, f"{self.root}/quorum/", 0.5)

    # -- the reconciliation ---------------------------------------------------------------
    def reconcile(self) -> None:
        self._adopt_retired()
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused:
            return
        view = cluster
        loop = asyncio.get_running_loop()
        seen: set[Ident] = set()
        for vh, q, lead in led_queues(self, _is_quorum, seen):
            ident = (vh.name, q.name)
            assert isinstance(lead, GroupLeading)
            if lead.fenced:
                lead.answer_gets(time.monotonic(), False)
                lead.handouts.expire(time.monotonic())
                continue
            if lead.checkouts:
                lead.expire_checkouts(time.monotonic())
            lead.handouts.release()
            lead.handouts.expire(time.monotonic())
            rev = self.revisions.get(ident)
            if rev is not None and lead.rev > 0 and rev > lead.rev and \
                    self.records.get(ident, {}).get("leader") == self.node:
                lead.rev = -1  # edited (membership): write() adopts it
                lead.dirty = True
            lead.connect()
            if lead.dirty and not lead.writing:
                self._spawn(lead.write())
            serving = lead.serving()
            lead.answer_gets(time.monotonic(), serving)
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
        busy = self.copy_of.keys() | self.promoting.keys() | self.leading.keys()
        for ident, lost in lost_without_copy(self.records, self.node, busy,
                                             cluster.catalogue.get, view.is_running):
            self.promoting[ident] = loop.create_task(vote_without_copy(self, ident, lost))

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

    def group_recorded(self, vhost: str, name: str) -> Awaitable[None] | None:
        """A durable queue this node leads was declared (the definitions' hook, before
        the declare-ok): a quorum queue's group is set up now, and the declare is
        answered once it is (:meth:`~amqpd.cluster.definitions.DefinitionsMirror.after_mirrored`).
        Left to the next reconciliation, the queue confirmed its first publishes from
        this node's disk alone, and a leader lost before it wrote the group record left
        no member able to elect another: the queue waited for that node (issue 28)."""
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused or (vhost, name) in self.promoting:
            return None  # (an election's winner records the queue it makes, and leads it)
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        ident = (vhost, name)
        if vh is None or q is None or q.forwards_publish or not q.durable \
                or q.type_name != "quorum" or ident in self.leading \
                or ident in self.establishing:
            return None
        self.establishing.add(ident)
        return self._establish_for_declare(vh, q)

    async def _establish_for_declare(self, vh: VHost, q: QueueType) -> None:
        """:meth:`_establish` until this node leads the group (group_walk's
        :func:`establish_for_declare`: its retries, its bound, and why the group stays
        marked as being set up across its pauses)."""
        await establish_for_declare(self, vh, q, lambda patience: NoQuorum(
            f"quorum queue '{q.name}' in vhost '{vh.name}': its replica group could not "
            f"be set up within {patience:g} s (etcd, or an old group record still "
            "there); the declare is refused"))

    async def _establish(self, vh: VHost, q: QueueType) -> None:
        """Lead a quorum queue this node holds: create its group record (a new queue) or
        take up the one that names this node (a restart)."""
        ident = (vh.name, q.name)
        try:
            key = self.record_key(ident)
            revision, kvs = await self.etcd.range_prefix(key)
            if ident in self.leading:
                return  # led already: taking its record up again would end its term
            kv = next((k for k in kvs if k.key.decode() == key), None)
            rec: dict[str, Any]
            if kv is None:
                # among the cluster's members, running or not: one that is down (or
                # whose link is not up yet) now is a member all the same, and
                # GroupLeading.connect starts its copy once it is back
                view = self.cluster
                members = initial_members(self.node, self.initial_size(q.arguments),
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
            live = dict.fromkeys(q.ready_positions(), False)
        lead = GroupLeading(self, vh.name, q, live, members, term)
        self.leading[lead.ident] = lead
        self.store.by_key[lead.key] = lead
        self.gate.sets.append(lead.rs)
        self.known_terms[lead.ident] = max(term, self.known_terms.get(lead.ident, 0))
        if isinstance(q, QuorumQueue):  # (always: the groups lead quorum queues only)
            q.group = lead
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
        if isinstance(lead.q, QuorumQueue) and lead.q.group is lead:
            lead.q.group = None
        if isinstance(lead, GroupLeading):
            lead.answer_gets(0.0, True)  # no longer led here: answered as things are
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

    # -- what the API shows ----------------------------------------------------------------
    def queue_fields(self, vhost: str, name: str) -> dict[str, Any]:
        """The group as the management API shows it. The leader named is the
        catalogue's (etcd's, read afresh before this node's leadership counts as
        confirmed: amqpd.cluster.leadership), not this node's own belief: a leader
        replaced while it was cut off or stopped keeps its ``GroupLeading`` until the
        next reconciliation (or, fenced, until its queue is replaced), and listing that
        named two leaders for a moment after a partition healed (issue 28)."""
        ident = (vhost, name)
        lead = self.leading.get(ident)
        named = self.cluster.catalogue.get(ident)
        if lead is not None and ((isinstance(lead, GroupLeading) and lead.fenced)
                                 or named not in (None, self.node)):
            lead = None  # deposed, or replaced: what etcd holds is the truth
        rec = lead.record() if lead is not None else self.records.get(ident)
        if rec is None:
            return {}
        members = [str(m) for m in rec.get("members", [])]
        leader = str(named or rec.get("leader"))
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
    def group_size(self, vhost: str, name: str) -> int:
        return len(self.records.get((vhost, name), {}).get("members", []))

    def is_member_node(self, node: str) -> bool:
        return node in self.cluster.nodes()

    async def edit_members(self, vhost: str, name: str, add: str | None = None,
                           remove: str | None = None) -> list[str]:
        """Add or remove one member in the group record (a transaction on its last
        revision); the leader adopts it. The new members; MembershipError, LookupError
        (no such quorum queue)."""
        def change(rec: dict[str, Any]) -> bool:
            members = [str(m) for m in rec.get("members", [])]
            if add is not None:
                members = add_member(members, add, self.cluster.nodes())
            if remove is not None:
                members = remove_member(members, remove, str(rec.get("leader")))
            rec["members"] = members
            rec["wanted"] = sorted(m for m in members if m != rec.get("leader"))
            rec["synchronised"] = [m for m in rec.get("synchronised", []) if m in members]
            rec["mirrors"] = [m for m in rec.get("mirrors", []) if m in members]
            return True

        rec, revision = await edit_group_record(
            self.etcd, self.record_key((vhost, name)),
            f"no quorum queue '{name}' in vhost '{vhost}'", change)
        assert revision is not None  # change() always writes
        self.records[(vhost, name)] = rec
        self.revisions[(vhost, name)] = revision
        log.info("quorum queue '%s' in vhost '%s': members now %s", name, vhost,
                 rec["members"])
        return list(rec["members"])

    def grow_targets(self, node: str, strategy: str) -> list[Ident]:
        return grow_targets(self.records, node, strategy)

    def shrink_targets(self, node: str) -> list[Ident]:
        return sorted(i for i, r in self.records.items() if node in r.get("members", []))


def _is_quorum(q: QueueType) -> bool:
    """A quorum queue this node may lead (a durable one of its own, not a stand-in
    for one another node leads)."""
    return not q.forwards_publish and q.durable and q.type_name == "quorum"


def start(api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> QuorumGroups:
    """Start this node's part in quorum queues' groups (``serve`` calls it after
    :func:`amqpd.cluster.mirror.start`)."""
    groups = QuorumGroups(api, cluster, queues)
    groups.start()
    cluster.quorum_groups = groups
    return groups


# GroupLeading, CHECKOUT_WAIT and election_offer live in quorum_leading.py and
# quorum_failover.py; named here too, for the callers of old
__all__ = ["CHECKOUT_WAIT", "QTERM", "GroupLeading", "QuorumGroups", "election_offer",
           "start"]
