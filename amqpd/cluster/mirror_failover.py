"""The mirrored queues' failover (issue 16): part of :class:`amqpd.cluster.mirror.Mirrors`.

When the view says a copy's leader is not running, :meth:`MirrorFailover._promote` runs
election rounds (:func:`amqpd.cluster.election.election_round`, with a
:class:`MirrorBallot`: a synchronised mirror always stands, an unsynchronised one only
where ``ha-promote-on-failure`` / ``-on-shutdown`` allow it, the most up to date wins,
then one that was synchronised before one that never was:
:class:`~amqpd.cluster.replica_core.MirroredPromotion`); the winner
takes over (:meth:`MirrorFailover._take_over`: one etcd transaction on the queue's
definition and its mirror record) and turns its copy into a classic queue in the remote
queue's place (:meth:`MirrorFailover._promote_here`). The other nodes' remote queues ask
:meth:`MirrorFailover.failover_expected` whether to keep their consumers meanwhile.
Theory of operation: :mod:`amqpd.cluster.mirror`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar, Final

from amqpd.broker.api import LoggedMessage
from amqpd.cluster.election import Ballot, claim, clear_offers, election_round, late_claim
from amqpd.cluster.mirror_host import MirrorsHost
from amqpd.cluster.mirror_state import TICK, Ident, ha_setting, mirror_nodes
from amqpd.cluster.replica_core import Candidate, MirroredPromotion
from amqpd.coord.etcd import EtcdError

if TYPE_CHECKING:
    from amqpd.cluster.mirror_copy import MirrorCopy
    from amqpd.cluster.remote_state import RemoteQueueState

log = logging.getLogger("amqpd.cluster.mirror")

# seconds an unsynchronised mirror's promotion waits for running synchronised mirrors
# to offer themselves (MirroredPromotion.choose's ``awaited``)
SYNCED_WAIT: Final = 15.0
KEPT_CHECK_TRIES: Final = 20  # etcd reads of a record to confirm kept consumers


class MirrorBallot(Ballot["MirrorFailover"]):
    """A mirrored queue's rules in an election round (module docstring)."""

    DIRECTORY = "mirror-candidates"

    def __init__(self, mirrors: MirrorFailover, ident: Ident, copy: MirrorCopy,
                 rec: dict[str, Any]) -> None:
        super().__init__(mirrors, ident, copy, rec)
        self.synchronised = [str(n) for n in rec.get("synchronised", [])]
        self.shutdown = bool(rec.get("shutdown"))
        self.on_failure = str(rec.get("promote_on_failure", "always"))
        self.on_shutdown = str(rec.get("promote_on_shutdown", "when-synced"))
        self.policy = MirroredPromotion.from_policy(self.on_failure, self.on_shutdown,
                                                    self.shutdown)
        self.unsync_ok = self.policy.unsynchronised_ok
        self.am_synced = mirrors.node in self.synchronised and copy.synced
        # complete in this leader's stream now or before its link came back
        # (MirrorCopy.held_seq), even if no longer named synchronised: the core puts
        # it before a mirror that never was
        self.was_synced = copy.synced or copy.held_seq >= 0

    def stand(self) -> bool | None:
        ident, copy = self.ident, self.copy
        if not self.am_synced and not self.unsync_ok:
            copy.declined = time.monotonic()
            if self.shutdown:
                log.warning("queue '%s' in vhost '%s': leader %s stopped with no "
                            "synchronised mirror available; this node's mirror is not "
                            "synchronised, so the queue stays down until %s returns "
                            "(ha-promote-on-shutdown %s, ha-promote-on-failure %s)",
                            ident[1], ident[0], copy.leader, copy.leader,
                            self.on_shutdown, self.on_failure)
            else:
                log.warning("queue '%s' in vhost '%s': leader %s lost; this node's mirror "
                            "is not synchronised, so it is not promoted "
                            "(ha-promote-on-failure %s)", ident[1], ident[0], copy.leader,
                            self.on_failure)
            return True
        if not self.am_synced and copy.leader in self.host.cluster.records:
            # an unsynchronised copy takes over only once the leader's lease is gone
            # too: late heartbeats of a busy leader must not cost what this copy lacks
            return False
        return None

    def offer(self) -> str:
        return json.dumps({"seq": self.copy.last_seq, "synced": self.am_synced,
                           "was": self.was_synced})

    def take(self, node: str, value: bytes) -> None:
        try:
            offer = json.loads(value)
            seq = int(offer["seq"])
        except (ValueError, KeyError, TypeError):
            return
        # synchronised only where the record says so too; an offer without "was" (an
        # older node's) counts as never in sync: the stricter reading
        synced = offer.get("synced") is True and node in self.synchronised
        self.candidates[node] = Candidate(node, seq, in_sync=synced,
                                          was_in_sync=synced or offer.get("was") is True)

    def expected(self) -> list[str]:
        view = self.host.cluster
        expected = [n for n in self.synchronised if view.is_running(n)]
        if not expected and self.unsync_ok:  # every running mirror may take over
            expected = [str(n) for n in self.rec.get("mirrors", []) if view.is_running(n)]
        return expected

    def promotion(self) -> MirroredPromotion:
        return self.policy

    def standing(self) -> list[Candidate]:
        running = self.host.cluster.is_running
        return [c for c in self.candidates.values() if running(c.node)]

    def awaited(self) -> list[str]:
        # a running synchronised mirror that has not offered itself yet is waited for
        # (SYNCED_WAIT at most: one whose node runs without its copy never offers)
        if time.monotonic() - self.copy.election_started >= SYNCED_WAIT:
            return []
        node, running = self.host.node, self.host.cluster.is_running
        return [n for n in self.synchronised if n != node and running(n)]

    def synced_candidates(self) -> list[str]:
        return [n for n, c in self.candidates.items() if c.in_sync]

    async def undecided(self) -> bool | None:
        if not self.unsync_ok:
            return None
        log.info("queue '%s' in vhost '%s': leader %s lost; waiting for the "
                 "synchronised mirrors %s to offer themselves (candidates %s)",
                 self.ident[1], self.ident[0], self.copy.leader, self.synchronised,
                 self.offers)
        return False

    def announce(self, winner: str | None) -> None:
        log.info("queue '%s' in vhost '%s': leader %s %s; candidates %s (synchronised %s); "
                 "promoting %s", self.ident[1], self.ident[0], self.copy.leader,
                 "stopped" if self.shutdown else "lost", self.offers,
                 self.synced_candidates(), winner)

    async def take_over(self, rec_rev: int, prefix: str) -> bool:
        return await self.host._take_over(self.ident, self.copy, self.rec, rec_rev,
                                             prefix)


