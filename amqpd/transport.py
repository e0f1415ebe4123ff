"""asyncio glue: socket bytes into the sans-IO machine, its output back out once per tick.

Everything a connection produces during one event-loop tick (replies, deliveries from
scheduled dispatch, confirms) is joined and written with a single ``transport.write``.
When the kernel buffer backs up (``pause_writing``), deliveries to this connection stop
until it drains, so a slow consumer cannot make the broker buffer without bound.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from amqpd.logs import bind_connection, clear_context
from amqpd.session import Session

if TYPE_CHECKING:
    from amqpd.server import Broker

log = logging.getLogger("amqpd.transport")

READ_BUDGET = 64 * 1024  # bytes read from one socket per event-loop turn
FLOW_READ_BUDGET = 8 * 1024  # the same for a connection in flow


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self.reading_paused = False  # by an alarm
        self._backlog = False  # received frames still being handled in slices
        self._socket_paused = False
        self._turn_bytes = 0  # read since the loop last ran its callbacks
        self._over_budget = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        name = f"{peer[0]}:{peer[1]} -> {sock[0]}:{sock[1]}" if peer and sock else "?"
        self.session = Session(self.broker, peer[:2] if peer else None,
                               self.broker.limits(), name=name)
        self.session.protocol = self
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:  # amqps: the handshake is done, the peer is known
            self.session.tls_established(ssl_object.getpeercert())
        self.session.conn.on_output = self._schedule_flush
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)  # type: ignore[attr-defined]
        self.broker.transports.add(self)

    def data_received(self, data: bytes) -> None:
        session = self.session
        assert session is not None
        # libuv reads a readable socket up to 32 times before the loop runs callbacks, so
        # a flooding publisher could feed megabytes per loop turn while its consumers'
        # deliveries wait: past READ_BUDGET bytes in one turn, reading pauses until the
        # loop has run the callbacks queued so far (dispatch among them).
        self._turn_bytes += len(data)
        budget = FLOW_READ_BUDGET if session.conn.in_flow else READ_BUDGET
        if self._turn_bytes > budget and not self._over_budget:
            self._over_budget = True
            self._apply_reading()
            self._loop.call_soon(self._next_turn)
        # every log event while handling this read carries the connection's identity
        bind_connection(session.name, session.username or None, session.conn.vhost or None)
        try:
            session.conn.receive_data(data)
        finally:
            clear_context()
        self.flush()
        if session.conn.has_pending and not self._backlog:
            self._backlog = True
            self._apply_reading()
            self._loop.call_soon(self._work_off_backlog)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        session = self.session
        transport = self.transport
        if session is None or transport is None:
            return
        data = session.conn.data_to_send()
        if data and not transport.is_closing():
            transport.write(data)
        if session.delivery_stalled and not session.blocked_delivery:
            session.delivery_stalled = False
            self.broker.reschedule_session(session)
        if session.conn.should_close_transport and not transport.is_closing():
            transport.close()

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.blocked_delivery = True

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.blocked_delivery = False
            self.broker.reschedule_session(self.session)

    # Reading stops for three independent reasons: a resource alarm (pause_reading /
    # resume_reading, called by amqpd.alarms), a backlog of received frames still being
    # worked off in slices, and the per-turn read budget. The socket is read again only
    # when none holds.
    def pause_reading(self) -> None:
        self.reading_paused = True
        self._apply_reading()

    def resume_reading(self) -> None:
        self.reading_paused = False
        self._apply_reading()

    def _apply_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        want_paused = self.reading_paused or self._backlog or self._over_budget
        if self.session is not None:
            self.session.conn.reading_paused = want_paused
        if want_paused and not self._socket_paused:
            self._socket_paused = True
            transport.pause_reading()
        elif not want_paused and self._socket_paused:
            self._socket_paused = False
            transport.resume_reading()

    def _next_turn(self) -> None:
        self._turn_bytes = 0
        self._over_budget = False
        self._apply_reading()

    def _work_off_backlog(self) -> None:
        session = self.session
        if session is None or self.transport is None:
            return
        bind_connection(session.name, session.username or None, session.conn.vhost or None)
        try:
            more = session.conn.process_pending()
        finally:
            clear_context()
        self.flush()
        if more:
            self._loop.call_soon(self._work_off_backlog)
        else:
            self._backlog = False
            self._apply_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.broker.transports.discard(self)
        if self.session is not None:
            if exc is not None:
                log.info("connection lost: %s (%s)", self.session.name, exc)
            self.session.conn.connection_lost()
        self.transport = None
