"""direct: a binding matches when its key equals the routing key exactly."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message


class DirectExchange(Exchange):
    type_name = "direct"

    def __init__(
        self, vhost: str, name: str, durable: bool = False, auto_delete: bool = False,
        internal: bool = False, arguments: dict[str, Any] | None = None,
    ) -> None:
        self._by_key: dict[str, dict[tuple[str, str, str, str], Destination]] = {}
        super().__init__(vhost, name, durable, auto_delete, internal, arguments)

    def add_binding(self, binding: Binding) -> None:
        self._by_key.setdefault(binding.routing_key, {})[binding.key] = binding.destination

    def remove_binding(self, binding: Binding) -> None:
        dests = self._by_key.get(binding.routing_key)
        if dests is not None:
            dests.pop(binding.key, None)
            if not dests:
                del self._by_key[binding.routing_key]

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        # .get() so an unbound key does not leave an empty entry behind
        dests = self._by_key.get(routing_key)
        return dests.values() if dests else ()


register_exchange_type(DirectExchange)
