"""/api/shovels: RabbitMQ's shovel management paths and JSON shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.core import Ctx, Router, json_response, no_content, not_found, select_columns

if TYPE_CHECKING:
    from plugins.shovel import ShovelPlugin


def routes(router: Router, plugin: ShovelPlugin) -> None:
    async def list_shovels(ctx: Ctx) -> Any:
        vhost = ctx.vhost().name if "vhost" in ctx.params else None
        items = [r.status() for r in plugin.all_runners()
                 if (vhost is None or r.defn.vhost == vhost) and ctx.can_see_vhost(r.defn.vhost)]
        items.sort(key=lambda s: (s["vhost"], s["name"]))
        return json_response(select_columns(items, ctx))

    async def get_shovel(ctx: Ctx) -> Any:
        vh = ctx.vhost()
        runner = plugin.find(vh.name, ctx.params["name"])
        if runner is None:
            raise not_found()
        return json_response(runner.status())

    async def delete_shovel(ctx: Ctx) -> Any:
        vh = ctx.vhost(write=True)
        ctx.require_policymaker()
        if not ctx.api.parameters.clear("shovel", vh.name, ctx.params["name"]):
            raise not_found()
        return no_content()

    async def restart_shovel(ctx: Ctx) -> Any:
        vh = ctx.vhost(write=True)
        ctx.require_policymaker()
        runner = plugin.find(vh.name, ctx.params["name"])
        if runner is None:
            raise not_found()
        await runner.restart()
        return no_content()

    router.get("/api/shovels", list_shovels)
    router.get("/api/shovels/{vhost}", list_shovels)
    router.get("/api/shovels/vhost/{vhost}/{name}", get_shovel)
    router.delete("/api/shovels/vhost/{vhost}/{name}", delete_shovel)
    router.delete("/api/shovels/vhost/{vhost}/{name}/restart", restart_shovel)
