"""/api/definitions[/{vhost}]: GET exports, POST imports (RabbitMQ's JSON shape)."""

from __future__ import annotations

from typing import Any

from amqpd.broker.api import DefinitionsError
from amqpd.http.core import Ctx, Router, bad_request, json_response, no_content


async def get_definitions(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    headers = None
    if "download" in ctx.query:
        headers = {"Content-Disposition":
                   f'attachment; filename="{ctx.query["download"] or "definitions.json"}"'}
    return json_response(ctx.api.export_definitions(vhost), headers=headers)


async def post_definitions(ctx: Ctx) -> Any:
    ctx.require_admin()
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    body = await ctx.json()
    if not isinstance(body, dict):
        raise bad_request("definitions must be a JSON object")
    try:
        ctx.api.import_definitions(body, vhost)
    except DefinitionsError as exc:
        raise bad_request(str(exc)) from None
    return no_content()


def routes(r: Router) -> None:
    r.get("/api/definitions", get_definitions)
    r.post("/api/definitions", post_definitions)
    r.get("/api/definitions/{vhost}", get_definitions)
    r.post("/api/definitions/{vhost}", post_definitions)
