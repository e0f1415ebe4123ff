"""/api/vhosts[/{name}] and /api/vhosts/{name}/permissions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.connections import close_session
from amqpd.http.core import Ctx, Router, as_bool, created, json_response, no_content, not_found
from amqpd.http.core import select_columns as select
from amqpd.http.users import parse_tags

if TYPE_CHECKING:
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker


def vhost_view(ctx: Ctx, vh: VHost) -> dict[str, Any]:
    ready = sum(len(q.ready) for q in vh.queues.values())
    unacked = sum(q.unacked_count for q in vh.queues.values())
    meta = ctx.broker.parameters.vhost_meta.get(vh.name, {})
    return {
        "name": vh.name,
        "description": meta.get("description", ""),
        "tags": meta.get("tags", []),
        "default_queue_type": meta.get("default_queue_type", "undefined"),  # as RabbitMQ 3.10
        "metadata": {"description": meta.get("description", ""), "tags": meta.get("tags", [])},
        "tracing": False,
        "cluster_state": {ctx.broker.settings.node_name: "running"},
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "messages_details": {"rate": 0.0},
    }


def delete_vhost(broker: Broker, name: str) -> None:
    """Close the vhost's connections, drop its queues, permissions and parameters."""
    vh = broker.vhosts.pop(name)
    for session in list(broker.sessions):
        if session.vhost is vh:
            close_session(session, f"vhost '{name}' is deleted")
    for q in list(vh.queues.values()):
        vh.delete_queue(q, reason="vhost deleted")
    for ex in list(vh.exchanges.values()):
        for binding in list(ex.bindings.values()):  # exchange-to-exchange ones are left
            broker.definitions_changed(binding, True)
        broker.definitions_changed(ex, True)
        ex.close()
    for key in [k for k in broker.auth.permissions if k[1] == name]:
        del broker.auth.permissions[key]
    broker.parameters.clear_vhost(name)
    policies = getattr(broker, "policies", None)
    if policies is not None:
        for p in policies.list(name):
            policies.clear(name, p["name"])
    broker.definitions_changed()


async def list_vhosts(ctx: Ctx) -> Any:
    items = [vhost_view(ctx, vh) for vh in sorted(ctx.visible_vhosts(), key=lambda v: v.name)]
    return json_response(select(items, ctx))


async def get_vhost(ctx: Ctx) -> Any:
    return json_response(vhost_view(ctx, ctx.vhost(ctx.params["name"])))


async def put_vhost(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    body = await ctx.json_object()
    existed = name in ctx.broker.vhosts
    as_bool(body.get("tracing"), "tracing")
    tags = parse_tags(body.get("tags")) if "tags" in body else None
    meta = ctx.broker.parameters.vhost_meta.setdefault(name, {})
    if "description" in body:
        meta["description"] = str(body["description"])
    if tags is not None:
        meta["tags"] = tags
    if "default_queue_type" in body:
        meta["default_queue_type"] = str(body["default_queue_type"])
    ctx.broker.add_vhost(name)
    if not existed:
        # RabbitMQ grants the user who creates a vhost full permissions in it, so a
        # client can create one over the API and connect to it at once
        ctx.broker.auth.set_permissions(ctx.username, name, ".*", ".*", ".*")
        ctx.broker.definitions_changed()
    return no_content() if existed else created()


async def remove_vhost(ctx: Ctx) -> Any:
    ctx.require_admin()
    if ctx.params["name"] not in ctx.broker.vhosts:
        raise not_found()
    delete_vhost(ctx.broker, ctx.params["name"])
    return no_content()


async def vhost_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    if name not in ctx.broker.vhosts:
        raise not_found()
    from amqpd.http.users import permission_view

    items = [permission_view(u, v, p) for (u, v), p in
             sorted(ctx.broker.auth.permissions.items()) if v == name]
    return json_response(items)


async def start_vhost(ctx: Ctx) -> Any:
    ctx.require_admin()
    if ctx.params["name"] not in ctx.broker.vhosts:
        raise not_found()
    return no_content()


async def vhost_topic_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    if name not in ctx.broker.vhosts:
        raise not_found()
    return json_response([e for e in ctx.broker.parameters.topic_permissions
                          if e.get("vhost") == name])


def routes(r: Router) -> None:
    r.get("/api/vhosts", list_vhosts)
    r.get("/api/vhosts/{name}", get_vhost)
    r.put("/api/vhosts/{name}", put_vhost)
    r.delete("/api/vhosts/{name}", remove_vhost)
    r.get("/api/vhosts/{name}/permissions", vhost_permissions)
    r.get("/api/vhosts/{name}/topic-permissions", vhost_topic_permissions)
    r.post("/api/vhosts/{name}/start/{node}", start_vhost)
