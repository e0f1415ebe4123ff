"""asyncio glue: socket bytes into the sans-IO machine, its output back out once per tick.

Everything a connection produces during one event-loop tick (replies, deliveries from
scheduled dispatch, confirms) is joined and written with a single ``transport.write``.
When the kernel buffer backs up (``pause_writing``), deliveries to this connection stop
until it drains, so a slow consumer cannot make the broker buffer without bound.

Each connection that negotiated heartbeats gets two timers, as in RabbitMQ: a sender every
heartbeat/2 s and a monitor every heartbeat s (a once-a-second tick is too coarse for
``heartbeat=1``: a client that drops a socket silent for one second would be lost).
After a client's connection.close the socket *lingers*: it is read and discarded until
the peer closes it or the linger timeout passes, so unread client data never turns the
close into a TCP reset.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from amqpd.config import host_port
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
        self._beat_timer: asyncio.TimerHandle | None = None  # heartbeat sender
        self._monitor_timer: asyncio.TimerHandle | None = None  # heartbeat monitor
        self._linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        # RabbitMQ's connection name; an IPv6 address in brackets, as RabbitMQ writes it
        name = (f"{host_port(peer[0], peer[1])} -> {host_port(sock[0], sock[1])}"
                if peer and sock else "?")
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
        if self._monitor_timer is None and session.conn.heartbeat:
            self._start_heartbeats(session.conn.heartbeat)
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
            if not session.conn.linger:
                transport.close()
            elif self._linger_timer is None:
                self._linger_timer = self._loop.call_later(session.conn.linger_timeout,
                                                           self._end_linger)
                self._apply_reading()  # drain whatever the peer still sends

    def _end_linger(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None  # the peer closed its end: close ours (ends a linger too)

    # ------------------------------------------------------------------ heartbeats
    def _start_heartbeats(self, heartbeat: int) -> None:
        self._beat_timer = self._loop.call_later(heartbeat / 2, self._beat)
        self._monitor_timer = self._loop.call_later(heartbeat, self._monitor)

    def _beat(self) -> None:
        session = self.session
        if session is None or self.transport is None:
            return
        session.conn.heartbeat_send()
        self.flush()
        self._beat_timer = self._loop.call_later(session.conn.heartbeat / 2, self._beat)

    def _monitor(self) -> None:
        session = self.session
        if session is None or self.transport is None:
            return
        conn = session.conn
        conn.heartbeat_check(conn.clock())
        self.flush()
        self._monitor_timer = self._loop.call_later(conn.heartbeat, self._monitor)

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
        want_paused = (self.reading_paused or self._backlog or self._over_budget) and \
            self._linger_timer is None
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
        for timer in (self._beat_timer, self._monitor_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        # nothing may point back at this protocol or the session any more: each
        # connection is then freed by reference counting, not left to the cyclic
        # collector (see AMQPConnection.detach)
        self._beat_timer = self._monitor_timer = self._linger_timer = None
        if self.session is not None:
            if exc is not None:
                log.info("connection lost: %s (%s)", self.session.name, exc)
            self.session.conn.detach()
            self.session.protocol = None
        self.transport = None
