"""x-consistent-hash: rabbitmq-consistent-hash-exchange semantics.

Each binding's routing key is a *weight* (an integer, "1" to ...): a destination bound
with weight N owns N points on a hash ring. A message is hashed (by default its routing
key; with the exchange argument ``hash-header`` that header's value; with
``hash-property`` one of ``message_id``, ``correlation_id``, ``timestamp``) and goes to the
owner of the first point at or after its hash, so the same key always reaches the same
queue while the bindings stay the same, and load spreads in proportion to the weights.
A message without the configured header or property is still routed (its value hashes
as empty), as the plugin does. Error texts are the plugin's (3.10.8).

The plugin's ring (erlang:phash2 buckets) is not reproduced bit for bit, only its
properties; the hash here is BLAKE2b.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from typing import Any

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message
from amqpd.protocol.errors import PreconditionFailed

_PROPERTIES = ("message_id", "correlation_id", "timestamp")


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big")


@register_exchange_type
class ConsistentHashExchange(Exchange):
    type_name = "x-consistent-hash"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self._points: list[int] = []
        self._owners: list[Destination] = []
        self._ring: dict[tuple[str, str, str, str], list[int]] = {}
        self._dests: dict[tuple[str, str, str, str], Destination] = {}
        super().__init__(*args, **kwargs)

    def validate(self, arguments: dict[str, Any]) -> None:
        header = arguments.get("hash-header")
        prop = arguments.get("hash-property")
        if header is not None and prop is not None:
            raise PreconditionFailed("hash-header and hash-property are mutually exclusive")
        if prop is not None and prop not in _PROPERTIES:
            raise PreconditionFailed(f"Unsupported property: {prop}")
        if header is not None and not isinstance(header, str):
            raise PreconditionFailed("Invalid argument, 'hash-header' must be a string")

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        text = routing_key.strip()
        if not text.lstrip("+-").isdigit() or len(text) - len(text.lstrip("+-")) > 1:
            raise PreconditionFailed(f'The binding key must be an integer: <<"{routing_key}">>')
        if int(text) < 1:
            raise PreconditionFailed("The binding key must be greater than 0")

    def add_binding(self, binding: Binding) -> None:
        weight = int(binding.routing_key.strip())
        dest_id = f"{binding.key[0]}:{binding.destination.name}".encode()
        points = [_hash(dest_id + b":" + str(i).encode()) for i in range(weight)]
        self._ring[binding.key] = points
        self._dests[binding.key] = binding.destination
        self._rebuild()

    def remove_binding(self, binding: Binding) -> None:
        self._ring.pop(binding.key, None)
        self._dests.pop(binding.key, None)
        self._rebuild()

    def _rebuild(self) -> None:
        pairs = sorted((p, i, key) for i, (key, pts) in enumerate(self._ring.items())
                       for p in pts)
        self._points = [p for p, _i, _k in pairs]
        self._owners = [self._dests[k] for _p, _i, k in pairs]

    def _hash_input(self, message: Message, routing_key: str) -> bytes:
        header = self.arguments.get("hash-header")
        if header is not None:
            value = message.headers.get(header)
            if value is None:
                return b""
            return value if isinstance(value, bytes) else str(value).encode()
        prop = self.arguments.get("hash-property")
        if prop is not None:
            value = message.props.get(prop)
            return b"" if value is None else str(value).encode()
        return routing_key.encode()

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        if not self._points:
            return ()
        data = self._hash_input(message, routing_key)
        i = bisect.bisect_left(self._points, _hash(data))
        return (self._owners[i % len(self._owners)],)


__all__ = ["ConsistentHashExchange"]
