"""A published message, shared by every queue it was routed to.

The property bytes stay exactly as the publisher sent them and are decoded only when
something needs a property (headers exchange, TTL, priority, dead-lettering, user-id):
most messages are never decoded at all. ``position`` is the message's place in the
shared log once it is persisted (``-1`` while it lives only in memory).
"""

from __future__ import annotations

from typing import Any

from amqpd.protocol import codec
from amqpd.protocol.constants import DELIVERY_PERSISTENT


class Message:
    __slots__ = (
        "_props",
        "body",
        "exchange",
        "persistent",
        "position",
        "properties",
        "routing_key",
    )

    def __init__(
        self, exchange: str, routing_key: str, properties: bytes, body: bytes,
        persistent: bool | None = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.persistent = (
            codec.delivery_mode(properties) == DELIVERY_PERSISTENT if persistent is None
            else persistent
        )
        self.position = -1
        self._props: dict[str, Any] | None = None

    @property
    def props(self) -> dict[str, Any]:
        """Decoded properties (cached); decoding happens at most once per message."""
        if self._props is None:
            self._props = codec.decode_properties(self.properties)
        return self._props

    @property
    def headers(self) -> dict[str, Any]:
        headers = self.props.get("headers")
        return headers if isinstance(headers, dict) else {}

    @property
    def size(self) -> int:
        return len(self.body)

    def with_properties(self, props: dict[str, Any], exchange: str | None = None,
                        routing_key: str | None = None) -> Message:
        """A copy with changed properties (dead-lettering, CC/BCC stripping)."""
        msg = Message(
            self.exchange if exchange is None else exchange,
            self.routing_key if routing_key is None else routing_key,
            codec.encode_properties(props),
            self.body,
        )
        msg._props = props
        return msg


class LoggedMessage(Message):
    """A message that lives only in the shared log: position and size, nothing else.

    Recovered backlogs (and, under memory pressure, cold backlogs) are held this way so a
    queue costs an index entry per message, not a body. :meth:`load` reads it back; the
    queue swaps the loaded :class:`Message` in when the entry leaves for a consumer.
    """

    __slots__ = ("_size", "_store")

    def __init__(self, store: Any, position: int, size: int) -> None:
        self._store = store
        self.position = position
        self._size = size
        self.persistent = True
        self._props = None

    def load(self) -> Message:
        stored = self._store.read(self.position)
        msg = Message(stored.exchange, stored.routing_key, stored.properties, stored.body,
                      persistent=True)
        msg.position = self.position
        return msg

    @property  # type: ignore[override]
    def size(self) -> int:
        return self._size

    # Attribute access that needs content loads it (rare: TTL/priority/headers checks).
    @property  # type: ignore[override]
    def exchange(self) -> str:  # type: ignore[override]
        return self._store.read(self.position).exchange

    @property  # type: ignore[override]
    def routing_key(self) -> str:  # type: ignore[override]
        return self._store.read(self.position).routing_key

    @property  # type: ignore[override]
    def properties(self) -> bytes:  # type: ignore[override]
        return self._store.read(self.position).properties

    @property  # type: ignore[override]
    def body(self) -> bytes:  # type: ignore[override]
        return self._store.read(self.position).body
