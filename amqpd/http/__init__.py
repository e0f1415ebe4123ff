"""The management HTTP API: RabbitMQ's paths and JSON shapes, health checks, metrics.

One module per resource (LavinMQ's controllers): ``overview``, ``connections``,
``exchanges``, ``queues``, ``bindings``, ``vhosts``, ``users``, ``policies``,
``parameters``, ``definitions``, ``health``, ``metrics``, ``topic_permissions``,
``replication`` (the warren), ``stream_replicas`` and ``super_streams`` (streams), and
``webui`` (the management web UI at ``/`` and its login). Each exposes ``routes(router)``.
:class:`HttpServer` is started and stopped by the broker.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqpd.config import host_port
from amqpd.http import (
    bindings,
    cluster,
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
    quorum_members,
    replication,
    stream_replicas,
    super_streams,
    users,
    vhosts,
    webui,
)
from amqpd.http.core import Router, make_dispatcher
from amqpd.http.sessions import SessionStore
from amqpd.http.stats import RateSampler

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI

log = logging.getLogger("amqpd.http")

RESOURCES = (overview, connections, exchanges, queues, bindings, vhosts, users, policies,
             parameters, definitions, health, metrics, webui, limits, replication, cluster,
             quorum_members, stream_replicas, super_streams)


def build_router(api: BrokerAPI | None = None) -> Router:
    router = Router()
    for module in RESOURCES:
        module.routes(router)
    for add_routes in (api.plugin_http_routes() if api is not None else ()):
        add_routes(router)  # /api/shovels, /api/federation-links...
    return router


def create_app(api: BrokerAPI, sampler: RateSampler | None = None) -> web.Application:
    @web.middleware
    async def role_header(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        warren = api.warren()
        if warren is not None:  # every answer says which part this node plays
            response.headers["X-Amqpd-Role"] = warren.role
        return response

    app = web.Application(client_max_size=128 * 1024 * 1024, middlewares=[role_header])
    app["api"] = api
    app["sampler"] = sampler or RateSampler(api)
    app["sessions"] = SessionStore(Path(api.data_dir()) / "http-sessions.json")
    # this listener, filled in once bound (a mutable holder: aiohttp forbids changing a
    # started application's own keys)
    app["listener"] = {"host": "", "port": 0, "tls": False}
    router = build_router(api)
    app["router"] = router  # /metrics asks its metric_sources
    app.router.add_route("*", "/{tail:.*}", make_dispatcher(api, router))
    return app


class HttpServer:
    """The API listener: ``await start()`` binds (port 0 = ephemeral), ``port`` says where."""

    def __init__(self, api: BrokerAPI) -> None:
        self.api = api
        self.sampler = RateSampler(api, max(api.settings.stats_interval, 0.1))
        self.app = create_app(api, self.sampler)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.host = ""

    async def start(self) -> None:
        s = self.api.settings
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
            raise OSError(exc.errno, f"HTTP API cannot listen on {host_port(host, s.http_port)}: "
                                     f"{exc.strerror or exc}") from exc
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.host, self.port = sockets[0].getsockname()[:2]
        else:
            self.host, self.port = host, s.http_port
        self.app["listener"].update(host=self.host, port=self.port, tls=ssl_ctx is not None)
        self.sampler.start()
        log.info("HTTP API listening on %s://%s", "https" if ssl_ctx else "http",
                 host_port(self.host, self.port))

    async def stop(self) -> None:
        await self.sampler.stop()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


__all__ = ["HttpServer", "build_router", "create_app"]
