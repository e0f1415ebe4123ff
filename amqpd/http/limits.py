"""/api/vhost-limits and /api/user-limits (administrator only), RabbitMQ's shapes:
``[{"vhost": "/", "value": {"max-connections": 10}}]`` and
``[{"user": "guest", "value": {"max-channels": 5}}]``; PUT ``{"value": N}`` per limit.
Enforcement: amqpd/broker/resource_limits.py."""

from __future__ import annotations

from typing import Any

from amqpd.http.core import Ctx, Router, bad_request, json_response, no_content, not_found


def _vhost_entries(ctx: Ctx, only: str | None = None) -> list[dict[str, Any]]:
    out = []
    for vh in ctx.api.vhosts():
        if only is not None and vh.name != only:
            continue
        limits = ctx.api.vhost_limits(vh.name)
        if limits:
            out.append({"vhost": vh.name, "value": limits})
    return out


def _user_entries(ctx: Ctx, only: str | None = None) -> list[dict[str, Any]]:
    return [{"user": user, "value": limits}
            for user, limits in sorted(ctx.api.user_limits().items())
            if limits and (only is None or user == only)]


async def list_vhost_limits(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost = ctx.params.get("vhost")
    if vhost is not None and not ctx.api.has_vhost(vhost):
        raise not_found()
    return json_response(_vhost_entries(ctx, vhost))


async def _value(ctx: Ctx) -> Any:
    body = await ctx.json_object()
    return body.get("value")


def _invalid(exc: ValueError) -> Exception:
    return bad_request(f"Validation failed\n\n{exc}\n")


async def put_vhost_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, name = ctx.params["vhost"], ctx.params["name"]
    if not ctx.api.has_vhost(vhost):
        raise not_found()
    value = await _value(ctx)
    try:
        ctx.api.set_vhost_limit(vhost, name, value)
    except ValueError as exc:
        raise _invalid(exc) from None
    return no_content()


async def delete_vhost_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    if not ctx.api.clear_vhost_limit(ctx.params["vhost"], ctx.params["name"]):
        raise not_found()
    return no_content()


async def list_user_limits(ctx: Ctx) -> Any:
    ctx.require_admin()
    user = ctx.params.get("user")
    if user is not None and ctx.api.user(user) is None:
        raise not_found()
    return json_response(_user_entries(ctx, user))


async def put_user_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    user, name = ctx.params["user"], ctx.params["name"]
    if ctx.api.user(user) is None:
        raise not_found()
    value = await _value(ctx)
    try:
        ctx.api.set_user_limit(user, name, value)
    except ValueError as exc:
        raise _invalid(exc) from None
    return no_content()


async def delete_user_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    if not ctx.api.clear_user_limit(ctx.params["user"], ctx.params["name"]):
        raise not_found()
    return no_content()


def routes(r: Router) -> None:
    r.get("/api/vhost-limits", list_vhost_limits)
    r.get("/api/vhost-limits/{vhost}", list_vhost_limits)
    r.put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    r.delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
    r.get("/api/user-limits", list_user_limits)
    r.get("/api/user-limits/{user}", list_user_limits)
    r.put("/api/user-limits/{user}/{name}", put_user_limit)
    r.delete("/api/user-limits/{user}/{name}", delete_user_limit)
