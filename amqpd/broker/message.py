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
    """The message as published. Its content is read through properties (``exchange``,
    ``routing_key``, ``properties``, ``body``, ``size``) so :class:`LoggedMessage` can
    answer them from the log instead; the module is compiled with the hot path, where a
    property of a compiled class costs a direct call, not an interpreted frame."""

    __slots__ = (
        "_body",
        "_exchange",
        "_properties",
        "_props",
        "_routing_key",
        "persistent",
        "position",
    )

    def __init__(
        self, exchange: str, routing_key: str, properties: bytes, body: bytes,
        persistent: bool | None = None,
    ) -> None:
        self._exchange = exchange
        self._routing_key = routing_key
        self._properties = properties
        self._body = body
        self.persistent: bool = (
            codec.delivery_mode(properties) == DELIVERY_PERSISTENT if persistent is None
            else persistent
        )
        self.position = -1
        self._props: dict[str, Any] | None = None

    @property
    def exchange(self) -> str:
        return self._exchange

    @property
    def routing_key(self) -> str:
        return self._routing_key

    @property
    def properties(self) -> bytes:
        return self._properties

    @property
    def body(self) -> bytes:
        return self._body

    @property
    def size(self) -> int:
        return len(self._body)

    @property
    def props(self) -> dict[str, Any]:
        """Decoded properties (cached); decoding happens at most once per message."""
        props = self._props
        if props is None:
            props = self._props = codec.decode_properties(self.properties)
        return props

    @property
    def headers(self) -> dict[str, Any]:
        headers = self.props.get("headers")
        return headers if isinstance(headers, dict) else {}

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
        super().__init__("", "", b"", b"", True)
        self._store = store
        self.position = position
        self._size = size

    def load(self) -> Message:
        stored = self._store.read(self.position)
        msg = Message(stored.exchange, stored.routing_key, stored.properties, stored.body,
                      persistent=True)
        msg.position = self.position
        return msg

    @property
    def size(self) -> int:
        return self._size

    # Content is read from the log when asked for (rare: TTL/priority/headers checks).
    @property
    def exchange(self) -> str:
        return str(self._store.read(self.position).exchange)

    @property
    def routing_key(self) -> str:
        return str(self._store.read(self.position).routing_key)

    @property
    def properties(self) -> bytes:
        return bytes(self._store.read(self.position).properties)

    @property
    def body(self) -> bytes:
        return bytes(self._store.read(self.position).body)
