"""The management HTTP API: RabbitMQ's paths and JSON shapes, health checks, metrics.

One module per resource (LavinMQ's controllers): ``overview``, ``connections``,
``exchanges``, ``queues``, ``bindings``, ``vhosts``, ``users``, ``policies``,
``parameters``, ``definitions``, ``health``, ``metrics``, ``topic_permissions``, and
``webui`` (the management web UI at ``/`` and its login). Each exposes ``routes(router)``.
:class:`HttpServer` is started and stopped by the broker.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from amqpd.http import (
    bindings,
    connections,
    definitions,
    exchanges,
    health,
    limits,
    metrics,
    overview,
    parameters,
    policies,
    queues,
    users,
    vhosts,
    webui,
)
from amqpd.http.core import Router, make_dispatcher
from amqpd.http.sessions import SessionStore
from amqpd.http.stats import RateSampler

if TYPE_CHECKING:
    from amqpd.broker.api import Broker

log = logging.getLogger("amqpd.http")

RESOURCES = (overview, connections, exchanges, queues, bindings, vhosts, users, policies,
             parameters, definitions, health, metrics, webui, limits)


def build_router(broker: Broker | None = None) -> Router:
    router = Router()
    for module in RESOURCES:
        module.routes(router)
    for plugin in (broker.plugins.values() if broker is not None else ()):
        add_routes = getattr(plugin, "http_routes", None)
        if add_routes is not None:  # /api/shovels, /api/federation-links...
            add_routes(router)
    return router


def create_app(broker: Broker, sampler: RateSampler | None = None) -> web.Application:
    app = web.Application(client_max_size=128 * 1024 * 1024)
    app["broker"] = broker
    app["sampler"] = sampler or RateSampler(broker)
    app["sessions"] = SessionStore(Path(broker.settings.data_dir) / "http-sessions.json")
    app["listener"] = {"port": 0, "tls": False}  # filled in once bound (a mutable holder:
    # aiohttp forbids changing a started application's own keys)
    app.router.add_route("*", "/{tail:.*}", make_dispatcher(broker, build_router(broker)))
    return app


class HttpServer:
    """The API listener: ``await start()`` binds (port 0 = ephemeral), ``port`` says where."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sampler = RateSampler(broker, max(broker.settings.stats_interval, 0.1))
        self.app = create_app(broker, self.sampler)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.host = ""

    async def start(self) -> None:
        s = self.broker.settings
        ssl_ctx = None
        if s.http_tls:
            from amqpd.tls import server_context

            ssl_ctx = server_context(s)
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self.runner.setup()
        host = s.http_bind or s.bind
        site = web.TCPSite(self.runner, host, s.http_port, ssl_context=ssl_ctx,
                           reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            # Half a broker (AMQP without its API, so no health checks, no management)
            # is worse than none: refuse to start, as RabbitMQ does when a listener
            # cannot bind.
            await self.runner.cleanup()
            self.runner = None
            raise OSError(exc.errno, f"HTTP API cannot listen on {host}:{s.http_port}: "
                                     f"{exc.strerror or exc}") from exc
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.host, self.port = sockets[0].getsockname()[:2]
        else:
            self.host, self.port = host, s.http_port
        self.app["listener"].update(port=self.port, tls=ssl_ctx is not None)
        self.sampler.start()
        log.info("HTTP API listening on %s://%s:%d", "https" if ssl_ctx else "http",
                 self.host, self.port)

    async def stop(self) -> None:
        await self.sampler.stop()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


__all__ = ["HttpServer", "build_router", "create_app"]
