"""A message's place in one queue (kept apart so ready.py and queue.py can share it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqpd.broker.message import Message
    from amqpd.broker.queue import Consumer
    from amqpd.broker.queue_type import QueueType


class SeqCounter:
    """A queue's sequence numbers, 1, 2, 3, ... (:meth:`take`). Compiled code calls it
    natively; ``next()`` on an ``itertools.count`` was a look-up of ``next`` in builtins
    and a Python call, ~500 instructions per enqueue. No ``__next__``: mypyc 2.4 types
    that slot wrongly for an ``int`` result (the C build fails)."""

    __slots__ = ("value",)

    def __init__(self, start: int = 1) -> None:
        self.value = start

    def take(self) -> int:
        value = self.value
        self.value = value + 1
        return value


class QueueEntry:
    """One message's place in one queue (the message itself may be shared)."""

    __slots__ = ("message", "redelivered", "seq")

    def __init__(self, message: Message, seq: int, redelivered: bool = False) -> None:
        self.message = message
        self.seq = seq
        self.redelivered = redelivered


class TimedEntry(QueueEntry):
    """A queue entry that knows when it expires (monotonic seconds) and its priority.

    Lives here, beside its base, because the hot-path modules are compiled together and
    a compiled class cannot be subclassed from an interpreted module.
    """

    __slots__ = ("expires", "priority")

    def __init__(self, message: Message, seq: int, redelivered: bool, expires: float | None,
                 priority: int) -> None:
        super().__init__(message, seq, redelivered)
        self.expires = expires
        self.priority = priority


class Unacked:
    """A delivery a channel holds until its ack: the queue to settle it with, the entry,
    the consumer whose credit it takes (None: a basic.get). Kept here, not in
    channel.py, because a consumer of a queue that only counts acks holds one for all
    its deliveries (:meth:`QueueType.shared_unacked`) and queue.py cannot import the
    channel."""

    __slots__ = ("consumer", "entry", "queue")

    def __init__(self, queue: QueueType, entry: QueueEntry, consumer: Consumer | None) -> None:
        self.queue = queue
        self.entry = entry
        self.consumer = consumer


def expiry_of(entry: QueueEntry) -> float | None:
    """When ``entry`` expires (monotonic seconds), or None: only a :class:`TimedEntry`
    carries an expiry (a plain entry keeps no slot for it)."""
    return entry.expires if isinstance(entry, TimedEntry) else None


class QuorumEntry(TimedEntry):
    """A delivery a quorum queue got back: ``message`` carries ``x-delivery-count``;
    ``base`` is the message as published (what dead-lettering republishes) and ``count``
    how many times it was delivered and returned (amqpd.broker.quorum)."""

    __slots__ = ("base", "count")

    def __init__(self, message: Message, seq: int, redelivered: bool, expires: float | None,
                 priority: int, base: Message, count: int) -> None:
        super().__init__(message, seq, redelivered, expires, priority)
        self.base = base
        self.count = count
