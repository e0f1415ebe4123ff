"""The HTTP API's listener: bound at start, aiohttp loaded at the first connection.

Why. aiohttp (its client side comes with ``import aiohttp``), yarl, multidict, the email
parser and the API's twenty resource modules are ~15 MB of a broker's resident memory,
a quarter of all of it, and a node that serves AMQP and streams and is never asked over
HTTP uses none of it (bench/RESULTS.md, "Broker memory at start"). What does not change:
the port is bound (or the broker refuses to start) and logged before the broker says it
is listening; the message-rate sampler runs from the start, so rates and histories are
the same whenever the first request comes.

How. The listening sockets are asyncio's own (``loop.create_server``, as aiohttp's
``TCPSite`` would make them). Until the application is loaded, each accepted connection
gets a :class:`_Held` protocol that stops reading at once; the first one starts the
load: :mod:`amqpd.http.app` is imported in a worker thread (the event loop keeps
serving AMQP; importing it on the loop stalled it ~0.6 s), then the aiohttp application
and its runner are made on the loop, and every held connection is handed to aiohttp's
protocol (``transport.set_protocol``), which reads the request that waited. From then
on aiohttp's protocol factory answers every connection directly. A load that fails
closes the held connections and logs why; the next connection tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from typing import TYPE_CHECKING, Any

from amqpd.config import host_port
from amqpd.http.stats import RateSampler

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI

log = logging.getLogger("amqpd.http")

BACKLOG = 128  # aiohttp's TCPSite default
# what another node of the cluster asks this one: its part of a management list
# (amqpd.http.cluster_lists; BrokerAPI.serve_node_requests' kind)
LOCAL_PART = "http-local-part"


class _Held(asyncio.Protocol):
    """A connection accepted before the application is loaded: not read until
    :meth:`HttpServer._release` hands it to aiohttp's protocol."""

    def __init__(self, owner: HttpServer) -> None:
        self.owner = owner
        # asyncio's or uvloop's (whose transports are not asyncio.Transport subclasses)
        self.transport: Any = None
        self.data: list[bytes] = []  # anything that arrived before reading stopped
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transport.pause_reading()
        self.owner._hold(self)

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return True  # half-closed: the request may still be answered

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.owner._held.discard(self)


class HttpServer:
    """The API listener: ``await start()`` binds (port 0 = ephemeral), ``port`` says where."""

    def __init__(self, api: BrokerAPI) -> None:
        self.api = api
        self.sampler = RateSampler(api, max(api.settings.stats_interval, 0.1))
        self.port = 0
        self.host = ""
        self.tls = False
        self._server: asyncio.AbstractServer | None = None
        self._held: set[_Held] = set()
        self._loading: asyncio.Task[None] | None = None
        self._runner: Any = None  # aiohttp's web.AppRunner, once loaded
        self._factory: Any = None  # its protocol factory (runner.server)
        # other nodes' questions for this node's part of a list (amqpd.http.cluster_lists)
        api.serve_node_requests(LOCAL_PART, self._local_part)

    @property
    def loaded(self) -> bool:
        """Whether aiohttp and the API's modules are loaded (a connection came)."""
        return self._factory is not None

    async def start(self) -> None:
        s = self.api.settings
        ssl_ctx = None
        if s.http_tls:
            from amqpd.tls import server_context

            ssl_ctx = server_context(s)
        host = s.http_bind or s.bind
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self._protocol, host, s.http_port, ssl=ssl_ctx, backlog=BACKLOG,
                reuse_address=True)
        except OSError as exc:
            # Half a broker (AMQP without its API, so no health checks, no management)
            # is worse than none: refuse to start, as RabbitMQ does when a listener
            # cannot bind.
            raise OSError(exc.errno, f"HTTP API cannot listen on {host_port(host, s.http_port)}: "
                                     f"{exc.strerror or exc}") from exc
        sockets = getattr(self._server, "sockets", None) or []
        if sockets:
            self.host, self.port = sockets[0].getsockname()[:2]
        else:
            self.host, self.port = host, s.http_port
        self.tls = ssl_ctx is not None
        self.sampler.start()
        log.info("HTTP API listening on %s://%s", "https" if ssl_ctx else "http",
                 host_port(self.host, self.port))

    def describe_as_tls(self) -> None:
        """Say https of this listener (the overview's protocol, the protocol-listener
        check, a UI cookie's Secure flag) though it is plain: a worker's loopback API
        behind the node's https front (amqpd/workers/worker.py)."""
        self.tls = True
        if self._runner is not None:
            self._runner.app["listener"]["tls"] = True

    def _protocol(self) -> asyncio.Protocol:
        """asyncio's protocol factory for this listener's connections."""
        if self._factory is not None:
            return self._factory()  # type: ignore[no-any-return]
        return _Held(self)

    def _hold(self, held: _Held) -> None:
        self._held.add(held)
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        try:
            app = await asyncio.to_thread(importlib.import_module, "amqpd.http.app")
            runner = await app.start_runner(
                self.api, self.sampler, {"host": self.host, "port": self.port, "tls": self.tls})
        except Exception:
            log.exception("HTTP API: loading the application failed")
            self._loading = None
            for held in list(self._held):
                if held.transport is not None:
                    held.transport.close()
            self._held.clear()
            return
        self._runner = runner
        self._factory = runner.server
        self._release()

    async def _local_part(self, args: dict[str, Any]) -> Any:
        """Another node's question for this node's part of a list: answered by the
        application (loaded now if no request has come yet)."""
        if self._runner is None:
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._load())
            await asyncio.shield(self._loading)
        if self._runner is None:
            raise RuntimeError("the HTTP API could not be loaded")
        return await self._runner.app["local_part"](args)

    def _release(self) -> None:
        """Hand every held connection to aiohttp's protocol."""
        held_now, self._held = self._held, set()
        for held in held_now:
            transport = held.transport
            if transport is None or transport.is_closing():
                continue
            protocol = self._factory()
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            for chunk in held.data:
                protocol.data_received(chunk)
            if held.eof and not protocol.eof_received():
                transport.close()
                continue
            transport.resume_reading()

    async def stop(self) -> None:
        await self.sampler.stop()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loading
        for held in list(self._held):
            if held.transport is not None:
                held.transport.close()
        self._held.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


__all__ = ["HttpServer"]
