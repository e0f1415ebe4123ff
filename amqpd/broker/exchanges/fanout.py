"""fanout: every bound destination gets every message; keys are ignored."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message


class FanoutExchange(Exchange):
    type_name = "fanout"

    def __init__(
        self, vhost: str, name: str, durable: bool = False, auto_delete: bool = False,
        internal: bool = False, arguments: dict[str, Any] | None = None,
    ) -> None:
        self._dests: dict[tuple[str, str, str, str], Destination] = {}
        super().__init__(vhost, name, durable, auto_delete, internal, arguments)

    def add_binding(self, binding: Binding) -> None:
        self._dests[binding.key] = binding.destination

    def remove_binding(self, binding: Binding) -> None:
        self._dests.pop(binding.key, None)

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        return self._dests.values()


register_exchange_type(FanoutExchange)