class MirrorFailover(MirrorsHost):
    """:class:`~amqpd.cluster.mirror.Mirrors`' failover (a mixin: the state is the
    ``Mirrors`` instance's)."""

    # the rules of an election round (QuorumGroups: GroupBallot)
    BALLOT: ClassVar[type[Ballot[Any]]] = MirrorBallot

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
        """One round (:func:`~amqpd.cluster.election.election_round`) under the rules of
        :attr:`BALLOT`; True when it is decided (this node took over, another did, or
        none can)."""
        return await election_round(self, ident, copy,
                                    lambda rec: self.BALLOT(self, ident, copy, rec))

    async def _take_over(self, ident: Ident, copy: MirrorCopy, rec: dict[str, Any],
                         rec_rev: int, prefix: str) -> bool:
        mirrors = sorted((set(rec.get("wanted", [])) | {copy.leader}) - {self.node})
        new_rec = {"leader": self.node, "mirrors": [], "synchronised": [],
                   "wanted": mirrors}
        won = await claim(self, ident, copy, rec_rev, new_rec)
        if not isinstance(won, tuple):
            return won
        item, revision = won
        self._promote_here(ident, copy, item)
        lead = self.leading.get(ident)
        if lead is not None:
            lead.rev = revision
            lead.written = new_rec
        await clear_offers(self.etcd, prefix)
        return True

    async def _finish_late_take_over(self, ident: Ident, copy: MirrorCopy,
                                     rec: dict[str, Any], rec_rev: int) -> bool:
        """A take-over of this node's that etcd applied after this node stopped
        waiting for its answer (:func:`~amqpd.cluster.election.late_claim`): finish it,
        so the messages this copy holds are served."""
        item = await late_claim(self, ident, rec, log)
        if item is None:
            return True
        self._promote_here(ident, copy, item)
        lead = self.leading.get(ident)
        if lead is not None:
            lead.rev = rec_rev
            lead.written = rec
        return True

    def _promote_here(self, ident: Ident, copy: MirrorCopy, item: dict[str, Any]) -> None:
        """Turn the copy into the queue, in the remote queue's place."""
        from amqpd.broker.api import Queue
        from amqpd.cluster.cluster_queues import replace_queue

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

    def failover_expected(self, queue: RemoteQueueState) -> bool:
        """The link to ``queue``'s leader went (or its kept consumers have waited a
        while): can a mirror take over (its consumers elsewhere are then kept,
        remote_queue.RemoteQueue.detach)?

        Decided on what this node knows now, whichever of the link's end, the view's
        news and the periodic read of the mirror records (every ``2 * TICK``) came
        first: a copy of the lost leader's queue held here (this node takes part in
        the election), else the record as last read, else -- no record read yet --
        the queue's policy (:meth:`failover_kept` then checks etcd's record)."""
        if not self.adopts(queue.listed_type()):
            return False  # a quorum queue: amqpd.cluster.quorum_group decides
        ident = (queue.vhost.name, queue.name)
        lost = queue.leader
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
        unsync_ok = MirroredPromotion.from_policy(
            str(rec.get("promote_on_failure", "always")),
            str(rec.get("promote_on_shutdown", "when-synced")),
            bool(rec.get("shutdown"))).unsynchronised_ok
        pool = [str(n) for n in rec.get("synchronised", [])]
        if unsync_ok:
            pool += [str(n) for n in rec.get("mirrors", [])]
        return any(n != lost and self._up(n) for n in pool)

    def failover_kept(self, queue: RemoteQueueState) -> None:
        """``queue`` kept its consumers on :meth:`failover_expected`'s word: read the
        queue's record from etcd now, and cancel them if no mirror can take over after
        all (the record read here before was late, or the policy promised mirrors the
        leader never had). Quorum queues are amqpd.cluster.quorum_group's (the same
        check on their group record, with their :meth:`could_take_over`)."""
        if not self.adopts(queue.listed_type()):
            return
        task = asyncio.get_running_loop().create_task(self._check_kept(queue, queue.leader))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check_kept(self, queue: RemoteQueueState, lost: str) -> None:
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


__all__ = ["KEPT_CHECK_TRIES", "SYNCED_WAIT", "MirrorBallot", "MirrorFailover"]
