"""The management HTTP API's aiohttp application: every resource's routes, one dispatcher.

One module per resource (LavinMQ's controllers): ``overview``, ``connections``,
``exchanges``, ``queues``, ``bindings``, ``vhosts``, ``users``, ``policies``,
``parameters``, ``definitions``, ``health``, ``metrics``, ``topic_permissions``,
``replication`` (the warren), ``stream_replicas`` and ``super_streams`` (streams), and
``webui`` (the management web UI at ``/`` and its login). Each exposes ``routes(router)``.
Imported when the API is first used, not at start (amqpd/http/listener.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqpd.http import (
    bindings,
    cluster,
    cluster_lists,
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
    app["sessions"] = SessionStore(Path(api.settings.http_sessions_file or Path(
        api.data_dir()) / "http-sessions.json"))
    # this listener, filled in once bound (a mutable holder: aiohttp forbids changing a
    # started application's own keys)
    app["listener"] = {"host": "", "port": 0, "tls": False}
    router = build_router(api)
    app["router"] = router  # /metrics asks its metric_sources

    async def local_part(args: dict[str, Any]) -> Any:
        return await cluster_lists.answer_peer(api, router, app, args)

    app["local_part"] = local_part  # another node's question (amqpd/http/listener.py)
    app.router.add_route("*", "/{tail:.*}", make_dispatcher(api, router))
    return app


async def start_runner(api: BrokerAPI, sampler: RateSampler,
                       listener: dict[str, Any]) -> web.AppRunner:
    """The application behind a listener that is already bound (``listener``: its host,
    port and TLS flag, for the pages that show them); ``runner.server`` is the protocol
    factory of its connections (amqpd/http/listener.py)."""
    app = create_app(api, sampler)
    app["listener"].update(listener)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    return runner


__all__ = ["build_router", "create_app", "start_runner"]
