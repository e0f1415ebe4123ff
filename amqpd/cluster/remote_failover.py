"""A remote queue's stream to its leader, and its loss (issue 28's split of
remote_queue.py): part of :class:`amqpd.cluster.remote_queue.RemoteQueue`.

:meth:`RemoteFailover.attach` starts a stream on the link to the leader (a quorum
queue's new leader first gets RECLAIM: what this node's channels still hold of the lost
leader); :meth:`RemoteFailover.detach` ends it: confirms waiting are nacked, consumers
get basic.cancel unless a mirror or a quorum member can take over
(``ClusterQueues.failover_expected``), in which case they are kept for up to
:data:`FAILOVER_WAIT` (again while a take-over stays possible, :data:`FAILOVER_LIMIT` at
most). Theory of operation: :mod:`amqpd.cluster.remote_queue`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from amqpd.cluster import link_wire as W
from amqpd.cluster.link import Link
from amqpd.cluster.remote_state import PUBLISH_WINDOW, LinkLost, RemoteQueueState, _Held

if TYPE_CHECKING:
    from amqpd.broker.api import QueueType

log = logging.getLogger("amqpd.cluster.queues")

# consumers kept when a mirrored queue's leader is lost wait this long for a new leader
# before the failover is looked at again (RemoteQueue._cancel_kept): they are cancelled
# then unless a mirror can still take over, and after FAILOVER_LIMIT in any case
FAILOVER_WAIT: Final = 30.0
FAILOVER_LIMIT: Final = 300.0


class RemoteFailover(RemoteQueueState):
    """The stream to the leader, and its loss (module docstring)."""

    # -- link ----------------------------------------------------------------------------
    def attach(self, link: Link, stream: int) -> None:
        self.link = link
        self.stream = stream
        self._credit = PUBLISH_WINDOW
        self._base += 1 << 40
        link.send(W.encode(W.OPEN, stream, self.vhost.name, self.name))
        if self.real_type == "quorum":
            self._reclaim()  # ahead of the consumers: what they hold stays theirs
        if self._kept_timer is not None:
            self._kept_timer.cancel()
            self._kept_timer = None
        for state in self._cons.values():  # consumers kept across a failover
            self._consume(state)

    def _reclaim(self) -> None:
        """Tell a quorum queue's leader (a new one after a failover, or the same one
        again) which deliveries of a lost leader this node's channels still hold, by
        that leader's store positions: the leader keeps the messages its consumers here
        held checked out for this node until it says (amqpd.cluster.quorum_group), so
        the client's acks by the old delivery tags settle them. Always sent, empty too:
        it is this node's whole answer, and what it does not name is returned."""
        by_origin: dict[str, dict[int, _Held]] = {}
        for held in [*self._held_done, *self._stale.values()]:  # held ones win
            if held.origin and held.position >= 0:
                by_origin.setdefault(held.origin, {})[held.position] = held
        self._held_done = []
        self._reclaiming = {}
        if not by_origin:
            self._send(W.encode(W.RECLAIM, self.stream, "", []))
            return
        for origin, helds in by_origin.items():
            for position, held in helds.items():
                self._reclaiming[(origin, position)] = held
            self._send(W.encode(W.RECLAIM, self.stream, origin, sorted(helds)))

    def _reclaimed(self, origin: str, positions: list[int], ids: list[int],
                   news: list[int]) -> None:
        """The leader's answer to RECLAIM: a delivery it hands back is one of this
        stream's from now on (its entry keeps the id the channel knows), or, if the
        client settled it meanwhile, is settled there now; one it no longer holds for
        this node (returned to the queue) stays a dead delivery here."""
        for position, delivery, new in zip(positions, ids, news, strict=False):
            held = self._reclaiming.pop((origin, position), None)
            if held is None:
                continue
            if not delivery:
                held.origin = ""  # redelivered from the queue: its ack settles nothing
                continue
            if held.done:
                self._send(W.encode(held.done, self.stream, [delivery]))
                if new and held.done != W.REQUEUE:
                    self._recent.append((new - 1, held.done))
                continue
            if self._stale.get(held.key) is not held:
                continue
            del self._stale[held.key]
            live = self._base + delivery
            self._owner[live] = held.state
            if new:
                self._pos[live] = new - 1
            self._renamed[held.key] = live
            self._alias[live] = held.key

    def detach(self, keep_consumers: bool = False) -> None:
        """The link went: consumers cancelled, confirms nacked, requests answered.

        A queue a mirror can take over (amqpd.cluster.mirror: ``failover_expected``)
        keeps its consumers instead, except those that asked for
        ``x-cancel-on-ha-failover``: they consume from the promoted mirror once this
        queue follows it. They are cancelled if etcd's record shows no mirror can take
        over (``failover_kept``, checked at once) or none did in the end
        (:meth:`_cancel_kept`). ``keep_consumers``: the queue follows a new leader
        already known, whatever ``failover_expected`` says.

        Publishes still waiting for the leader's credit never reach it: they are
        dropped here, and those a publisher waits a confirm for are nacked (a
        transaction holding one fails), with a log line -- nothing waits for a credit
        that cannot come."""
        self.link = None
        self._batch = None
        waiting = len(self._unsent)
        self._unsent.clear()
        confirms, self._confirms = self._confirms, {}
        if waiting or confirms:
            log.warning("queue '%s' in vhost '%s': link to its leader %s lost; %d "
                        "publish(es) waiting for its credit dropped, %d confirm(s) nacked",
                        self.name, self.vhost.name, self.leader, waiting, len(confirms))
        for callback in confirms.values():
            callback(LinkLost(f"link to {self.leader} lost"))
        keep = keep_consumers or (self.cluster is not None
                                  and self.cluster.failover_expected(self))
        kept = 0
        for state in list(self._cons.values()):
            # what waits here was never handed to the client, so it is not held here:
            # the leader's copy has it (a quorum queue's new leader returns it)
            for e in state.buffer:
                self._owner.pop(e.seq, None)
                self._pos.pop(e.seq, None)
            consumer = state.consumer
            answer = state.answer
            if answer is not None:  # the leader never answered: the consume fails
                state.answer = None
                self._forget_consumer(state)
                answer(self._unavailable())
                continue
            if keep and consumer.arguments.get("x-cancel-on-ha-failover") is not True:
                state.buffer.clear()  # the leader's copy has them (redelivered if marked)
                kept += 1
                continue
            del self._cons[state.id]
            self._stop_local(state)
            self._by_consumer.pop(id(consumer), None)
            try:
                self.consumers.remove(consumer)
            except ValueError:
                pass
            consumer.channel.consumer_cancelled_by_server(consumer)
        stale = self._stale
        positions = self._pos
        alias = self._alias
        for seq, owner in self._owner.items():
            position = positions.get(seq, -1)
            if (owner is not None and owner.id in self._cons) or position >= 0:
                # still on a channel here, unacked (a kept consumer's, or a quorum
                # queue's basic.get): the key is the id its entry has there
                key = alias.get(seq, seq)
                stale[key] = _Held(key, owner if owner is not None and owner.id in
                                   self._cons else None, self.leader, position)
        self._owner.clear()  # the leader requeued them when the link went
        positions.clear()
        for position, how in self._recent:
            # settled just before the link went: the lost leader may never have taken
            # it, and then the next one holds it for this node; named, it is settled
            held = _Held(-1, None, self.leader, position)
            held.done = how
            self._held_done.append(held)
        self._recent.clear()
        alias.clear()
        self._renamed.clear()
        for held in self._reclaiming.values():  # asked, never answered: ask again
            if held.done and held.done != W.REQUEUE:
                self._held_done.append(held)
        self._reclaiming = {}
        if kept and self._kept_timer is None:
            loop = asyncio.get_running_loop()
            self._kept_since = loop.time()
            self._kept_timer = loop.call_later(FAILOVER_WAIT, self._cancel_kept)
            if self.cluster is not None and not keep_consumers:
                self.cluster.failover_kept(self)
        gets, self._gets = self._gets, {}
        for channel, _ in gets.values():
            if not channel.closed:
                channel.answer_get(self, None, True, 0)
        requests, self._requests = self._requests, {}
        for done in requests.values():
            done(0)
        for req in list(self._counts):
            self._count_answer(req)

    def _cancel_kept(self) -> None:
        """No leader took over within FAILOVER_WAIT: the kept consumers are cancelled,
        unless a mirror can still take over (a slow election on a loaded machine), for
        at most FAILOVER_LIMIT."""
        self._kept_timer = None
        if self.link is not None or self.deleted:
            return
        loop = asyncio.get_running_loop()
        if self.cluster is not None and self.cluster.failover_expected(self) \
                and loop.time() - self._kept_since < FAILOVER_LIMIT:
            self._kept_timer = loop.call_later(FAILOVER_WAIT, self._cancel_kept)
            return
        self.cancel_kept()

    def stop_kept_timer(self) -> None:
        """The queue was replaced (this node took it over): no wait for a new leader."""
        if self._kept_timer is not None:
            self._kept_timer.cancel()
            self._kept_timer = None

    def hand_over_held(self, origin: str, pending: dict[int, Any],
                       successor: QueueType) -> list[tuple[int, Any]]:
        """This node took the quorum queue over in this queue's place
        (amqpd.cluster.quorum_failover): what this node's channels still hold of the
        lost leader ``origin`` among ``pending`` (that leader's log positions -> the
        new queue's checked-out entries) becomes ``successor``'s delivery in place (the
        channel's record of it points at the new queue and entry), so the client's acks
        by the old delivery tags settle it; each is taken out of ``pending``. Returns
        how the client settled the ones it settled before the election ended
        (``W.SETTLE``, else a reject) with their entries, taken out of ``pending`` too,
        for the new leader to settle or reject."""
        stale = self._stale
        if stale:
            for proto in list(self.port.transports):
                session = proto.session
                for ch in list(session.channels.values() if session is not None else ()):
                    for item in list(ch.unacked.values()):
                        if item.queue is not self:
                            continue
                        held = stale.get(item.entry.seq)
                        if held is None or held.origin != origin or \
                                held.position not in pending:
                            continue
                        del stale[item.entry.seq]
                        item.queue = successor
                        item.entry = pending.pop(held.position)
        settled: list[tuple[int, Any]] = []
        for held in list(self._held_done):  # settled by the client before the election ended
            entry = pending.pop(held.position, None) if held.origin == origin else None
            if entry is None:
                continue
            self._held_done.remove(held)
            settled.append((held.done, entry))
        return settled

    def cancel_kept(self) -> None:
        """The consumers kept across a failover are cancelled: no leader will take the
        queue over (amqpd.cluster.mirror found no mirror to promote, or the wait is
        over)."""
        self.stop_kept_timer()
        if self.link is not None:
            return
        for state in list(self._cons.values()):
            consumer = state.consumer
            self.remove_consumer(consumer)
            consumer.channel.consumer_cancelled_by_server(consumer)


__all__ = ["FAILOVER_LIMIT", "FAILOVER_WAIT", "RemoteFailover"]
