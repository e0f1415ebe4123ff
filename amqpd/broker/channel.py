"""One AMQP channel's broker-side state: consumers, unacked deliveries, QoS, confirms, tx.

The protocol layer hands this class complete commands; it answers through the
connection's output buffer. Topology, consumer and basic.get commands go through the
public broker API (``broker.api``), so they follow the same rules and error codes as the
HTTP API and plugins; the per-message calls (publish, deliver, settle) go straight to the
compiled publish pipeline and queue types.

Delivery tags are per channel and strictly increasing, so the unacked map (a dict,
insertion-ordered) is also ordered by tag, which makes ``multiple=true`` acks a walk
from the front. Every tag of a stream consumer maps to the same record (the queue's
``shared_unacked``): a stream's ack only counts, so a delivery costs the map its tag.

QoS follows RabbitMQ's reading of basic.qos: ``global=false`` sets the limit for each
consumer created afterwards on this channel; ``global=true`` sets one limit shared by all
consumers of the channel. Both are in force at once only when the global one came last:
RabbitMQ 3.10's ``global=false`` also lifts the channel-wide limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pamqp import commands

from amqpd.broker import reply_to
from amqpd.broker.message import Message
from amqpd.broker.publish import JointConfirm
from amqpd.broker.queue import Consumer, QueueEntry
from amqpd.broker.queue_entry import Unacked
from amqpd.broker.queue_type import QueueType
from amqpd.broker.retry_routes import CAPABILITY as RETRY_OF
from amqpd.broker.retry_routes import RetryRoutes
from amqpd.broker.vhost import generate_name
from amqpd.protocol import codec
from amqpd.protocol import constants as C
from amqpd.protocol.errors import (
    AccessRefused,
    AMQPError,
    CommandInvalid,
    ContentTooLarge,
    NotAllowed,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
)
from amqpd.store.api import StoreError

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.protocol.connection import AMQPConnection
    from amqpd.session import Session

log = logging.getLogger("amqpd.channel")

# A queue with consumers and more ready messages than this puts its publishers in flow.
FLOW_BACKLOG: Final = 10_000

# Deliveries queued for one connection in one tick stop here (no-ack consumers have no
# prefetch limit: without a cap a million-message backlog would be encoded in one go).
DELIVERY_BURST_BYTES: Final = 1 << 20


class Channel:
    def __init__(self, session: Session, number: int) -> None:
        self.session = session
        self.number = number
        self.vhost = session.vhost
        self.api: BrokerAPI = session.broker.api
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, Unacked] = {}
        self.next_tag = 1
        self.prefetch_consumer = 0  # basic.qos global=false
        self.prefetch_channel = 0  # basic.qos global=true
        self.unacked_consumer_count = 0  # unacked deliveries to consumers needing acks
        self.confirm_mode = False
        self._acks: list[int] = []  # confirms of this tick, not yet sent
        self._acked_upto = 0  # every publish seq up to here has been acked or nacked
        self._sent_single: set[int] = set()  # acked/nacked singly above _acked_upto
        self.publish_seq = 0
        self.tx_mode = False
        self.tx_publishes: list[tuple[str, str, bool, bytes, bytes]] = []
        self.tx_acks: list[Callable[[], None]] = []
        self.last_queue: str | None = None
        self.closed = False
        self.flow_active = True
        self.stat_publish = 0
        self.stat_deliver = 0
        self.stat_ack = 0
        # topology -ok frames waiting for their definition change to be durable, with
        # the journal count each one needs (see _reply_ok)
        self._held: list[tuple[int, bytes]] = []
        self.stat_confirm = 0  # publisher confirms (basic.ack) sent; read by http/stats
        self._frames = codec.DeliveryFrames(number)  # what its deliveries repeat
        # a connection that announced the publish_retry_of capability (a shovel): its
        # publishes in confirm mode are routed per queue, and a retry only into the
        # queues that did not take an earlier try (amqpd.broker.retry_routes)
        self.retry_routes: RetryRoutes | None = (
            RetryRoutes(self) if session.conn.capabilities.get(RETRY_OF) is True else None)

    # ------------------------------------------------------------------ plumbing
    @property
    def conn(self) -> AMQPConnection:
        return self.session.conn

    def reply(self, method: Any) -> None:
        self.session.conn.send_method(self.number, method)

    def handle(self, method: Any) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            # a method only the server may send (e.g. channel.flow-ok, basic.deliver)
            raise CommandInvalid(f"unexpected method {method.name} from the client")
        handler(self, method)

    def _reply_ok(self, frame: bytes) -> None:
        """Send a topology method's -ok once every definition change recorded so far
        (this method's included) is durable, and never ahead of an earlier one still
        waiting: a declare-ok promises the object survives a crash (issue 22)."""
        journal = self.session.broker.definitions
        target = journal.recorded
        held = self._held
        if not held and target <= journal.durable:
            self.session.conn.write(frame)
            return
        held.append((target, frame))
        if len(held) == 1:
            journal.when_durable(target, self._release_held)

    def _release_held(self, error: BaseException | None) -> None:
        held = self._held
        if self.closed:
            held.clear()
            return
        if error is not None:  # the client must not believe the change is durable
            held.clear()
            self.session.conn.close(
                541, f"INTERNAL_ERROR - definition change not made durable: {error}")
            return
        journal = self.session.broker.definitions
        write = self.session.conn.write
        i = 0
        while i < len(held) and held[i][0] <= journal.durable:
            write(held[i][1])
            i += 1
        del held[:i]
        if held:
            journal.when_durable(held[-1][0], self._release_held)

    def _queue_name(self, name: str) -> str:
        """An empty queue name means the channel's last declared queue (spec rule)."""
        if name:
            return name
        if self.last_queue is None:
            raise NotFound("no previously declared queue")
        return self.last_queue

    def _check(self, kind: str, resource: str, name: str) -> None:
        self.session.check_permission(kind, resource, name)

    # ------------------------------------------------------------------ channel
    def _flow(self, m: commands.Channel.Flow) -> None:
        if not m.active:
            raise NotImplemented_("active=false")
        self.reply(commands.Channel.FlowOk(active=True))

    # ------------------------------------------------------------------ exchange
    def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        if not m.passive:
            self._check("configure", "exchange", m.exchange)
            ae = (m.arguments or {}).get("alternate-exchange")
            if isinstance(ae, str):  # RabbitMQ: read on the exchange, write on its AE
                self._check("read", "exchange", m.exchange)
                self._check("write", "exchange", ae)
        self.api.declare_exchange(
            self.vhost, m.exchange, m.exchange_type, passive=m.passive, durable=m.durable,
            auto_delete=m.auto_delete, internal=m.internal, arguments=m.arguments,
        )
        if not m.nowait:
            self._reply_ok(codec.method_frame(self.number, C.EXCHANGE_DECLARE_OK))

    def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self._check("configure", "exchange", m.exchange)
        self.api.delete_exchange(self.vhost, m.exchange, if_unused=m.if_unused)
        if not m.nowait:
            self._reply_ok(codec.method_frame(self.number, C.EXCHANGE_DELETE_OK))

    def _exchange_bind(self, m: commands.Exchange.Bind) -> None:
        self._check("write", "exchange", m.destination)
        self._check("read", "exchange", m.source)
        self.api.bind(self.vhost, "exchange", m.destination, m.source, m.routing_key,
                      m.arguments, username=self.session.username)  # + topic read
        if not m.nowait:
            self._reply_ok(codec.method_frame(self.number, C.EXCHANGE_BIND_OK))

    def _exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        self._check("write", "exchange", m.destination)
        self._check("read", "exchange", m.source)
        self.api.unbind(self.vhost, "exchange", m.destination, m.source, m.routing_key,
                        m.arguments, username=self.session.username)  # + topic read
        if not m.nowait:
            self._reply_ok(codec.method_frame(self.number, C.EXCHANGE_UNBIND_OK))

    # ------------------------------------------------------------------ queue
    def _queue_declare(self, m: commands.Queue.Declare) -> None:
        name = m.queue
        server_named = False
        if not name:
            if m.passive:
                pass  # RabbitMQ: no "last queue" shortcut here, so this is 404 for ''
            else:
                name = generate_name("amq.gen-")
                server_named = True
        if not m.passive:
            self._check("configure", "queue", name)
            dlx = (m.arguments or {}).get("x-dead-letter-exchange")
            if isinstance(dlx, str):  # RabbitMQ: read on the queue, write on its DLX
                self._check("read", "queue", name)
                self._check("write", "exchange", dlx)
        existing = self.api.find_queue(self.vhost.name, name)
        # a queue led by another node may be stale in this node's view (a delete made
        # there not seen yet, issue 28): the declare goes on once the queue's record
        # has been read again
        if existing is not None and existing.refreshes_view(
                lambda: self._declare_refreshed(m, name, server_named)):
            return
        self._declare(m, name, server_named)

    def _declare_refreshed(self, m: commands.Queue.Declare, name: str,
                           server_named: bool) -> None:
        if self.closed:
            return
        try:
            self._declare(m, name, server_named)
        except AMQPError as exc:
            exc.class_id, exc.method_id = 50, 10  # queue.declare
            self.session.conn._close_channel(self.number, exc)

    def _declare(self, m: commands.Queue.Declare, name: str, server_named: bool) -> None:
        owner = self.session
        q = self.api.declare_queue(
            self.vhost, name, passive=m.passive, durable=m.durable,
            exclusive_owner=owner if m.exclusive else None, auto_delete=m.auto_delete,
            arguments=m.arguments, owner=owner, server_named=server_named,
        )
        if q.exclusive_owner is owner and m.exclusive:
            self.session.own_queue(q)
        self.last_queue = q.name
        if not m.nowait:  # the counts as the queue has them (its leader, if elsewhere)
            name = q.name
            q.counts_for(lambda ready, consumers: self._declare_ok(name, ready, consumers))

    def _declare_ok(self, name: str, ready: int, consumers: int) -> None:
        if self.closed:
            return
        args = codec.shortstr(name) + ready.to_bytes(4, "big") + consumers.to_bytes(4, "big")
        self._reply_ok(codec.method_frame(self.number, C.QUEUE_DECLARE_OK, args))

    def _queue_bind(self, m: commands.Queue.Bind) -> None:
        queue = self._queue_name(m.queue)
        routing_key = m.routing_key if (m.routing_key or m.queue) else queue
        self._check("write", "queue", queue)
        self._check("read", "exchange", m.exchange)
        self.api.bind(self.vhost, "queue", queue, m.exchange, routing_key, m.arguments,
                      owner=self.session, username=self.session.username)  # + topic read
        if not m.nowait:
            self._reply_ok(codec.method_frame(self.number, C.QUEUE_BIND_OK))

    def _queue_unbind(self, m: commands.Queue.Unbind) -> None:
        queue = self._queue_name(m.queue)
        routing_key = m.routing_key if (m.routing_key or m.queue) else queue
        self._check("write", "queue", queue)
        self._check("read", "exchange", m.exchange)
        self.api.unbind(self.vhost, "queue", queue, m.exchange, routing_key, m.arguments,
                        owner=self.session, username=self.session.username)  # + topic read
        self._reply_ok(codec.method_frame(self.number, C.QUEUE_UNBIND_OK))

    def _queue_purge(self, m: commands.Queue.Purge) -> None:
        queue = self._queue_name(m.queue)
        self._check("read", "queue", queue)
        n = self.api.purge_queue(self.vhost, queue, owner=self.session)
        if not m.nowait:
            self._reply_ok(codec.method_frame(self.number, C.QUEUE_PURGE_OK,
                                              n.to_bytes(4, "big")))

    def _queue_delete(self, m: commands.Queue.Delete) -> None:
        queue = self._queue_name(m.queue)
        self._check("configure", "queue", queue)
        existing = self.api.find_queue(self.vhost.name, queue)
        n = self.api.delete_queue(self.vhost, queue, if_unused=m.if_unused,
                                  if_empty=m.if_empty, owner=self.session)
        if m.nowait:
            return
        frame = codec.method_frame(self.number, C.QUEUE_DELETE_OK, n.to_bytes(4, "big"))
        # a queue led by another node: its leader deletes it and tells the cluster,
        # delete-ok once that is seen here
        if existing is not None and existing.confirms_delete(
                lambda error: self._remote_deleted(frame, error)):
            return
        self._reply_ok(frame)

    def _remote_deleted(self, frame: bytes, error: BaseException | None) -> None:
        if self.closed:
            return
        if error is not None:
            self.session.conn.close(
                541, f"INTERNAL_ERROR - queue delete not confirmed by the cluster: {error}")
            return
        self._reply_ok(frame)

    # ------------------------------------------------------------------ basic: qos/consume
    def _basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise NotImplemented_(f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.prefetch_channel = m.prefetch_count
        else:
            # RabbitMQ 3.10 also lifts the channel-wide limit here, so global=true followed
            # by global=false leaves only per-consumer limits (global=false first keeps both)
            self.prefetch_consumer = m.prefetch_count
            self.prefetch_channel = 0
        self.reply(commands.Basic.QosOk())
        self._schedule_all()

    def _basic_consume(self, m: commands.Basic.Consume) -> None:
        queue_name = self._queue_name(m.queue)
        if queue_name == reply_to.PSEUDO_QUEUE:
            reply_to.consume(self, m.consumer_tag, m.no_ack, m.nowait)
            return
        self._check("read", "queue", queue_name)
        api = self.api
        api.check_exclusive(api.queue(self.vhost, queue_name), self.session)  # 404, 405
        tag = m.consumer_tag or generate_name("amq.ctag-")
        if tag in self.consumers:
            raise NotAllowed(f"attempt to reuse consumer tag '{tag}'",
                             C.class_of(C.BASIC_CONSUME), C.method_of(C.BASIC_CONSUME))
        consumer = api.consume(self.vhost, queue_name, self, tag, no_ack=m.no_ack,
                               exclusive=m.exclusive, prefetch=self.prefetch_consumer,
                               arguments=m.arguments, owner=self.session,
                               global_prefetch=self.prefetch_channel)
        self.consumers[tag] = consumer
        # consume-ok once the queue accepted it (its leader, if led by another node)
        nowait = m.nowait
        consumer.queue.consume_for(
            consumer, lambda error: self._consumed(consumer, nowait, error))

    def _consumed(self, consumer: Consumer, nowait: bool,
                  error: BaseException | None) -> None:
        """The queue's answer to a consume (its leader's for a queue led by another
        node; RabbitMQ's channel waits for its queue's answer too): consume-ok, or the
        channel error it gave."""
        if self.closed or self.consumers.get(consumer.tag) is not consumer:
            return
        if error is not None:
            del self.consumers[consumer.tag]
            exc = error if isinstance(error, AMQPError) else NotFound(str(error))
            exc.class_id = C.class_of(C.BASIC_CONSUME)
            exc.method_id = C.method_of(C.BASIC_CONSUME)
            self.session.conn._close_channel(self.number, exc)
            return
        if not nowait:
            self.session.conn.write(codec.method_frame(self.number, C.BASIC_CONSUME_OK,
                                                        consumer.tag_bytes))

    def _basic_cancel(self, m: commands.Basic.Cancel) -> None:
        tag = m.consumer_tag or ""
        consumer = self.consumers.pop(tag, None)
        if not m.nowait:
            self.session.conn.write(
                codec.method_frame(self.number, C.BASIC_CANCEL_OK, codec.shortstr(tag))
            )
        if consumer is not None:
            self.api.cancel(consumer)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        """The queue went away: tell the client, if it said it understands basic.cancel."""
        if self.consumers.pop(consumer.tag, None) is None or self.closed:
            return
        if not self.session.conn.capabilities.get("consumer_cancel_notify"):
            return
        # RabbitMQ's channel learns of the queue's end after the fact, so a channel that
        # deleted the queue it consumes from gets queue.delete-ok first, then basic.cancel
        # (py-amqp waits for delete-ok and fails on a cancel before it)
        loop = self.session.broker._loop
        if loop is None:
            self._send_cancel(consumer.tag_bytes)
        else:
            loop.call_soon(self._send_cancel, consumer.tag_bytes)

    def _send_cancel(self, tag_bytes: bytes) -> None:
        # nowait=true, as RabbitMQ sends it: a client must not answer with cancel-ok
        # (@cloudamqp/amqp-client would, and both brokers close on that with 503)
        if not self.closed:
            self.session.conn.write(codec.method_frame(self.number, C.BASIC_CANCEL,
                                                        tag_bytes + b"\x01"))

    # ------------------------------------------------------------------ delivery
    def can_deliver(self, consumer: Consumer) -> bool:
        session = self.session
        if self.closed or not self.flow_active or session.blocked_delivery:
            return False
        if session.conn.out_bytes > DELIVERY_BURST_BYTES:
            # enough for this tick: resume after the transport has taken it
            session.delivery_stalled = True
            return False
        if consumer.no_ack:
            return True
        return not self.prefetch_channel or self.unacked_consumer_count < self.prefetch_channel

    def deliver(self, consumer: Consumer, queue: QueueType, entry: QueueEntry) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        msg = entry.message
        self.session.conn.write_delivery(
            self._frames, consumer.tag_bytes, tag, entry.redelivered, msg.exchange,
            msg.routing_key, msg.properties, self.session.body_of(msg))
        self.stat_deliver += 1
        if consumer.no_ack:
            queue.delivered(entry, acked=True)
        else:
            consumer.unacked += 1
            self.unacked_consumer_count += 1
            shared = consumer.shared_unacked  # a stream's: the ack only counts
            self.unacked[tag] = shared if shared is not None else \
                Unacked(queue, entry, consumer)
            queue.delivered(entry, acked=False)

    def _basic_get(self, m: commands.Basic.Get) -> None:
        queue_name = self._queue_name(m.queue)
        self._check("read", "queue", queue_name)
        q = self.api.queue(self.vhost, queue_name)
        self.api.check_exclusive(q, self.session)
        q.touch()  # basic.get counts as use for x-expires
        if q.defers_get():  # led by another node, or a checkout to commit first
            q.fetch_for(self, m.no_ack)
            return
        entry = q.fetch()
        if entry is not None and q.ext is not None:
            q.ext.drop_expired_head()  # RabbitMQ's message-count leaves them out
        self.answer_get(q, entry, m.no_ack, q.message_count)

    def answer_get(self, q: QueueType, entry: QueueEntry | None, no_ack: bool,
                   message_count: int) -> None:
        """basic.get-ok with ``entry`` (get-empty for None), which leaves ``q`` now."""
        if entry is None:
            self.session.conn.write(codec.method_frame(self.number, C.BASIC_GET_EMPTY, b"\x00"))
            return
        tag = self.next_tag
        self.next_tag = tag + 1
        msg = entry.message
        conn = self.session.conn
        conn.write(
            codec.get_ok_method(self.number, tag, entry.redelivered, msg.exchange,
                                msg.routing_key, message_count)
            + codec.content_frames(self.number, C.CLASS_BASIC, msg.properties,
                                   self.session.body_of(msg),
                                   conn.frame_max)
        )
        if no_ack:
            q.delivered(entry, acked=True)
        else:
            self.unacked[tag] = Unacked(q, entry, None)
            q.delivered(entry, acked=False)

    # ------------------------------------------------------------------ settlement
    def _take_unacked(self, tag: int, multiple: bool) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                taken = list(unacked.values())
                unacked.clear()
                return taken
            if tag not in unacked:  # RabbitMQ: even with multiple, the tag itself must exist
                raise PreconditionFailed(f"unknown delivery tag {tag}")
            if tag == self.next_tag - 1:  # the last one sent: everything goes
                taken = list(unacked.values())
                unacked.clear()
                return taken
            keys = []
            for key in unacked:
                if key > tag:
                    break
                keys.append(key)
            return [unacked.pop(k) for k in keys]
        item = unacked.pop(tag, None)
        if item is None:
            raise PreconditionFailed(f"unknown delivery tag {tag}")
        return [item]

    def _release(self, items: list[Unacked]) -> dict[QueueType, list[QueueEntry]]:
        """Credit goes back to consumers; entries grouped by queue."""
        by_queue: dict[QueueType, list[QueueEntry]] = {}
        for item in items:
            consumer = item.consumer
            if consumer is not None:
                consumer.unacked -= 1
                self.unacked_consumer_count -= 1
            by_queue.setdefault(item.queue, []).append(item.entry)
        return by_queue

    def ack(self, tag: int, multiple: bool) -> None:
        if self.tx_mode:
            self._take_check(tag, multiple)
            self.tx_acks.append(lambda: self._do_ack(tag, multiple))
            return
        self._do_ack(tag, multiple)

    def _take_check(self, tag: int, multiple: bool) -> None:
        """In a transaction, validate the tag now (errors are immediate in RabbitMQ)."""
        if multiple and tag == 0:
            return
        if tag not in self.unacked:
            raise PreconditionFailed(f"unknown delivery tag {tag}")

    def _do_ack(self, tag: int, multiple: bool) -> None:
        items = self._take_unacked(tag, multiple)
        self.stat_ack += len(items)
        for queue, entries in self._release(items).items():
            queue.settle(entries)

    def _basic_reject(self, m: commands.Basic.Reject) -> None:
        self._reject(m.delivery_tag or 0, False, m.requeue)

    def _basic_nack(self, m: commands.Basic.Nack) -> None:
        self._reject(m.delivery_tag, m.multiple, m.requeue)

    def _reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        if self.tx_mode:
            self._take_check(tag, multiple)
            self.tx_acks.append(lambda: self._do_reject(tag, multiple, requeue))
            return
        self._do_reject(tag, multiple, requeue)

    def _do_reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        items = self._take_unacked(tag, multiple)
        for item in items:  # a stream refuses (540)
            item.queue.check_return("basic.nack")
        for queue, entries in self._release(items).items():
            if requeue and not queue.deleted:
                queue.requeue(entries)
            else:
                queue.reject(entries)

    def _basic_recover(self, m: commands.Basic.Recover) -> None:
        if not m.requeue:
            raise NotImplemented_("requeue=false")
        for item in self.unacked.values():  # a stream refuses (540)
            item.queue.check_return("basic.recover")
        self.requeue_all()
        self.reply(commands.Basic.RecoverOk())

    def _basic_recover_async(self, m: commands.Basic.RecoverAsync) -> None:
        if not m.requeue:
            raise NotImplemented_("requeue=false")
        self.requeue_all()

    def requeue_all(self) -> None:
        items = list(self.unacked.values())
        self.unacked.clear()
        for queue, entries in self._release(items).items():
            if not queue.deleted:
                queue.requeue(entries)

    def _schedule_all(self) -> None:
        for consumer in self.consumers.values():
            self.vhost.schedule_dispatch(consumer.queue)

    # ------------------------------------------------------------------ publish
    def publish(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool,
                properties: bytes, body: bytes) -> None:
        if immediate:
            raise NotImplemented_("immediate=true")
        self.session.check_publish(exchange)
        ex = self.vhost.get_exchange(exchange)
        if ex.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange '{exchange}' in vhost '{self.vhost.name}'"
            )
        persistent = False
        if len(properties) > 1 and properties[0] & C.FLAG_DELIVERY_MODE_HI:
            mode = codec.delivery_mode(properties)
            # RabbitMQ 3.10 refuses any value but these two
            if mode != C.DELIVERY_TRANSIENT and mode != C.DELIVERY_PERSISTENT:
                raise PreconditionFailed(f"invalid message: {{delivery_mode_unknown,{mode}}}")
            persistent = mode == C.DELIVERY_PERSISTENT
        if ex.type_name == "topic":
            self.session.check_topic("write", exchange, routing_key)
        if self.confirm_mode:
            self.publish_seq += 1
        self.stat_publish += 1
        if self.tx_mode:
            self.tx_publishes.append((exchange, routing_key, mandatory, properties, body))
            return
        if self.retry_routes is not None and self.confirm_mode:  # the one test others pay
            self.retry_routes.publish(exchange, routing_key, mandatory, properties, body,
                                      self.publish_seq, persistent)
            return
        self._route(exchange, routing_key, mandatory, properties, body,
                    self.publish_seq if self.confirm_mode else 0, persistent)

    def _route(self, exchange: str, routing_key: str, mandatory: bool, properties: bytes,
               body: bytes, seq: int, persistent: bool | None = None,
               on_done: Callable[[BaseException | None], None] | None = None) -> None:
        """``on_done``: a transaction's part (tx.commit waits for every message's
        leader, :meth:`_tx_commit`), in place of a confirm for ``seq``."""
        msg = Message(exchange, routing_key, properties, body, persistent)
        if len(properties) > 1 and properties[0] & C.FLAG_REPLY_TO_HI:  # direct reply-to?
            msg = reply_to.rewrite(self, msg)
        if mandatory:
            self._route_mandatory(exchange, routing_key, properties, body, seq, msg,
                                  on_done)
            return
        publisher = self.session.broker.publisher  # the pipeline itself (compiled)
        on_confirm = on_done if on_done is not None else (
            self._on_durable(seq) if seq else None)
        queues = publisher.publish(self.vhost, exchange, msg, self.session.username,
                                   on_confirm=on_confirm)
        self._credit_flow(queues)

    def _route_mandatory(self, exchange: str, routing_key: str, properties: bytes,
                         body: bytes, seq: int, msg: Message,
                         on_done: Callable[[BaseException | None], None] | None) -> None:
        """Apart from :meth:`_route`: compiled, a function with a nested one builds its
        closure environment on every call, taken or not."""
        publisher = self.session.broker.publisher
        on_confirm = on_done if on_done is not None else (
            self._on_durable(seq) if seq else None)

        def unroutable() -> None:  # basic.return precedes the confirm, as in RabbitMQ
            self.session.conn.write(
                codec.return_method(self.number, 312, "NO_ROUTE", exchange, routing_key)
                + codec.content_frames(self.number, C.CLASS_BASIC, properties, body,
                                       self.session.conn.frame_max)
            )

        queues = publisher.publish(self.vhost, exchange, msg, self.session.username,
                                   on_confirm=on_confirm, on_unroutable=unroutable)
        self._credit_flow(queues)

    def _credit_flow(self, queues: list[QueueType]) -> None:
        """Credit flow, the single-process way: a connection whose last publish went into a
        queue whose consumers are falling behind is handled in smaller slices per loop
        turn, so deliveries and acks get their share of the CPU instead of a backlog
        growing (RabbitMQ's credit flow gives the same balance between its processes).
        Publishers are slowed, never stopped: with slow consumers and an idle broker the
        small slices still come round at once."""
        flow = False
        for q in queues:
            # the consumers list first: a field read that rules out every publish to a
            # queue nobody consumes from (message_count is a method call, interpreted
            # for a stream), then message_count, which rules out nearly every other
            if q.consumers and q.message_count > FLOW_BACKLOG and \
                    q.flow_backlog() > FLOW_BACKLOG:
                flow = True
                break
        self.session.conn.in_flow = flow

    def _on_durable(self, seq: int) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            self.confirm(seq, error is None)
        return done

    def confirm(self, seq: int, ok: bool) -> None:
        """Queue a publisher confirm; the tick's acks go out coalesced (see _flush_acks)."""
        if self.closed:
            return
        if not ok:
            self._flush_acks()  # keep order: earlier acks first
            self._sent_single.add(seq)
            self.session.conn.write(codec.nack_method(self.number, seq, False))
            return
        self.stat_confirm += 1
        if not self._acks:
            loop = self.session.broker._loop
            if loop is not None:
                loop.call_soon(self._flush_acks)
        self._acks.append(seq)
        if self.session.broker._loop is None:
            self._flush_acks()

    def _flush_acks(self) -> None:
        """Send the pending acks: one ``multiple=true`` ack for a run that continues from
        everything already confirmed, single acks otherwise (never re-acking a tag)."""
        acks = self._acks
        if not acks or self.closed:
            acks.clear()
            return
        acks.sort()
        self._acks = []
        conn = self.session.conn
        single = self._sent_single
        i, n = 0, len(acks)
        while i < n:
            j = i
            while j + 1 < n and acks[j + 1] == acks[j] + 1:
                j += 1
            start, end = acks[i], acks[j]
            if start == self._acked_upto + 1:
                conn.write(codec.ack_method(self.number, end, end > start))
                upto = end
                while upto + 1 in single:  # tags confirmed singly earlier: now covered
                    single.discard(upto + 1)
                    upto += 1
                self._acked_upto = upto
            else:
                for seq in range(start, end + 1):
                    conn.write(codec.ack_method(self.number, seq, False))
                    single.add(seq)
            i = j + 1

    def _confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx_mode:
            raise PreconditionFailed("cannot switch from tx to confirm mode")
        self.confirm_mode = True
        if not m.nowait:
            self.reply(commands.Confirm.SelectOk())

    # ------------------------------------------------------------------ tx
    def _tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirm_mode:
            raise PreconditionFailed("cannot switch from confirm to tx mode")
        self.tx_mode = True
        self.reply(commands.Tx.SelectOk())

    def _tx_commit(self, m: commands.Tx.Commit) -> None:
        if not self.tx_mode:
            raise PreconditionFailed("channel is not transactional")
        publishes, self.tx_publishes = self.tx_publishes, []
        acks, self.tx_acks = self.tx_acks, []
        publisher = self.session.broker.publisher
        # each publish answers as a confirm would: a queue's refusal (x-overflow
        # reject-publish) fails the commit; in a cluster, commit-ok also waits for the
        # queues led by other nodes (their leaders' group commits); and for this node's
        # store (after_commit)
        joint: JointConfirm | None = None
        if publishes:
            joint = JointConfirm(self._tx_committed, len(publishes) + 1)
        for exchange, routing_key, mandatory, properties, body in publishes:
            if exchange not in self.vhost.exchanges:
                raise NotFound(f"no exchange '{exchange}' in vhost '{self.vhost.name}'")
            self._route(exchange, routing_key, mandatory, properties, body, 0, None,
                        joint.part if joint is not None else None)
        for action in acks:
            action()
        publisher.after_commit(joint.part if joint is not None else self._tx_committed)

    def _tx_committed(self, error: BaseException | None) -> None:
        """commit-ok only once the transaction's persistent messages are durable; if the
        store could not write them, the publisher must not believe they are: the
        connection is closed with 541 (nothing else tells a tx client). A message a
        queue refused (its leader node lost, a length limit) fails the transaction as
        RabbitMQ 3.10 does: channel error 406 "partial tx completion"."""
        if self.closed:
            return
        if error is None:
            self.reply(commands.Tx.CommitOk())
            return
        conn = self.session.conn
        if isinstance(error, StoreError):
            conn.close(541, f"INTERNAL_ERROR - transaction not made durable: {error}")
        else:
            conn._close_channel(self.number, PreconditionFailed("partial tx completion"))

    def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if not self.tx_mode:
            raise PreconditionFailed("channel is not transactional")
        self.tx_publishes.clear()
        self.tx_acks.clear()
        self.reply(commands.Tx.RollbackOk())

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Channel closed (by either side, or its connection went): release everything."""
        if self.closed:
            return
        self.closed = True
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self.requeue_all()
        self.tx_publishes.clear()
        self.tx_acks.clear()


# Method class -> handler: one table for all channels (not a dict of bound methods each).
_HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    commands.Channel.Flow: Channel._flow,
    commands.Exchange.Declare: Channel._exchange_declare,
    commands.Exchange.Delete: Channel._exchange_delete,
    commands.Exchange.Bind: Channel._exchange_bind,
    commands.Exchange.Unbind: Channel._exchange_unbind,
    commands.Queue.Declare: Channel._queue_declare,
    commands.Queue.Bind: Channel._queue_bind,
    commands.Queue.Unbind: Channel._queue_unbind,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: Channel._queue_delete,
    commands.Basic.Qos: Channel._basic_qos,
    commands.Basic.Consume: Channel._basic_consume,
    commands.Basic.Cancel: Channel._basic_cancel,
    commands.Basic.Get: Channel._basic_get,
    commands.Basic.Reject: Channel._basic_reject,
    commands.Basic.Nack: Channel._basic_nack,
    commands.Basic.Recover: Channel._basic_recover,
    commands.Basic.RecoverAsync: Channel._basic_recover_async,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}

__all__ = ["Channel", "ContentTooLarge"]
