"""A virtual host: its exchanges, queues and bindings, and the rules for changing them.

The rules (reserved ``amq.`` names, equivalence checks, exclusivity, RabbitMQ's error
texts) live here, in one place; callers outside the broker package reach them through
the public broker API (:mod:`amqpd.broker.api`), which delegates to these methods.
Methods raise :mod:`amqpd.protocol.errors` exceptions; callers translate them (AMQP
close, HTTP 4xx). Queues are held as :class:`~amqpd.broker.queue_type.QueueType`:
``x-queue-type`` picks the implementation at declaration.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import amqpd.broker.exchanges
import amqpd.broker.queue  # noqa: F401 - registers the classic queue type
from amqpd.broker.exchange import EXCHANGE_TYPES, Binding, Exchange, args_key
from amqpd.broker.message import Message
from amqpd.broker.queue_type import QueueType, resolve
from amqpd.broker.reply_to import DefaultExchange, ReplyRegistry, pseudo_queue
from amqpd.protocol.errors import (
    AccessRefused,
    CommandInvalid,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)

if TYPE_CHECKING:
    from amqpd.server import Broker

log = logging.getLogger("amqpd.vhost")

BUILTIN_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def generate_name(prefix: str) -> str:
    """RabbitMQ-style server-generated name: prefix + 22 url-safe base64 characters."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class VHost:
    def __init__(self, broker: Broker, name: str) -> None:
        self.broker = broker
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueType] = {}
        self.on_queue_deleted: list[Callable[[QueueType], None]] = []
        # observers (federation follows a federated exchange's bindings): called with the
        # source exchange after a bind or unbind through this API changed its bindings
        self.on_binding_changed: list[Callable[[Exchange], None]] = []
        # direct reply-to inboxes of this vhost; the default exchange routes replies there
        self.replies = ReplyRegistry(self)
        for xname, xtype in BUILTIN_EXCHANGES:
            self.exchanges[xname] = EXCHANGE_TYPES[xtype](name, xname, durable=True)
        self.exchanges[""] = DefaultExchange(name, self.replies)

    def __repr__(self) -> str:
        return f"<VHost {self.name!r}>"

    # ------------------------------------------------------------------ lookups
    def get_exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise NotFound(f"no exchange '{name}' in vhost '{self.name}'")
        return ex

    def get_queue(self, name: str) -> QueueType:
        q = self.queues.get(name)
        if q is None:
            raise NotFound(f"no queue '{name}' in vhost '{self.name}'")
        return q

    def check_exclusive(self, queue: QueueType, owner: object | None, strict: bool = False) -> None:
        """405 unless ``owner`` may use ``queue``. ``strict`` (redeclaration, as RabbitMQ):
        the declared exclusivity must match too, so an exclusive redeclare of a shared
        queue, or a shared redeclare of one's own exclusive queue, is refused."""
        if (queue.exclusive_owner is not None and queue.exclusive_owner is not owner) or (
                strict and queue.exclusive_owner is not owner):
            raise ResourceLocked(
                f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost "
                f"'{self.name}'. It could be originally declared on another connection or the "
                "exclusive property value does not match that of the original declaration."
            )

    # ------------------------------------------------------------------ exchanges
    def declare_exchange(
        self, name: str, type_: str, *, passive: bool = False, durable: bool = False,
        auto_delete: bool = False, internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        existing = self.exchanges.get(name)
        if name == "":  # even a passive declare of it is refused, as RabbitMQ does
            raise AccessRefused("operation not permitted on the default exchange")
        if passive:
            if existing is None:
                raise NotFound(f"no exchange '{name}' in vhost '{self.name}'")
            return existing
        if existing is None and name.startswith("amq."):
            raise AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        cls = EXCHANGE_TYPES.get(type_)
        if cls is None:
            raise CommandInvalid(f"unknown exchange type '{type_}'")
        if existing is not None:
            self._check_exchange_equivalent(existing, type_, durable, auto_delete, internal,
                                            arguments or {})
            return existing
        ex = cls(self.name, name, durable=durable, auto_delete=auto_delete, internal=internal,
                 arguments=arguments)
        self.exchanges[name] = ex
        self.broker.apply_policies_to(self, ex)
        self.broker.definitions_changed(ex)  # (non-durable: cluster-wide in a cluster)
        log.debug("exchange declared: %s %s", name, type_)
        return ex

    def _check_exchange_equivalent(
        self, ex: Exchange, type_: str, durable: bool, auto_delete: bool, internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        for field, got, have in (
            ("type", type_, ex.type_name),
            ("durable", durable, ex.durable),
            ("auto_delete", auto_delete, ex.auto_delete),
            ("internal", internal, ex.internal),
        ):
            if got != have:
                raise PreconditionFailed(
                    f"inequivalent arg '{field}' for exchange '{ex.name}' in vhost '{self.name}': "
                    f"received '{_fmt(got)}' but current is '{_fmt(have)}'"
                )
        got_ae = arguments.get("alternate-exchange")
        have_ae = ex.arguments.get("alternate-exchange")
        if got_ae != have_ae:
            raise PreconditionFailed(
                f"inequivalent arg 'alternate-exchange' for exchange '{ex.name}' in vhost "
                f"'{self.name}': {_received(got_ae, have_ae)}"
            )

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if name == "":
            raise AccessRefused("operation not permitted on the default exchange")
        if name.startswith("amq.") and name in dict(BUILTIN_EXCHANGES):
            raise AccessRefused(f"operation not permitted on the built-in exchange '{name}'")
        ex = self.exchanges.get(name)
        if ex is None:
            return  # idempotent, as in RabbitMQ 3.x
        if if_unused and ex.bindings:
            raise PreconditionFailed(f"exchange '{name}' in vhost '{self.name}' in use")
        self._remove_exchange(ex)

    def _remove_exchange(self, ex: Exchange) -> None:
        self.exchanges.pop(ex.name, None)
        changed = self.broker.definitions_changed
        for binding in list(ex.bindings.values()):
            ex.unbind(binding.key)
            changed(binding, True)
        # bindings where this exchange is the destination
        for binding in list(ex.inbound or ()):
            binding.source.unbind(binding.key)
            changed(binding, True)
            self._maybe_auto_delete(binding.source)
        ex.close()
        changed(ex, True)

    def _maybe_auto_delete(self, ex: Exchange) -> None:
        if ex.auto_delete and not ex.bindings and ex.had_bindings and ex.name in self.exchanges:
            self._remove_exchange(ex)

    # ------------------------------------------------------------------ queues
    def declare_queue(
        self, name: str, *, passive: bool = False, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None, owner: object | None = None,
        server_named: bool = False,
    ) -> QueueType:
        """Declare (or passively check) a queue. ``owner`` is the declaring connection."""
        existing = self.queues.get(name)
        if existing is not None:
            existing.touch()  # a declare counts as use for x-expires
        if passive:
            if existing is None:
                pseudo = pseudo_queue(self, name)
                if pseudo is not None:
                    return pseudo
                raise NotFound(f"no queue '{name}' in vhost '{self.name}'")
            self.check_exclusive(existing, owner)
            return existing
        if existing is not None:
            self.check_exclusive(existing, owner)
            self.check_exclusive(existing, exclusive_owner, strict=True)
            self._check_queue_equivalent(existing, durable, exclusive_owner is not None,
                                         auto_delete, arguments or {})
            return existing
        if name.startswith("amq.") and not server_named:
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        # x-queue-type picks the type, which checks the declaration
        cls = resolve(arguments or {}, name, self.name, durable, exclusive_owner is not None,
                      auto_delete, server_named)
        placer = self.broker.queue_placer  # a cluster's leader locator; None on one node
        if placer is not None and durable and exclusive_owner is None:
            placed = placer(self, name, cls, auto_delete, arguments or {})
            if placed is not None:  # led by another node, which was asked to create it
                return placed
        q = cls(self, name, durable=durable, exclusive_owner=exclusive_owner,
                auto_delete=auto_delete, arguments=arguments)
        self.queues[name] = q
        self.exchanges[""].bind(Binding(self.exchanges[""], q, name, {}))
        self.broker.apply_policies_to(self, q)
        if durable and exclusive_owner is None:
            self.broker.definitions_changed(q)
        elif self.broker.cluster is not None and self.broker.cluster.transient_declared(q):
            # known on every node (issue 15), and the declare-ok waits until it is
            self.broker.definitions.awaits_cluster()
        log.debug("queue declared: %s", name)
        return q

    def _check_queue_equivalent(
        self, q: QueueType, durable: bool, exclusive: bool, auto_delete: bool,
        arguments: dict[str, Any],
    ) -> None:
        for field, got, have in (
            ("durable", durable, q.durable),
            ("exclusive", exclusive, q.exclusive),
            ("auto_delete", auto_delete, q.auto_delete),
        ):
            if got != have:
                raise PreconditionFailed(
                    f"inequivalent arg '{field}' for queue '{q.name}' in vhost '{self.name}': "
                    f"received '{_fmt(got)}' but current is '{_fmt(have)}'"
                )
        compared = q.compared_arguments or EQUIVALENCE_ARGS
        keys = {k for k in set(arguments) | set(q.arguments) if k in compared}
        for key in sorted(keys):
            got_v, have_v = arguments.get(key), q.arguments.get(key)
            if got_v != have_v:
                raise PreconditionFailed(
                    f"inequivalent arg '{key}' for queue '{q.name}' in vhost '{self.name}': "
                    f"{_received(got_v, have_v)}"
                )

    def delete_queue_named(
        self, name: str, *, if_unused: bool = False, if_empty: bool = False,
        owner: object | None = None,
    ) -> int:
        q = self.queues.get(name)
        if q is None:
            return 0  # idempotent, as in RabbitMQ 3.x
        self.check_exclusive(q, owner)
        q.check_delete(if_unused, if_empty)
        if if_unused and q.consumers:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and q.message_count:
            raise PreconditionFailed(f"queue '{name}' in vhost '{self.name}' not empty")
        n = q.message_count
        self.delete_queue(q, reason="deleted")
        return n

    def delete_queue(self, q: QueueType, reason: str = "deleted") -> None:
        if q.deleted or self.queues.get(q.name) is not q:
            return
        q.deleted = True
        del self.queues[q.name]
        changed = self.broker.definitions_changed
        for binding in list(q.inbound or ()):
            binding.source.unbind(binding.key)
            changed(binding, True)
            self._maybe_auto_delete(binding.source)
        if q.durable:
            changed(q, True)  # before the drop: the definition's delete settles it too
        q.delete()  # consumers cancelled, messages dropped, the store forgets it
        for cb in self.on_queue_deleted:
            cb(q)
        for cb in q.on_removed:
            cb(q)
        log.debug("queue %s: %s", reason, q.name)

    def purge_queue(self, name: str, owner: object | None = None) -> int:
        q = self.get_queue(name)
        self.check_exclusive(q, owner)
        return q.purge()

    # ------------------------------------------------------------------ bindings
    def _binding_ends(self, kind: str, destination: str, source: str,
                      owner: object | None) -> tuple[Exchange, QueueType | Exchange]:
        """The two ends of a (un)binding, with the checks both operations make."""
        if source == "" or (kind == "exchange" and destination == ""):
            raise AccessRefused("operation not permitted on the default exchange")
        dest: QueueType | Exchange
        if kind == "queue":
            dest = self.get_queue(destination)
            self.check_exclusive(dest, owner)
        else:
            dest = self.get_exchange(destination)
        return self.get_exchange(source), dest

    def bind(
        self, kind: str, destination: str, source: str, routing_key: str,
        arguments: dict[str, Any] | None = None, owner: object | None = None,
    ) -> None:
        """Bind a queue (kind='queue') or exchange (kind='exchange') to ``source``."""
        src, dest = self._binding_ends(kind, destination, source, owner)
        binding = Binding(src, dest, routing_key, dict(arguments or {}))
        if not src.bind(binding):
            return
        self.broker.definitions_changed(binding)
        for cb in self.on_binding_changed:
            cb(src)

    def unbind(
        self, kind: str, destination: str, source: str, routing_key: str,
        arguments: dict[str, Any] | None = None, owner: object | None = None,
    ) -> None:
        """Remove a binding. As RabbitMQ 3.10 does, a missing source, destination or
        binding is not an error: there is nothing to remove, and the caller answers
        unbind-ok (aio-pika's cleanups rely on it)."""
        if source == "" or (kind == "exchange" and destination == ""):
            raise AccessRefused("operation not permitted on the default exchange")
        src = self.exchanges.get(source)
        dest: QueueType | Exchange | None
        if kind == "queue":
            dest = self.queues.get(destination)
            if dest is not None:
                self.check_exclusive(dest, owner)
        else:
            dest = self.exchanges.get(destination)
        if src is None or dest is None:
            return
        key = (kind, destination, routing_key, args_key(arguments))
        binding = src.unbind(key)
        if binding is not None:
            self.broker.definitions_changed(binding, True)
            self._maybe_auto_delete(src)
            for cb in self.on_binding_changed:
                cb(src)

    def bindings(self) -> list[Binding]:
        return [b for ex in self.exchanges.values() for b in ex.bindings.values()]

    # ------------------------------------------------------------------ routing
    def route(self, exchange: Exchange, message: Message,
              routing_keys: list[str]) -> list[QueueType]:
        """Every queue the message reaches, following exchange-to-exchange bindings once.

        This is the one routing result: direct reply-to inboxes (the default exchange)
        and a delayed exchange's held messages come back as destinations like any queue.
        """
        first = None
        if len(routing_keys) == 1:
            # the common case: one key, and it reaches one queue or none
            first = exchange.route(message, routing_keys[0])
            if not first and not exchange.alternate:
                return []
            if len(first) == 1:  # type: ignore[arg-type]
                (dest,) = first
                if isinstance(dest, QueueType):
                    return [dest]
        queues: dict[int, QueueType] = {}
        seen: set[int] = {id(exchange)}
        pending = [exchange]
        while pending:
            ex = pending.pop()
            matched = False
            for rk in routing_keys:
                # route() is called once per exchange and key (some types keep state)
                dests = first if ex is exchange and first is not None else ex.route(message, rk)
                for dest in dests:
                    matched = True
                    if isinstance(dest, QueueType):
                        queues[id(dest)] = dest
                    elif id(dest) not in seen:
                        seen.add(id(dest))
                        pending.append(dest)
            if not matched and ex.alternate:
                alt = self.exchanges.get(ex.alternate)
                if alt is not None and id(alt) not in seen:
                    seen.add(id(alt))
                    pending.append(alt)
        return list(queues.values())

    def schedule_dispatch(self, queue: QueueType) -> None:
        self.broker.schedule_dispatch(queue)

    def store_settle(self, queue: QueueType, positions: list[int]) -> None:
        self.broker.publisher.store_settle(queue, positions)

    def store_delivered(self, queue: QueueType, position: int) -> None:
        self.broker.publisher.store_delivered(queue, position)

    def store_drop_queue(self, queue: QueueType) -> None:
        self.broker.publisher.store_drop_queue(queue)


EQUIVALENCE_ARGS = frozenset({
    "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-dead-letter-exchange",
    "x-dead-letter-routing-key", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-type",
    "x-single-active-consumer", "x-queue-master-locator",
})


def _kind(value: Any) -> str:
    """The AMQP field type a client sent ``value`` as (pika's choice for integers)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    return {bool: "bool", str: "longstr", float: "double"}.get(type(value), "table")


def _describe(value: Any) -> str:
    if value is None:
        return "none"
    return f"the value '{_fmt(value)}' of type '{_kind(value)}'"


def _received(got: Any, have: Any) -> str:
    """RabbitMQ's wording: bare values when both sides have one of the same type."""
    if got is not None and have is not None and _kind(got) == _kind(have):
        return f"received '{_fmt(got)}' but current is '{_fmt(have)}'"
    return f"received {_describe(got)} but current is {_describe(have)}"
