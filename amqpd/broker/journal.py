"""DefinitionJournal: durable topology changes become records in the shared log.

Why (issue 22): the whole ``definitions.json`` used to be rewritten on every durable
change, so with 10,000 queues one declare cost a 3 MB write and a client waiting for
each declare-ok made every change its own rewrite. Now each change is one small
DEFINITION record (``store/format.py``) written through the store's group commit, and
the store keeps the current set (``store/defs.py``) and snapshots it at checkpoints in
its writer thread. A change costs the same whatever already exists.

The broker's one hook is :meth:`Broker.definitions_changed`:

* with an object (a queue, an exchange or a binding, from ``vhost.py``), that object's
  entry is put or deleted; whether it is persisted at all (durable, not exclusive, not a
  built-in exchange) is decided here, once;
* without one (users, permissions, vhosts, policies, parameters: the HTTP API, plugins,
  definitions import), the small sections are compared with what was last recorded and
  only the entries that differ are written. Their size does not grow with queues.

Changes made in one synchronous stretch (a queue delete with its bindings, a vhost
delete with all its queues) travel in one record: after a crash they are all there or
none. Durability for a reply: :meth:`target` names "everything recorded so far" and
:meth:`when_durable` calls back once the store's commit covers it; the channel holds a
declare-ok until then, the HTTP API its response.

In a cluster (``broker.cluster``, amqpd/cluster/) every recorded entry is also handed to
the cluster's mirror, which writes it to etcd for the other nodes, and a reply waits for
that as well (``after_mirrored``). A queue led by another node is not recorded here at
all: its definition lives in the cluster's catalogue. With persistence off the entries
still reach the mirror (there is no store to record them in).

Keys (the store treats them as opaque, except a queue's, which is its queue key)::

    DEF_VHOST name                  DEF_USER name          DEF_PERMISSION user NUL vhost
    DEF_TOPIC_PERMISSION user NUL vhost NUL exchange       DEF_POLICY vhost NUL name
    DEF_PARAMETER component NUL vhost NUL name             DEF_GLOBAL_PARAMETER name
    DEF_EXCHANGE vhost NUL name     DEF_QUEUE vhost NUL name
    DEF_BINDING vhost NUL source NUL destination_type NUL destination NUL key NUL args

Bodies are the entries of RabbitMQ's definitions JSON (``broker/definitions.py``), so
recovery turns them back into a definitions document section by section.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpd.broker.exchange import Binding, Exchange
from amqpd.broker.queue_type import QueueType
from amqpd.protocol.errors import AMQPError
from amqpd.store import format as fmt

if TYPE_CHECKING:
    from amqpd.server import Broker
    from amqpd.store.api import MessageStore

log = logging.getLogger("amqpd.definitions")

BUILTIN_EXCHANGES = frozenset({"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers",
                               "amq.match", "amq.rabbitmq.trace", "amq.rabbitmq.log"})
SMALL_KINDS = (fmt.DEF_VHOST, fmt.DEF_USER, fmt.DEF_PERMISSION, fmt.DEF_TOPIC_PERMISSION,
               fmt.DEF_POLICY, fmt.DEF_PARAMETER, fmt.DEF_GLOBAL_PARAMETER)
SECTION_OF = {fmt.DEF_VHOST: "vhosts", fmt.DEF_USER: "users",
              fmt.DEF_PERMISSION: "permissions", fmt.DEF_TOPIC_PERMISSION: "topic_permissions",
              fmt.DEF_POLICY: "policies", fmt.DEF_PARAMETER: "parameters",
              fmt.DEF_GLOBAL_PARAMETER: "global_parameters"}
Callback = Callable[[BaseException | None], None]
Entries = dict[tuple[int, str], bytes]


def _json(value: dict[str, Any]) -> bytes:
    # default=str: an AMQP table may hold values JSON has no type for (decimals,
    # timestamps); they are kept as text rather than losing the whole object
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def queue_entry(q: QueueType) -> tuple[str, bytes]:
    return (f"{q.vhost.name}\x00{q.name}", _json(
        {"name": q.name, "vhost": q.vhost.name, "durable": True,
         "auto_delete": q.auto_delete, "arguments": q.arguments}))


def exchange_entry(x: Exchange) -> tuple[str, bytes]:
    return (f"{x.vhost}\x00{x.name}", _json(
        {"name": x.name, "vhost": x.vhost, "type": x.type_name, "durable": x.durable,
         "auto_delete": x.auto_delete, "internal": x.internal, "arguments": x.arguments}))


def binding_entry(b: Binding) -> tuple[str, bytes]:
    kind, dest, rk, akey = b.key
    vhost = b.source.vhost
    return ("\x00".join((vhost, b.source.name, kind, dest, rk, akey)), _json(
        {"source": b.source.name, "vhost": vhost, "destination": dest,
         "destination_type": kind, "routing_key": rk, "arguments": b.arguments}))


def persisted(obj: QueueType | Exchange | Binding) -> bool:
    """Does this object outlive a restart (RabbitMQ's rules)?"""
    if isinstance(obj, QueueType):
        return obj.durable and obj.exclusive_owner is None
    if isinstance(obj, Exchange):
        return obj.durable and obj.name not in BUILTIN_EXCHANGES
    src, dest = obj.source, obj.destination
    if not src.name or not src.durable or not dest.durable:
        return False
    return not isinstance(dest, QueueType) or dest.exclusive_owner is None


def small_entries(broker: Broker) -> Entries:
    """Users, vhosts, permissions, policies, parameters as entries (not queues etc.)."""
    out: Entries = {}
    auth, params = broker.auth, broker.parameters
    for u in auth.users.values():
        out[(fmt.DEF_USER, u.name)] = _json(
            {"name": u.name, "password_hash": u.password_hash,
             "hashing_algorithm": u.hashing_algorithm, "tags": list(u.tags),
             "limits": dict(params.user_limits.get(u.name, {}))})
    for name in broker.vhosts:
        meta = params.vhost_meta.get(name, {})
        out[(fmt.DEF_VHOST, name)] = _json(
            {"name": name, "limits": [],
             "metadata": {"description": meta.get("description", ""),
                          "tags": meta.get("tags", [])}})
    for (user, vhost), perm in auth.permissions.items():
        out[(fmt.DEF_PERMISSION, f"{user}\x00{vhost}")] = _json(
            {"user": user, "vhost": vhost, "configure": perm.configure, "write": perm.write,
             "read": perm.read})
    for t in params.topic_permissions:
        key = "\x00".join(str(t.get(k, "")) for k in ("user", "vhost", "exchange"))
        out[(fmt.DEF_TOPIC_PERMISSION, key)] = _json(t)
    for p in broker.policies.list():
        out[(fmt.DEF_POLICY, f"{p.get('vhost', '')}\x00{p['name']}")] = _json(
            {"vhost": p.get("vhost", ""), "name": p["name"], "pattern": p["pattern"],
             "apply-to": p.get("apply-to", "all"), "definition": p["definition"],
             "priority": p.get("priority", 0)})
    for p in params.list():
        key = f"{p['component']}\x00{p['vhost']}\x00{p['name']}"
        out[(fmt.DEF_PARAMETER, key)] = _json(p)
    for g in params.list_global():
        out[(fmt.DEF_GLOBAL_PARAMETER, g["name"])] = _json(g)
    return out


class DefinitionJournal:
    """Owned by the Broker; inactive (everything a no-op) until :meth:`attach`."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store: MessageStore | None = None
        self.restoring = False
        self.recorded = 0  # changes handed to the store so far
        self.durable = 0  # ... of which a commit has confirmed this many
        self._small: Entries = {}  # the small sections as last recorded
        # durability waits in progress: id -> (time.monotonic() it began, the change
        # count it needs), for the watchdog and the node-can-declare health check
        self._waits: dict[int, tuple[float, int]] = {}
        self._next_wait = 0

    def attach(self, store: MessageStore) -> None:
        self.store = store

    # ------------------------------------------------------------------ recording
    def changed(self, obj: QueueType | Exchange | Binding | None, deleted: bool) -> None:
        store = self.store
        cluster = self.broker.cluster
        if self.restoring or (store is None and cluster is None):
            return
        if obj is None:
            self._record_small()
            return
        if not persisted(obj):
            if cluster is not None and not isinstance(obj, QueueType):
                self._transient(obj, deleted)
            return
        if isinstance(obj, QueueType):
            if cluster is not None and not cluster.records_queue(obj.vhost.name, obj.name):
                return  # led by another node: its definition is the cluster's, not ours
            kind, (key, body) = fmt.DEF_QUEUE, queue_entry(obj)
        elif isinstance(obj, Exchange):
            kind, (key, body) = fmt.DEF_EXCHANGE, exchange_entry(obj)
        else:
            kind, (key, body) = fmt.DEF_BINDING, binding_entry(obj)
        self._append(store, kind, key, b"" if deleted else body)

    def _append(self, store: MessageStore | None, kind: int, key: str, body: bytes) -> None:
        from amqpd.store.api import StoreError

        if store is not None:
            try:
                store.append_definition(kind, key, body)
            except StoreError as exc:  # the commit a reply waits for reports it
                log.error("definition change not recorded: %s", exc)
                self.broker.publisher.store_failed(exc)
        self.recorded += 1
        cluster = self.broker.cluster
        if cluster is not None:  # the cluster mirrors it to every node (through etcd)
            cluster.definition_recorded(kind, key, body)

    def _transient(self, obj: Exchange | Binding, deleted: bool) -> None:
        """In a cluster, non-durable exchanges and the bindings that are not durable are
        cluster-wide too, as in RabbitMQ (amqpd/cluster/transient_defs.py): not in the
        log, but a reply waits for etcd as for a durable change. A binding to a
        non-durable or exclusive queue travels with its queue (cluster/transient.py)."""
        cluster = self.broker.cluster
        assert cluster is not None
        if isinstance(obj, Exchange):
            if obj.name in BUILTIN_EXCHANGES:
                return
            kind, (key, body) = fmt.DEF_EXCHANGE, exchange_entry(obj)
        else:
            dest = obj.destination
            if isinstance(dest, QueueType) and not persisted(dest):
                # a non-durable queue's, cluster-wide: the reply waits until every node
                # has it (so a publish anywhere routes by it)
                if cluster.transient_binding(obj, deleted):
                    self.awaits_cluster()
                return
            if not obj.source.name:
                return
            kind, (key, body) = fmt.DEF_BINDING, binding_entry(obj)
        if cluster.transient_recorded(kind, key, b"" if deleted else body):
            self.recorded += 1  # the reply waits for etcd (when_durable)

    def awaits_cluster(self) -> None:
        """A change the cluster spreads itself (a non-durable queue or its binding)
        was made: the next reply waits for it as for a recorded change
        (``when_durable`` -> ``cluster.after_mirrored``)."""
        self.recorded += 1

    def _record_small(self) -> None:
        store = self.store
        now = small_entries(self.broker)
        old = self._small
        for ident, body in now.items():
            if old.get(ident) != body:
                self._append(store, ident[0], ident[1], body)
        for ident in old.keys() - now.keys():
            self._append(store, ident[0], ident[1], b"")
        self._small = now

    def record_all(self) -> None:
        """Record every durable object (migration from a definitions.json)."""
        store = self.store
        assert store is not None
        self._record_small()
        for vh in self.broker.vhosts.values():
            for x in vh.exchanges.values():
                self.changed(x, False)
            for q in vh.queues.values():
                self.changed(q, False)
            for x in vh.exchanges.values():
                for b in x.bindings.values():
                    self.changed(b, False)

    # ------------------------------------------------------------------ durability
    def target(self) -> int:
        return self.recorded

    def when_durable(self, target: int, callback: Callback) -> None:
        """Call back once the changes up to ``target`` are durable (maybe at once)."""
        if target <= self.durable:
            callback(None)
            return
        cluster = self.broker.cluster
        if self.store is None and cluster is None:
            callback(None)
            return

        self._next_wait += 1
        wait = self._next_wait
        self._waits[wait] = (time.monotonic(), target)

        def durable(error: BaseException | None) -> None:
            self._waits.pop(wait, None)
            if error is None and target > self.durable:
                self.durable = target
            callback(error)

        done: Callback = durable
        if cluster is not None:
            # in a cluster a change is acknowledged once etcd holds it as well
            done = cluster.after_mirrored(durable)
        if self.store is None:
            done(None)
            return
        self.broker.publisher.commit(done)

    def waits(self, now: float) -> list[tuple[float, str]]:
        """The durability waits in progress (a declare-ok, an HTTP response), as
        ``(started, what)`` for amqpd/watchdog.py; oldest first."""
        out = []
        for started, target in self._waits.values():
            where = "the store's commit"
            if self.broker.cluster is not None:
                where += " and etcd"
            out.append((started, f"definition change {target} to become durable "
                                 f"({where}; {self.durable} of {self.recorded} are)"))
        return out

    async def wait_durable(self) -> None:
        """For the HTTP API: return once everything recorded so far is durable."""
        import asyncio

        target = self.recorded
        if target <= self.durable or (self.store is None and self.broker.cluster is None):
            return
        fut: asyncio.Future[BaseException | None] = \
            asyncio.get_running_loop().create_future()

        def done(error: BaseException | None) -> None:
            if not fut.done():
                fut.set_result(error)

        self.when_durable(target, done)
        error = await fut
        if error is not None:
            raise error

    # ------------------------------------------------------------------ recovery
    def restore(self, entries: Entries) -> None:
        """Rebuild the broker's topology from the store's definitions, not re-recording
        any of it. An entry that cannot be applied is logged and skipped: one bad
        object must not keep the node from starting."""
        from amqpd.broker.definitions import import_definitions

        broker = self.broker
        sections: dict[str, list[dict[str, Any]]] = {s: [] for s in SECTION_OF.values()}
        queues: list[dict[str, Any]] = []
        exchanges: list[dict[str, Any]] = []
        bindings: list[dict[str, Any]] = []
        # one parse for all bodies: per-call overhead dominated 200,000 small loads
        items = json.loads(b"[" + b",".join(entries.values()) + b"]")
        for (kind, _key), item in zip(entries, items, strict=True):
            if kind == fmt.DEF_QUEUE:
                queues.append(item)
            elif kind == fmt.DEF_EXCHANGE:
                exchanges.append(item)
            elif kind == fmt.DEF_BINDING:
                bindings.append(item)
            elif kind in SECTION_OF:
                sections[SECTION_OF[kind]].append(item)
        self.restoring = True
        try:
            if sections["users"]:
                broker.auth.users.clear()
                broker.auth.permissions.clear()
                broker.auth.version += 1
            if any(sections.values()):
                import_definitions(broker, sections)
            self._restore_topology(queues, exchanges, bindings)
        finally:
            self.restoring = False
        self._small = {ident: body for ident, body in entries.items()
                       if ident[0] in SMALL_KINDS}

    def _restore_topology(self, queues: list[dict[str, Any]], exchanges: list[dict[str, Any]],
                          bindings: list[dict[str, Any]]) -> None:
        vhosts = self.broker.vhosts
        for x in exchanges:
            vh = vhosts.get(x["vhost"])
            if vh is None or x["name"] in vh.exchanges:
                continue
            try:
                vh.declare_exchange(x["name"], x["type"], durable=True,
                                    auto_delete=x["auto_delete"], internal=x["internal"],
                                    arguments=x["arguments"])
            except AMQPError as exc:
                log.error("recovery: exchange %r in vhost %r skipped: %s", x["name"],
                          x["vhost"], exc.text)
        for q in queues:
            vh = vhosts.get(q["vhost"])
            if vh is None:
                log.error("recovery: queue %r skipped: vhost %r is gone", q["name"], q["vhost"])
                continue
            try:
                # only a server-named queue may carry the reserved "amq." prefix; saying
                # server_named for every queue would make a quorum queue refuse itself
                vh.declare_queue(q["name"], durable=True, auto_delete=q["auto_delete"],
                                 arguments=q["arguments"],
                                 server_named=q["name"].startswith("amq."))
            except AMQPError as exc:
                log.error("recovery: queue %r in vhost %r skipped: %s", q["name"],
                          q["vhost"], exc.text)
        for b in bindings:
            vh = vhosts.get(b["vhost"])
            try:
                if vh is None:
                    raise LookupError(f"vhost {b['vhost']!r} is gone")
                vh.bind(b["destination_type"], b["destination"], b["source"],
                        b["routing_key"], b["arguments"])
            except (AMQPError, LookupError) as exc:
                log.error("recovery: binding %r skipped: %s", b, exc)

    def migrate(self, path: Path) -> None:
        """First start over a data dir from before issue 22: load its definitions.json
        the old way, record all of it in the log, make that durable, then set the file
        aside (renamed, not deleted) so it is never read again."""
        from amqpd.store.definitions import DefinitionsStore

        done = path.with_name(path.name + ".migrated")
        self.restoring = True
        try:
            self.broker._restore_definitions(DefinitionsStore(path).load())
        finally:
            self.restoring = False
        self.record_all()
        sync = getattr(self.store, "sync", None)
        if sync is not None:
            sync()
        path.rename(done)
        log.info("definitions migrated from %s into the log (file kept as %s)", path, done)
