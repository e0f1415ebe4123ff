"""``/api/federation-links[/{vhost}]``: link status in the management plugin's shape.

Each item is what RabbitMQ's ``rabbitmq_federation_management`` lists: ``upstream``,
``exchange``/``upstream_exchange`` or ``queue``/``upstream_queue``, ``vhost``, ``type``,
``status`` (``starting``, ``running``, ``error``), ``error`` when failing, ``uri``
without credentials, ``local_connection``, ``timestamp``, ``node`` and ``id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.core import Ctx, Router, json_response, select_columns

if TYPE_CHECKING:
    from plugins.federation import FederationPlugin


def _plugin(ctx: Ctx) -> FederationPlugin:
    plugin: FederationPlugin = ctx.broker.plugins["federation"]  # type: ignore[assignment]
    return plugin


async def list_links(ctx: Ctx) -> Any:
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    items = [item for item in _plugin(ctx).supervisor.status(vhost)
             if ctx.can_see_vhost(item["vhost"])]
    return json_response(select_columns(items, ctx))


def routes(router: Router) -> None:
    router.get("/api/federation-links", list_links)
    router.get("/api/federation-links/{vhost}", list_links)
