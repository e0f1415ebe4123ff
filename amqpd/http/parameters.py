"""/api/parameters/{component}/{vhost}/{name} and /api/global-parameters/{name}."""

from __future__ import annotations

from typing import Any

from amqpd.broker.api import UnknownComponent
from amqpd.http.core import (
    Ctx,
    Router,
    bad_request,
    created,
    json_response,
    no_content,
    not_found,
    select_columns,
)


async def list_parameters(ctx: Ctx) -> Any:
    ctx.require_policymaker()
    component = ctx.params.get("component")
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    items = [p for p in ctx.api.parameters.list(component, vhost)
             if ctx.can_see_vhost(p["vhost"])]
    return json_response(select_columns(items, ctx))


async def get_parameter(ctx: Ctx) -> Any:
    ctx.require_policymaker()
    vh = ctx.vhost()
    c, n = ctx.params["component"], ctx.params["name"]
    value = ctx.api.parameters.get(c, vh.name, n)
    if value is None:
        raise not_found()
    return json_response({"component": c, "vhost": vh.name, "name": n, "value": value})


async def put_parameter(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True)
    ctx.require_policymaker()
    body = await ctx.json_object()
    if "value" not in body:
        raise bad_request("value is required")
    try:
        new = ctx.api.parameters.set(ctx.params["component"], vh.name, ctx.params["name"],
                                        body["value"])
    except UnknownComponent as exc:
        raise bad_request(str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise bad_request(f"Validation failed\n\n{exc}") from None
    return created() if new else no_content()


async def delete_parameter(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True)
    ctx.require_policymaker()
    if not ctx.api.parameters.clear(ctx.params["component"], vh.name, ctx.params["name"]):
        raise not_found()
    return no_content()


async def list_global(ctx: Ctx) -> Any:
    ctx.require_admin()
    return json_response(ctx.api.parameters.list_global())


async def get_global(ctx: Ctx) -> Any:
    ctx.require_admin()
    name = ctx.params["name"]
    if name not in ctx.api.parameters.global_values:
        raise not_found()
    return json_response({"name": name, "value": ctx.api.parameters.global_values[name]})


async def put_global(ctx: Ctx) -> Any:
    ctx.require_admin()
    body = await ctx.json_object()
    if "value" not in body:
        raise bad_request("value is required")
    new = ctx.api.parameters.set_global(ctx.params["name"], body["value"])
    return created() if new else no_content()


async def delete_global(ctx: Ctx) -> Any:
    ctx.require_admin()
    if not ctx.api.parameters.clear_global(ctx.params["name"]):
        raise not_found()
    return no_content()


def routes(r: Router) -> None:
    r.get("/api/parameters", list_parameters)
    r.get("/api/parameters/{component}", list_parameters)
    r.get("/api/parameters/{component}/{vhost}", list_parameters)
    r.get("/api/parameters/{component}/{vhost}/{name}", get_parameter)
    r.put("/api/parameters/{component}/{vhost}/{name}", put_parameter)
    r.delete("/api/parameters/{component}/{vhost}/{name}", delete_parameter)
    r.get("/api/global-parameters", list_global)
    r.get("/api/global-parameters/{name}", get_global)
    r.put("/api/global-parameters/{name}", put_global)
    r.delete("/api/global-parameters/{name}", delete_global)
