"""asyncio glue for the stream protocol: socket bytes into a StreamConnection, its
frames back out once per tick, heartbeats, and back-pressure on deliveries.

As the AMQP transport (:mod:`amqpd.transport`), everything a connection produces in one
tick is written at once (``transport.writelines`` of its frames and frame parts: one
vectored write under uvloop, whose transports send a list with one ``writev``); when
the kernel buffer backs up (``pause_writing``) deliveries stop until it drains. With a
negotiated heartbeat the server sends one every heartbeat seconds and closes a
connection from which nothing arrived for two heartbeats (RabbitMQ's rule), with a log
line.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from amqpd.streamproto import codec
from amqpd.streamproto.connection import StreamConnection
from amqpd.streamproto.forwarding import TrackingForwarder
from amqpd.streamproto.relay import PublishRelay
from amqpd.streamproto.sac import Coordinator

if TYPE_CHECKING:
    from amqpd.server import Broker

log = logging.getLogger("amqpd.streamproto")


class StreamProtocol(asyncio.Protocol):
    def __init__(self, broker: Broker, advertised: tuple[str, int],
                 connections: set[StreamProtocol],
                 coordinator: Coordinator, forwarder: TrackingForwarder) -> None:
        self.broker = broker
        self.advertised = advertised
        self.coordinator = coordinator
        self.forwarder = forwarder
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.conn: StreamConnection | None = None
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self._handshake: asyncio.TimerHandle | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._missed = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        name = f"{peer[0]}:{peer[1]} -> {sock[0]}:{sock[1]}" if peer and sock else "?"
        self.conn = StreamConnection(self.broker, peer[:2] if peer else None, name,
                                     self.advertised, self.coordinator,
                                     self.forwarder)
        self.conn.on_output = self._schedule_flush
        self.conn.reading = self._reading
        self.connections.add(self)
        self._handshake = self._loop.call_later(self.broker.settings.handshake_timeout,
                                                self._handshake_check)

    def _handshake_check(self) -> None:
        self._handshake = None
        conn = self.conn
        if conn is not None and not conn.is_open and self.transport is not None:
            log.warning("stream connection %s: no open within the handshake timeout; "
                        "closing", conn.name)
            self.transport.close()

    def _schedule_beat(self) -> None:
        conn = self.conn
        if conn is not None and conn.heartbeat:
            self._beat = self._loop.call_later(conn.heartbeat, self._heartbeat)

    def _heartbeat(self) -> None:
        conn = self.conn
        if conn is None or self.transport is None or self.transport.is_closing():
            return
        if conn.received:
            self._missed = 0
        else:
            self._missed += 1
            if self._missed >= 2:
                log.warning("stream connection %s: missed heartbeats from the client; "
                            "closing", conn.name)
                self.transport.close()
                return
        conn.received = False
        conn.send(codec.heartbeat())
        self._schedule_beat()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        assert conn is not None
        conn.receive_data(data)
        if conn.is_open and self._beat is None:  # tuned and opened: heartbeats begin
            if self._handshake is not None:
                self._handshake.cancel()
                self._handshake = None
            self._schedule_beat()
        self.flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        conn, transport = self.conn, self.transport
        if conn is None or transport is None or transport.is_closing():
            return
        parts = conn.take_parts()
        if len(parts) == 1:
            transport.write(parts[0])
        elif parts:
            # uvloop writes the list with one writev (no join of a deliver frame's
            # entries first); asyncio's own transports join it
            transport.writelines(parts)
        if conn.close_transport:
            transport.close()

    def _reading(self, on: bool) -> None:
        """Go on (or stop) reading from the client (StreamConnection.in_flight)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if on:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.paused = True

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.paused = False
            self.conn.deliver_all()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._beat, self._handshake):
            if timer is not None:
                timer.cancel()
        self.connections.discard(self)
        if self.conn is not None:
            self.conn.closed()
        self.transport = None


class StreamListener:
    """The stream protocol's listener(s) of a broker and what they share."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connections: set[StreamProtocol] = set()
        self.coordinator = Coordinator()  # single active consumer groups, node-wide
        # offsets and publisher sequences of streams another node leads, asked of it,
        # and this node's answers to the others for the streams it leads
        self.forwarder = TrackingForwarder(broker)
        self.forwarder.serve()
        # publishes other nodes forward for the streams this node leads (their
        # publishers' clients declared them there): amqpd.cluster.forwarded_publish
        self.relay = PublishRelay(broker, lambda: broker._loop)
        # what metadata names for this node (the plain listener's): the cluster puts it
        # in the node's record, so other nodes' metadata can name this one
        self.advertised: tuple[str, int] | None = None

    async def start(self, port: int, ssl: Any = None) -> list[tuple[str, int]]:
        """Listen on ``port`` (0: ephemeral) where the AMQP listeners do (the broker's
        ``_listen``, which also closes them at shutdown); ``ssl``: a TLS listener
        (5551). Metadata advertises the listener's own port to its clients."""
        settings = self.broker.settings
        advertised: list[tuple[str, int]] = []  # known once bound, before any client

        def factory() -> StreamProtocol:
            return StreamProtocol(self.broker, advertised[0], self.connections,
                                  self.coordinator, self.forwarder)

        bound = await self.broker._listen(port, ssl=ssl, factory=factory,
                                          name="stream" if ssl is None else "stream/ssl")
        host = bound[0][0]
        advertised.append((settings.stream_advertised_host or (
            host if host not in ("0.0.0.0", "::") else _hostname()),
            settings.stream_advertised_port or bound[0][1]))
        if ssl is None:
            self.advertised = advertised[0]
        return bound

    def http_routes(self, router: Any) -> None:
        """/api/stream/... (amqpd.streamproto.http) on the management API's router, and
        the amqpd_stream_protocol_* series of /metrics (amqpd.streamproto.metrics)."""
        from amqpd.streamproto.http import add_routes
        from amqpd.streamproto.metrics import add_metrics

        add_routes(self)(router)
        router.metric_sources.append(lambda e: add_metrics(self, e))

    def close(self) -> None:
        """Close every stream connection (the broker closed the listening sockets)
        and stop asking other nodes for them."""
        self.forwarder.close()
        for proto in list(self.connections):
            if proto.transport is not None:
                proto.transport.close()


def _hostname() -> str:
    import socket

    return socket.gethostname()


__all__ = ["StreamListener", "StreamProtocol"]
