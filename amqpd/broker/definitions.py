"""Definitions: the broker's topology as RabbitMQ's definitions JSON, both ways.

The shape is RabbitMQ 3.10's ``GET /api/definitions`` (``rabbitmqctl export_definitions``),
so a RabbitMQ export imports here and an amqpd export imports into RabbitMQ:
``users, vhosts, permissions, topic_permissions, parameters, global_parameters, policies,
queues, exchanges, bindings``. The export holds what RabbitMQ 3.10.8 exports: every
queue but the exclusive ones (a transient one with ``"durable": false``), every user
exchange, durable or not, and the bindings between exported objects (or from the
built-in ``amq.*`` exchanges to them).

Import checks the whole document before changing anything, so a bad file is refused
with a :class:`DefinitionsError` naming the offending entry, and the broker is unchanged.
Objects that already exist are redeclared; an inequivalent redeclaration is an error, as
it is in RabbitMQ. Persisting the result is the definitions store's business.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any

import amqpd
from amqpd.broker.auth import HASHING_SHA256, hash_password
from amqpd.broker.exchange import EXCHANGE_TYPES
from amqpd.protocol.errors import AMQPError

if TYPE_CHECKING:
    from amqpd.server import Broker

COMPAT_VERSION = "3.10.8"
HASHING_ALGORITHMS = ("rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512",
                      "rabbit_password_hashing_md5")
SECTIONS = ("users", "vhosts", "permissions", "topic_permissions", "parameters",
            "global_parameters", "policies", "queues", "exchanges", "bindings")
VHOST_SECTIONS = ("parameters", "policies", "queues", "exchanges", "bindings")


class DefinitionsError(ValueError):
    """The definitions document is malformed or cannot be applied; the text says where."""


# ---------------------------------------------------------------------------- export
def export_definitions(broker: Broker, vhost: str | None = None) -> dict[str, Any]:
    """The broker's definitions; with ``vhost``, RabbitMQ's per-vhost export shape."""
    auth = broker.auth
    params = broker.parameters
    vhosts = [vh for name, vh in sorted(broker.vhosts.items()) if vhost in (None, name)]
    queues, exchanges, bindings = [], [], []
    for vh in vhosts:
        # exclusive queues live and die with their connection: never exported
        exported_q = {q.name for q in vh.queues.values() if not q.exclusive}
        exported_x = {x.name for x in vh.exchanges.values() if x.name and
                      not (x.name.startswith("amq.") and x.name in _BUILTIN)}
        for name in sorted(exported_q):
            q = vh.queues[name]
            queues.append({"name": q.name, "vhost": vh.name, "durable": q.durable,
                           "auto_delete": q.auto_delete, "arguments": q.arguments})
        for name in sorted(exported_x):
            x = vh.exchanges[name]
            exchanges.append({"name": x.name, "vhost": vh.name, "type": x.type_name,
                              "durable": x.durable, "auto_delete": x.auto_delete,
                              "internal": x.internal, "arguments": x.arguments})
        for b in vh.bindings():
            if not b.source.name:
                continue  # the default exchange's implicit bindings
            dest = b.destination.name
            if b.destination_type == "queue" and dest not in exported_q:
                continue
            bindings.append({"source": b.source.name, "vhost": vh.name, "destination": dest,
                             "destination_type": b.destination_type,
                             "routing_key": b.routing_key, "arguments": b.arguments})
    policies = []
    for vh in vhosts:
        for p in broker.policies.list(vh.name):
            policies.append({"vhost": p.get("vhost", vh.name), "name": p["name"],
                             "pattern": p["pattern"], "apply-to": p.get("apply-to", "all"),
                             "definition": p["definition"],
                             "priority": p.get("priority", 0)})
    parameters = [p for vh in vhosts for p in params.list(vhost=vh.name)]
    if vhost is not None:
        return {"rabbit_version": COMPAT_VERSION, "rabbitmq_version": COMPAT_VERSION,
                "parameters": [{k: v for k, v in p.items() if k != "vhost"}
                               for p in parameters],
                "policies": [{k: v for k, v in p.items() if k != "vhost"} for p in policies],
                "queues": [_drop_vhost(q) for q in queues],
                "exchanges": [_drop_vhost(x) for x in exchanges],
                "bindings": [_drop_vhost(b) for b in bindings]}
    users = [{"name": u.name, "password_hash": u.password_hash,
              "hashing_algorithm": u.hashing_algorithm, "tags": list(u.tags),
              "limits": dict(params.user_limits.get(u.name, {}))}
             for u in sorted(auth.users.values(), key=lambda u: u.name)]
    vhost_list = []
    for vh in vhosts:
        meta = params.vhost_meta.get(vh.name, {})
        vhost_list.append({"name": vh.name, "limits": [],
                           "metadata": {"description": meta.get("description", ""),
                                        "tags": meta.get("tags", [])}})
    permissions = [{"user": u, "vhost": v, "configure": p.configure, "write": p.write,
                    "read": p.read} for (u, v), p in sorted(auth.permissions.items())]
    global_parameters = [{"name": "cluster_name",
                          "value": broker.settings.effective_cluster_name}]
    global_parameters += [g for g in params.list_global() if g["name"] != "cluster_name"]
    return {
        "rabbit_version": COMPAT_VERSION,
        "rabbitmq_version": COMPAT_VERSION,
        "product_name": "amqpd",
        "product_version": amqpd.__version__,
        "users": users,
        "vhosts": vhost_list,
        "permissions": permissions,
        "topic_permissions": list(params.topic_permissions),
        "parameters": parameters,
        "global_parameters": global_parameters,
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


_BUILTIN = frozenset({"amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match",
                      "amq.rabbitmq.trace", "amq.rabbitmq.log"})


def _drop_vhost(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "vhost"}


# ---------------------------------------------------------------------------- import
def _entries(data: dict[str, Any], section: str) -> list[dict[str, Any]]:
    items = data.get(section)
    if items is None:
        return []
    if not isinstance(items, list):
        raise DefinitionsError(f"'{section}' must be a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DefinitionsError(f"{section}[{i}] must be an object")
    return items


def _str(item: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise DefinitionsError(f"{where}: '{key}' must be a string")
    return value


def _bool(item: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = item.get(key, default)
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    if not isinstance(value, bool):
        raise DefinitionsError(f"{where}: '{key}' must be true or false")
    return value


def _dict(item: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = item.get(key) or {}
    if not isinstance(value, dict):
        raise DefinitionsError(f"{where}: '{key}' must be an object")
    return value


def _tags(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return list(value)
    raise DefinitionsError(f"{where}: 'tags' must be a string or a list of strings")


def _regex(value: str, where: str) -> None:
    try:
        re.compile(value)
    except re.error as exc:
        raise DefinitionsError(f"{where}: invalid regular expression {value!r}: {exc}") from None


def _validate(broker: Broker, data: dict[str, Any], vhost: str | None) -> None:
    """Check every entry's shape before anything is applied."""
    sections = VHOST_SECTIONS if vhost is not None else SECTIONS
    for section in sections:
        _entries(data, section)
    known_vhosts = set(broker.vhosts) | {
        _str(v, "name", f"vhosts[{i}]") for i, v in enumerate(_entries(data, "vhosts"))
    } if vhost is None else {vhost}
    known_users = set(broker.auth.users) | {
        _str(u, "name", f"users[{i}]") for i, u in enumerate(_entries(data, "users"))
    } if vhost is None else set()

    def vh(item: dict[str, Any], where: str) -> str:
        name = vhost if vhost is not None else _str(item, "vhost", where)
        if name not in known_vhosts:
            raise DefinitionsError(f"{where}: vhost '{name}' does not exist")
        return name

    for i, u in enumerate(_entries(data, "users") if vhost is None else []):
        where = f"users[{i}] ('{u.get('name')}')"
        algorithm = _str(u, "hashing_algorithm", where, HASHING_SHA256)
        if algorithm not in HASHING_ALGORITHMS:
            raise DefinitionsError(f"{where}: unknown hashing algorithm '{algorithm}'")
        if "password" in u:
            _str(u, "password", where)
        else:
            h = _str(u, "password_hash", where, "")
            if h:
                try:
                    base64.b64decode(h, validate=True)
                except (binascii.Error, ValueError):
                    raise DefinitionsError(f"{where}: password_hash is not base64") from None
        _tags(u.get("tags"), where)
    for i, p in enumerate(_entries(data, "permissions") if vhost is None else []):
        where = f"permissions[{i}]"
        user = _str(p, "user", where)
        if user not in known_users:
            raise DefinitionsError(f"{where}: user '{user}' does not exist")
        vh(p, where)
        for key in ("configure", "write", "read"):
            _regex(_str(p, key, where), where)
    for i, p in enumerate(_entries(data, "parameters")):
        where = f"parameters[{i}]"
        _str(p, "component", where)
        _str(p, "name", where)
        vh(p, where)
        if "value" not in p:
            raise DefinitionsError(f"{where}: 'value' is required")
    for i, p in enumerate(_entries(data, "policies")):
        where = f"policies[{i}]"
        _str(p, "name", where)
        vh(p, where)
        _regex(_str(p, "pattern", where), where)
        if not _dict(p, "definition", where):
            raise DefinitionsError(f"{where}: 'definition' must not be empty")
        prio = p.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise DefinitionsError(f"{where}: 'priority' must be an integer")
    for i, q in enumerate(_entries(data, "queues")):
        where = f"queues[{i}]"
        if not _str(q, "name", where):
            raise DefinitionsError(f"{where}: 'name' must not be empty")
        vh(q, where)
        _bool(q, "durable", where, True)
        _bool(q, "auto_delete", where, False)
        _dict(q, "arguments", where)
    _check_queue_limits(broker, data, vhost)
    for i, x in enumerate(_entries(data, "exchanges")):
        where = f"exchanges[{i}]"
        _str(x, "name", where)
        vh(x, where)
        kind = _str(x, "type", where)
        if kind not in EXCHANGE_TYPES:
            raise DefinitionsError(f"{where}: unknown exchange type '{kind}'")
        for key, default in (("durable", True), ("auto_delete", False), ("internal", False)):
            _bool(x, key, where, default)
        _dict(x, "arguments", where)
    for i, b in enumerate(_entries(data, "bindings")):
        where = f"bindings[{i}]"
        _str(b, "source", where)
        _str(b, "destination", where)
        if b.get("destination_type") not in ("queue", "exchange"):
            raise DefinitionsError(f"{where}: 'destination_type' must be queue or exchange")
        vh(b, where)
        _str(b, "routing_key", where, "")
        _dict(b, "arguments", where)


