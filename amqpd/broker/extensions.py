"""Per-queue extension state: what a queue with TTL, limits, priorities, a DLX, x-expires or
single-active-consumer carries, and the glue between :class:`Queue` and the extension
modules (:mod:`ttl`, :mod:`limits`, :mod:`priority`, :mod:`deadletter`).

A queue with none of these has ``queue.ext is None`` and pays one attribute test on
enqueue/take. The only thing that gives a plain queue an ``ext`` lazily is a message with
an ``expiration`` property (a raw flag-bit test, no decoding).
"""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING, Any

from amqpd.broker import limits, rawprops
from amqpd.broker.exchange import Exchange
from amqpd.broker.message import LoggedMessage, Message
from amqpd.broker.policy import OVERFLOW_VALUES, QueueOptions, alternate_exchange, queue_options
from amqpd.broker.priority import PriorityReady
from amqpd.broker.queue import Consumer, Queue, QueueEntry
from amqpd.broker.queue_entry import TimedEntry, expiry_of
from amqpd.broker.queue_type import QueueType
from amqpd.broker.ttl import parse_expiration
from amqpd.protocol.constants import FLAG_EXPIRATION_HI, FLAG_HEADERS_HI, FLAG_PRIORITY_HI
from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker



class QueueExt:
    def __init__(self, queue: Queue, opts: QueueOptions) -> None:
        self.queue = queue
        self.opts = opts
        self.rejects = False
        self.sac = False
        self.max_priority = 0
        self.expiry_armed: float | None = None
        self.last_used = time.monotonic()
        self.expires_armed: float | None = None
        self.sac_order: list[Consumer] = []
        self.sac_draining: Consumer | None = None
        self.timed = False  # some entry ever had an expiry (else takes skip the check)
        # recovered entries are kept cold (log-only); their TTL counts from recovery and
        # is worked out when one reaches the head
        self.cold_since: float | None = None
        self.cold_last = -1  # sequence number of the last recovered entry
        # recovered entries whose record carried their publish time: position ->
        # monotonic deadline (absent: no TTL); cold_legacy: some record did not say,
        # so those entries fall back to reading the message at the head
        self.cold_deadlines: dict[int, float] = {}
        self.cold_legacy = False
        self.ttl_seen = False  # some entry of this queue ever had an expiry
        self.plain = False
        self.configure(opts)

    def configure(self, opts: QueueOptions) -> None:
        q = self.queue
        opts = q.effective_options(opts)  # as the queue's type applies them
        self.opts = opts
        self.rejects = opts.overflow != "drop-head" and (
            opts.max_length is not None or opts.max_length_bytes is not None)
        self.sac = opts.single_active_consumer
        self.plain = not opts.any
        if opts.max_priority and not isinstance(q.ready, PriorityReady):
            self.max_priority = opts.max_priority
            ready = PriorityReady(opts.max_priority)
            for entry in q.ready:
                ready.append(self._timed(entry))
            q.ready = ready
        if opts.expires is not None:
            self._arm_expires(self.last_used + opts.expires / 1000)
        if q.ready:
            self.arm_expiry_at_head()
            limits.enforce(q)

    def _timed(self, entry: QueueEntry) -> TimedEntry:
        if isinstance(entry, TimedEntry):
            return entry
        return TimedEntry(entry.message, entry.seq, entry.redelivered, None,
                          self._priority(entry.message))

    def _priority(self, message: Message) -> int:
        if not self.max_priority:
            return 0
        props = message.properties
        if not (props and props[0] & FLAG_PRIORITY_HI):
            return 0
        value = message.props.get("priority") or 0
        return value if value <= self.max_priority else self.max_priority

    def _expiry(self, message: Message, now: float) -> float | None:
        ttl = self.opts.message_ttl
        props = message.properties
        if props and props[0] & FLAG_EXPIRATION_HI:
            try:
                per_message = parse_expiration(message.props.get("expiration"))
            except PreconditionFailed:
                per_message = None
            if per_message is not None and (ttl is None or per_message < ttl):
                ttl = per_message
        if ttl is None:
            return None
        return now + ttl / 1000

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, message: Message) -> None:
        q = self.queue
        if self.plain and (type(message) is LoggedMessage or not (
                message.properties and message.properties[0] & FLAG_EXPIRATION_HI)):
            q.ready.append(QueueEntry(message, q._seq.take()))  # nothing to track
            q.ready_bytes += message.size
            q.stat_publish += 1
            if q.consumers:
                q.vhost.schedule_dispatch(q)
            return
        now = time.monotonic()
        expires = self._expiry(message, now)
        if ((expires is not None and expires <= now) or self._too_big_alone(message)) and \
                self._deliver_at_once(message, expires):
            return
        q.ready.append(TimedEntry(message, q._seq.take(), False, expires,
                                  self._priority(message)))
        q.ready_bytes += message.size
        q.stat_publish += 1
        if expires is not None:
            self.timed = self.ttl_seen = True
            if expires <= now:  # TTL 0: gone now if it is at the head (RabbitMQ)
                self.drop_expired_head()
            elif self.expiry_armed is None or expires < self.expiry_armed:
                self._arm_expiry(expires)
        if self.opts.max_length is not None or self.opts.max_length_bytes is not None:
            limits.enforce(q)
        if q.consumers:
            q.vhost.schedule_dispatch(q)

    def _too_big_alone(self, message: Message) -> bool:
        """Would drop-head trim this message even from an empty queue?"""
        opts = self.opts
        return not self.rejects and (opts.max_length == 0 or (
            opts.max_length_bytes is not None and message.size > opts.max_length_bytes))

    def _deliver_at_once(self, message: Message, expires: float | None) -> bool:
        """RabbitMQ offers a new message to a waiting consumer before it is ever queued
        (the queue is empty whenever a consumer has credit). That decides the fate of a
        message the queue could not keep: TTL 0 (expired on arrival) or over a length
        limit of 0. Such a message goes out now or never; anything else is dispatched at
        the end of the tick as usual."""
        q = self.queue
        if q.ready or not q.consumers:
            return False
        consumer = q._next_consumer()
        if consumer is None:
            return False
        q.stat_publish += 1
        consumer.channel.deliver(consumer, q, TimedEntry(
            loaded(message), q._seq.take(), False, expires, self._priority(message)))
        return True

    def restore(self, message: Message, redelivered: bool, published: int = 0,
                extra: int = 0) -> None:
        """A recovered message of a priority queue (the level needs the priority; other
        queues keep recovered entries cold and call :meth:`mark_cold`). With the
        record's ``published``/``extra`` nothing is read; a record from before they
        were logged is read for both, and its TTL counts again from recovery."""
        q = self.queue
        if published:
            expires = self._recovered_deadline(published, extra)
            priority = min(extra & 0xFF, self.max_priority)
        else:
            expires = self._expiry(message, time.monotonic())
            priority = self._priority(message)
        q.ready.append(TimedEntry(message, q._seq.take(), redelivered, expires, priority))
        q.ready_bytes += message.size
        if expires is not None:
            self.timed = True
            if self.expiry_armed is None or expires < self.expiry_armed:
                self._arm_expiry(expires)

    def _recovered_deadline(self, published: int, extra: int) -> float | None:
        """Monotonic deadline of a recovered message from its publish time (wall ms)
        and its own expiry: the clock kept running while the broker was down."""
        deadline = extra >> 8  # per-message expiry, wall ms (0: none)
        ttl = self.opts.message_ttl
        if ttl is not None and (not deadline or published + ttl < deadline):
            deadline = published + ttl
        if not deadline:
            return None
        self.ttl_seen = self.timed = True
        from amqpd.broker.persist import monotonic_deadline

        return monotonic_deadline(deadline)

    def mark_cold(self, position: int = -1, published: int = 0, extra: int = 0) -> None:
        """A recovered entry was added as it is (log-only). Its deadline comes from the
        record (publish time and expiry); for a record from before those were logged,
        TTL counts from recovery and is worked out when it reaches the head (no read
        per recovered message)."""
        if published:
            deadline = self._recovered_deadline(published, extra)
            if deadline is not None:
                self.cold_deadlines[position] = deadline
        else:
            self.cold_legacy = True
        if self.cold_since is None:
            self.cold_since = time.monotonic()
            self.timed = True
            self._arm_expiry(self.cold_since)  # look at the head once recovery is done

    def requeue(self, entries: list[QueueEntry]) -> None:
        """Entries go back to their original places (per priority level in a priority
        queue); an expired one is then dropped from the head as RabbitMQ does."""
        q = self.queue
        ready: Any = q.ready
        for entry in sorted(entries, key=lambda e: e.seq, reverse=True):
            q.unacked_count -= 1
            entry.redelivered = True
            q.ready_bytes += entry.message.size
            if isinstance(ready, PriorityReady):
                ready.put_back(self._timed(entry))
            elif not ready or entry.seq < ready[0].seq:
                ready.appendleft(entry)
            elif entry.seq > ready[-1].seq:
                ready.append(entry)
            elif hasattr(ready, "insert_by_seq"):
                ready.insert_by_seq(entry)
            else:
                seqs = [e.seq for e in ready]
                ready.insert(bisect.bisect_left(seqs, entry.seq), entry)
        self.arm_expiry_at_head()
        if q.consumers:
            q.vhost.schedule_dispatch(q)

    # ------------------------------------------------------------------ expiry at the head
    def drop_expired_head(self) -> None:
        q = self.queue
        ready = q.ready
        if not ready or not self.timed:
            if not ready and self.cold_since is not None:
                self._cold_done()
            return
        now = time.monotonic()
        expired: list[QueueEntry] = []
        # only the head, also in a priority queue: RabbitMQ 3.10 keeps an expired
        # low-priority message behind an unexpired higher one until it reaches the head
        while ready:
            head = ready[0]
            exp = self._head_expiry(head)
            if exp is None or exp > now:
                break
            ready.popleft()
            q.ready_bytes -= head.message.size
            expired.append(head)
        if expired:
            self.discard(q, expired, "expired")
        if self.cold_since is not None and (not ready or ready[0].seq > self.cold_last):
            self._cold_done()
        if expired and not ready and self.plain:
            self.drained()

    def _cold_done(self) -> None:
        """Every recovered entry has left the ready list. A queue that was given this
        extension only to work out their TTLs loses it again: with it, every later
        message takes the extension path (measured ~30 % slower publish+consume)."""
        self.cold_since = None
        self.cold_deadlines = {}
        self.cold_legacy = False
        q = self.queue
        if self.plain and not self.ttl_seen and not self.sac and not q.needs_ext \
                and q.ext is self:
            q.ext = None

    def drained(self) -> None:
        """The ready list has just emptied. A queue with no TTL, limits, priorities,
        dead-lettering, expiry or single active consumer of its own was given this
        extension only for messages with an expiration of their own (or recovered ones):
        with none left it drops it, or every later message would take the extension
        path for good (measured ~30 % slower publish+consume). An unacknowledged entry
        with an expiry that is requeued brings it back (:func:`give_expiry_back`)."""
        q = self.queue
        if self.plain and not self.sac and not q.needs_ext and q.ext is self \
                and not q.ready:
            q.ext = None

    def _head_expiry(self, head: QueueEntry) -> float | None:
        exp = expiry_of(head)
        if exp is not None or self.cold_since is None or isinstance(head, TimedEntry):
            return exp
        message = head.message  # a recovered entry
        if self.cold_deadlines:
            exp = self.cold_deadlines.get(message.position)
            if exp is not None:
                return exp
        if not self.cold_legacy:
            return None  # its record said: no TTL
        # from an older log: load it (take() would anyway)
        if type(message) is LoggedMessage:
            head.message = message = message.load()
        exp = self._expiry(message, self.cold_since)
        if exp is not None:
            self.ttl_seen = True
        return exp

    def discard(self, q: Queue, entries: list[QueueEntry], reason: str) -> None:
        """Ready entries leave the queue without delivery: dead-letter, then settle."""
        q.vhost.broker.dead_letter(q, entries, reason)
        if q.dedup is not None:
            for entry in entries:
                q.dedup.release(entry.message)
        if q.in_store:
            positions = [e.message.position for e in entries if e.message.position >= 0]
            if positions:
                q.vhost.store_settle(q, positions)

    def arm_expiry_at_head(self) -> None:
        ready = self.queue.ready
        if ready:
            exp = self._head_expiry(ready[0])
            if exp is not None and (self.expiry_armed is None or exp < self.expiry_armed):
                self._arm_expiry(exp)

    def _arm_expiry(self, deadline: float) -> None:
        self.expiry_armed = deadline
        self.queue.vhost.broker.timers.call_at(deadline, self._expiry_due)

    def _expiry_due(self) -> None:
        q = self.queue
        if q.deleted or q.ext is not self:  # the queue has dropped this extension since
            return
        now = time.monotonic()
        if self.expiry_armed is not None and self.expiry_armed > now + 0.001:
            return  # a stale heap entry; the current one is still pending
        self.expiry_armed = None
        self.drop_expired_head()
        self.arm_expiry_at_head()

    # ------------------------------------------------------------------ x-expires
    def touch(self) -> None:
        self.last_used = time.monotonic()
        if self.opts.expires is not None:
            self._arm_expires(self.last_used + self.opts.expires / 1000)

    def _arm_expires(self, deadline: float) -> None:
        self.expires_armed = deadline
        self.queue.vhost.broker.timers.call_at(deadline, self._expires_due)

    def _expires_due(self) -> None:
        q = self.queue
        expires = self.opts.expires
        if q.deleted or expires is None:
            return
        deadline = self.last_used + expires / 1000
        if q.consumers:
            return  # in use; the last consumer leaving touches and re-arms
        if time.monotonic() + 0.001 < deadline:
            if self.expires_armed != deadline:  # touched since: wait for the new deadline
                self._arm_expires(deadline)
            return
        q.vhost.delete_queue(q, reason="expired")

    # ------------------------------------------------------------------ consumers
    def consumers_changed(self) -> None:
        q = self.queue
        if self.sac:
            current = set(map(id, q.consumers))
            if self.sac_order and id(self.sac_order[0]) not in current and \
                    self.sac_order[0].unacked > 0:
                # the active consumer left with deliveries outstanding: its successor
                # starts once they are settled or requeued, so it sees them first
                self.sac_draining = self.sac_order[0]
            order = [c for c in self.sac_order if id(c) in current]
            known = set(map(id, order))
            order.extend(c for c in q.consumers if id(c) not in known)
            self.sac_order = order
            q.vhost.schedule_dispatch(q)
        self.touch()

    def sac_consumer(self) -> Consumer | None:
        draining = self.sac_draining
        if draining is not None:
            if draining.unacked > 0:
                return None
            self.sac_draining = None
        if not self.sac_order:
            return None
        c = self.sac_order[0]
        if c.has_credit() and c.channel.can_deliver(c):
            return c
        return None

    def active_consumer_tag(self) -> str | None:
        return self.sac_order[0].tag if self.sac and self.sac_order else None


