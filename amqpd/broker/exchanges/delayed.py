"""x-delayed-message: hold a message for its ``x-delay`` header (ms), then route it.

Compatible with rabbitmq-delayed-message-exchange: the exchange is declared with an
``x-delayed-type`` argument (direct, topic, fanout, headers, ...) and routes like that
type once a message is due. A message without ``x-delay``, or with ``x-delay <= 0``, is
routed at once. When a delayed message is routed its ``x-delay`` header is negated, as
the plugin does. Beyond the plugin: any delay (40 days and more) at millisecond
resolution, publisher confirms for delayed persistent messages wait for the log, and a
restart loses none of them.

Design: all of an exchange's delayed messages sit in one heap ordered by due time; the
exchange keeps a single entry in the broker's :class:`~amqpd.broker.ttl.TimerService` for
its earliest due time (no timer per message). A persistent message on a durable exchange
is written once to the shared log under the internal store key
``"<vhost>\\x00amq.delayed.<exchange>"``, as the publish pipeline writes a message for a
durable queue (:func:`amqpd.broker.persist.stored_message`: an ENQUEUE_META record with
its publish time), except that the record's expiry is the hold's: its absolute due time
(wall clock, ms). The store keeps that in its index and checkpoint, so at recovery
:func:`recover` rebuilds the heap from the key without reading a single held message
(a log from before kept the due time in the record's exchange field as
``"<exchange>\\x00<due_ms>"``; such records are still read for it). The heap keeps only
a stored message's log position, not its body; when a message is routed its record is
settled under the key. The message's own expiration applies once it is routed to a
queue, counted from then, as with the RabbitMQ plugin.

Routing: a message to hold is routed, like any other, to a destination: the exchange's
:class:`HeldMessages`, a queue type that is never in ``vhost.queues`` and whose
:meth:`~HeldMessages.enqueue` puts the message into the heap. So the publish pipeline
sees a routed message (not unroutable, no alternate exchange), and when the hold wrote
the message to the log the pipeline's confirm waits for the commit, as for a durable
queue.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import struct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from amqpd.broker.exchange import (
    EXCHANGE_TYPES,
    Binding,
    Destination,
    Exchange,
    register_exchange_type,
)
from amqpd.broker.exchanges import internal
from amqpd.broker.message import Message
from amqpd.broker.persist import stored_message
from amqpd.broker.queue_type import QueueType
from amqpd.protocol.constants import FLAG_HEADERS_HI
from amqpd.protocol.errors import CommandInvalid, PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker
    from amqpd.store.api import RecoveredQueue

log = logging.getLogger("amqpd.delayed")

KEY_PREFIX = "amq.delayed."


def store_key(vhost: str, exchange: str) -> str:
    return internal.store_key(vhost, KEY_PREFIX, exchange)


def message_delay(message: Message) -> int:
    """The x-delay header in ms (0 when absent, not an integer, or not positive)."""
    props = message.properties
    if not (props and props[0] & FLAG_HEADERS_HI and b"\x07x-delay" in props):
        return 0
    delay = message.headers.get("x-delay")
    if isinstance(delay, bool) or not isinstance(delay, int) or delay <= 0:
        return 0
    return delay


_INT_FORMATS = {0x62: ">b", 0x73: ">h", 0x49: ">i", 0x6C: ">q"}  # b s I l: signed ints


def _negate_raw(props: bytes) -> bytes | None:
    """Negate x-delay in the raw property bytes (no decode/encode), or None if the header
    cannot be found unambiguously or is not a signed integer type."""
    i = props.find(b"\x07x-delay")
    if i < 0 or props.find(b"\x07x-delay", i + 1) >= 0:
        return None
    j = i + 8
    fmt = _INT_FORMATS.get(props[j]) if j < len(props) else None
    if fmt is None:
        return None
    try:
        value = struct.unpack_from(fmt, props, j + 1)[0]
    except struct.error:
        return None
    if value <= 0:
        return None
    out = bytearray(props)
    struct.pack_into(fmt, out, j + 1, -value)
    return bytes(out)


def _negated(message: Message, exchange: str) -> Message:
    raw = _negate_raw(message.properties)
    if raw is not None:
        msg = Message(exchange, message.routing_key, raw, message.body,
                      persistent=message.persistent)
        return msg
    props = dict(message.props)
    headers = dict(props.get("headers") or {})
    delay = headers.get("x-delay")
    if isinstance(delay, int) and not isinstance(delay, bool):
        headers["x-delay"] = -delay
    props["headers"] = headers
    return message.with_properties(props, exchange=exchange)


class HeldMessages(QueueType):
    """Where a delayed exchange routes a message it holds back: enqueue = hold.

    Not a queue clients see (never in ``vhost.queues``, no consumers); it exists so that
    holding is a routing result like any other. Its count is the exchange's backlog.
    """

    type_name = "x-delayed-held"

    def __init__(self, exchange: DelayedMessageExchange, vhost: VHost) -> None:
        super().__init__(vhost, f"{KEY_PREFIX}{exchange.name}")
        self.exchange = exchange

    @property
    def message_count(self) -> int:
        return self.exchange.pending

    def enqueue(self, message: Message) -> None:
        self.exchange._hold(message, message_delay(message))


@register_exchange_type
class DelayedMessageExchange(Exchange):
    type_name = "x-delayed-message"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self._inner: Exchange | None = None
        # (due monotonic s, seq, log position or -1, size, in-memory message or None)
        self._heap: list[tuple[float, int, int, Message | None]] = []
        self._ids = itertools.count()
        self._armed: float | None = None
        self.broker: Broker | None = None
        self.vhost_obj: VHost | None = None
        self.held_messages: HeldMessages | None = None  # the destination of held ones
        self.held: Message | None = None  # the message the last route() call held back
        self._releasing: Message | None = None  # the due message being routed
        self.closed = False
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ declaration
    def validate(self, arguments: dict[str, Any]) -> None:
        inner = arguments.get("x-delayed-type")
        if inner == self.type_name:
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
        if not isinstance(inner, str):
            raise PreconditionFailed(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type")
        cls = EXCHANGE_TYPES.get(inner)
        if cls is None:
            raise CommandInvalid(f"unknown exchange type '{inner}'")
        self._inner = cls(self.vhost, self.name, durable=self.durable, arguments=arguments)

    def attach(self, broker: Broker, vhost: VHost) -> None:
        """Called once the exchange is declared (policy application hook)."""
        self.broker = broker
        self.vhost_obj = vhost
        self.held_messages = HeldMessages(self, vhost)

    @property
    def key(self) -> str:
        return store_key(self.vhost, self.name)

    @property
    def pending(self) -> int:
        return len(self._heap)

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["messages_delayed"] = len(self._heap)
        return out

    # ------------------------------------------------------------------ bindings: the inner type's
    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        assert self._inner is not None
        self._inner.validate_binding(routing_key, arguments)

    def add_binding(self, binding: Binding) -> None:
        assert self._inner is not None
        self._inner.add_binding(binding)

    def remove_binding(self, binding: Binding) -> None:
        assert self._inner is not None
        self._inner.remove_binding(binding)

    # ------------------------------------------------------------------ routing
    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        assert self._inner is not None
        if message is self._releasing:
            return self._inner.route(message, routing_key)  # due now: no second look
        held = self.held_messages
        if held is None:
            return self._inner.route(message, routing_key)
        if message is self.held:
            return (held,)  # a CC key of a message already held: still one destination
        delay = message_delay(message)
        if delay <= 0:
            return self._inner.route(message, routing_key)
        self.held = message
        return (held,)  # the pipeline enqueues it there: HeldMessages.enqueue holds it

    def _hold(self, message: Message, delay: int) -> None:
        broker = self.broker
        assert broker is not None
        due = time.monotonic() + delay / 1000
        position = -1
        kept: Message | None = message
        store = broker.store
        if message.persistent and self.durable:
            record = stored_message(message)  # stamped as for a durable queue...
            record.expires = record.published + delay  # ...but it expires when due
            position = store.append_enqueue([self.key], record)
            if message.position < 0:  # the confirm waits for this write (publish pipeline)
                message.position = position
            kept = None  # the log has it: keep 3 ints, not the body
        else:
            message._props = None  # the decoded headers cost more than the message itself
        heapq.heappush(self._heap, (due, next(self._ids), position, kept))
        if self._armed is None or due < self._armed:
            self._arm(due)

    def _arm(self, due: float) -> None:
        assert self.broker is not None
        self._armed = due
        self.broker.timers.call_at(due, self._due)

    def _due(self) -> None:
        if self.closed or self.broker is None:
            return
        now = time.monotonic()
        if self._armed is not None and self._armed > now + 0.001:
            return  # stale: an earlier-armed entry that was superseded
        self._armed = None
        heap = self._heap
        broker = self.broker
        store = broker.store
        settled: list[int] = []
        wrote = False
        budget = 5000  # route at most this many per wake-up; the rest on the next tick
        while heap and heap[0][0] <= now + 0.0005 and budget:
            budget -= 1
            _due, _seq, position, message = heapq.heappop(heap)
            if message is None:
                stored = store.read(position)
                message = Message(self.name, stored.routing_key, stored.properties,
                                  stored.body, persistent=True)
            if position >= 0:
                settled.append(position)
            wrote |= self._route_due(message)
        if settled:
            store.append_settle(self.key, settled)
            wrote = True
        if wrote:
            store.commit(lambda _err: None)
        if heap:
            self._arm(heap[0][0] if budget else now)

    def _route_due(self, message: Message) -> bool:
        from amqpd.broker.deadletter import header_routes
        from amqpd.broker.extensions import enqueue_routed

        vhost = self.vhost_obj
        assert vhost is not None and self.broker is not None
        msg = _negated(message, self.name)
        routing_keys = [msg.routing_key]
        if b"\x02CC" in msg.properties:  # decode only when there may be CC keys
            routing_keys.extend(header_routes(msg.headers))
        self._releasing = msg
        try:
            queues = vhost.route(self, msg, routing_keys)
        finally:
            self._releasing = None
        return enqueue_routed(self.broker, msg, queues)

    def close(self) -> None:
        self.closed = True
        self._heap.clear()
        if self.broker is not None and self.durable:
            self.broker.store.drop_queue(self.key)

    # ------------------------------------------------------------------ recovery
    def restore(self, position: int, due_ms: int) -> None:
        delay_s = max(0.0, (due_ms - time.time() * 1000) / 1000)
        due = time.monotonic() + delay_s
        heapq.heappush(self._heap, (due, next(self._ids), position, None))
        if self._armed is None or due < self._armed:
            self._arm(due)


def recover(broker: Broker, key: str, recovered: RecoveredQueue) -> bool:
    """Rebuild a delayed exchange's heap from its store key; False if ``key`` is not one."""
    mine, ex = internal.owner(broker, key, KEY_PREFIX)
    if not mine:
        return False
    store = broker.store
    if not isinstance(ex, DelayedMessageExchange) or ex.broker is None:
        store.drop_queue(key)  # its exchange is gone
        return True
    for position, stamp, extra in zip(recovered.positions, recovered.stamps,
                                      recovered.extra, strict=True):
        if stamp >> 1:  # ENQUEUE_META: the record's expiry is the due time
            ex.restore(position, extra >> 8)
            continue
        # a record from before ENQUEUE_META: "<exchange>\x00<due_ms>" as its exchange
        _, _, due = store.read(position).exchange.rpartition("\x00")
        ex.restore(position, int(due) if due.isdigit() else 0)
    log.info("delayed exchange '%s': %d messages recovered", ex.name, len(recovered.positions))
    return True


__all__ = ["DelayedMessageExchange", "HeldMessages", "message_delay", "recover", "store_key"]
