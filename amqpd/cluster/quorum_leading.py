"""The leader's side of a quorum queue's replica group (issue 16's second half):
:class:`GroupLeading`, a :class:`~amqpd.cluster.mirror_leading.Leading` with the
group's members, its term and a majority for commits, and the checkouts (which
node's consumer holds each delivery: ``MHELD``; deliveries leave only once that record
is committed, :mod:`amqpd.cluster.handout`; after an election, what consumers on
running nodes held stays theirs until they reclaim it or :data:`CHECKOUT_WAIT`
passes). Theory of operation: :mod:`amqpd.cluster.quorum_group`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.handout import Handouts
from amqpd.cluster.mirror_leading import HAVE_WAIT, Leading
from amqpd.cluster.replica_core import Majority

if TYPE_CHECKING:
    from amqpd.broker.api import QueueType
    from amqpd.cluster.link import Link
    from amqpd.cluster.quorum_group import QuorumGroups
    from amqpd.coord.etcd import EtcdClient

log = logging.getLogger("amqpd.cluster.quorum")

# after an election, what consumers on a running node held stays checked out to them
# until that node names it (RECLAIM), says it holds none of it, goes down, or this long
CHECKOUT_WAIT: Final = 30.0


# how long a basic.get of a queue with ready messages waits for its group to serve (a
# majority holding it: after a restart, the other members' copies catching up) before
# it answers get-empty: RabbitMQ never answers get-empty while messages are there, its
# channel waits for the queue's leader (issue 35: a workers = 2 node's 2-member groups)
GET_WAIT: Final = 10.0


class GroupLeading(Leading):
    """A quorum queue this node leads: :class:`~amqpd.cluster.mirror.Leading` with the
    group's members, its term, and a majority for commits."""

    RECORD = "group"
    LOG = log

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
        # basic.get waiting for the group to serve: (monotonic deadline, answer)
        self.get_waiters: list[tuple[float, Callable[[], None]]] = []
        self.fenced = False  # deposed: refuses and holds until the queue is replaced
        # the node whose consumer the delivery being recorded goes to ("": this node's;
        # remote_served.Served.delivered sets it around the queue's ``delivered``)
        self.holder = ""
        self.holders: dict[int, str] = {}  # position -> node holding it checked out
        # after an election: node -> {lost leader's position: the queue's delivery}
        # kept checked out for that node's consumers until it reclaims them
        self.checkouts: dict[str, dict[int, Any]] = {}
        self.checkouts_from = ""  # the lost leader those positions are of
        self.checkouts_until = 0.0  # monotonic: returned then at the latest

    def set_members(self, members: list[str]) -> None:
        self.members = list(members)
        self.rs.policy = Majority.of(len(self.members))
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
    def after_commit(self, action: Any, expired: Any = None) -> None:
        """Run ``action`` (a delivery to another node: remote_served.Served.hand) once
        every record so far -- the checkout just recorded among them -- is committed;
        a get's ``expired`` instead if that takes longer than
        :data:`~amqpd.cluster.handout.GET_COMMIT_WAIT`. Deliveries to this node's
        channels wait in :attr:`handouts` (QuorumQueue's dispatch and basic.get hand
        them there)."""
        self.handouts.outbox.after_commit(action, expired)

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
            self._send(lambda rid: W.encode(M.MHELD, rid, seq, holder, [position]))

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
            s.link.send(W.encode(M.MHELD, rid, s.start_seq, holder, held))

    def reclaim(self, node: str, origin: str, positions: list[int]) -> dict[int, Any]:
        """``node``'s RECLAIM (remote_served.Served.reclaim): of what this group kept
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
        self.rs.policy = Majority(len(self.members) + 1)

    def attach(self, node: str, link: Link) -> None:
        # a new copy is incomplete until its backlog is: it stops counting for commits
        # at once (stricter, so no etcd write needs to come first as for mirrors)
        self.rs.leave(node)
        self.leaving.discard(node)
        link.send(W.encode(M.QTERM, self.mirrors.next_rid + 1, self.term))
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
        return Majority.of(len(self.members)).reached(1 + complete)

    def when_serving(self, answer: Callable[[], None]) -> None:
        """Call ``answer`` (a basic.get answered again) once the group serves, or after
        :data:`GET_WAIT` at the latest (then it answers get-empty); the queue's
        reconciliation (QuorumGroups.reconcile) calls :meth:`answer_gets`."""
        self.get_waiters.append((time.monotonic() + GET_WAIT, answer))

    def answer_gets(self, now: float, serving: bool) -> None:
        """The waiting basic.gets answered: all of them once the group serves (or it is
        no longer led here), else those whose :data:`GET_WAIT` passed, in order."""
        waiters = self.get_waiters
        if not waiters:
            return
        if serving:
            due, self.get_waiters = waiters, []
        else:
            due = [w for w in waiters if w[0] <= now]
            self.get_waiters = [w for w in waiters if w[0] > now]
            if due:
                complete = sorted(n for n, s in self.streams.items()
                                  if s.synced and not s.closed)
                log.warning("quorum queue '%s' in vhost '%s': %d basic.get waited %.0fs "
                            "for a majority of its members %s to hold it (complete "
                            "copies besides this node's: %s) and is answered get-empty",
                            self.ident[1], self.ident[0], len(due), GET_WAIT, self.members,
                            complete or "none")
        for _, answer in due:
            answer()

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
        # rules (replica_core.MajorityPromotion) whatever a policy says
        rec.pop("promote_on_failure", None)
        rec.pop("promote_on_shutdown", None)
        return rec

    async def _write_pass(self, key: str, etcd: EtcdClient) -> bool | None:
        """As :meth:`Leading._write_pass`, except that a record changed by a
        membership edit (this node still its leader, a newer revision) is adopted
        first: its members replace ours, then ours is written; and no member waits in
        ``leaving`` (a copy stops counting for commits as soon as its stream ends:
        :meth:`detach`)."""
        if self.rev < 0:
            old = await self._read_record(key, etcd)
            if old is None:
                return None
            members = [str(m) for m in old.get("members") or []]
            if members and members != self.members:
                log.info("queue '%s' in vhost '%s': members now %s",
                         self.ident[1], self.ident[0], members)
                self.set_members(members)
        rec = self.record()
        return rec == self.written or await self._put_record(key, etcd, rec)


__all__ = ["CHECKOUT_WAIT", "GroupLeading"]
