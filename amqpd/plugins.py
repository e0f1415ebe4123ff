"""Plugins: optional parts (shovel, federation) that live outside the core.

A plugin talks to brokers only through AMQP (for the local broker too, with the URI
:meth:`BrokerAPI.local_uri` gives it: a shovel consumes from this node that way) and
through the public broker API (:class:`amqpd.broker.api.BrokerAPI`: topology, publish,
``parameters``, policies, requests to other nodes of the cluster), which is all it is
given; a federation link and a shovel whose destination is this node publish through
the API, once per destination queue. It is enabled by name in the config
(``plugins = ["shovel"]`` or ``AMQPD_PLUGINS=shovel,federation``) and found either
under the entry-point group ``amqpd.plugins`` or as the module ``plugins.<name>`` of
this repository; either way a ``create_plugin(api)`` callable builds it.

Life cycle, and why in this order:

1. ``create_plugin(api)`` runs while the broker is being built, before durable
   definitions are restored, so a plugin can register its runtime-parameter component
   (``api.parameters.register(...)``) and saved parameters validate at boot.
2. ``await start()`` runs once the AMQP listeners and the HTTP API are up, so links to
   the local broker can connect.
3. ``http_routes(router)`` (optional) adds the plugin's API paths (``/api/shovels``...)
   when the HTTP API's application is built: at its first connection, which a plugin
   has started by then or, arriving before, waits for (amqpd/http/listener.py).
4. ``await stop()`` runs first at shutdown, while connections are still open.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI

log = logging.getLogger("amqpd.plugins")


class Plugin(Protocol):
    name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class PluginError(Exception):
    """A configured plugin cannot be found or built."""


def _factory(name: str) -> Any:
    # imported here, when a plugin is configured: importlib.metadata brings the email
    # parser, zipfile and csv with it (~1 MB of a broker's RSS, bench/RESULTS.md)
    from importlib.metadata import entry_points

    for ep in entry_points(group="amqpd.plugins"):
        if ep.name == name:
            return ep.load()
    try:
        module = importlib.import_module(f"plugins.{name}")
    except ImportError as exc:
        raise PluginError(f"plugin {name!r} not found (no 'amqpd.plugins' entry point and "
                          f"no module plugins.{name}): {exc}") from exc
    factory = getattr(module, "create_plugin", None)
    if factory is None:
        raise PluginError(f"plugin module plugins.{name} has no create_plugin(api)")
    return factory


def load_plugins(api: BrokerAPI, names: list[str]) -> dict[str, Plugin]:
    plugins: dict[str, Plugin] = {}
    for name in names:
        plugins[name] = _factory(name)(api)
        log.info("plugin enabled: %s", name)
    return plugins