# ---------------------------------------------------------------------- broker hooks
def give_expiry_back(queue: Queue, entries: list[QueueEntry]) -> None:
    """Requeued entries with an expiry return to a queue that dropped its extension
    since they left (:meth:`QueueExt.drained`): it gets a fresh one, armed for them."""
    ext = queue.ext = QueueExt(queue, QueueOptions())
    ext.timed = ext.ttl_seen = True
    deadlines = [e.expires for e in entries
                 if isinstance(e, TimedEntry) and e.expires is not None]
    if deadlines:
        ext._arm_expiry(min(deadlines))


def queue_enqueue(queue: Queue, message: Message) -> None:
    ext = queue.ext
    if ext is None:
        ext = queue.ext = QueueExt(queue, QueueOptions())
    ext.enqueue(message)


def apply_policies(broker: Broker, vhost: VHost, obj: QueueType | Exchange) -> None:
    broker.policies.apply(vhost, obj)
    if isinstance(obj, Exchange):
        obj.alternate = alternate_exchange(obj.arguments, obj.policy)
        obj.attach(broker, vhost)  # a type's own settings (x-delayed-type, dedup's)
        return
    if obj.dedup is not None or obj.policy is not None or obj.arguments:
        from amqpd.broker.dedup import configure_queue

        configure_queue(broker, obj)
    if obj.ext is None and obj.policy is None and not obj.arguments:
        return  # the common plain queue: no options to derive (restart declares 100,000)
    opts = queue_options(obj.arguments, obj.policy)
    operator = broker.operator_policies.match(vhost.name, "queues", obj.name)
    if operator is not None:  # caps what arguments and the user's policy give
        from amqpd.broker.operator_policy import cap

        cap(opts, operator.definition)
    if obj.ext is not None:
        obj.ext.configure(opts)
    elif opts.any or obj.needs_ext:
        obj.attach_ext(opts)  # the classic queue's extensions (the quorum queue's too)
    obj.options_changed()  # a stream reads its retention from arguments and policy


