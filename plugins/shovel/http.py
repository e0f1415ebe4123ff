"""/api/shovels: RabbitMQ's shovel management paths and JSON shapes.

In a cluster any node answers for every dynamic shovel, as RabbitMQ's do: the list and a
shovel's status come from what the other nodes share (``api.cluster_info``), and a
restart asked of a node that does not run the shovel is passed to the node that does
(``api.ask_node``, request ``shovel-restart``; :meth:`ShovelPlugin.restart_request`
answers it there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.core import (
    Ctx,
    Router,
    json_response,
    no_content,
    not_found,
    select_columns,
)
from plugins.common.http import ask

if TYPE_CHECKING:
    from plugins.shovel import ShovelPlugin


def routes(router: Router, plugin: ShovelPlugin) -> None:
    async def list_shovels(ctx: Ctx) -> Any:
        """This node's shovels and, in a cluster, the dynamic shovels every other
        running node runs (each with its ``node``), as RabbitMQ's answer on any node."""
        vhost = ctx.vhost().name if "vhost" in ctx.params else None
        items = [r.status() for r in plugin.all_runners()]
        for statuses in (await ctx.api.cluster_info("shovels")).values():
            items.extend(s for s in statuses if isinstance(s, dict) and "vhost" in s)
        items = [s for s in items if (vhost is None or s["vhost"] == vhost)
                 and ctx.can_see_vhost(s["vhost"])]
        items.sort(key=lambda s: (s["vhost"], s["name"], s.get("node", "")))
        return json_response(select_columns(items, ctx))

    async def elsewhere(ctx: Ctx, vhost: str, name: str) -> dict[str, Any] | None:
        """The status of a dynamic shovel another node of the cluster runs (with its
        ``node``), or None when this node runs it, or no node does now."""
        runner = plugin.find(vhost, name)
        if runner is None or runner.defn.type != "dynamic" or runner.task is not None \
                or not ctx.api.clustered():
            return None
        for statuses in (await ctx.api.cluster_info("shovels")).values():
            for s in statuses:
                if isinstance(s, dict) and s.get("vhost") == vhost and s.get("name") == name:
                    return s
        return None

    async def get_shovel(ctx: Ctx) -> Any:
        vh = ctx.vhost()
        runner = plugin.find(vh.name, ctx.params["name"])
        if runner is None:
            raise not_found()
        # another node of the cluster runs it: its status is that node's
        return json_response(await elsewhere(ctx, vh.name, runner.defn.name)
                             or runner.status())

    async def delete_shovel(ctx: Ctx) -> Any:
        vh = ctx.vhost(write=True)
        ctx.require_policymaker()
        if not ctx.api.parameters.clear("shovel", vh.name, ctx.params["name"]):
            raise not_found()
        return no_content()

    async def restart_shovel(ctx: Ctx) -> Any:
        vh = ctx.vhost(write=True)
        ctx.require_policymaker()
        name = ctx.params["name"]
        runner = plugin.find(vh.name, name)
        if runner is None:
            raise not_found()
        if runner.defn.type == "dynamic" and runner.task is None and ctx.api.clustered():
            # another node runs it (RabbitMQ restarts it there): ask that node
            status = await elsewhere(ctx, vh.name, name)
            if status is None:
                raise not_found(f"no node of the cluster runs shovel '{name}' in vhost "
                                f"'{vh.name}' now")
            await ask(ctx, str(status["node"]), "shovel-restart",
                      {"vhost": vh.name, "name": name})
            return no_content()
        await runner.restart()
        return no_content()

    router.get("/api/shovels", list_shovels)
    router.get("/api/shovels/{vhost}", list_shovels)
    router.get("/api/shovels/vhost/{vhost}/{name}", get_shovel)
    router.delete("/api/shovels/vhost/{vhost}/{name}", delete_shovel)
    router.delete("/api/shovels/vhost/{vhost}/{name}/restart", restart_shovel)

