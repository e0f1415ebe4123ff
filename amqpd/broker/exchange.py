"""Exchanges: one small class per type, registered by name, RabbitMQ-style.

An exchange keeps its bindings in the shape its lookup needs (a dict by routing key for
direct, a set for fanout, a trie for topic, a list for headers) and answers one question:
:meth:`ExchangeType.route` -- which destinations get this message? Destinations are queues
or other exchanges (exchange-to-exchange bindings); the vhost follows exchange
destinations recursively.

A type is added with :func:`register_exchange_type`, the same registry the built-in types
use, so a plugin adds ``x-delayed-message`` exactly the way ``topic`` is added.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from amqpd.broker.message import Message
    from amqpd.broker.queue_type import QueueType
    from amqpd.broker.vhost import VHost


def args_key(arguments: dict[str, Any] | None) -> str:
    """A hashable, order-independent identity for binding arguments."""
    if not arguments:
        return ""
    return repr(sorted((k, repr(v)) for k, v in arguments.items()))


@dataclass(slots=True, eq=False)
class Binding:
    source: Exchange
    destination: QueueType | Exchange
    routing_key: str
    arguments: dict[str, Any]
    key: tuple[str, str, str, str] = field(init=False)

    def __post_init__(self) -> None:
        kind = "exchange" if isinstance(self.destination, Exchange) else "queue"
        self.key = (kind, self.destination.name, self.routing_key, args_key(self.arguments))

    @property
    def destination_type(self) -> str:
        return self.key[0]


Destination = Any  # QueueType | Exchange, kept loose to avoid an import cycle at runtime


@mypyc_attr(allow_interpreted_subclasses=True)
class Exchange:
    """Base of every exchange type. Subclasses implement the binding index and route()."""

    type_name: ClassVar[str] = ""

    def __init__(
        self, vhost: str, name: str, durable: bool = False, auto_delete: bool = False,
        internal: bool = False, arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        self.bindings: dict[tuple[str, str, str, str], Binding] = {}
        self.had_bindings = False
        self.policy: dict[str, Any] | None = None
        self.policy_name: str | None = None
        self.alternate: str | None = None
        # bindings whose destination is this exchange (None until the first): deleting
        # it then costs what it is bound by, not a scan of every binding in the vhost
        self.inbound: set[Binding] | None = None
        # RabbitMQ's publish_in and publish_out: messages published to this exchange,
        # and the copies it routed (one per queue reached). Counted by the publish
        # pipeline (Publisher.publish), read by the HTTP API's rate sampler.
        self.stat_publish_in = 0
        self.stat_publish_out = 0
        self.validate(self.arguments)

    # --- called BEFORE declaration, to check arguments; raise PreconditionFailed etc.
    def validate(self, arguments: dict[str, Any]) -> None:
        """Check declare arguments; the default accepts anything."""

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        """Check a binding before it is added; the default accepts anything."""

    def attach(self, broker: Any, vhost: VHost) -> None:
        """After declaration and after every policy change (``broker``: the node's
        :class:`amqpd.server.Broker`): a type with settings of its own (arguments and
        policy) works them out here; the default has none."""

    # --- binding index maintenance (called after the binding is recorded in .bindings)
    def add_binding(self, binding: Binding) -> None:
        raise NotImplementedError

    def remove_binding(self, binding: Binding) -> None:
        raise NotImplementedError

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        """Destinations (queues or exchanges) for a message with this routing key."""
        raise NotImplementedError

    # --- shared bookkeeping
    def bind(self, binding: Binding) -> bool:
        """Record a binding; False if it already existed (bind is idempotent)."""
        if binding.key in self.bindings:
            return False
        self.validate_binding(binding.routing_key, binding.arguments)
        self.bindings[binding.key] = binding
        self.had_bindings = True
        self.add_binding(binding)
        dest = binding.destination
        if dest.inbound is None:
            dest.inbound = set()
        dest.inbound.add(binding)
        return True

    def unbind(self, key: tuple[str, str, str, str]) -> Binding | None:
        binding = self.bindings.pop(key, None)
        if binding is not None:
            self.remove_binding(binding)
            inbound = binding.destination.inbound
            if inbound is not None:
                inbound.discard(binding)
        return binding

    def close(self) -> None:
        """Called when the exchange is deleted (types with timers stop them here)."""

    def refused(self, message: Message) -> None:
        """Called when a message published to this exchange was routed but then refused
        (a queue's reject-publish overflow, a store failure): its publisher gets a nack.
        A type that remembered the message (deduplication) forgets it here."""

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vhost": self.vhost,
            "type": self.type_name,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "internal": self.internal,
            "arguments": self.arguments,
        }


EXCHANGE_TYPES: dict[str, type[Exchange]] = {}


def register_exchange_type(cls: type[Exchange]) -> type[Exchange]:
    """Class decorator: make ``cls.type_name`` declarable."""
    EXCHANGE_TYPES[cls.type_name] = cls
    return cls
