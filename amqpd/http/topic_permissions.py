"""/api/topic-permissions/{vhost}/{user}: set, read and clear topic permissions.

The list (``GET /api/topic-permissions``) lives in :mod:`amqpd.http.users`; this module
adds the per-user forms RabbitMQ has, so the web UI's admin page can change them. Each
entry is ``{"user", "vhost", "exchange", "write", "read"}`` (regular expressions), one per
exchange, kept in ``broker.parameters.topic_permissions`` like imported definitions.
"""

from __future__ import annotations

from typing import Any

from amqpd.http.core import (
    Ctx,
    Router,
    as_str,
    created,
    json_response,
    no_content,
    not_found,
)
from amqpd.http.users import validate_regex


def _target(ctx: Ctx) -> tuple[str, str]:
    ctx.require_admin()
    vhost, user = ctx.params["vhost"], ctx.params["user"]
    if vhost not in ctx.broker.vhosts or user not in ctx.broker.auth.users:
        raise not_found()
    return vhost, user


def _entries(ctx: Ctx, vhost: str, user: str) -> list[dict[str, Any]]:
    return [t for t in ctx.broker.parameters.topic_permissions
            if t.get("vhost") == vhost and t.get("user") == user]


async def get_topic_permissions(ctx: Ctx) -> Any:
    vhost, user = _target(ctx)
    found = _entries(ctx, vhost, user)
    if not found:
        raise not_found()
    return json_response(found)


async def put_topic_permission(ctx: Ctx) -> Any:
    vhost, user = _target(ctx)
    body = await ctx.json_object()
    exchange = as_str(body.get("exchange"), "exchange")
    write = validate_regex(body.get("write"), "write")
    read = validate_regex(body.get("read"), "read")
    perms = ctx.broker.parameters.topic_permissions
    existed = False
    for entry in perms:
        if (entry.get("vhost"), entry.get("user"), entry.get("exchange")) == (
                vhost, user, exchange):
            entry.update(write=write, read=read)
            existed = True
    if not existed:
        perms.append({"user": user, "vhost": vhost, "exchange": exchange, "write": write,
                      "read": read})
    ctx.broker.definitions_changed()
    return no_content() if existed else created()


async def delete_topic_permissions(ctx: Ctx) -> Any:
    """Without ``exchange`` in the path: every exchange's entry for the user."""
    vhost, user = _target(ctx)
    exchange = ctx.params.get("exchange")
    params = ctx.broker.parameters
    keep = [t for t in params.topic_permissions
            if not (t.get("vhost") == vhost and t.get("user") == user
                    and (exchange is None or t.get("exchange") == exchange))]
    if len(keep) == len(params.topic_permissions):
        raise not_found()
    params.topic_permissions = keep
    ctx.broker.definitions_changed()
    return no_content()


async def user_topic_permissions(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    if name not in ctx.broker.auth.users:
        raise not_found()
    return json_response([t for t in ctx.broker.parameters.topic_permissions
                          if t.get("user") == name])


def routes(r: Router) -> None:
    r.get("/api/topic-permissions/{vhost}/{user}", get_topic_permissions)
    r.put("/api/topic-permissions/{vhost}/{user}", put_topic_permission)
    r.delete("/api/topic-permissions/{vhost}/{user}", delete_topic_permissions)
    r.delete("/api/topic-permissions/{vhost}/{user}/{exchange}", delete_topic_permissions)
    r.get("/api/users/{name}/topic-permissions", user_topic_permissions)
