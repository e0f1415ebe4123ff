"""Streams across nodes (issue 30's "In a cluster"): a stream has a leader and members
on the cluster's replica core, as RabbitMQ's streams have a writer and replicas.

Theory of operation:

* **Members at declare.** A durable ``x-queue-type: stream`` queue is created on the
  declaring node (or where the leader locator put it), which leads it. Before the
  declare-ok its leader writes the stream's *group record* to etcd,
  ``{root}/stream/{vhost}/{name}`` = ``{"leader", "members", "term", "epochs"}``,
  created once (a transaction on the key's absence): ``x-initial-cluster-size``
  members (default: every node of the cluster, RabbitMQ 3.10's default) chosen as a
  quorum queue's are (:func:`~amqpd.cluster.quorum_state.initial_members`: the leader,
  the running nodes, then those not running), its first term above any a stream of
  that name had (the etcd revision + 1), and one epoch ``[term, 0]``. Every later write
  is a transaction guarded by the record's revision. A record naming this node the
  leader that a stream declared again finds (the deleted one's, not removed yet) is
  replaced the same way, never continued: the new stream's log has no term yet
  (``_earlier_stream``), where a restarted leader's has.
* **Replication.** The leader (:mod:`~amqpd.cluster.stream_leading`) sends each other
  member ``SSTART`` on the node link (frames of :mod:`~amqpd.cluster.stream_wire`),
  the member opens its copy -- the stream's own log, in the directory the stream has
  on every node (:mod:`~amqpd.cluster.stream_replica`) -- keeps what agrees with the
  leader's epochs and answers with the offset it continues from; the leader then ships
  the records from there, at their offsets, and the member acknowledges what it has
  written. Offsets are the leader's, so they are the same on every member.
* **Commit rule.** A confirm (and tx.commit-ok) leaves once the records are fsynced on
  the leader and written on a majority of the members, the leader included
  (:class:`~amqpd.cluster.replica_core.Majority`). RabbitMQ confirms a stream's chunk
  once a majority has it written, and relies on replication rather than fsync; amqpd
  adds the leader's own fsync (it is there anyway: the single-node rule), and members
  write without fsync. A commit no majority acknowledges within
  ``cluster.mirror_sync_timeout`` is refused (nack).
* **Election.** When the view says the leader's node is not running, every member
  runs the election round of the replicated queues (:mod:`amqpd.cluster.election`)
  with the quorum queues' ballot (:class:`~amqpd.cluster.quorum_failover.GroupBallot`),
  offering how far it holds the lost leader's log (its next offset, -1 when it never
  followed that leader's term) and taking no more of its records; the replica core's
  :class:`~amqpd.cluster.replica_core.MajorityPromotion` picks the longest log among a
  majority of the members. A committed record is on a majority, so the winner holds
  it. The winner takes over with one etcd transaction on the queue's definition and
  the record (term + 1, a new epoch starting at its next offset), opens its copy as
  the :class:`~amqpd.broker.api.StreamQueue` in the remote queue's place and leads.
  Consumers on the other nodes follow the catalogue to it (their remote queues keep
  them) and go on from the offset after the last one their channel was given; this
  node's own consumers move to the new queue the same way (``resume_arguments``).
* **Returning members.** A member whose link or node comes back gets ``SSTART`` again
  and continues from what it holds, once it agrees with the leader's epochs
  (:func:`~amqpd.cluster.stream_replica.valid_end`); a copy that does not (an
  uncommitted tail of a lost leader) starts again from the leader's first offset.

The member's side (copies of streams led elsewhere) is
:mod:`~amqpd.cluster.stream_copies`.

Consumers on a member's node read its copy there up to the commit point
(:mod:`~amqpd.cluster.stream_local`), and so do the stream protocol's subscribers there
(:meth:`StreamGroups.readable_copy`, :mod:`amqpd.streamproto.copies`). Not done yet
(docs/streams.md): a deposed leader cut off from etcd keeps its gate until the next
reconciliation (its members refuse an older term once they saw the newer one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any, Final, cast

from amqpd.broker.api import StreamLogError, StreamQueue
from amqpd.cluster import link_wire as W
from amqpd.cluster import stream_wire as S
from amqpd.cluster.election import claim, clear_offers, election_round, late_claim
from amqpd.cluster.group_records import (
    edit_group_record,
    poll_group_records,
    read_group_records,
)
from amqpd.cluster.group_walk import establish_for_declare, led_queues
from amqpd.cluster.mirror_state import Ident, key_part
from amqpd.cluster.node_part import NodePart
from amqpd.cluster.periodic import every, spawn
from amqpd.cluster.quorum_failover import GroupBallot, in_place
from amqpd.cluster.quorum_state import (
    MembershipError,
    NoQuorum,
    add_member,
    initial_members,
    remove_member,
)
from amqpd.cluster.replica_core import Majority, MajorityPromotion
from amqpd.cluster.stream_copies import StreamCopies
from amqpd.cluster.stream_leading import StreamLeading
from amqpd.cluster.stream_local import usable
from amqpd.cluster.stream_replica import StreamReplica, read_term, write_term
from amqpd.coord.etcd import Compare, Delete, EtcdError, Put

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType, VHost
    from amqpd.cluster.cluster_queues import ClusterQueues
    from amqpd.cluster.link import Link
    from amqpd.cluster.node import Cluster
    from amqpd.cluster.remote_state import RemoteQueueState

log = logging.getLogger("amqpd.cluster.stream")

TICK: Final = 0.2  # seconds between reconciliations
RECORDS_EVERY: Final = 0.5  # seconds between reads of the group records


def replica_edit(members: list[str], leader: str, known: Iterable[str],
                 add: str | None, remove: str | None) -> list[str]:
    """The members after ``add_replica`` / ``delete_replica``: adding a member or
    removing a node that is none changes nothing (RabbitMQ answers ok); the others
    are the quorum queues' rules (the last member, the leader: refused)."""
    if add is not None and add not in members:
        return add_member(members, add, known)
    if remove is not None and remove in members:
        if len(members) == 1:
            raise MembershipError("Cannot delete the last member of a stream")
        return remove_member(members, remove, leader)
    return members


