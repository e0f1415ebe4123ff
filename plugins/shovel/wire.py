"""The link client: a small AMQP 0-9-1 client through which messages pass undecoded.

It is the one client of both link plugins: shovels (source and destination) and
federation links (the upstream connection). A link forwards what it receives, so the
hot path never decodes a message: a delivery is the exchange, routing key and delivery
tag from ``basic.deliver`` plus the *raw* property bytes of its content header and the
body; a publish writes those bytes back (the properties are decoded only when a link must
change them: forward headers, ``x-received-from``, publish properties).

Methods that carry names or tables (declares, binds, deletes, consume, cancel) are
encoded here (:mod:`plugins.shovel.methods`), not with pamqp: RabbitMQ accepts any UTF-8
name (federation's own are ``federation: X -> C``), which pamqp's 0-9-1 domain patterns
refuse, and table integers go out as RabbitMQ's own clients send them (64-bit ``l``).
Other methods (handshake, qos, confirm.select, close) are pamqp frames; replies are
parsed with pamqp, which never validates names when parsing. One RPC per channel at a
time.

Frames are parsed in ``data_received`` from one buffer, without a task or queue per
frame; deliveries and confirms reach their callbacks synchronously, in wire order.
Writes are backpressured through ``pause_writing``/``resume_writing`` (:meth:`drain`).
Heartbeats: sent when nothing else was written for half the interval; a peer silent for
two intervals is considered gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp.header import ContentHeader, ProtocolHeader

from amqpd.broker.api import wire as C
from plugins.shovel import methods

FRAME_MAX = 131072
WRITE_BUFFER = 4 * 1024 * 1024  # bytes queued in the transport before publishers wait
# amqpd's capability (amqpd.broker.retry_routes, docs/shovel.md): a publish carrying
# RETRY_OF_HEADER (the confirm sequence number of its first try on the channel) goes only
# into the queues of its route that did not take that try
RETRY_OF = "publish_retry_of"
RETRY_OF_HEADER = "x-publish-retry-of"
_FRAME = struct.Struct(">BHI")
_HB = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_PROTOCOL_HEADER = ProtocolHeader().marshal()
_U16 = struct.Struct(">H")
_U64B = struct.Struct(">QB")
_HDR = struct.Struct(">HHQ")
_END = bytes((C.FRAME_END,))
_PUBLISH = C.BASIC_PUBLISH.to_bytes(4, "big")
_ACK = C.BASIC_ACK.to_bytes(4, "big")
_NACK = C.BASIC_NACK.to_bytes(4, "big")
_DELIVER = C.BASIC_DELIVER.to_bytes(4, "big")


class AMQPError(Exception):
    """The peer closed the channel or the connection (reply code and text)."""

    def __init__(self, code: int, text: str, scope: str = "channel") -> None:
        super().__init__(f"{scope} closed: {code} {text}")
        self.code = code
        self.text = text
        self.scope = scope


class NotFound(AMQPError):
    pass


def _error(code: int | None, text: str | None, scope: str) -> AMQPError:
    return (NotFound if code == 404 else AMQPError)(code or 0, text or "", scope)


@dataclass(slots=True)
class Delivery:
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: bytes  # raw property flags + values, as on the wire
    body: bytes


@dataclass
class Params:
    host: str
    port: int
    vhost: str
    user: str
    password: str
    heartbeat: int
    tls: bool
    connect_timeout: float


def parse_uri(uri: str) -> Params:
    parts = urlsplit(uri)
    tls = parts.scheme == "amqps"
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    vhost = unquote(parts.path[1:]) if parts.path and parts.path != "/" else "/"
    return Params(
        host=parts.hostname or "localhost", port=parts.port or (5671 if tls else 5672),
        vhost=vhost or "/", user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        heartbeat=int(query.get("heartbeat", 60)), tls=tls,
        connect_timeout=float(query.get("connection_timeout", 10000)) / 1000,
    )


def decode_properties(raw: bytes) -> spec.Basic.Properties:
    header = ContentHeader()
    header.unmarshal(_HDR.pack(C.CLASS_BASIC, 0, 0) + raw)
    return header.properties


def encode_properties(properties: spec.Basic.Properties) -> bytes:
    return ContentHeader(0, 0, properties).marshal()[12:]


def _tls_context(uri: str) -> ssl.SSLContext:
    """amqps: RabbitMQ's URI query keys (cacertfile, certfile, keyfile, verify,
    server_name_indication)."""
    query = {k: v[-1] for k, v in parse_qs(urlsplit(uri).query).items()}
    context = ssl.create_default_context(cafile=query.get("cacertfile"))
    if "certfile" in query:
        context.load_cert_chain(query["certfile"], query.get("keyfile"))
    if query.get("verify") == "verify_none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif query.get("server_name_indication") == "disable":
        context.check_hostname = False
    return context


def _shortstr(value: str) -> bytes:
    raw = value.encode()
    return bytes((len(raw),)) + raw


class Connection(asyncio.Protocol):
    def __init__(self, params: Params) -> None:
        self.params = params
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.frame_max = FRAME_MAX
        self.closed: asyncio.Future[Any] = self.loop.create_future()
        self._waiters: dict[int, asyncio.Future[Any]] = {}  # channel -> RPC reply
        self._channel_closed: dict[int, asyncio.Future[Any]] = {}
        self._live: set[int] = set()  # open channel numbers (freed ones are reused)
        self.channel_max = 2047
        self.server_properties: dict[str, Any] = {}
        self.product = "amqpd-shovel"
        # announce RETRY_OF when the server offers it (a shovel's destination connection)
        self.want_retry_of = False
        self.retry_of = False  # announced: retries carry RETRY_OF_HEADER
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._wrote = False
        self._heard = True
        self._hb_task: asyncio.Task[None] | None = None
        # per-channel hot-path callbacks
        self.on_delivery: dict[int, Callable[[Delivery], None]] = {}
        self.on_confirm: dict[int, Callable[[int, bool, bool], None]] = {}
        self.on_cancel: dict[int, Callable[[str], None]] = {}
        self._content: dict[int, list[Any]] = {}  # channel -> delivery being assembled

    # ------------------------------------------------------------------ open / close
    @classmethod
    async def open(cls, uri: str, product: str = "amqpd-shovel", *,
                   retry_of: bool = False) -> Connection:
        """Connect and log in. ``retry_of``: announce :data:`RETRY_OF` when the server
        offers it (then :attr:`retry_of` is True)."""
        params = parse_uri(uri)
        loop = asyncio.get_running_loop()
        context = _tls_context(uri) if params.tls else None
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: cls(params), params.host, params.port,
                                   ssl=context),
            params.connect_timeout)
        conn.product = product
        conn.want_retry_of = retry_of
        try:
            await asyncio.wait_for(conn._handshake(), params.connect_timeout)
        except (ConnectionError, OSError) as exc:
            conn.abort()
            if conn.server_properties:
                raise
            # nothing was said: what a load balancer does while no backend is up
            raise ConnectionError(
                f"{params.host}:{params.port} accepted the connection and closed it before "
                f"the AMQP handshake ({exc}); a load balancer with no backend up?") from exc
        except BaseException:
            conn.abort()
            raise
        return conn

    async def _handshake(self) -> None:
        p = self.params
        start = self._expect(0)
        self._write(_PROTOCOL_HEADER)
        self.server_properties = dict((await start).server_properties or {})
        offered = self.server_properties.get("capabilities")
        capabilities: dict[str, Any] = {
            "publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
            "connection.blocked": True, "authentication_failure_close": True}
        if self.want_retry_of and isinstance(offered, dict) and offered.get(RETRY_OF) is True:
            capabilities[RETRY_OF] = self.retry_of = True
        tune_f = self._expect(0)
        self.send(0, spec.Connection.StartOk(
            client_properties={
                "product": self.product, "platform": "Python",
                "capabilities": capabilities},
            mechanism="PLAIN", response=f"\0{p.user}\0{p.password}"))
        tune = await tune_f
        self.frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        heartbeat = min(tune.heartbeat, p.heartbeat) if tune.heartbeat else p.heartbeat
        self.channel_max = min(tune.channel_max or 2047, 2047)
        self.send(0, spec.Connection.TuneOk(channel_max=self.channel_max,
                                            frame_max=self.frame_max, heartbeat=heartbeat))
        await self.rpc(0, spec.Connection.Open(virtual_host=p.vhost))
        if heartbeat:
            self._hb_task = self.loop.create_task(self._heartbeats(heartbeat))

    async def close(self) -> None:
        """Close politely (bounded), then drop the socket whatever the peer did."""
        if self.transport is None:
            return
        if not self.closed.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.rpc(0, spec.Connection.Close(
                    reply_code=200, reply_text="shovel")), 5)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._fail(ConnectionError("connection aborted"))

    async def _heartbeats(self, interval: int) -> None:
        """Beat every interval/2 when idle; give up after two silent intervals."""
        silent = 0
        while not self.closed.done():
            await asyncio.sleep(interval / 2)
            if not self._wrote:
                self._write(_HB)
            self._wrote = False
            silent = 0 if self._heard else silent + 1
            self._heard = False
            if silent >= 4:
                self._fail(ConnectionError(f"missed heartbeats from the peer "
                                           f"({2 * interval}s)"))
                if self.transport is not None:
                    self.transport.abort()
                return

    # ------------------------------------------------------------------ channels / RPC
    async def channel(self) -> int:
        """Open a channel: the lowest free number (closed ones are reused, so a link
        that opens a disposable channel now and then never runs out)."""
        number = next((n for n in range(1, self.channel_max + 1) if n not in self._live), 0)
        if not number:
            raise AMQPError(0, f"all {self.channel_max} channels in use", "connection")
        self._live.add(number)
        self._channel_closed[number] = self.loop.create_future()
        try:
            await self.rpc(number, spec.Channel.Open())
        except BaseException:
            self._release(number)
            raise
        return number

    async def close_channel(self, number: int) -> None:
        """Close a channel (bounded); its ``channel_closed`` future completes."""
        if number in self._live and not self.closed.done():
            with contextlib.suppress(AMQPError, ConnectionError, asyncio.TimeoutError):
                await asyncio.wait_for(self.rpc(number, spec.Channel.Close(
                    reply_code=200, reply_text="closed", class_id=0, method_id=0)), 5)
        fut = self._channel_closed.get(number)
        if fut is not None and not fut.done():
            fut.set_result("channel closed by the link")
        self._release(number)

    def _release(self, number: int) -> None:
        self._live.discard(number)
        self.on_delivery.pop(number, None)
        self.on_confirm.pop(number, None)
        self.on_cancel.pop(number, None)
        self._content.pop(number, None)

    # ------------------------------------------------------------------ named methods
    async def queue_declare(self, channel: int, queue: str, *, passive: bool = False,
                            durable: bool = False, exclusive: bool = False,
                            auto_delete: bool = False,
                            arguments: dict[str, Any] | None = None) -> Any:
        """queue.declare; the DeclareOk (queue, message_count, consumer_count)."""
        return await self.rpc_frame(channel, methods.queue_declare(
            channel, queue, passive, durable, exclusive, auto_delete, arguments))

    async def queue_bind(self, channel: int, queue: str, exchange: str, routing_key: str = "",
                         arguments: dict[str, Any] | None = None) -> None:
        await self.rpc_frame(channel, methods.queue_bind(channel, queue, exchange,
                                                         routing_key, arguments))

    async def queue_delete(self, channel: int, queue: str) -> None:
        await self.rpc_frame(channel, methods.queue_delete(channel, queue))

    async def exchange_declare(self, channel: int, exchange: str, exchange_type: str = "direct",
                               *, passive: bool = False, durable: bool = False,
                               auto_delete: bool = False, internal: bool = False,
                               arguments: dict[str, Any] | None = None) -> None:
        await self.rpc_frame(channel, methods.exchange_declare(
            channel, exchange, exchange_type, passive, durable, auto_delete, internal,
            arguments))

    async def exchange_delete(self, channel: int, exchange: str) -> None:
        await self.rpc_frame(channel, methods.exchange_delete(channel, exchange))

    async def exchange_bind(self, channel: int, destination: str, source: str,
                            routing_key: str = "",
                            arguments: dict[str, Any] | None = None) -> None:
        await self.rpc_frame(channel, methods.exchange_bind(
            channel, destination, source, routing_key, arguments, unbind=False))

    async def exchange_unbind(self, channel: int, destination: str, source: str,
                              routing_key: str = "",
                              arguments: dict[str, Any] | None = None) -> None:
        await self.rpc_frame(channel, methods.exchange_bind(
            channel, destination, source, routing_key, arguments, unbind=True))

    async def basic_qos(self, channel: int, prefetch_count: int) -> None:
        await self.rpc(channel, spec.Basic.Qos(prefetch_count=prefetch_count))

    async def basic_consume(self, channel: int, queue: str, *, consumer_tag: str = "",
                            no_ack: bool = False,
                            arguments: dict[str, Any] | None = None) -> str:
        """Start consuming (set ``on_delivery[channel]`` first); the consumer tag."""
        ok = await self.rpc_frame(channel, methods.basic_consume(
            channel, queue, consumer_tag, no_ack, arguments))
        return str(ok.consumer_tag or consumer_tag)

    async def basic_cancel(self, channel: int, consumer_tag: str) -> None:
        await self.rpc_frame(channel, methods.basic_cancel(channel, consumer_tag))

    def channel_closed(self, number: int) -> asyncio.Future[Any]:
        return self._channel_closed[number]

    def _expect(self, channel: int) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        if self.closed.done():
            # the peer may close before the first wait even starts (a load balancer with
            # no backend up accepts and closes at once): fail now, not at the timeout
            exc = self.closed.exception() if not self.closed.cancelled() else None
            fut.set_exception(exc or ConnectionError("connection closed"))
            fut.exception()
            return fut
        self._waiters[channel] = fut
        return fut

    async def rpc(self, channel: int, method: Any) -> Any:
        return await self.rpc_frame(channel, pframe.marshal(method, channel))

    async def rpc_frame(self, channel: int, frame: bytes) -> Any:
        """Send one method frame and wait for the reply on its channel."""
        if self.closed.done():
            raise ConnectionError("connection closed")
        fut = self._expect(channel)
        self._write(frame)
        done, _ = await asyncio.wait([fut, self.closed], return_when=asyncio.FIRST_COMPLETED)
        if fut not in done:
            fut.cancel()
            exc = self.closed.exception() if not self.closed.cancelled() else None
            raise exc or ConnectionError("connection closed")
        return fut.result()

    # ------------------------------------------------------------------ writing
    def send(self, channel: int, method: Any) -> None:
        self._write(pframe.marshal(method, channel))

    def _write(self, data: bytes | bytearray) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self._wrote = True

    async def drain(self) -> None:
        if not self._can_write.is_set():
            waiter = asyncio.ensure_future(self._can_write.wait())
            await asyncio.wait([waiter, self.closed], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if self.closed.done():
            raise ConnectionError("connection closed")

    def publish_frames(self, channel: int, exchange: str, routing_key: str,
                       properties: bytes, body: bytes, out: bytearray) -> None:
        """Append one publish (method, header, body frames) to out."""
        method = _PUBLISH + b"\x00\x00" + _shortstr(exchange) + _shortstr(routing_key) \
            + b"\x00"
        out += _FRAME.pack(C.FRAME_METHOD, channel, len(method)) + method + _END
        header = _HDR.pack(C.CLASS_BASIC, 0, len(body)) + properties
        out += _FRAME.pack(C.FRAME_HEADER, channel, len(header)) + header + _END
        step = self.frame_max - 8
        for i in range(0, len(body), step):
            chunk = body[i:i + step]
            out += _FRAME.pack(C.FRAME_BODY, channel, len(chunk)) + chunk + _END

    def write(self, data: bytes | bytearray) -> None:
        self._write(data)

    def ack(self, channel: int, tag: int, multiple: bool) -> None:
        payload = _ACK + _U64B.pack(tag, 1 if multiple else 0)
        self._write(_FRAME.pack(C.FRAME_METHOD, channel, len(payload)) + payload + _END)

    def nack(self, channel: int, tag: int, requeue: bool = True) -> None:
        payload = _NACK + _U64B.pack(tag, 2 if requeue else 0)
        self._write(_FRAME.pack(C.FRAME_METHOD, channel, len(payload)) + payload + _END)

    # ------------------------------------------------------------------ protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is not a subclass)
        with contextlib.suppress(AttributeError, NotImplementedError):
            transport.set_write_buffer_limits(high=WRITE_BUFFER)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection closed by the peer"))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def _fail(self, exc: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_exception(exc)
            self.closed.exception()  # retrieved: watchers get it from here
        for fut in [*self._waiters.values(), *self._channel_closed.values()]:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        if self._hb_task is not None:
            self._hb_task.cancel()

    def data_received(self, data: bytes) -> None:
        self._heard = True
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 8:
                if buf[pos] == 65:  # "AMQP": the server refused our protocol version
                    raise ConnectionError("server refused the protocol header")
                ftype, channel, size = _FRAME.unpack_from(buf, pos)
                end = pos + 7 + size
                if n < end + 1:
                    break
                if ftype == C.FRAME_BODY:
                    self._on_body(channel, bytes(buf[pos + 7:end]))
                elif ftype == C.FRAME_METHOD:
                    self._on_method(channel, buf, pos, end)
                elif ftype == C.FRAME_HEADER:
                    self._on_header(channel, bytes(buf[pos + 7:end]))
                pos = end + 1
        except Exception as exc:
            self._fail(exc)
            if self.transport is not None:
                self.transport.abort()
            return
        del buf[:pos]

    def _on_method(self, channel: int, buf: bytearray, pos: int, end: int) -> None:
        key = bytes(buf[pos + 7:pos + 11])
        if key == _DELIVER:
            p = pos + 11
            ln = buf[p]
            p += 1 + ln  # consumer tag
            tag, bits = _U64B.unpack_from(buf, p)
            p += 9
            ln = buf[p]
            exchange = buf[p + 1:p + 1 + ln].decode()
            p += 1 + ln
            ln = buf[p]
            routing_key = buf[p + 1:p + 1 + ln].decode()
            # [delivery, body size, body parts, bytes so far]
            self._content[channel] = [Delivery(tag, bool(bits & 1), exchange, routing_key,
                                               b"", b""), 0, [], 0]
            return
        if key in (_ACK, _NACK):
            tag, bits = _U64B.unpack_from(buf, pos + 11)
            cb = self.on_confirm.get(channel)
            if cb is not None:
                cb(tag, bool(bits & 1), key == _ACK)
            return
        _, _, method = pframe.unmarshal(bytes(buf[pos:end + 1]))
        if isinstance(method, spec.Basic.Cancel):
            cancel = self.on_cancel.get(channel)
            if cancel is not None:
                cancel(method.consumer_tag or "")
            return
        if isinstance(method, spec.Channel.Close):
            self.send(channel, spec.Channel.CloseOk())
            exc = _error(method.reply_code, method.reply_text, "channel")
            for fut in (self._waiters.pop(channel, None), self._channel_closed.get(channel)):
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                    fut.exception()
            self._release(channel)
            return
        if isinstance(method, spec.Connection.Close):
            self.send(0, spec.Connection.CloseOk())
            self._fail(_error(method.reply_code, method.reply_text, "connection"))
            return
        if isinstance(method, (spec.Connection.Blocked, spec.Connection.Unblocked)):
            return  # the peer stops reading while blocked: writes back up, drain() waits
        fut = self._waiters.pop(channel, None)
        if fut is not None and not fut.done():
            fut.set_result(method)

    def _on_header(self, channel: int, payload: bytes) -> None:
        pending = self._content.get(channel)
        if pending is None:
            raise ConnectionError("content header without a delivery")
        _, _, size = _HDR.unpack_from(payload)
        pending[0].properties = payload[12:]
        pending[1] = size
        if size == 0:
            self._deliver(channel, pending)

    def _on_body(self, channel: int, chunk: bytes) -> None:
        pending = self._content.get(channel)
        if pending is None:
            raise ConnectionError("content body without a delivery")
        pending[2].append(chunk)
        pending[3] += len(chunk)
        if pending[3] >= pending[1]:
            self._deliver(channel, pending)

    def _deliver(self, channel: int, pending: list[Any]) -> None:
        del self._content[channel]
        delivery: Delivery = pending[0]
        parts = pending[2]
        delivery.body = parts[0] if len(parts) == 1 else b"".join(parts)
        cb = self.on_delivery.get(channel)
        if cb is not None:
            cb(delivery)
