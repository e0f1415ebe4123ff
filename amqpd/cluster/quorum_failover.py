"""A quorum queue's election (issue 16's second half): part of
:class:`amqpd.cluster.quorum_group.QuorumGroups`.

When the view says a group's leader is not running, every member runs election rounds
(:func:`amqpd.cluster.election.election_round`, the one the mirrored queues run too)
with a :class:`GroupBallot`: every member offers how far it holds the lost leader's log
of the record's term completely (:func:`election_offer`) and stops taking that
leader's records (a vote ends its term here); the longest log among a majority of the
members wins (:class:`~amqpd.cluster.replica_core.MajorityPromotion`). The winner takes
over with the next term (:meth:`GroupFailover._take_over_group`) and turns its copy
into a :class:`~amqpd.broker.quorum.QuorumQueue` with the lost leader's checkouts
(:meth:`GroupFailover._promote_group`). The other nodes' remote queues ask
:meth:`GroupFailover.failover_expected` whether to keep their consumers meanwhile.
Theory of operation: :mod:`amqpd.cluster.quorum_group`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from amqpd.broker.api import LoggedMessage
from amqpd.cluster import link_wire as W
from amqpd.cluster.election import Ballot, claim, clear_offers, late_claim
from amqpd.cluster.mirror_host import MirrorsHost
from amqpd.cluster.mirror_state import Ident
from amqpd.cluster.quorum_leading import CHECKOUT_WAIT, GroupLeading
from amqpd.cluster.quorum_state import group_size
from amqpd.cluster.replica_core import Candidate, Majority, MajorityPromotion

if TYPE_CHECKING:
    from amqpd.broker.api import QueueType, VHost
    from amqpd.cluster.mirror_copy import MirrorCopy
    from amqpd.cluster.remote_state import RemoteQueueState

log = logging.getLogger("amqpd.cluster.quorum")


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


class GroupBallot(Ballot["GroupFailover"]):
    """A quorum queue's rules in an election round (module docstring)."""

    DIRECTORY = "quorum-candidates"

    @cached_property
    def members(self) -> list[str]:
        """The group's members, as its record names them."""
        return [str(m) for m in self.rec.get("members", [])]

    def stand(self) -> bool | None:
        return True if self.host.node not in self.members else None

    def offer(self) -> str:
        copy = self.copy
        offer = election_offer(copy, int(self.rec.get("term", 0)))
        self.host.frozen.add((copy.leader, copy.rid))
        return str(offer)

    def take(self, node: str, value: bytes) -> None:
        # an offer is complete (held the lost leader's log in full) or -1 (votes only)
        seq = int(value or b"-1")
        self.candidates[node] = Candidate(node, seq, in_sync=seq >= 0,
                                          was_in_sync=seq >= 0)

    def expected(self) -> list[str]:
        view, lost = self.host.cluster, self.copy.leader
        return [n for n in self.members if n != lost and view.is_running(n)]

    def promotion(self) -> MajorityPromotion:
        return MajorityPromotion(tuple(self.members))

    async def undecided(self) -> bool | None:
        log.warning("queue '%s' in vhost '%s': leader %s lost and no majority of %s "
                    "can elect another (offers %s): the queue waits for members to "
                    "return", self.ident[1], self.ident[0], self.copy.leader,
                    self.members, self.offers)
        await asyncio.sleep(1.0)
        return False

    def announce(self, winner: str | None) -> None:
        log.info("queue '%s' in vhost '%s': leader %s lost; offers %s; electing %s",
                 self.ident[1], self.ident[0], self.copy.leader, self.offers, winner)

    async def take_over(self, rec_rev: int, prefix: str) -> bool:
        return await self.host._take_over_group(self.ident, self.copy, self.rec,
                                                  rec_rev, prefix)


Q = TypeVar("Q", bound="QueueType")


def in_place(groups: Any, ident: Ident, cls: type[Q], item: dict[str, Any]
             ) -> tuple[VHost, QueueType | None, Q]:
    """An election's winner makes its queue: a new ``cls`` in the place of the queue
    there (the remote queue, whose bindings and kept consumers it takes), the
    catalogue naming this node. The vhost, the queue replaced and the new one."""
    from amqpd.cluster.cluster_queues import replace_queue

    vh = groups.broker.vhosts[ident[0]]
    old = vh.queues.get(ident[1])
    groups.cluster.catalogue[ident] = groups.node
    q = cls(vh, ident[1], durable=True, auto_delete=False,
            arguments=dict(old.arguments if old is not None
                           else item.get("arguments") or {}))
    replace_queue(groups.queues, vh, old, q)
    groups.broker.apply_policies_to(vh, q)
    return vh, old, q