def cluster_size(arguments: dict[str, Any], nodes: int) -> int:
    """``x-initial-cluster-size`` (validated at declare), else every node."""
    value = arguments.get("x-initial-cluster-size")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return nodes
    return value


def _earlier_stream(rec: dict[str, Any], node: str, q: StreamQueue) -> bool:
    """Whether a group record naming this node the leader of ``q`` was left by an
    earlier stream of that name (deleted, and its record not yet, when ``q`` was
    declared): ``q``'s log never held a record and never had a term (a restarted
    leader's has one, written when it first led: :func:`write_term`)."""
    return rec.get("leader") == node and read_term(q.directory) == 0 \
        and q.log.first_offset == 0 and q.log.flushed_offset == 0


def _is_stream(q: QueueType) -> bool:
    return isinstance(q, StreamQueue) and q.durable


class _Ballot(GroupBallot):
    """The quorum queues' ballot over a stream copy: the offer is the copy's next
    offset in the lost leader's term, the take-over :meth:`StreamGroups.take_over`."""

    def offer(self) -> str:
        replica = cast(StreamReplica, self.copy)
        replica.frozen = True  # a vote ends the lost leader's term here
        return str(replica.offer(int(self.rec.get("term", 0))))

    async def take_over(self, rec_rev: int, prefix: str) -> bool:
        groups = cast(StreamGroups, self.host)
        return await groups.take_over(cast(StreamReplica, self.copy), self.rec, rec_rev,
                                      prefix)


