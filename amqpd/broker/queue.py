"""The classic queue: ready messages in order, its consumers, and the dispatch loop.

The first implementation of the queue-type seam (:mod:`amqpd.broker.queue_type`),
registered as ``classic``, the type a declaration without ``x-queue-type`` gets.

Ordering: every entry carries a queue-local sequence number. Requeued messages (nack,
reject, channel close) go back to their original place, as RabbitMQ does, so a consumer
that rejects and re-reads sees the queue's order again.

Dispatch is *scheduled*, not run inline: publishing, acking or consuming marks the queue
dirty (``vhost.schedule_dispatch``) and the broker's dispatch scheduler runs
:meth:`Queue.dispatch` once at the end of the event-loop tick. That batches deliveries
(one socket write per tick) and keeps re-entrancy out of the handlers (an ack handler
never finds itself inside a delivery).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from mypy_extensions import mypyc_attr

from amqpd.broker.message import LoggedMessage, Message
from amqpd.broker.queue_entry import QueueEntry, SeqCounter, TimedEntry, Unacked
from amqpd.broker.queue_type import QueueType, register_queue_type
from amqpd.broker.ready import ReadyList
from amqpd.protocol.constants import FLAG_EXPIRATION_HI

if TYPE_CHECKING:
    from amqpd.broker.channel import Channel
    from amqpd.broker.policy import QueueOptions
    from amqpd.broker.priority import PriorityReady
    from amqpd.broker.vhost import VHost


class ConsumerChannel(Protocol):
    """What a queue needs from the channel that owns a consumer."""

    def can_deliver(self, consumer: Consumer) -> bool: ...
    def deliver(self, consumer: Consumer, queue: QueueType, entry: QueueEntry) -> None: ...
    def consumer_cancelled_by_server(self, consumer: Consumer) -> None: ...


def _as_channel(channel: ConsumerChannel) -> Channel | None:
    """``channel`` when it is an AMQP :class:`~amqpd.broker.channel.Channel` (imported
    here, once per consumer: channel.py imports this module)."""
    from amqpd.broker.channel import Channel

    return channel if isinstance(channel, Channel) else None


class Consumer:
    __slots__ = (
        "arguments", "channel", "exclusive", "local", "no_ack", "prefetch", "priority", "queue",
        "shared_unacked", "tag", "tag_bytes", "unacked",
    )

    def __init__(
        self, channel: ConsumerChannel, queue: QueueType, tag: str, no_ack: bool, exclusive: bool,
        prefetch: int, arguments: dict[str, Any],
    ) -> None:
        self.channel = channel
        # The same object typed as the AMQP channel, when that is what owns the consumer
        # (any other owner, such as a cluster link's proxy, leaves it None). The queue
        # calls the channel twice per message: through this attribute the compiled build
        # makes a native call; through the protocol-typed ``channel`` each is a Python
        # method call (name lookup, arguments boxed and parsed again).
        self.local: Channel | None = _as_channel(channel)
        self.queue = queue
        self.tag = tag
        self.tag_bytes = bytes((len(tag.encode()),)) + tag.encode()
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # per-consumer limit (basic.qos global=false), 0 = none
        self.unacked = 0
        self.arguments = arguments
        priority = arguments.get("x-priority", 0)
        self.priority = priority if isinstance(priority, int) else 0
        # what the channel keeps per delivery when the queue's acks only count (a
        # stream: 20 consumers at a prefetch of 1,000 hold one record, not 20,000)
        self.shared_unacked: Unacked | None = queue.shared_unacked(self)

    def has_credit(self) -> bool:
        return self.no_ack or not self.prefetch or self.unacked < self.prefetch

    def can_receive(self) -> bool:
        """Credit left, and the owning channel takes a delivery now."""
        if not self.has_credit():
            return False
        local = self.local
        if local is not None:
            return local.can_deliver(self)
        return self.channel.can_deliver(self)

    def deliver(self, queue: QueueType, entry: QueueEntry) -> None:
        """Hand ``entry`` to the owning channel."""
        local = self.local
        if local is not None:
            local.deliver(self, queue, entry)
        else:
            self.channel.deliver(self, queue, entry)


@mypyc_attr(allow_interpreted_subclasses=True)
class Queue(QueueType):
    """A classic queue: everything in this process, backlogs paged to the shared log.
    The one-node quorum queue (amqpd.broker.quorum, interpreted) builds on it."""

    type_name = "classic"

    def __init__(
        self, vhost: VHost, name: str, durable: bool = False, exclusive_owner: object | None = None,
        auto_delete: bool = False, arguments: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        # extensions swap in a PriorityReady for x-max-priority queues
        self.ready: ReadyList | PriorityReady = ReadyList()
        self._rr = 0
        self._seq = SeqCounter(1)
        self.had_consumers = False
        self.pages_out = True  # a backlog of logged messages may be held log-only

    def attach_ext(self, opts: QueueOptions) -> None:
        """The extensions (TTL, limits, priorities, DLX, x-expires, single active
        consumer) are the classic queue's, and the quorum queue's built on it."""
        from amqpd.broker.extensions import QueueExt

        self.ext = QueueExt(self, opts)

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any], name: str, vhost: str) -> None:
        """RabbitMQ 3.10's checks for a classic queue (amqpd.broker.extensions)."""
        from amqpd.broker.extensions import validate_queue_arguments

        validate_queue_arguments(arguments, name, vhost)

    @classmethod
    def validate_consumer_arguments(cls, arguments: dict[str, Any], name: str,
                                    vhost: str) -> None:
        from amqpd.broker.extensions import validate_consumer_arguments

        validate_consumer_arguments(arguments, name, vhost)

    @property
    def message_count(self) -> int:
        return len(self.ready)

    def ready_entries(self) -> Iterable[QueueEntry]:
        return self.ready

    def ready_positions(self) -> list[int]:
        ready = self.ready
        if isinstance(ready, ReadyList):  # log-only runs answered without entry objects
            return ready.positions()
        return super().ready_positions()

    def refuses_publish(self, message: Message) -> bool:
        from amqpd.broker.limits import would_overflow

        return would_overflow(self, message)

    def touch(self) -> None:
        if self.ext is not None:
            self.ext.touch()

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, message: Message) -> None:
        # per-message TTL (the expiration flag); a log-only message was checked before it
        # was paged out, and reading its properties would cost a disk read
        if self.ext is not None or (type(message) is not LoggedMessage and (
                props := message.properties) and props[0] & FLAG_EXPIRATION_HI):
            from amqpd.broker.extensions import queue_enqueue

            queue_enqueue(self, message)
            return
        self.ready.append(QueueEntry(message, self._seq.take()))
        self.ready_bytes += message.size
        self.stat_publish += 1
        if self.consumers:
            self.vhost.schedule_dispatch(self)

    def restore(self, message: Message, redelivered: bool, published: int = 0,
                extra: int = 0) -> None:
        """Put a recovered message at the tail (recovery replays in log order).

        ``published`` (wall-clock ms, 0 if the log did not say) and ``extra``
        (expires_ms << 8 | priority) come from the store's record, so neither TTL nor
        priority needs the message read back (a deduplicating queue reads its header)."""
        if self.dedup is not None:
            self.dedup.restore(message)
        if self.ext is not None and self.ext.max_priority:
            # its level needs its priority now
            self.ext.restore(message, redelivered, published, extra)
            return
        if self.ext is None:  # TTLs of recovered messages are worked out at the head
            from amqpd.broker.extensions import QueueExt
            from amqpd.broker.policy import QueueOptions

            self.ext = QueueExt(self, QueueOptions())
        self.ext.mark_cold(message.position, published, extra)
        seq = self._seq.take()
        self.ext.cold_last = seq  # recovery replays in log order: the last one so far
        if type(message) is LoggedMessage and isinstance(self.ready, ReadyList):
            self.ready.append_logged(message._store, message.position, message.size,
                                     seq, redelivered)
        else:
            self.ready.append(QueueEntry(message, seq, redelivered))
        self.ready_bytes += message.size

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        """Return unacked entries to their original places, marked redelivered."""
        if self.ext is None:
            entries = list(entries)
            for entry in entries:
                if isinstance(entry, TimedEntry) and entry.expires is not None:
                    # it left while the queue had its TTL extension, which the queue
                    # dropped once empty (QueueExt.drained): it comes back with it
                    from amqpd.broker.extensions import give_expiry_back

                    give_expiry_back(self, entries)
                    break
        if self.ext is not None:  # per-priority places; expiry re-armed
            self.ext.requeue(list(entries))
            return
        ready = self.ready
        for entry in sorted(entries, key=lambda e: e.seq, reverse=True):
            self.unacked_count -= 1
            entry.redelivered = True
            self.ready_bytes += entry.message.size
            if not ready or entry.seq < ready[0].seq:
                ready.appendleft(entry)
            elif entry.seq > ready[-1].seq:
                ready.append(entry)
            elif isinstance(ready, ReadyList):
                ready.insert_by_seq(entry)
            else:
                ready.put_back(entry)
        if self.consumers:
            self.vhost.schedule_dispatch(self)

    def settle(self, entries: Iterable[QueueEntry]) -> None:
        """Unacked entries are done with (acked, or rejected without requeue)."""
        n = 0
        positions = []
        dedup = self.dedup
        for entry in entries:
            n += 1
            if dedup is not None:
                dedup.release(entry.message)
            if entry.message.position >= 0:
                positions.append(entry.message.position)
        self.unacked_count -= n
        self.stat_ack += n
        if positions and self.in_store:
            self.vhost.store_settle(self, positions)
        if self.consumers:
            self.vhost.schedule_dispatch(self)

    # ------------------------------------------------------------------ fetch
    def take(self) -> QueueEntry | None:
        """Pop the head for delivery (basic.get or a consumer), or None if empty."""
        ready = self.ready
        if self.ext is not None:
            self.ext.drop_expired_head()  # expired messages are never delivered
        if not ready:
            return None
        entry = ready.popleft()
        message = entry.message
        if type(message) is LoggedMessage:  # body lives only in the log: read it back
            entry.message = message = message.load()
        self.ready_bytes -= message.size
        if not ready and self.ext is not None and self.ext.plain:
            self.ext.drained()
        return entry

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        """Book-keeping once an entry has left for a consumer or basic.get."""
        self.stat_deliver += 1
        if entry.redelivered:
            self.stat_redeliver += 1
        if acked:
            self.stat_ack += 1
            if self.dedup is not None:
                self.dedup.release(entry.message)
            if entry.message.position >= 0 and self.in_store:
                # marked too: if the settle is lost in a crash it comes back redelivered
                self.vhost.store_delivered(self, entry.message.position)
                self.vhost.store_settle(self, [entry.message.position])
        else:
            self.unacked_count += 1
            if entry.message.position >= 0 and self.in_store:
                self.vhost.store_delivered(self, entry.message.position)

    # ------------------------------------------------------------------ consumers
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.consumers.sort(key=lambda c: -c.priority)  # stable: FIFO within a priority
        self.had_consumers = True
        if self.ext is not None:
            self.ext.consumers_changed()
        self.vhost.schedule_dispatch(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self.ext is not None:
            self.ext.consumers_changed()
        if not self.consumers and self.auto_delete and self.had_consumers:
            self.vhost.delete_queue(self, reason="auto-delete")

    def dispatch(self) -> None:
        """Deliver ready messages to consumers with credit, round-robin within a priority."""
        consumers = self.consumers
        ready = self.ready
        while ready and consumers:
            consumer = self._next_consumer()
            if consumer is None:
                return
            entry = self.take()
            if entry is None:
                return
            consumer.deliver(self, entry)

    def _next_consumer(self) -> Consumer | None:
        if self.ext is not None and self.ext.sac:
            return self.ext.sac_consumer()
        consumers = self.consumers
        n = len(consumers)
        top = consumers[0].priority
        # highest priority first; round-robin among equals
        if consumers[-1].priority == top:
            same = consumers
        else:
            same = [c for c in consumers if c.priority == top]
        m = len(same)
        for i in range(m):
            c = same[(self._rr + i) % m]
            if c.can_receive():
                self._rr = (self._rr + i + 1) % m
                return c
        if m == n:
            return None
        for c in consumers[m:]:
            if c.can_receive():
                return c
        return None

    # ------------------------------------------------------------------ purge / delete
    def purge(self) -> int:
        n = len(self.ready)
        ready = self.ready
        if isinstance(ready, ReadyList):
            positions = ready.positions()
        else:
            positions = [e.message.position for e in ready if e.message.position >= 0]
        ready.clear()
        self.ready_bytes = 0
        if self.dedup is not None:
            self.dedup.clear()
        if positions and self.in_store:
            self.vhost.store_settle(self, positions)
        return n

    def cancel_all_consumers(self) -> None:
        for consumer in list(self.consumers):
            self.consumers.remove(consumer)
            consumer.channel.consumer_cancelled_by_server(consumer)

    def delete(self) -> None:
        """Consumers are told (basic.cancel), messages dropped, the store forgets it."""
        self.cancel_all_consumers()
        self.ready.clear()
        if self.dedup is not None:
            self.dedup.clear()
        if self.in_store:
            self.vhost.store_drop_queue(self)


register_queue_type(Queue)
