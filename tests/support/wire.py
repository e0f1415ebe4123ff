"""The client side of the wire for tests: frames built and parsed with pamqp.

:class:`ClientCodec` is a tiny sans-IO client (h11's ``ConnectionPair`` idea): it builds
what a client would send and splits what the server sent back into pamqp objects.
:class:`RawSocket` drives it over a real socket with deadlines, for the cases a real
client library refuses to produce (bad headers, malformed and oversize frames).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from pamqp import body as pbody
from pamqp import commands, common, exceptions, frame, header, heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


@dataclass
class Out:
    """One frame the server sent: its channel and the decoded pamqp value."""

    channel: int
    value: Any

    @property
    def name(self) -> str:
        return getattr(self.value, "name", type(self.value).__name__)


def method(channel: int, value: Any) -> bytes:
    return frame.marshal(value, channel)


def content(channel: int, body: bytes, frame_max: int = 131072, **props: Any) -> bytes:
    """Content header + body frames (split to fit ``frame_max``)."""
    out = [frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(**props)),
                         channel)]
    chunk = frame_max - 8
    for start in range(0, len(body), chunk):
        out.append(frame.marshal(pbody.ContentBody(body[start:start + chunk]), channel))
    return b"".join(out)


def publish(channel: int, exchange: str, routing_key: str, body: bytes,
            mandatory: bool = False, frame_max: int = 131072, **props: Any) -> bytes:
    return method(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                  mandatory=mandatory)) + \
        content(channel, body, frame_max, **props)


def raw_frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def plain(user: str = "guest", password: str = "guest") -> bytes:
    return f"\0{user}\0{password}".encode()


def handshake(vhost: str = "/", user: str = "guest", password: str = "guest",
              channel_max: int = 0, frame_max: int = 131072, heartbeat_: int = 0,
              capabilities: dict[str, Any] | None = None) -> bytes:
    """Everything a client sends up to and including connection.open, pipelined."""
    caps: common.FieldTable = {
        "authentication_failure_close": True, "consumer_cancel_notify": True,
        "basic.nack": True, "publisher_confirms": True}
    caps.update(capabilities or {})
    return b"".join((
        PROTOCOL_HEADER,
        method(0, commands.Connection.StartOk(
            client_properties={"product": "amqpd-tests", "capabilities": caps},
            mechanism="PLAIN", response=plain(user, password).decode(), locale="en_US")),
        method(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max,
                                             heartbeat=heartbeat_)),
        method(0, commands.Connection.Open(virtual_host=vhost)),
    ))


@dataclass
class AccessRequestOk:
    """access.request-ok (class 30, method 11): gone from 0-9-1 and from pamqp, yet RabbitMQ
    and amqpd still answer an old client's access.request with it (ticket 1)."""

    ticket: int
    name = "Access.RequestOk"


@dataclass
class RawContentHeader:
    """A content header whose property bytes pamqp cannot decode as text.

    The broker passes a publisher's property bytes through unchanged (DESIGN.md: decoded
    lazily, only when something needs them), as RabbitMQ does, so a header table key or
    short string that is not UTF-8 reaches the consumer as it was sent. pamqp decodes
    every short string as UTF-8 and refuses such a frame; the test client keeps it raw,
    with the fields a test checks, instead of failing on the broker's faithful copy.
    """

    class_id: int
    body_size: int
    properties: bytes
    name = "ContentHeader(raw)"


FRAME_HEADER = 2


def _raw_content_header(buf: bytes, size: int) -> RawContentHeader:
    class_id, _weight, body_size = struct.unpack_from(">HHQ", buf, 7)
    return RawContentHeader(class_id, body_size, bytes(buf[7 + 12:7 + size]))


def _undecodable_text(error: exceptions.UnmarshalingException) -> bool:
    """True when pamqp refused a frame only for text that is not UTF-8."""
    return isinstance(error.__cause__, UnicodeDecodeError)


ACCESS_REQUEST_OK_PREFIX = b"\x01"  # a method frame; class 30, method 11 follow the header


