"""The leader's side of a queue used from other nodes (issue 15): :class:`Served`, one
per stream a node opened on the link for a queue this node leads, and its consumers'
proxies (:class:`_Proxy`). Publishes forwarded from another node are enqueued as this
node's publish pipeline would (:func:`enqueue_here`) and confirmed after its commit;
its consumers' deliveries go over the link within the credit the other node grants.
Theory of operation: :mod:`amqpd.cluster.remote_queue`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import (
    Consumer,
    Message,
    QueueEntry,
    QueueType,
    QuorumQueue,
)
from amqpd.cluster import link_wire as W
from amqpd.cluster.link import Link
from amqpd.cluster.link_records import Publishes, add_delivery, enqueue_publishes
from amqpd.cluster.remote_state import LinkLost, OnConfirm

if TYPE_CHECKING:
    from amqpd.broker.api import ClusterPort

log = logging.getLogger("amqpd.cluster.queues")


def _group(queue: QueueType) -> Any:
    """The replica group a quorum queue's leader here sets on it
    (amqpd.cluster.quorum_group.GroupLeading; None for other queues and before)."""
    return queue.group if isinstance(queue, QuorumQueue) else None


class _Proxy:
    """The leader's stand-in for a channel on the consuming node: delivers within the
    credit that node granted (``ConsumerChannel`` of amqpd.broker.queue)."""

    def __init__(self, served: Served, cid: int, credit: int) -> None:
        self.served = served
        self.cid = cid
        self.credit = credit
        self.consumer: Consumer | None = None
        self.closed = False
        # the DELIVERS frame this consumer's deliveries join while it is the last frame
        # queued on the link (link_wire's batches)
        self.batch: bytearray | None = None

    def can_deliver(self, consumer: Consumer) -> bool:
        return self.credit > 0 and not self.closed

    def deliver(self, consumer: Consumer, queue: QueueType, entry: QueueEntry) -> None:
        # once per message crossing: a queue that is not a quorum queue takes the short
        # way (Served.delivered and Served.hand inlined: no replica group to involve)
        self.credit -= 1
        served = self.served
        served._next += 1
        delivery = served._next
        msg = entry.message
        no_ack = consumer.no_ack
        quorum = isinstance(queue, QuorumQueue)
        if quorum:
            position = served.delivered(queue, entry, no_ack)
        else:
            queue.delivered(entry, acked=no_ack)
            position = 0
        if not no_ack:
            served.unacked[delivery] = entry
        body = served.broker.publisher.body_of(msg)
        if quorum:  # sent once its checkout is committed: a frame of its own
            served.hand(queue, entry, no_ack, W.encode_deliver(
                W.DELIVER, served.stream, self.cid, delivery, entry.redelivered,
                queue.message_count, msg.exchange, msg.routing_key, msg.properties, body,
                position), self)
            return
        # joins this consumer's DELIVERS frame while that is the last frame queued on
        # the link (nothing sent meanwhile is overtaken), else starts one (compiled)
        self.batch = add_delivery(self.batch, served.link, served.stream, self.cid, delivery,
                                  entry.redelivered, queue.message_count, msg, body, position)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        self.closed = True
        self.served.proxies.pop(self.cid, None)
        self.served.link.send(W.encode(W.CANCELLED, self.served.stream, self.cid))


@dataclass(eq=False, repr=False)  # each stream is itself (kept in dicts by identity)
class Served:
    """One stream a peer opened on this node's queue ``queue``."""

    broker: ClusterPort
    link: Link
    stream: int
    queue: QueueType
    proxies: dict[int, _Proxy] = field(default_factory=dict)
    unacked: dict[int, QueueEntry] = field(default_factory=dict)
    _next: int = 0
    credit_due: int = 0
    last_stats: tuple[int, int, int] | None = None
    closed: bool = False  # close() ran: a get still waiting is not answered

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def delivered(self, queue: QueueType, entry: QueueEntry, no_ack: bool) -> int:
        """``queue.delivered`` for a delivery to the peer; a quorum queue's replica
        group records the checkout as the peer's (amqpd.cluster.quorum_group: it
        survives an election), and the peer learns the message's store position
        (+ 1; 0 for other queues) to name it after one (RECLAIM). A group's delivery
        that needs no ack is settled only once it is sent (:meth:`hand`)."""
        group = _group(queue)
        if group is None:
            queue.delivered(entry, acked=no_ack)
            return 0
        group.holder = self.link.peer
        try:
            queue.delivered(entry, acked=False)
        finally:
            group.holder = ""
        position = entry.message.position
        return position + 1 if position >= 0 and not no_ack else 0

    def hand(self, queue: QueueType, entry: QueueEntry, no_ack: bool, frame: bytes,
             proxy: _Proxy | None, expired: Callable[[], None] | None = None) -> None:
        """Send a delivery (``DELIVER`` of ``proxy``'s consumer, or ``GET_OK``) to the
        peer: a quorum queue's once its checkout (recorded by :meth:`delivered`) is
        committed (amqpd.cluster.handout), then settled if it needs no ack. One that
        needs no ack and can no longer be sent (the link went, the consumer was
        cancelled) comes back to the queue as a returned checkout; one that needs an
        ack is the stream's until settled (its close returns it). A get's
        ``expired`` runs instead when the commit takes too long (handout's
        ``GET_COMMIT_WAIT``)."""
        if not isinstance(queue, QuorumQueue) or queue.group is None:
            self.link.send(frame)
            return
        group = queue.group
        quorum = queue
        link = self.link

        def send() -> None:
            gone = link.closed or (proxy is not None and proxy.closed)
            if no_ack and (gone or quorum.deleted):
                if not quorum.deleted:
                    quorum.return_checked_out([entry])
                return
            link.send(frame)
            if no_ack:
                queue.settle([entry])

        group.after_commit(send, expired)

    def reclaim(self, origin: str, positions: list[int]) -> None:
        """The peer's RECLAIM: what the quorum queue's group kept checked out for it
        since the election becomes this stream's deliveries (their ids answered in
        RECLAIMED); what it does not name is returned to the queue."""
        q = self.queue
        group = _group(q)
        got: dict[int, QueueEntry] = {}
        if group is not None and not q.deleted:
            got = group.reclaim(self.link.peer, origin, positions)
        ids: list[int] = []
        news: list[int] = []
        for position in positions:
            entry = got.pop(position, None)  # once, even if named twice
            if entry is None:
                ids.append(0)
                news.append(0)
                continue
            delivery = self.next_id()
            self.unacked[delivery] = entry
            ids.append(delivery)
            news.append(entry.message.position + 1)
        self.link.send(W.encode(W.RECLAIMED, self.stream, origin, positions, ids, news))

    def publish(self, seq: int, persistent: int, exchange: str, key: str, props: bytes,
                body: bytes) -> None:
        """Enqueue as this node's publish pipeline would (limits, store, paging);
        CONFIRM once the store has it (its group commit) or at once."""
        self.credit_due += 1
        q = self.queue
        link, stream = self.link, self.stream
        on_confirm: OnConfirm | None = None
        if seq:
            def on_confirm(error: BaseException | None) -> None:
                link.send(W.encode_confirm(stream, seq, error is None))
        if q.deleted:
            if on_confirm is not None:
                on_confirm(LinkLost("queue deleted"))
            return
        enqueue_here(self.broker, q, Message(exchange, key, props, body, bool(persistent)),
                     on_confirm)

    def publish_many(self, batch: Publishes) -> None:
        """A PUBLISHES frame's records (read by the link as Messages), each as
        :meth:`publish`, in order: the loop is compiled
        (:func:`amqpd.cluster.link_records.enqueue_publishes`)."""
        self.credit_due += len(batch)
        enqueue_publishes(self.broker.publisher, self.queue, batch, self.link, self.stream,
                          _confirmer)

    def settle(self, ids: list[int], how: int) -> None:
        """``how``: SETTLE (acked), REQUEUE or REJECT."""
        entries = [e for e in (self.unacked.pop(i, None) for i in ids) if e is not None]
        if not entries or self.queue.deleted:
            return
        if how == W.REQUEUE:
            self.queue.requeue(entries)
        elif how == W.REJECT:
            self.queue.reject(entries)
        else:
            self.queue.settle(entries)

    def consume(self, cid: int, no_ack: int, credit: int, args: dict[str, Any]) -> None:
        """Attach a consumer standing for one on the user's node, or refuse it as a
        consume here would be refused (CONSUMED with the reply code either way, before
        any delivery: the user's consume-ok waits for it)."""
        q = self.queue
        exclusive = bool(args.get("exclusive"))
        where = f"queue '{q.name}' in vhost '{q.vhost.name}'"
        refusal: tuple[int, str] | None = None
        if q.deleted:
            refusal = 404, f"no {where}"
        elif q.exclusive:
            refusal = 405, f"cannot obtain exclusive access to locked {where}"
        elif q.consumers and (exclusive or any(c.exclusive for c in q.consumers)):
            refusal = 403, f"{where} in exclusive use"
        if refusal is not None:
            self.link.send(W.encode(W.CONSUMED, self.stream, cid, *refusal))
            return
        self.link.send(W.encode(W.CONSUMED, self.stream, cid, 0, ""))
        proxy = _Proxy(self, cid, credit)
        consumer = Consumer(proxy, q, str(args.get("tag", "")), bool(no_ack), exclusive, 0,
                            dict(args.get("arguments") or {}))
        proxy.consumer = consumer
        self.proxies[cid] = proxy
        q.add_consumer(consumer)

    def grant(self, cid: int, n: int) -> None:
        proxy = self.proxies.get(cid)
        if proxy is not None:
            proxy.credit += n
            self.queue.vhost.schedule_dispatch(self.queue)

    def cancel(self, cid: int) -> None:
        proxy = self.proxies.pop(cid, None)
        if proxy is not None and proxy.consumer is not None:
            proxy.closed = True
            self.queue.remove_consumer(proxy.consumer)

    def get(self, req: int, wire_no_ack: int, wait: bool = True) -> None:
        """basic.get from the peer. A quorum queue's group lacking a majority (after a
        restart, until the other members' copies are back) makes a get of a queue with
        ready messages wait for it, bounded (``GroupLeading.when_serving``), as
        ``QuorumQueue.fetch_for`` does for this node's channels (issue 35)."""
        no_ack = bool(wire_no_ack)  # the compiled queue types want a bool, not the u8
        q = self.queue
        group = _group(q)
        if wait:
            q.touch()
            if group is not None and q.message_count and not group.serving():
                group.when_serving(lambda: self._get_after_wait(req, wire_no_ack))
                return
        entry = q.fetch()
        if entry is None:
            self.link.send(W.encode(W.GET_EMPTY, self.stream, req))
            return
        if q.ext is not None:
            q.ext.drop_expired_head()
        delivery = self.next_id()
        position = self.delivered(q, entry, no_ack)
        if not no_ack:
            self.unacked[delivery] = entry
        msg = entry.message
        self.hand(q, entry, no_ack, W.encode_deliver(
            W.GET_OK, self.stream, req, delivery, entry.redelivered, q.message_count,
            msg.exchange, msg.routing_key, msg.properties, self.broker.publisher.body_of(msg),
            position), None, lambda: self._get_expired(req, delivery, entry))

    def _get_expired(self, req: int, delivery: int, entry: QueueEntry) -> None:
        """A get whose checkout was not committed in time (amqpd.cluster.handout): the
        peer is answered get-empty and never learns the delivery, so the message comes
        back to the queue as a returned checkout."""
        q = self.queue
        self.unacked.pop(delivery, None)
        log.warning("quorum queue '%s' in vhost '%s': a basic.get from node %s waited "
                    "for a majority of the members to commit its checkout and is "
                    "answered get-empty; the message goes back to the queue",
                    q.name, q.vhost.name, self.link.peer)
        if isinstance(q, QuorumQueue) and not q.deleted:
            q.return_checked_out([entry])
        if not self.link.closed:
            self.link.send(W.encode(W.GET_EMPTY, self.stream, req))

    def _get_after_wait(self, req: int, wire_no_ack: int) -> None:
        """A waiting get's turn (:meth:`get`): answered as the queue is now, unless the
        stream or its link is gone (nobody to answer; nothing was taken)."""
        if self.closed or self.link.closed:
            return
        if self.queue.deleted:
            self.link.send(W.encode(W.GET_EMPTY, self.stream, req))
            return
        self.get(req, wire_no_ack, wait=False)

    def close(self) -> None:
        """The peer is gone or done: its consumers removed, its unacked put back."""
        self.closed = True
        for cid in list(self.proxies):
            self.cancel(cid)
        entries = list(self.unacked.values())
        self.unacked.clear()
        if entries and not self.queue.deleted:
            self.queue.requeue(entries)

    def stats(self) -> tuple[int, int, int]:
        q = self.queue
        return q.message_count, q.unacked_count, len(q.consumers)


def _confirmer(link: Link, stream: int, seq: int) -> OnConfirm:
    """The callback that answers publish ``seq`` of ``stream`` (CONFIRM) once done
    (looked up when each batch arrives: tests hold the confirms by replacing it)."""
    def on_confirm(error: BaseException | None) -> None:
        link.send(W.encode_confirm(stream, seq, error is None))
    return on_confirm


def enqueue_here(broker: ClusterPort, q: QueueType, message: Message,
                 on_confirm: OnConfirm | None) -> None:
    """A publish forwarded from another node, into local queue ``q``: the publish
    pipeline's tail (``Publisher.enqueue_forwarded``)."""
    broker.publisher.enqueue_forwarded(q, message, on_confirm)


__all__ = ["Served", "enqueue_here"]
