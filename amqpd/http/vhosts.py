"""/api/vhosts[/{name}] and /api/vhosts/{name}/permissions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.core import Ctx, Router, as_bool, created, json_response, no_content, not_found
from amqpd.http.core import select_columns as select
from amqpd.http.users import parse_tags

if TYPE_CHECKING:
    from amqpd.broker.api import VHost


def vhost_view(ctx: Ctx, vh: VHost) -> dict[str, Any]:
    queues = ctx.api.queues(vh)
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    meta = ctx.api.vhost_meta(vh.name)
    return {
        "name": vh.name,
        "description": meta.get("description", ""),
        "tags": meta.get("tags", []),
        "default_queue_type": meta.get("default_queue_type", "undefined"),  # as RabbitMQ 3.10
        "metadata": {"description": meta.get("description", ""), "tags": meta.get("tags", [])},
        "tracing": False,
        "cluster_state": {ctx.api.node_name(): "running"},
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "messages_details": {"rate": 0.0},
    }


async def list_vhosts(ctx: Ctx) -> Any:
    items = [vhost_view(ctx, vh) for vh in sorted(ctx.visible_vhosts(), key=lambda v: v.name)]
    return json_response(select(items, ctx))


async def get_vhost(ctx: Ctx) -> Any:
    return json_response(vhost_view(ctx, ctx.vhost(ctx.params["name"])))


async def put_vhost(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    body = await ctx.json_object()
    as_bool(body.get("tracing"), "tracing")
    tags = parse_tags(body.get("tags")) if "tags" in body else None
    created_now = ctx.api.add_vhost(
        name, description=str(body["description"]) if "description" in body else None,
        tags=tags,
        default_queue_type=str(body["default_queue_type"]) if "default_queue_type" in body
        else None)
    if created_now:
        # RabbitMQ grants the user who creates a vhost full permissions in it, so a
        # client can create one over the API and connect to it at once
        ctx.api.set_permissions(ctx.username, name, ".*", ".*", ".*")
    return created() if created_now else no_content()


async def remove_vhost(ctx: Ctx) -> Any:
    ctx.require_admin()
    if not ctx.api.has_vhost(ctx.params["name"]):
        raise not_found()
    ctx.api.delete_vhost(ctx.params["name"])
    return no_content()


async def vhost_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    if not ctx.api.has_vhost(name):
        raise not_found()
    from amqpd.http.users import permission_view

    items = [permission_view(u, v, p) for u, v, p in ctx.api.permissions() if v == name]
    return json_response(items)


async def start_vhost(ctx: Ctx) -> Any:
    ctx.require_admin()
    if not ctx.api.has_vhost(ctx.params["name"]):
        raise not_found()
    return no_content()


async def vhost_topic_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    if not ctx.api.has_vhost(name):
        raise not_found()
    return json_response(ctx.api.topic_permissions(vhost=name))


def routes(r: Router) -> None:
    r.get("/api/vhosts", list_vhosts)
    r.get("/api/vhosts/{name}", get_vhost)
    r.put("/api/vhosts/{name}", put_vhost)
    r.delete("/api/vhosts/{name}", remove_vhost)
    r.get("/api/vhosts/{name}/permissions", vhost_permissions)
    r.get("/api/vhosts/{name}/topic-permissions", vhost_topic_permissions)
    r.post("/api/vhosts/{name}/start/{node}", start_vhost)
