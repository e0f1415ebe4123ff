"""DeliveryHold: a node whose leadership is in doubt delivers nothing from the queues it leads.

Why. A node woken from a SIGSTOP (or back from a long event-loop stall) may have been
replaced: the others counted it down and promoted a mirror or elected a member. Until it
has read etcd again (:mod:`amqpd.cluster.leadership`) its old local queue still looks
like the leader to it, and the first thing it reads on waking is what its clients sent
meanwhile -- an ack that frees a consumer's credit. A mirrored queue's leader then
handed that consumer more of its backlog at once, messages the new leader had already
delivered and settled, without ``redelivered`` (issue 28). RabbitMQ delivers a message
from the one leader only.

How. On every doubt :meth:`DeliveryHold.hold` sets ``deliveries_held`` on each queue this
node leads as a replica group's leader (mirrored and quorum: ``queues`` lists them), so
the broker's dispatch scheduler skips them and basic.get answers empty
(:attr:`amqpd.broker.queue_type.QueueType.deliveries_held`); publishes and confirms go
on (their commit rule already refuses a deposed leader). When etcd's definitions have
been read and applied, :meth:`release` clears it and schedules a dispatch: a queue this
node still leads delivers on; one another node leads was replaced by then (its consumers
on this node cancelled: ``cluster_queues.replace_queue``) and delivers nothing more.

A stall is seen by the loop clock's tick, a timer (:mod:`amqpd.cluster.loop_clock`): on
waking, the event loop runs due timers before the dispatch that the acks read at the
wake scheduled, so the hold is in place first. A quorum queue's deliveries also wait
for a majority's acknowledgement of their checkout (:mod:`amqpd.cluster.handout`), which
members that elected another leader refuse; the hold spares that wait. Streams are not
held: a stream consumer reads committed records by offset, and nothing is settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

log = logging.getLogger("amqpd.cluster")


class HeldQueue(Protocol):
    """What the hold reads and sets of a queue (amqpd.broker.queue_type.QueueType)."""

    deleted: bool
    deliveries_held: bool
    vhost: Any  # its schedule_dispatch(queue) marks it for the end of the tick


class DeliveryHold:
    def __init__(self, queues: Callable[[], Iterable[HeldQueue]]) -> None:
        """``queues``: the queues this node leads as a replica group's leader now."""
        self.queues = queues
        self.held: list[HeldQueue] = []

    def hold(self) -> None:
        """Leadership is in doubt: hold what this node leads now (again on each doubt:
        a queue whose leadership it won since, through etcd, is held too until the
        read)."""
        fresh = [q for q in self.queues() if not q.deleted and not q.deliveries_held]
        if not fresh:
            return
        for q in fresh:
            q.deliveries_held = True
        self.held += fresh
        log.info("cluster: deliveries of %d queue(s) led here held until etcd confirms "
                 "this node still leads them", len(self.held))

    def release(self) -> None:
        """Leadership read afresh: the queues held deliver again (those replaced
        meanwhile are deleted: their dispatch is skipped)."""
        held, self.held = self.held, []
        for q in held:
            q.deliveries_held = False
            if not q.deleted:
                q.vhost.schedule_dispatch(q)
        if held:
            log.info("cluster: deliveries of %d queue(s) released (%d still led here)",
                     len(held), sum(1 for q in held if not q.deleted))


__all__ = ["DeliveryHold", "HeldQueue"]