_INT_ARGS = ("x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes",
             "x-max-priority")


def type_name(value: Any) -> str:
    """The AMQP field type RabbitMQ names in its errors (as pika would have sent it)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    kind = {str: "longstr", float: "double", list: "array", dict: "table",
            bytes: "bytes", bytearray: "bytes"}.get(type(value))
    return kind or ("void" if value is None else "timestamp")


MAX_EXPIRY = 2**32 - 1  # ms: RabbitMQ's ?MAX_EXPIRY_TIMER for x-message-ttl and x-expires
# quorum/stream-only arguments that RabbitMQ 3.10 refuses on a classic queue
CLASSIC_UNSUPPORTED = (
    "x-max-in-memory-length", "x-max-in-memory-bytes", "x-delivery-limit", "x-max-age",
    "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
    "x-quorum-initial-group-size", "x-quorum-target-group-size", "x-dead-letter-strategy",
)


def validate_consumer_arguments(arguments: dict[str, Any], queue: str = "",
                                vhost: str = "") -> None:
    """basic.consume arguments, with RabbitMQ 3.10's errors for a classic queue."""
    where = f"for queue '{queue}' in vhost '{vhost}'" if queue else "for consumer"
    if "x-priority" in arguments:
        value = arguments["x-priority"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise PreconditionFailed(
                f'invalid arg \'x-priority\' {where}: "expected integer, got '
                f'{type_name(value)}"')
    if "x-stream-offset" in arguments:
        raise PreconditionFailed(
            f"invalid arg 'x-stream-offset' {where} of queue type rabbit_classic_queue")


def validate_queue_arguments(arguments: dict[str, Any], name: str = "",
                             vhost: str = "") -> None:
    """Reject argument values RabbitMQ 3.10 rejects, with its error terms."""
    where = f"for queue '{name}' in vhost '{vhost}'" if name else "for queue"

    def fail(key: str, why: str) -> PreconditionFailed:
        return PreconditionFailed(f"invalid arg '{key}' {where}: {why}")

    for key in _INT_ARGS:
        if key not in arguments:
            continue
        value = arguments[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(key, f'"expected integer, got {type_name(value)}"')
        if value < 0:
            raise fail(key, f"{{value_negative,{value}}}")
        if key == "x-expires" and value == 0:
            raise fail(key, "{value_zero,0}")
        if key == "x-max-priority" and value > 255:
            raise fail(key, f"{{max_value_exceeded,{value}}}")
        if key in ("x-message-ttl", "x-expires") and value > MAX_EXPIRY:
            raise fail(key, f"{{value_too_large,{value}}}")
    for key in CLASSIC_UNSUPPORTED:
        if key in arguments:
            raise PreconditionFailed(f"invalid arg '{key}' {where} of queue type "
                                     "rabbit_classic_queue")
    if "x-message-deduplication" in arguments:
        from amqpd.broker.dedup import validate_queue_argument

        validate_queue_argument(arguments)
    overflow = arguments.get("x-overflow")
    if overflow is not None and not isinstance(overflow, str):
        raise fail("x-overflow", f"{{unacceptable_type,{type_name(overflow)}}}")
    if overflow is not None and overflow not in OVERFLOW_VALUES:
        raise fail("x-overflow", "invalid_overflow")
    dlx = arguments.get("x-dead-letter-exchange")
    if dlx is not None and not isinstance(dlx, str):
        raise PreconditionFailed(
            f"invalid type '{type_name(dlx)}' for arg 'x-dead-letter-exchange' in queue "
            f"'{name}' in vhost '{vhost}'")
    dlrk = arguments.get("x-dead-letter-routing-key")
    if dlrk is not None and not isinstance(dlrk, str):
        raise fail("x-dead-letter-routing-key", f"{{unacceptable_type,{type_name(dlrk)}}}")
    mode = arguments.get("x-queue-mode")
    if mode is not None and mode not in ("default", "lazy"):
        raise fail("x-queue-mode", f'"unsupported queue mode \'{mode}\'"')
    version = arguments.get("x-queue-version")
    if version is not None and version not in (1, 2):
        raise fail("x-queue-version", f'"unsupported queue version \'{version}\'"')
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise fail("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
    qtype = arguments.get("x-queue-type")
    if qtype is not None and not isinstance(qtype, str):
        raise fail("x-queue-type", f"{{unacceptable_type,{type_name(qtype)}}}")
    # otherwise x-queue-type picked this validation (a quorum queue checks the arguments
    # it shares with classic ones here: QuorumQueue.validate_arguments); an unknown type
    # is refused by queue_type.resolve
    sac = arguments.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise fail("x-single-active-consumer", f"{{unacceptable_type,{type_name(sac)}}}")


def prepare_publish(message: Message) -> tuple[Message, list[str]]:
    """Checks and rewrites needing the properties: a valid ``expiration``; CC/BCC routing
    keys, with BCC stripped from what is stored and delivered."""
    props = message.properties
    routing_keys = [message.routing_key]
    if props[0] & FLAG_EXPIRATION_HI:
        parse_expiration(message.props.get("expiration"))
    if props[0] & FLAG_HEADERS_HI and (b"\x02CC" in props or b"\x03BCC" in props):
        headers = message.headers
        for key in ("CC", "BCC"):
            value = headers.get(key)
            if value is None:
                continue
            if not isinstance(value, list):
                raise PreconditionFailed(
                    f"invalid message: {{unacceptable_type_in_header,\"{key}\","
                    f"{type_name(value)}}}")
            routing_keys.extend(v.decode() if isinstance(v, bytes | bytearray) else str(v)
                                for v in value)
        if "BCC" in headers:  # removed in place, as rabbit_basic:strip_bcc does
            fields = rawprops.split_properties(props)
            items = [kv for kv in rawprops.header_items(fields) if kv[0] != "BCC"]
            fields["headers"] = rawprops.encode_table(items)
            message = Message(message.exchange, message.routing_key,
                              rawprops.join_properties(fields), message.body,
                              persistent=message.persistent)
    return message, routing_keys


def enqueue_routed(broker: Broker, message: Message, queues: list[QueueType]) -> bool:
    """Put a broker-made message (dead-lettered, delayed and now due) into ``queues``:
    length limits apply, persistent copies for durable queues go to the log (no confirm
    waits for them). True if something was written to the store (caller commits)."""
    if not queues:
        return False
    queues, _refused = limits.admit(broker, queues, message)
    if queues and broker.publisher.dedup_queues:
        from amqpd.broker.dedup import admitted

        queues = admitted(queues, message)
    if queues and not message.persistent and broker.publisher.keeping_queues:
        message.persistent = any(q.keeps_all for q in queues)
    wrote = False
    if queues and message.persistent:
        durable = [q.store_key for q in queues if q.durable]
        if durable:
            from amqpd.broker.persist import stored_message

            message.position = broker.store.append_enqueue(durable, stored_message(message))
            wrote = True
    for q in queues:
        q.enqueue(message)
    return wrote


def loaded(message: Message) -> Message:
    return message.load() if type(message) is LoggedMessage else message


__all__ = [
    "QueueExt", "TimedEntry", "apply_policies", "enqueue_routed", "prepare_publish",
    "queue_enqueue", "validate_consumer_arguments", "validate_queue_arguments",
]
