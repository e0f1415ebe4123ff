"""``/api/federation-links[/{vhost}]``: link status in the management plugin's shape.

Each item is what RabbitMQ's ``rabbitmq_federation_management`` lists: ``upstream``,
``exchange``/``upstream_exchange`` or ``queue``/``upstream_queue``, ``vhost``, ``type``,
``status`` (``starting``, ``running``, ``error``), ``error`` when failing, ``uri``
without credentials, ``local_connection``, ``timestamp``, ``node`` and ``id``. In a
cluster the list is the whole cluster's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.core import Ctx, Router, json_response, no_content, not_found, select_columns
from plugins.common.http import ask

if TYPE_CHECKING:
    from plugins.federation import FederationPlugin


def _plugin(ctx: Ctx) -> FederationPlugin:
    plugin: FederationPlugin = ctx.api.plugin("federation")  # type: ignore[assignment]
    return plugin


async def list_links(ctx: Ctx) -> Any:
    """Every link of the cluster, each with the ``node`` that runs it, as RabbitMQ lists
    them on any node: this node's own, and what the other running nodes shared (a
    second or so old at most)."""
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    items = _plugin(ctx).supervisor.status(vhost)
    for statuses in (await ctx.api.cluster_info("federation-links")).values():
        if isinstance(statuses, list):
            items.extend(s for s in statuses if isinstance(s, dict) and "vhost" in s
                         and (vhost is None or s["vhost"] == vhost))
    items = [s for s in items if ctx.can_see_vhost(s["vhost"])]
    items.sort(key=lambda s: (s["vhost"], s.get("exchange") or s.get("queue") or "",
                              s.get("upstream", ""), s.get("node", "")))
    return json_response(select_columns(items, ctx))


async def restart_link(ctx: Ctx) -> Any:
    """``DELETE /api/federation-links/vhost/{vhost}/{id}/{node}/restart`` (RabbitMQ's):
    the link ``id`` that ``node`` runs, asked of any node of the cluster (another
    node's link: that node is asked, request ``federation-link-restart``)."""
    vh = ctx.vhost(write=True)
    ctx.require_policymaker()
    node, link_id = ctx.params["node"], ctx.params["id"]
    if node != ctx.api.node_name():
        # 404 when node is no running node of the cluster or does not run the link
        await ask(ctx, node, "federation-link-restart", {"vhost": vh.name, "id": link_id})
        return no_content()
    if not await _plugin(ctx).supervisor.restart(link_id, vh.name):
        raise not_found()
    return no_content()


def routes(router: Router) -> None:
    router.get("/api/federation-links", list_links)
    router.get("/api/federation-links/{vhost}", list_links)
    router.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart", restart_link)
