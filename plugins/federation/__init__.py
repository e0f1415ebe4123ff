"""Federation: receive an upstream broker's exchange messages, or pull its queue's.

Interoperates with RabbitMQ 3.10's ``rabbitmq_federation`` in both directions:

- as a *downstream*, links (``exchange_link``, ``queue_link``) declare on the upstream
  exactly what RabbitMQ's plugin declares;
- as an *upstream*, the broker gains the ``x-federation-upstream`` exchange type that a
  RabbitMQ downstream declares here (``upstream_exchange``).

Configuration is RabbitMQ's: runtime parameters ``federation-upstream`` and
``federation-upstream-set`` (``params``), applied by policies that carry
``federation-upstream`` or ``federation-upstream-set``. Enable it with
``plugins = ["federation"]`` or ``AMQPD_PLUGINS=federation``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.broker.api import NotFound, register_policy_key
from plugins.federation import http, params, upstream_exchange
from plugins.federation.links import Supervisor

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.http.core import Router

__all__ = ["FederationPlugin", "create_plugin"]


class FederationPlugin:
    name = "federation"

    def __init__(self, api: BrokerAPI) -> None:
        self.api = api
        self.supervisor = Supervisor(api)
        # before definitions restore: saved upstream exchanges and parameters must load
        upstream_exchange.register()
        for component, validate in ((params.UPSTREAM, params.validate_upstream),
                                    (params.UPSTREAM_SET, params.validate_upstream_set)):
            api.parameters.register(component, validate, on_set=self._changed,
                                       on_clear=self._changed)
        register_policy_key(params.UPSTREAM, params.validate_policy_upstream)
        register_policy_key(params.UPSTREAM_SET, params.validate_policy_upstream)
        register_policy_key(params.UPSTREAM_PATTERN, params.validate_policy_upstream)
        api.on_policy_applied(self.supervisor.on_policy_applied)
        api.serve_node_requests("federation-link-restart", self._restart_request)

    async def _restart_request(self, args: dict[str, Any]) -> bool:
        """Another node was asked to restart a link this node runs (RabbitMQ's restart
        from any node): 404 if no such link runs here."""
        vhost, link_id = str(args.get("vhost")), str(args.get("id"))
        if not await self.supervisor.restart(link_id, vhost):
            raise NotFound(f"no federation link '{link_id}' in vhost '{vhost}' on node "
                           f"'{self.api.node_name()}'")
        return True

    def _changed(self, _vhost: str, _name: str, _value: object) -> None:
        self.supervisor.schedule()

    def http_routes(self, router: Router) -> None:
        http.routes(router)

    async def start(self) -> None:
        await self.supervisor.start()

    async def stop(self) -> None:
        await self.supervisor.stop()


def create_plugin(api: BrokerAPI) -> FederationPlugin:
    return FederationPlugin(api)
