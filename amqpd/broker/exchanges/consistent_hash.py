"""x-consistent-hash: rabbitmq-consistent-hash-exchange semantics.

Each binding's routing key is a *weight* (an integer >= 1): a destination bound with
weight N owns N buckets. A message is hashed (by default its routing key; with the
exchange argument ``hash-header`` that header's value; with ``hash-property`` one of
``message_id``, ``correlation_id``, ``timestamp``) and jump consistent hashing picks its
bucket, as the plugin does since 3.8: the same key always reaches the same queue while
the bindings stay the same, and load spreads in proportion to the weights.
A message without the configured header or property is still routed (its value hashes
as empty), as the plugin does. Error texts are the plugin's (3.10.8).

The key hash is BLAKE2b, not erlang:phash2, so which queue a given key lands on differs
from RabbitMQ's choice; the distribution properties are the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message
from amqpd.protocol.errors import PreconditionFailed

_PROPERTIES = ("message_id", "correlation_id", "timestamp")


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach), which the plugin uses since RabbitMQ 3.8:
    keys spread evenly over the buckets, and adding buckets moves only ~1/n of them."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


@register_exchange_type
class ConsistentHashExchange(Exchange):
    type_name = "x-consistent-hash"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        # bucket -> destination: each binding owns `weight` consecutive buckets, in
        # binding order (removing one shifts the later ones down, as the plugin does)
        self._buckets: list[Destination] = []
        self._weights: dict[tuple[str, str, str, str], tuple[int, Destination]] = {}
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
        self._weights[binding.key] = (int(binding.routing_key.strip()), binding.destination)
        self._rebuild()

    def remove_binding(self, binding: Binding) -> None:
        self._weights.pop(binding.key, None)
        self._rebuild()

    def _rebuild(self) -> None:
        self._buckets = [dest for weight, dest in self._weights.values() for _ in range(weight)]

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
        buckets = self._buckets
        if not buckets:
            return ()
        key = _hash(self._hash_input(message, routing_key))
        return (buckets[jump_hash(key, len(buckets))],)


__all__ = ["ConsistentHashExchange"]