def import_definitions(broker: Broker, data: Any, vhost: str | None = None) -> None:
    """Apply a definitions document (all of it, or one vhost's part with ``vhost``)."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    if vhost is not None and vhost not in broker.vhosts:
        raise DefinitionsError(f"vhost '{vhost}' does not exist")
    _validate(broker, data, vhost)
    try:
        _apply(broker, data, vhost)
    except AMQPError as exc:
        raise DefinitionsError(exc.text) from None
    broker.definitions_changed()


def _check_queue_limits(broker: Broker, data: dict[str, Any], vhost: str | None) -> None:
    """A vhost's ``max-queues`` limit holds for an import as for a declare, checked for the
    whole document before anything is applied: RabbitMQ 3.10.8 refuses such an import
    with this text (400) and imports nothing. Queues that already exist do not count."""
    from amqpd.broker.resource_limits import vhost_limits

    new: dict[str, set[str]] = {}
    for q in _entries(data, "queues"):
        name = vhost if vhost is not None else q["vhost"]
        existing = broker.vhosts.get(name)
        if existing is None or q["name"] not in existing.queues:
            new.setdefault(name, set()).add(q["name"])
    for name, queues in sorted(new.items()):
        limit = vhost_limits(broker, name).get("max-queues")
        if not isinstance(limit, int) or limit < 0:
            continue
        current = len(broker.vhosts[name].queues) if name in broker.vhosts else 0
        if current + len(queues) > limit:
            raise DefinitionsError(
                f'Adding {len(queues)} queue(s) to virtual host "{name}" would exceed the '
                f"limit of {limit} queue(s).\n\nThis virtual host currently has {current} "
                f"queue(s) defined.\n\nImport aborted!")


def _apply(broker: Broker, data: dict[str, Any], vhost: str | None) -> None:
    auth = broker.auth
    if vhost is None:
        for u in _entries(data, "users"):
            algorithm = u.get("hashing_algorithm") or HASHING_SHA256
            if "password" in u:
                password_hash = hash_password(u["password"], algorithm)
            else:
                password_hash = u.get("password_hash") or ""
            auth.add_user(u["name"], tags=_tags(u.get("tags"), ""),
                          password_hash=password_hash, algorithm=algorithm)
            if isinstance(u.get("limits"), dict) and u["limits"]:
                from amqpd.broker.resource_limits import USER_LIMITS, validate

                broker.parameters.user_limits[u["name"]] = validate(u["limits"], USER_LIMITS)
        for v in _entries(data, "vhosts"):
            broker.add_vhost(v["name"])
            meta: dict[str, Any] = v["metadata"] if isinstance(v.get("metadata"), dict) else {}
            desc = meta.get("description", v.get("description"))
            tags = meta.get("tags", v.get("tags"))
            target = broker.parameters.vhost_meta.setdefault(v["name"], {})
            if isinstance(desc, str):
                target["description"] = desc
            if isinstance(tags, list):
                target["tags"] = [t for t in tags if isinstance(t, str)]
        for p in _entries(data, "permissions"):
            auth.set_permissions(p["user"], p["vhost"], p["configure"], p["write"], p["read"])
        topic = _entries(data, "topic_permissions")
        if topic:
            broker.parameters.topic_permissions = [dict(t) for t in topic]
            auth.version += 1  # enforced (broker/topic_auth.py): cached checks go
        for g in _entries(data, "global_parameters"):
            name = g.get("name")
            if name == "cluster_name" and isinstance(g.get("value"), str):
                broker.settings.cluster_name = g["value"]
            elif isinstance(name, str) and name != "internal_cluster_id":
                broker.parameters.set_global(name, g.get("value"))

    def vh_of(item: dict[str, Any]) -> str:
        return vhost if vhost is not None else item["vhost"]

    params = broker.parameters
    for p in _entries(data, "parameters"):
        try:
            params.set(p["component"], vh_of(p), p["name"], p["value"])
        except LookupError:
            # no plugin for this component (yet): keep the value so an export round-trips
            params.values[(p["component"], vh_of(p), p["name"])] = p["value"]
        except (ValueError, TypeError) as exc:
            raise DefinitionsError(f"parameter '{p['name']}': {exc}") from None
    for p in _entries(data, "policies"):
        broker.policies.set(vh_of(p), p["name"], p["pattern"], p["definition"],
                     priority=p.get("priority", 0), apply_to=p.get("apply-to", "all"))
    for q in _entries(data, "queues"):
        broker.vhosts[vh_of(q)].declare_queue(
            q["name"], durable=_bool(q, "durable", "", True),
            auto_delete=_bool(q, "auto_delete", "", False), arguments=q.get("arguments") or {})
    for x in _entries(data, "exchanges"):
        vh = broker.vhosts[vh_of(x)]
        if x["name"] in vh.exchanges and (x["name"] == "" or x["name"] in _BUILTIN):
            continue
        vh.declare_exchange(
            x["name"], x["type"], durable=_bool(x, "durable", "", True),
            auto_delete=_bool(x, "auto_delete", "", False),
            internal=_bool(x, "internal", "", False), arguments=x.get("arguments") or {})
    for b in _entries(data, "bindings"):
        broker.vhosts[vh_of(b)].bind(b["destination_type"], b["destination"], b["source"],
                                     b.get("routing_key", ""), b.get("arguments") or {})
