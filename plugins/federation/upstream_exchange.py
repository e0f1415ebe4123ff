"""``x-federation-upstream``: the exchange a downstream's link declares on its upstream.

RabbitMQ's exchange link (on the downstream) declares on the upstream an internal
exchange of this type, bound *from* the federated exchange with the downstream's
bindings, with the link's queue bound to it. It routes like ``fanout`` but drops what
the downstream must not get (``should_forward``: hop limit, or the message already
passed through the downstream), so loops in rings and meshes stop at the upstream and
never cross the WAN. Its arguments say who the downstream is:

- ``x-max-hops`` (long), ``x-downstream-name`` (the downstream's cluster name),
  ``x-downstream-vhost``, and ``x-internal-purpose = federation``.

It is registered when the federation plugin is enabled, as in RabbitMQ. Without it a
downstream gets 503 on declare and falls back to ``fanout`` (it filters on its own side).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from amqpd.broker.api import (
    Binding,
    Destination,
    Exchange,
    Message,
    PreconditionFailed,
    register_exchange_type,
)
from plugins.federation.headers import should_forward

TYPE_NAME = "x-federation-upstream"


class FederationUpstreamExchange(Exchange):
    type_name = TYPE_NAME

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._dests: dict[tuple[str, str, str, str], Destination] = {}
        super().__init__(*args, **kwargs)

    # called BEFORE declaration: the link must say who the downstream is
    def validate(self, arguments: dict[str, Any]) -> None:
        hops = arguments.get("x-max-hops")
        if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
            raise PreconditionFailed(f"x-max-hops must be a positive integer, got {hops!r}")
        for key in ("x-downstream-name", "x-downstream-vhost"):
            if not isinstance(arguments.get(key), str):
                raise PreconditionFailed(f"{key} must be a string, got {arguments.get(key)!r}")

    def add_binding(self, binding: Binding) -> None:
        self._dests[binding.key] = binding.destination

    def remove_binding(self, binding: Binding) -> None:
        self._dests.pop(binding.key, None)

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        if not self._dests:
            return ()
        args = self.arguments
        if not should_forward(message.headers, args["x-max-hops"], args["x-downstream-name"],
                              args["x-downstream-vhost"]):
            return ()
        return self._dests.values()


def register() -> None:
    """Make the type declarable (idempotent; the registry is process-wide)."""
    register_exchange_type(FederationUpstreamExchange)