def _access_request_ok(buf: bytes, size: int) -> AccessRequestOk | None:
    """The frame at the start of ``buf`` decoded as access.request-ok, if it is one."""
    if buf[:1] != ACCESS_REQUEST_OK_PREFIX or size != 6 or buf[7 + size] != 0xCE:
        return None
    class_id, method_id, ticket = struct.unpack_from(">HHH", buf, 7)
    if (class_id, method_id) != (30, 11):
        return None
    return AccessRequestOk(ticket)


class ClientCodec:
    """Splits server bytes into :class:`Out` frames; a bare protocol header is kept apart."""

    def __init__(self) -> None:
        self.buf = b""
        self.protocol_header: bytes | None = None

    def feed(self, data: bytes) -> list[Out]:
        self.buf += data
        out: list[Out] = []
        if self.buf.startswith(b"AMQP") and len(self.buf) >= 8:
            self.protocol_header, self.buf = self.buf[:8], self.buf[8:]
        while len(self.buf) >= 8:
            size = struct.unpack_from(">I", self.buf, 3)[0]
            if len(self.buf) < size + 8:
                break
            access_ok = _access_request_ok(self.buf, size)
            if access_ok is not None:
                channel = struct.unpack_from(">H", self.buf, 1)[0]
                self.buf = self.buf[size + 8:]
                out.append(Out(channel, access_ok))
                continue
            value: Any
            try:
                used, channel, value = frame.unmarshal(self.buf)  # raises on a malformed frame
            except exceptions.UnmarshalingException as error:
                if self.buf[0] != FRAME_HEADER or not _undecodable_text(error):
                    raise
                channel = struct.unpack_from(">H", self.buf, 1)[0]
                used, value = size + 8, _raw_content_header(self.buf, size)
            self.buf = self.buf[used:]
            out.append(Out(channel, value))
        return out


class RawClosed(Exception):
    """The server closed the socket."""


class RawSocket:
    """A real socket with a deadline on every read; nothing is retried or hidden."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.codec = ClientCodec()
        self.pending: list[Out] = []
        self.timeout = timeout
        self.closed = False

    def send(self, *chunks: bytes) -> None:
        self.sock.sendall(b"".join(chunks))

    def _read(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("nothing arrived before the deadline")
        self.sock.settimeout(remaining)
        data = self.sock.recv(65536)
        if not data:
            self.closed = True
            raise RawClosed()
        self.pending.extend(self.codec.feed(data))

    def next(self, timeout: float | None = None, skip_heartbeats: bool = True) -> Out:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            while self.pending:
                item = self.pending.pop(0)
                if skip_heartbeats and isinstance(item.value, heartbeat.Heartbeat):
                    continue
                return item
            self._read(deadline)

    def expect(self, cls: type, timeout: float | None = None) -> Any:
        item = self.next(timeout)
        assert isinstance(item.value, cls), f"expected {cls.__name__}, got {item.value!r}"
        return item.value

    def wait_closed(self, timeout: float | None = None) -> list[Out]:
        """Read until the server closes the socket; return what arrived meanwhile."""
        deadline = time.monotonic() + (timeout or self.timeout)
        seen: list[Out] = []
        while True:
            seen.extend(self.pending)
            self.pending.clear()
            try:
                self._read(deadline)
            except (RawClosed, ConnectionResetError):
                seen.extend(self.pending)
                self.pending.clear()
                return seen

    def open(self, vhost: str = "/", **kwargs: Any) -> None:
        """Full handshake; returns once connection.open-ok arrived."""
        self.send(handshake(vhost, **kwargs))
        self.expect(commands.Connection.Start)
        self.expect(commands.Connection.Tune)
        self.expect(commands.Connection.OpenOk)

    def open_channel(self, channel: int = 1) -> None:
        self.send(method(channel, commands.Channel.Open()))
        item = self.next()
        assert isinstance(item.value, commands.Channel.OpenOk), item
        assert item.channel == channel

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