class StreamGroups(NodePart):
    """This node's part in replicated streams (module docstring)."""

    def __init__(self, api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> None:
        super().__init__(api, cluster, queues)
        self.timeout = cluster.config.mirror_sync_timeout
        self.leading: dict[Ident, StreamLeading] = {}
        self.replicas: dict[Ident, StreamReplica] = {}
        self.records: dict[Ident, dict[str, Any]] = {}
        self.revisions: dict[Ident, int] = {}
        self.known_terms: dict[Ident, int] = {}
        self.establishing: set[Ident] = set()
        self.electing: set[Ident] = set()
        self.records_read = False  # the group records were read since this node started
        self.elections = 0
        self._next_rid = 0
        self.copies = StreamCopies(self)
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[Any]] = set()

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self.queues.extensions.append(self)
        previous = self.queues.failover_expected

        def expected(queue: RemoteQueueState) -> bool:
            return self.failover_expected(queue) or previous(queue)

        self.queues.failover_expected = expected
        self.cluster.mirror.queue_listeners.append(self.group_recorded)
        self._keep_retired()
        self._tasks = [asyncio.create_task(every(TICK, self.reconcile, log,
                                                 "streams: reconciliation"),
                                           name="stream-groups"),
                       asyncio.create_task(self._read_records(), name="stream-records")]

    async def stop(self) -> None:
        for task in [*self._tasks, *self._spawned]:
            task.cancel()
        for replica in self.replicas.values():
            with contextlib.suppress(OSError, StreamLogError):
                replica.close()

    def _spawn(self, coro: Any) -> None:
        spawn(self._spawned, coro)

    def record_key(self, ident: Ident) -> str:
        return f"{self.root}/stream/{key_part(ident[0])}/{key_part(ident[1])}"

    def _rid(self) -> int:
        self._next_rid += 1
        return self._next_rid

    async def _read_records(self) -> None:
        prefix = f"{self.root}/stream/"
        while not self.records_read:  # the first read: StreamCopies.sweep_deleted waits
            with contextlib.suppress(EtcdError, ValueError):
                self.records, self.revisions = await read_group_records(
                    self.etcd, prefix, self.known_terms)
                self.records_read = True
            if not self.records_read:
                await asyncio.sleep(RECORDS_EVERY)
        await poll_group_records(self, prefix, RECORDS_EVERY)

    # -- the reconciliation -----------------------------------------------------------
    def local_stream(self, ident: Ident) -> StreamQueue | None:
        vh = self.broker.vhosts.get(ident[0])
        q = vh.queues.get(ident[1]) if vh is not None else None
        return q if isinstance(q, StreamQueue) and not q.deleted else None

    def _keep_retired(self) -> None:
        """Streams this node held before its restart that another node leads now
        (ClusterQueues.retire): their logs are closed, not deleted, so the leader's
        ``SSTART`` finds them and ships only what they lack."""
        retired = self.queues.retired
        for ident, q in list(retired.items()):
            if isinstance(q, StreamQueue):
                del retired[ident]
                q.shutdown()
                log.info("stream '%s' in vhost '%s': led elsewhere now; this node's log "
                         "(offsets %d..%d) is kept as its copy", ident[1], ident[0],
                         q.log.first_offset, q.log.last_offset)

    def reconcile(self) -> None:
        self._keep_retired()
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused:
            return
        seen: set[Ident] = set()
        for vh, q, lead in led_queues(self, _is_stream, seen):
            ident = (vh.name, q.name)
            rec = self.records.get(ident)
            if rec is not None and rec.get("leader") != self.node and \
                    self.revisions.get(ident, 0) > lead.rev:
                log.warning("stream '%s' in vhost '%s': the group record names %s its "
                            "leader (term %s): no longer leading it", q.name, vh.name,
                            rec.get("leader"), rec.get("term"))
                self.stop_leading(lead, delete_record=False)
                continue
            if rec is not None and self.revisions.get(ident, 0) > lead.rev:
                self._adopt_members(lead, rec, self.revisions[ident])
            lead.connect(self.queues.links.link)
            if lead.expire(time.monotonic()):
                log.warning("stream '%s' in vhost '%s': commits not acknowledged by a "
                            "majority of %s within %.1fs: refused (nack)", q.name,
                            vh.name, lead.members, self.timeout)
        for ident, lead in list(self.leading.items()):
            if ident not in seen:
                self.stop_leading(lead, delete_record=self.local_stream(ident) is None
                                  and ident not in self.queues_elsewhere())
        for ident, replica in list(self.replicas.items()):
            where = self.broker.vhosts.get(ident[0])
            if where is None or ident[1] not in where.queues:
                log.info("stream '%s' in vhost '%s': deleted; this node's copy goes",
                         ident[1], ident[0])
                self.copies.drop(replica, destroy=True)
                continue
            if not cluster.is_running(replica.leader) and ident not in self.electing:
                self.electing.add(ident)
                self._spawn(self._elect(ident, replica))
        if self.records_read and not self.copies.swept:
            self.copies.sweep_deleted()
        self.copies.clear_removed()

    def queues_elsewhere(self) -> set[Ident]:
        """Streams the catalogue says another node leads (not deleted, only moved)."""
        return {i for i, n in self.cluster.catalogue.items() if n != self.node}

    # -- leading ----------------------------------------------------------------------
    def group_recorded(self, vhost: str, name: str) -> Awaitable[None] | None:
        """A durable queue this node leads was declared (the definitions' hook, before
        the declare-ok): a stream's group record is written first, so no confirm
        leaves before its members are known."""
        cluster = self.cluster
        if not cluster.mirror.synced or cluster.paused:
            return None
        ident = (vhost, name)
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if vh is None or not isinstance(q, StreamQueue) or not q.durable:
            return None
        lead = self.leading.get(ident)
        if lead is not None and lead.q is not q:
            # deleted and declared again before the reconciliation saw it: the old
            # stream's members drop their copies, its record is replaced (_establish)
            self.stop_leading(lead, delete_record=True)
        if ident in self.leading or ident in self.establishing or ident in self.electing:
            return None
        self.establishing.add(ident)
        return self._establish_for_declare(vh, q)

    async def _establish_for_declare(self, vh: VHost, q: StreamQueue) -> None:
        """:meth:`_establish` until this node leads the stream (group_walk's
        :func:`establish_for_declare`)."""
        await establish_for_declare(self, vh, q, lambda patience: NoQuorum(
            f"stream '{q.name}' in vhost '{vh.name}': its members could not be recorded "
            f"within {patience:g} s; the declare is refused"))

    async def _establish(self, vh: VHost, q: StreamQueue) -> None:
        """Lead a stream this node holds: create its group record (a new stream) or
        take up the one naming this node (a restart: a new term and epoch)."""
        ident = (vh.name, q.name)
        try:
            key = self.record_key(ident)
            revision, kvs = await self.etcd.range_prefix(key)
            if ident in self.leading:
                return  # led already: taking its record up again would end its term
            kv = next((k for k in kvs if k.key.decode() == key), None)
            if kv is not None and _earlier_stream(json.loads(kv.value), self.node, q):
                log.info("stream '%s' in vhost '%s': the group record left by an earlier "
                         "stream of that name (term %s) is replaced", q.name, vh.name,
                         json.loads(kv.value).get("term"))
            if kv is None or _earlier_stream(json.loads(kv.value), self.node, q):
                view = self.cluster
                nodes = view.members | {self.node}
                members = initial_members(self.node, cluster_size(q.arguments, len(nodes)),
                                          nodes, view.is_running)
                term = revision + 1
                rec: dict[str, Any] = {"leader": self.node, "members": members,
                                       "term": term, "epochs": [[term, q.log.first_offset]]}
                guard = Compare("create", key, "==", 0) if kv is None else \
                    Compare("mod", key, "==", kv.mod_revision)
                result = await self.etcd.txn([guard], [Put(key, json.dumps(rec))])
                log.info("stream '%s' in vhost '%s': members %s", q.name, vh.name, members)
            else:
                rec = json.loads(kv.value)
                if rec.get("leader") != self.node:
                    log.warning("stream '%s' in vhost '%s' is here but its group record "
                                "names %s its leader: not leading it", q.name, vh.name,
                                rec.get("leader"))
                    return
                term = int(rec.get("term", 1)) + 1
                rec = {**rec, "term": term,
                       "epochs": [*rec.get("epochs", []), [term, q.log.flushed_offset]]}
                result = await self.etcd.txn([Compare("mod", key, "==", kv.mod_revision)],
                                             [Put(key, json.dumps(rec))])
            if not result.succeeded or vh.queues.get(q.name) is not q \
                    or ident in self.leading:
                return
            self._lead(ident, q, rec, result.revision)
        except (EtcdError, ValueError, KeyError) as exc:
            log.warning("stream '%s': group record not read yet: %s", q.name, exc)
        finally:
            self.establishing.discard(ident)

    def _lead(self, ident: Ident, q: StreamQueue, rec: dict[str, Any],
              revision: int) -> StreamLeading:
        term = int(rec["term"])
        write_term(q.directory, term)  # this log holds records of this term from now on
        lead = StreamLeading(self.node, ident[0], q, [str(m) for m in rec["members"]],
                             term, [[int(t), int(s)] for t, s in rec.get("epochs", [])],
                             self._rid, self.timeout)
        lead.rev = revision
        self.leading[ident] = lead
        self.known_terms[ident] = max(term, self.known_terms.get(ident, 0))
        lead.connect(self.queues.links.link)
        log.info("stream '%s' in vhost '%s': leading it (term %d, members %s)", ident[1],
                 ident[0], term, lead.members)
        return lead

    def stop_leading(self, lead: StreamLeading, delete_record: bool) -> None:
        """No longer leading (the queue went or was replaced, or etcd names another);
        ``delete_record``: the stream was deleted, so are the members' copies and its
        group record."""
        self.leading.pop(lead.ident, None)
        lead.stop()
        if not delete_record:
            return
        for member, link in list(lead.links.items()):
            link.send(W.encode(S.SDROP, lead.rid[member]))
        self._spawn(self._delete_record(lead))

    async def _delete_record(self, lead: StreamLeading) -> None:
        key = self.record_key(lead.ident)
        with contextlib.suppress(EtcdError):
            kv = await self.etcd.get(key)
            if kv is not None and json.loads(kv.value).get("term") == lead.term:
                await self.etcd.txn([Compare("mod", key, "==", kv.mod_revision)],
                                    [Delete(key)])

    def _adopt_members(self, lead: StreamLeading, rec: dict[str, Any], revision: int) -> None:
        """The record's members were edited (add_replica / delete_replica): a new member
        gets its copy at the next :meth:`StreamLeading.connect`, a removed one's copy is
        dropped (``SDROP``: it deletes it)."""
        members = [str(m) for m in rec.get("members", [])]
        for gone in set(lead.members) - set(members):
            link = lead.links.get(gone)
            if link is not None:
                link.send(W.encode(S.SDROP, lead.rid[gone]))
            lead.forget(gone)
        if members != lead.members:
            log.info("stream '%s' in vhost '%s': members now %s (were %s)", lead.ident[1],
                     lead.ident[0], members, lead.members)
        lead.members = members
        lead.rev = revision
        lead.release()  # a smaller majority may commit what waits

    async def edit_members(self, vhost: str, name: str, add: str | None = None,
                           remove: str | None = None) -> list[str]:
        """``add_replica`` / ``delete_replica``: one member more or less in the group
        record (a transaction on its last revision); the leader adopts it. The members
        after; MembershipError (RabbitMQ's refusals), LookupError (no such stream)."""
        def change(rec: dict[str, Any]) -> bool:
            members = [str(m) for m in rec.get("members", [])]
            rec["members"] = replica_edit(members, str(rec.get("leader")),
                                          self.cluster.nodes(), add, remove)
            return bool(rec["members"] != members)

        rec, revision = await edit_group_record(
            self.etcd, self.record_key((vhost, name)),
            f"no stream '{name}' in vhost '{vhost}'", change)
        if revision is not None:
            self.records[(vhost, name)] = rec
            self.revisions[(vhost, name)] = revision
            log.info("stream '%s' in vhost '%s': members now %s", name, vhost,
                     rec["members"])
        return list(rec["members"])

    # -- links ------------------------------------------------------------------------
    def link_up(self, link: Link) -> None:
        for lead in self.leading.values():
            lead.connect(self.queues.links.link)

    def link_down(self, link: Link) -> None:
        for lead in self.leading.values():
            for member, have in list(lead.links.items()):
                if have is link:
                    lead.forget(member)

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if not S.is_stream_frame(kind):
            return
        if self.copies.frame(link, kind, stream, f):
            return
        for lead in self.leading.values():
            member = lead.member_of(link, stream)
            if member is None:
                continue
            if kind == S.SHAVE:
                lead.have(member, f[0])
            elif kind == S.SACK:
                lead.ack(member, f[0])
            else:
                log.warning("stream '%s' in vhost '%s': %s refused its copy: %s",
                            lead.ident[1], lead.ident[0], member, f[0])
                lead.forget(member)
                asyncio.get_running_loop().call_later(
                    1.0, lead.connect, self.queues.links.link)
            return

    # -- elections --------------------------------------------------------------------
    async def _elect(self, ident: Ident, replica: StreamReplica) -> None:
        try:
            for _ in range(600):  # bounded: about ten minutes of rounds at most
                if self.replicas.get(ident) is not replica or \
                        self.cluster.is_running(replica.leader):
                    return
                with contextlib.suppress(EtcdError):
                    if await election_round(self, ident, cast(Any, replica),
                                            lambda rec: _Ballot(cast(Any, self), ident,
                                                                cast(Any, replica), rec)):
                        return
                await asyncio.sleep(0.2)
        finally:
            self.electing.discard(ident)
            replica.frozen = False

    async def take_over(self, replica: StreamReplica, rec: dict[str, Any], rec_rev: int,
                        prefix: str) -> bool:
        """This node won: the record (term + 1, an epoch from its next offset) and the
        queue's definition name it in one transaction; then it leads its copy."""
        ident = replica.ident
        term = int(rec.get("term", 1)) + 1
        new_rec = {**rec, "leader": self.node, "term": term,
                   "epochs": [*rec.get("epochs", []), [term, replica.next_offset]]}
        won = await claim(self, ident, cast(Any, replica), rec_rev, new_rec)
        if not isinstance(won, tuple):
            return won
        item, revision = won
        self._promote(replica, item, new_rec, revision)
        await clear_offers(self.etcd, prefix)
        return True

    async def _finish_late_take_over(self, ident: Ident, copy: Any, rec: dict[str, Any],
                                     rec_rev: int) -> bool:
        item = await late_claim(self, ident, rec, log)
        if item is not None:
            self._promote(copy, item, rec, rec_rev)
        return True

    def _promote(self, replica: StreamReplica, item: dict[str, Any],
                 rec: dict[str, Any], revision: int) -> None:
        """The copy becomes the stream, in the remote queue's place."""
        vhost, name = ident = replica.ident
        self.copies.drop(replica, destroy=False)  # its files are the stream's now
        _vh, _old, q = in_place(self, ident, StreamQueue, item)
        # the producers' ids and stored offsets the old leader shipped with the records
        q.use_tracking(replica.tracking)
        lead = self._lead(ident, q, rec, revision)
        self.broker.definitions_changed(q)
        self.elections += 1
        log.warning("stream '%s' in vhost '%s': elected leader on %s (term %d) after the "
                    "loss of %s; offsets %d..%d", name, vhost, self.node, lead.term,
                    replica.leader, q.log.first_offset, q.log.last_offset)

    def failover_expected(self, queue: RemoteQueueState) -> bool:
        """Will a stream whose leader's link went get a new leader (its consumers here
        are kept meanwhile, and publishes get a nack instead of the ack of an unroutable
        message)? When a majority of its members, the lost one aside, runs. With no
        record read yet (declared less than a read ago): a stream always has one (the
        declare-ok waits for it), of ``x-initial-cluster-size`` of the cluster's nodes,
        so the running nodes other than the lost leader decide."""
        if queue.listed_type() != "stream":
            return False
        lost = queue.leader
        rec = self.records.get((queue.vhost.name, queue.name))
        if rec is None:
            nodes = list(self.cluster.nodes())
            size = min(cluster_size(dict(queue.arguments), len(nodes)), len(nodes))
            others = sum(1 for n in nodes if n != lost and
                         (n == self.node or self.cluster.is_running(n)))
            return Majority.of(size).reached(min(others, size - 1))
        if rec.get("leader") != lost:
            return True
        members = [str(m) for m in rec.get("members", [])]
        up = [m for m in members if m != lost and
              (m == self.node or self.cluster.is_running(m))]
        return bool(members) and MajorityPromotion(tuple(members)).enough(len(up))

    def readable_copy(self, vhost: str, name: str) -> StreamReplica | None:
        """This node's copy of a stream led elsewhere when it may be read now (fed by the
        leader the catalogue names, told a commit point: :func:`stream_local.usable`):
        the stream protocol's subscribers on this node read it (issue 31)."""
        copy = self.replicas.get((vhost, name))
        leader = self.cluster.catalogue.get((vhost, name))
        return copy if leader is not None and usable(copy, leader) else None

    # -- what the API shows ---------------------------------------------------------
    def queue_fields(self, vhost: str, name: str) -> dict[str, Any]:
        """Leader and members as etcd's record has them (the catalogue names the
        leader), and which members run."""
        ident = (vhost, name)
        lead = self.leading.get(ident)
        rec = lead.record() if lead is not None else self.records.get(ident)
        if rec is None:
            return {}
        members = [str(m) for m in rec.get("members", [])]
        leader = str(self.cluster.catalogue.get(ident) or rec.get("leader"))
        online = [m for m in members if m == self.node or self.cluster.is_running(m)]
        out: dict[str, Any] = {"leader": leader, "node": leader, "members": members,
                               "online": online, "term": int(rec.get("term", 0))}
        if lead is not None:
            out["member_offsets"] = lead.offsets()
        return out


def start(api: BrokerAPI, cluster: Cluster, queues: ClusterQueues) -> StreamGroups:
    """Start this node's part in replicated streams (``serve`` calls it)."""
    groups = StreamGroups(api, cluster, queues)
    groups.start()
    queues.stream_copy = lambda vhost, name: groups.replicas.get((vhost, name))
    cluster.stream_groups = groups
    return groups


__all__ = ["StreamGroups", "cluster_size", "replica_edit", "start"]
