"""/api/vhost-limits and /api/user-limits (administrator only), RabbitMQ's shapes:
``[{"vhost": "/", "value": {"max-connections": 10}}]`` and
``[{"user": "guest", "value": {"max-channels": 5}}]``; PUT ``{"value": N}`` per limit.
Enforcement: amqpd/broker/resource_limits.py."""

from __future__ import annotations

from typing import Any

from amqpd.broker import resource_limits as rl
from amqpd.http.core import Ctx, Router, bad_request, json_response, no_content, not_found


def _vhost_entries(ctx: Ctx, only: str | None = None) -> list[dict[str, Any]]:
    out = []
    for vhost in sorted(ctx.broker.vhosts):
        if only is not None and vhost != only:
            continue
        limits = rl.vhost_limits(ctx.broker, vhost)
        if limits:
            out.append({"vhost": vhost, "value": dict(limits)})
    return out


def _user_entries(ctx: Ctx, only: str | None = None) -> list[dict[str, Any]]:
    return [{"user": user, "value": dict(limits)}
            for user, limits in sorted(ctx.broker.parameters.user_limits.items())
            if limits and (only is None or user == only)]


async def list_vhost_limits(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost = ctx.params.get("vhost")
    if vhost is not None and vhost not in ctx.broker.vhosts:
        raise not_found()
    return json_response(_vhost_entries(ctx, vhost))


async def _value(ctx: Ctx, name: str, allowed: tuple[str, ...]) -> int:
    body = await ctx.json_object()
    try:
        return rl.validate({name: body.get("value")}, allowed)[name]
    except ValueError as exc:
        raise bad_request(f"Validation failed\n\n{exc}\n") from None


async def put_vhost_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, name = ctx.params["vhost"], ctx.params["name"]
    if vhost not in ctx.broker.vhosts:
        raise not_found()
    value = await _value(ctx, name, rl.VHOST_LIMITS)
    limits = dict(rl.vhost_limits(ctx.broker, vhost))
    limits[name] = value
    ctx.broker.parameters.set(rl.COMPONENT, vhost, "limits", limits)
    ctx.broker.definitions_changed()
    return no_content()


async def delete_vhost_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost, name = ctx.params["vhost"], ctx.params["name"]
    limits = dict(rl.vhost_limits(ctx.broker, vhost))
    if name not in limits:
        raise not_found()
    del limits[name]
    if limits:
        ctx.broker.parameters.set(rl.COMPONENT, vhost, "limits", limits)
    else:
        ctx.broker.parameters.clear(rl.COMPONENT, vhost, "limits")
    ctx.broker.definitions_changed()
    return no_content()


async def list_user_limits(ctx: Ctx) -> Any:
    ctx.require_admin()
    user = ctx.params.get("user")
    if user is not None and user not in ctx.broker.auth.users:
        raise not_found()
    return json_response(_user_entries(ctx, user))


async def put_user_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    user, name = ctx.params["user"], ctx.params["name"]
    if user not in ctx.broker.auth.users:
        raise not_found()
    value = await _value(ctx, name, rl.USER_LIMITS)
    ctx.broker.parameters.user_limits.setdefault(user, {})[name] = value
    ctx.broker.definitions_changed()
    return no_content()


async def delete_user_limit(ctx: Ctx) -> Any:
    ctx.require_admin()
    user, name = ctx.params["user"], ctx.params["name"]
    limits = ctx.broker.parameters.user_limits.get(user, {})
    if name not in limits:
        raise not_found()
    del limits[name]
    if not limits:
        ctx.broker.parameters.user_limits.pop(user, None)
    ctx.broker.definitions_changed()
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
