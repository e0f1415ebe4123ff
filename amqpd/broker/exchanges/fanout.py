"""fanout: every bound destination gets every message; keys are ignored."""

from __future__ import annotations

from collections.abc import Iterable

from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.message import Message


@register_exchange_type
class FanoutExchange(Exchange):
    type_name = "fanout"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self._dests: dict[tuple[str, str, str, str], Destination] = {}
        super().__init__(*args, **kwargs)

    def add_binding(self, binding: Binding) -> None:
        self._dests[binding.key] = binding.destination

    def remove_binding(self, binding: Binding) -> None:
        self._dests.pop(binding.key, None)

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        return self._dests.values()
