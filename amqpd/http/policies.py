"""/api/policies[/{vhost}[/{name}]] over ``broker.policies`` (the policy module)."""

from __future__ import annotations

from typing import Any

from amqpd.broker.api import PreconditionFailed
from amqpd.http.core import (
    Ctx,
    Router,
    as_int,
    as_str,
    bad_request,
    created,
    json_response,
    no_content,
    not_found,
    select_columns,
)

APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")


def _find(ctx: Ctx, vhost: str, name: str) -> dict[str, Any] | None:
    return ctx.api.policy(vhost, name)


async def list_policies(ctx: Ctx) -> Any:
    if "vhost" in ctx.params:
        items = ctx.api.policies(ctx.vhost().name)
    else:
        items = [p for p in ctx.api.policies() if ctx.can_see_vhost(p.get("vhost", ""))]
    return json_response(select_columns(items, ctx))


async def get_policy(ctx: Ctx) -> Any:
    vh = ctx.vhost()
    p = _find(ctx, vh.name, ctx.params["name"])
    if p is None:
        raise not_found()
    return json_response(p)


def validate_policy(body: dict[str, Any]) -> tuple[str, dict[str, Any], int, str]:
    import re

    pattern = as_str(body.get("pattern"), "pattern")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise bad_request(f"pattern: invalid regular expression: {exc}") from None
    definition = body.get("definition")
    if not isinstance(definition, dict) or not definition:
        raise bad_request("definition must be a non-empty JSON object")
    priority = as_int(body.get("priority"), "priority", 0)
    apply_to = as_str(body.get("apply-to"), "apply-to", "all")
    if apply_to not in APPLY_TO:
        raise bad_request(f"apply-to must be one of {', '.join(APPLY_TO)}")
    return pattern, definition, priority, apply_to


async def put_policy(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True)
    ctx.require_policymaker()
    body = await ctx.json_object()
    pattern, definition, priority, apply_to = validate_policy(body)
    existed = _find(ctx, vh.name, ctx.params["name"]) is not None
    try:
        ctx.api.set_policy(vh.name, ctx.params["name"], pattern, definition,
                           priority=priority, apply_to=apply_to)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc)) from None
    return no_content() if existed else created()


async def delete_policy(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True)
    ctx.require_policymaker()
    if _find(ctx, vh.name, ctx.params["name"]) is None:
        raise not_found()
    ctx.api.clear_policy(vh.name, ctx.params["name"])
    return no_content()


async def list_operator_policies(ctx: Ctx) -> Any:
    ctx.require_admin()
    if "vhost" in ctx.params:
        return json_response(select_columns(ctx.api.operator_policies(ctx.vhost().name), ctx))
    return json_response(select_columns(ctx.api.operator_policies(), ctx))


async def get_operator_policy(ctx: Ctx) -> Any:
    ctx.require_admin()
    p = ctx.api.operator_policy(ctx.vhost().name, ctx.params["name"])
    if p is None:
        raise not_found()
    return json_response(p)


async def put_operator_policy(ctx: Ctx) -> Any:
    """Operator policies cap queue limits (amqpd/broker/operator_policy.py)."""
    ctx.require_admin()
    vh = ctx.vhost(write=True)
    body = await ctx.json_object()
    pattern, definition, priority, apply_to = validate_policy(body)
    existed = ctx.api.operator_policy(vh.name, ctx.params["name"]) is not None
    try:
        ctx.api.set_operator_policy(vh.name, ctx.params["name"], pattern, definition,
                                    priority=priority, apply_to=apply_to)
    except PreconditionFailed as exc:
        raise bad_request(f"Validation failed\n\n{exc.text}\n") from None
    return no_content() if existed else created()


async def delete_operator_policy(ctx: Ctx) -> Any:
    ctx.require_admin()
    vh = ctx.vhost(write=True)
    if ctx.api.operator_policy(vh.name, ctx.params["name"]) is None:
        raise not_found()
    ctx.api.clear_operator_policy(vh.name, ctx.params["name"])
    return no_content()


def routes(r: Router) -> None:
    r.get("/api/policies", list_policies)
    r.get("/api/policies/{vhost}", list_policies)
    r.get("/api/policies/{vhost}/{name}", get_policy)
    r.put("/api/policies/{vhost}/{name}", put_policy)
    r.delete("/api/policies/{vhost}/{name}", delete_policy)
    r.get("/api/operator-policies", list_operator_policies)
    r.get("/api/operator-policies/{vhost}", list_operator_policies)
    r.get("/api/operator-policies/{vhost}/{name}", get_operator_policy)
    r.put("/api/operator-policies/{vhost}/{name}", put_operator_policy)
    r.delete("/api/operator-policies/{vhost}/{name}", delete_operator_policy)
