"""Queue length limits: ``x-max-length``, ``x-max-length-bytes`` and ``x-overflow``.

Both limits count *ready* messages only (unacknowledged deliveries do not count), and
bytes are body bytes, as in RabbitMQ. Overflow behaviours:

* ``drop-head`` (default): the new message is enqueued, then messages are dropped from
  the head until the queue is within its limits; dropped messages are dead-lettered with
  reason ``maxlen``.
* ``reject-publish``: a message that would take the queue over a limit is refused by that
  queue; a publisher in confirm mode gets basic.nack. Other queues it was routed to
  still take it.
* ``reject-publish-dlx``: as reject-publish, and the refused message is dead-lettered.

Refusal is decided *before* the message is written to the log, so a refused message never
reaches the store on behalf of the queue that refused it. Quorum queues refuse by their
own rule (over the limit, then until back at 80 %: amqpd.broker.quorum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqpd.broker.message import Message
    from amqpd.broker.queue import Queue
    from amqpd.broker.queue_type import QueueType
    from amqpd.server import Broker


def would_overflow(queue: QueueType, message: Message) -> bool:
    opts = queue.ext.opts  # type: ignore[union-attr]
    if opts.max_length is not None and queue.message_count + 1 > opts.max_length:
        return True
    return opts.max_length_bytes is not None and \
        queue.ready_bytes + message.size > opts.max_length_bytes


def admit(broker: Broker, queues: list[QueueType],
          message: Message) -> tuple[list[QueueType], bool]:
    """The queues that accept ``message``, and whether any refused it."""
    refused: list[QueueType] | None = None
    for q in queues:
        ext = q.ext
        if ext is not None and ext.rejects and (
                ext.quorum.refuses() if ext.quorum is not None else would_overflow(q, message)):
            if refused is None:
                refused = []
            refused.append(q)
    if refused is None:
        return queues, False
    from amqpd.broker.deadletter import dead_letter
    from amqpd.broker.queue import QueueEntry

    for q in refused:
        if q.ext is not None and q.ext.opts.overflow == "reject-publish-dlx":
            dead_letter(broker, q, [QueueEntry(message, 0)], "maxlen")
    return [q for q in queues if q not in refused], True


def enforce(queue: Queue) -> None:
    """drop-head: trim the head of a classic queue until it is within its limits."""
    ext = queue.ext
    if ext is None or ext.rejects:
        if ext is not None and ext.quorum is not None:
            ext.quorum.after_enqueue()
        return
    opts = ext.opts
    max_len, max_bytes = opts.max_length, opts.max_length_bytes
    ready = queue.ready
    dropped = []
    while ready and ((max_len is not None and len(ready) > max_len) or (
            max_bytes is not None and queue.ready_bytes > max_bytes)):
        entry = ready.popleft()
        queue.ready_bytes -= entry.message.size
        dropped.append(entry)
    if dropped:
        ext.discard(queue, dropped, "maxlen")


__all__ = ["admit", "enforce", "would_overflow"]
