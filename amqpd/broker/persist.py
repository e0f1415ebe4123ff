"""What the broker hands the store for one message: the message plus what recovery
needs without reading it back (publish time, per-message expiry, priority, and whether
it is a transient message paged out under memory pressure).

Recovery uses these (store/format.py, ENQUEUE_META) so that a restart neither restarts
TTL clocks (a message expires when it would have without the restart) nor reads every
recovered body of a priority queue to learn its level, and so that a transient message
paged to the log is dropped instead of coming back.
"""

from __future__ import annotations

import time

from amqpd.broker.message import Message
from amqpd.broker.ttl import parse_expiration
from amqpd.protocol.constants import FLAG_EXPIRATION_HI, FLAG_PRIORITY_HI
from amqpd.protocol.errors import PreconditionFailed
from amqpd.store.api import StoredMessage


def stored_message(message: Message, *, transient: bool = False) -> StoredMessage:
    """The StoredMessage for ``message``, stamped now (wall clock, milliseconds)."""
    props = message.properties
    published = int(time.time() * 1000)
    expires = priority = 0
    if props and props[0] & (FLAG_EXPIRATION_HI | FLAG_PRIORITY_HI):
        decoded = message.props
        if props[0] & FLAG_EXPIRATION_HI:
            try:
                ttl = parse_expiration(decoded.get("expiration"))
            except PreconditionFailed:  # refused at publish; nothing to keep
                ttl = None
            if ttl is not None:
                expires = published + ttl
        if props[0] & FLAG_PRIORITY_HI:
            value = decoded.get("priority") or 0
            priority = max(0, min(255, int(value)))
    return StoredMessage(message.exchange, message.routing_key, props, message.body,
                         published, expires, priority, transient)


def monotonic_deadline(wall_ms: int) -> float:
    """A wall-clock deadline (ms) as a ``time.monotonic()`` one."""
    return time.monotonic() + (wall_ms - time.time() * 1000) / 1000


__all__ = ["monotonic_deadline", "stored_message"]
