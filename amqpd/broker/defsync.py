"""One durable definition change, both ways: the broker's definitions as journal entries,
and a journal entry (made on another node) applied to this broker.

Why here: the cluster (issue 15, ``amqpd/cluster/definitions.py``) keeps every node's
definitions equal by mirroring the :class:`~amqpd.broker.journal.DefinitionJournal`'s
entries (``(kind, key, JSON body)``, an empty body deletes) through etcd. Turning an
entry back into broker state is the inverse of the journal's encoders, so it lives in
the broker package beside them, and the cluster reaches it only through
:meth:`amqpd.broker.api.BrokerAPI.apply_definition`.

Applying is idempotent: an entry equal to what the broker holds changes nothing, a delete
of something absent is a no-op. A change applied here is recorded in the local log like
any other (a node that restarts without etcd still has it); the journal tells its mirror
hook, and the cluster's mirror knows it is applying and does not send it back.

A queue entry is applied as a local queue only where the caller says the queue is led by
this node; for a queue led elsewhere the caller keeps the definition in its catalogue
(and the queue-type hook of the inter-node links materialises it).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from amqpd.broker import topic_auth
from amqpd.broker.definitions import import_definitions
from amqpd.broker.journal import (
    BUILTIN_EXCHANGES,
    binding_entry,
    exchange_entry,
    persisted,
    queue_entry,
    small_entries,
)
from amqpd.broker.queue_type import QueueType
from amqpd.store import format as fmt

if TYPE_CHECKING:
    from amqpd.server import Broker

log = logging.getLogger("amqpd.definitions")

# the journal's kinds by the names the cluster writes into its etcd keys
KIND_NAMES: dict[int, str] = {
    fmt.DEF_VHOST: "vhost", fmt.DEF_USER: "user", fmt.DEF_PERMISSION: "permission",
    fmt.DEF_TOPIC_PERMISSION: "topic_permission", fmt.DEF_POLICY: "policy",
    fmt.DEF_PARAMETER: "parameter", fmt.DEF_GLOBAL_PARAMETER: "global_parameter",
    fmt.DEF_EXCHANGE: "exchange", fmt.DEF_QUEUE: "queue", fmt.DEF_BINDING: "binding",
}
KIND_QUEUE = fmt.DEF_QUEUE
KIND_EXCHANGE = fmt.DEF_EXCHANGE
KIND_BINDING = fmt.DEF_BINDING
KIND_VHOST = fmt.DEF_VHOST

Entries = dict[tuple[int, str], bytes]


def local_entries(broker: Broker) -> Entries:
    """Every durable definition this broker holds, as the journal would record it."""
    out = dict(small_entries(broker))
    for vh in broker.vhosts.values():
        for x in vh.exchanges.values():
            if persisted(x):
                key, body = exchange_entry(x)
                out[(fmt.DEF_EXCHANGE, key)] = body
        for q in vh.queues.values():
            if persisted(q):
                key, body = queue_entry(q)
                out[(fmt.DEF_QUEUE, key)] = body
        for x in vh.exchanges.values():
            for b in x.bindings.values():
                if persisted(b):
                    key, body = binding_entry(b)
                    out[(fmt.DEF_BINDING, key)] = body
    return out


def transient_entries(broker: Broker) -> Entries:
    """The non-durable exchanges and the bindings that are not durable (those not to a
    non-durable or exclusive queue) this broker holds: in a cluster they are
    cluster-wide, as in RabbitMQ (amqpd/cluster/transient_defs.py)."""
    out: Entries = {}
    for vh in broker.vhosts.values():
        for x in vh.exchanges.values():
            if x.name not in BUILTIN_EXCHANGES and not persisted(x):
                key, body = exchange_entry(x)
                out[(fmt.DEF_EXCHANGE, key)] = body
        for x in vh.exchanges.values():
            if not x.name:
                continue
            for b in x.bindings.values():
                dest = b.destination
                if persisted(b) or (isinstance(dest, QueueType) and not persisted(dest)):
                    continue
                key, body = binding_entry(b)
                out[(fmt.DEF_BINDING, key)] = body
    return out


def apply_entry(broker: Broker, kind: int, key: str, body: bytes | None) -> None:
    """Make the broker hold ``body`` for ``(kind, key)`` (None or b"": hold nothing).

    Raises :class:`amqpd.protocol.errors.AMQPError`,
    :class:`~amqpd.broker.definitions.DefinitionsError`, ``LookupError`` or
    ``ValueError`` when the entry cannot be applied; the caller logs it and goes on.
    """
    parts = key.split("\x00")
    item: dict[str, Any] | None = json.loads(body) if body else None
    if kind in (fmt.DEF_EXCHANGE, fmt.DEF_QUEUE, fmt.DEF_BINDING):
        _apply_topology(broker, kind, parts, item)
    else:
        _apply_small(broker, kind, parts, item)


def _apply_small(broker: Broker, kind: int, parts: list[str],
                 item: dict[str, Any] | None) -> None:
    api = broker.api
    if item is not None:
        if kind == fmt.DEF_TOPIC_PERMISSION:
            changed = topic_auth.put(broker.parameters.topic_permissions, item["user"],
                                     item["vhost"], item["exchange"], item["write"],
                                     item["read"])
            del changed
            broker.auth.version += 1
            broker.definitions_changed()
        elif kind == fmt.DEF_GLOBAL_PARAMETER:
            broker.parameters.set_global(item["name"], item.get("value"))
        else:
            section = {fmt.DEF_VHOST: "vhosts", fmt.DEF_USER: "users",
                       fmt.DEF_PERMISSION: "permissions", fmt.DEF_POLICY: "policies",
                       fmt.DEF_PARAMETER: "parameters"}[kind]
            if kind == fmt.DEF_USER and not item.get("limits"):
                broker.parameters.user_limits.pop(item["name"], None)
            import_definitions(broker, {section: [item]})
        return
    if kind == fmt.DEF_VHOST:
        if parts[0] in broker.vhosts:
            api.delete_vhost(parts[0])
    elif kind == fmt.DEF_USER:
        broker.auth.delete_user(parts[0])
    elif kind == fmt.DEF_PERMISSION:
        api.clear_permissions(parts[0], parts[1])
    elif kind == fmt.DEF_TOPIC_PERMISSION:
        api.clear_topic_permissions(parts[0], parts[1], parts[2])
    elif kind == fmt.DEF_POLICY:
        if api.policy(parts[0], parts[1]) is not None:
            api.clear_policy(parts[0], parts[1])
    elif kind == fmt.DEF_PARAMETER:
        broker.parameters.clear(parts[0], parts[1], parts[2])
    elif kind == fmt.DEF_GLOBAL_PARAMETER:
        broker.parameters.clear_global(parts[0])


def _apply_topology(broker: Broker, kind: int, parts: list[str],
                    item: dict[str, Any] | None) -> None:
    vh = broker.vhosts.get(parts[0])
    if vh is None:
        if item is None:
            return
        raise LookupError(f"vhost '{parts[0]}' does not exist")
    if kind == fmt.DEF_EXCHANGE:
        name = parts[1]
        existing = vh.exchanges.get(name)
        if item is None:
            if existing is not None:
                vh.delete_exchange(name)
            return
        if existing is not None and exchange_entry(existing)[1] != _canonical(item):
            vh.delete_exchange(name)  # redefined elsewhere: the cluster's version wins
        vh.declare_exchange(name, item["type"], durable=item.get("durable", True),
                            auto_delete=item.get("auto_delete", False),
                            internal=item.get("internal", False),
                            arguments=item.get("arguments") or {})
    elif kind == fmt.DEF_QUEUE:
        name = parts[1]
        if item is None:
            q = vh.queues.get(name)
            if q is not None:
                vh.delete_queue(q, reason="deleted on another node")
            return
        if name not in vh.queues:
            vh.declare_queue(name, durable=True, auto_delete=item.get("auto_delete", False),
                             arguments=item.get("arguments") or {},
                             server_named=name.startswith("amq."))
    else:
        source, dtype, dest, rk = parts[1], parts[2], parts[3], parts[4]
        if item is None:
            # the key holds the arguments' identity, not the table: find the binding
            ex = vh.exchanges.get(source)
            wanted = "\x00".join(parts)
            for b in list(ex.bindings.values()) if ex is not None else []:
                if binding_entry(b)[0] == wanted:
                    vh.unbind(dtype, dest, source, rk, b.arguments)
            return
        vh.bind(dtype, dest, source, rk, item.get("arguments") or {})


def _canonical(item: dict[str, Any]) -> bytes:
    """An exchange item as the journal encodes it (to compare with a local exchange)."""
    return json.dumps({"name": item["name"], "vhost": item["vhost"], "type": item["type"],
                       "durable": item.get("durable", True),
                       "auto_delete": item.get("auto_delete", False),
                       "internal": item.get("internal", False),
                       "arguments": item.get("arguments") or {}},
                      separators=(",", ":"), default=str).encode()


__all__ = ["KIND_NAMES", "apply_entry", "local_entries", "transient_entries"]