class GroupFailover(MirrorsHost):
    """:class:`~amqpd.cluster.quorum_group.QuorumGroups`' elections (a mixin: the state
    is the ``QuorumGroups`` instance's)."""

    BALLOT: ClassVar[type[Ballot[Any]]] = GroupBallot
    known_terms: dict[Ident, int]  # the newest term seen per queue
    # copies (leader, rid) whose member offered itself in an election
    frozen: set[tuple[str, int]]
    elections: int

    if TYPE_CHECKING:
        def _lead_group(self, vh: VHost, q: QueueType, members: list[str], term: int,
                        live: dict[int, bool] | None) -> GroupLeading: ...

    async def _take_over_group(self, ident: Ident, copy: MirrorCopy, rec: dict[str, Any],
                               rec_rev: int, prefix: str) -> bool:
        members = [str(m) for m in rec.get("members", [])]
        term = int(rec.get("term", 1)) + 1
        new_rec = {"leader": self.node, "members": members, "term": term, "mirrors": [],
                   "synchronised": [], "wanted": sorted(m for m in members
                                                        if m != self.node)}
        won = await claim(self, ident, copy, rec_rev, new_rec)
        if not isinstance(won, tuple):
            return won
        item, revision = won
        self.known_terms[ident] = term
        lead = self._promote_group(ident, copy, item, members, term)
        lead.rev = revision
        lead.written = new_rec
        self.elections += 1
        await clear_offers(self.etcd, prefix)
        return True

    async def _finish_late_take_over(self, ident: Ident, copy: MirrorCopy,
                                     rec: dict[str, Any], rec_rev: int) -> bool:
        """As the mirrors' (a take-over etcd applied after this node stopped waiting
        for its answer), for the group: lead it at the record's term."""
        item = await late_claim(self, ident, rec, log)
        if item is None:
            return True
        term = int(rec.get("term", 1))
        self.known_terms[ident] = term
        lead = self._promote_group(ident, copy, item,
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
        from amqpd.broker.api import QuorumQueue

        vhost, name = ident
        vh, old, q = in_place(self, ident, QuorumQueue, item)
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
        from amqpd.cluster.remote_queue import RemoteQueue

        pending = lead.checkouts.pop(self.node, None)
        if pending is None:
            return
        if isinstance(old, RemoteQueue):  # (the queue led by the lost leader, seen here)
            for done, entry in old.hand_over_held(lead.checkouts_from, pending, lead.q):
                if done == W.SETTLE:
                    lead.q.settle([entry])
                else:
                    lead.q.reject([entry])
        lead.give_back(self.node, list(pending.values()), "not held here any more")

    def initial_size(self, arguments: dict[str, Any]) -> int:
        """The members a new group gets: what its declare asks for (or RabbitMQ's
        default), at most ``cluster.quorum_max_members`` when that is set (the workers
        of one node: one member, the owning worker)."""
        size = group_size(arguments)
        cap = self.cluster.config.quorum_max_members
        return min(size, cap) if cap > 0 else size

    def failover_expected(self, queue: RemoteQueueState) -> bool:
        """The link to quorum queue ``queue``'s leader went (or its kept consumers have
        waited a while): will the group elect a new leader (its consumers here are then
        kept, remote_queue.RemoteQueue.detach)? Only if a majority of its members, the
        lost leader aside, is running (:class:`~amqpd.cluster.replica_core.MajorityPromotion`).

        Decided on what this node knows now, whichever of the link's end, the view's
        news and the periodic read of the group records (every 0.5 s) came first: the
        record as last read, else -- no record read yet, the queue declared moments
        before its leader died -- the queue's type: a quorum queue always has a group
        (written at declare), of ``x-quorum-initial-group-size`` members among the
        cluster's nodes, so the running nodes other than the lost leader, this one (a
        member holding a copy here, or not) included, decide. Consumers kept on that
        word are checked against etcd's record at once (:meth:`failover_kept`)."""
        if not self.adopts(queue.listed_type()):
            return False  # a mirrored queue: amqpd.cluster.mirror decides
        lost = queue.leader
        rec = self.records.get((queue.vhost.name, queue.name))
        if rec is not None:
            return self.could_take_over(rec, lost)
        nodes = list(self.cluster.nodes())
        size = min(self.initial_size(dict(queue.arguments)), len(nodes))
        others = sum(1 for n in nodes if n != lost and self._up(n))
        return Majority.of(size).reached(min(others, size - 1))

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
        return bool(members) and MajorityPromotion(tuple(members)).enough(len(up))


__all__ = ["GroupBallot", "GroupFailover", "election_offer", "in_place"]
