"""A small, strict raw-frame AMQP 0-9-1 client for the cases a real client refuses to do.

It speaks through a plain socket: pamqp builds the frames, and its own reader splits
the byte stream into frames (7-byte header, payload, frame-end octet) with a deadline,
so that "the broker said nothing" and "the broker closed the socket" are answers a case
can assert on. Nothing here retries or hides what the broker sent.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header, heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE


class RawTimeout(Exception):
    """Nothing (or not enough) arrived before the deadline."""


class RawClosed(Exception):
    """The broker closed the TCP connection."""


@dataclass
class RawFrame:
    type: int
    channel: int
    payload: bytes
    value: Any = None  # pamqp object for method/header/body/heartbeat frames

    @property
    def name(self) -> str:
        if self.value is None:
            return f"frame-type-{self.type}"
        return getattr(self.value, "name", type(self.value).__name__)

    def __repr__(self) -> str:
        return f"RawFrame({self.name} ch={self.channel} {self.value!r})"


def marshal_method(method: Any, channel: int = 0) -> bytes:
    return frame.marshal(method, channel)


def marshal_header(channel: int, body_size: int,
                   properties: commands.Basic.Properties | None = None,
                   class_id: int = 60) -> bytes:
    props = properties or commands.Basic.Properties()
    return frame.marshal(header.ContentHeader(class_id, body_size, props), channel)


def marshal_body(channel: int, data: bytes) -> bytes:
    return frame.marshal(pbody.ContentBody(data), channel)


def raw_frame(ftype: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    """Any frame, including malformed ones."""
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


class RawClient:
    """One TCP connection; the caller decides what goes on the wire."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout)
        self.buf = b""
        self.timeout = timeout
        self.frame_max = 131072
        self.channel_max = 2047
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None
        # Told about every close the broker sends and about EOF (for the report).
        self.observer: Callable[[str], None] | None = None

    def _observe(self, what: str) -> None:
        if self.observer is not None:
            self.observer(what)

    # -- bytes --------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, method: Any, channel: int = 0) -> None:
        self.send(marshal_method(method, channel))

    def publish(self, channel: int, exchange: str, routing_key: str, data: bytes,
                properties: commands.Basic.Properties | None = None,
                mandatory: bool = False) -> None:
        out = [marshal_method(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                     mandatory=mandatory), channel),
               marshal_header(channel, len(data), properties)]
        step = self.frame_max - 8
        out.extend(marshal_body(channel, data[i:i + step]) for i in range(0, len(data), step))
        self.send(b"".join(out))

    def _fill(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RawTimeout(f"waited for {n} bytes, have {len(self.buf)}")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise RawTimeout(f"waited for {n} bytes, have {len(self.buf)}")
            except ConnectionResetError:
                self._observe("TCP reset by broker (no close frame)")
                raise RawClosed("connection reset by broker")
            if not chunk:
                self._observe("socket closed by broker (no close frame)")
                raise RawClosed(f"broker closed the socket ({len(self.buf)} bytes unread)")
            self.buf += chunk

    def read_bytes(self, n: int, timeout: float | None = None) -> bytes:
        self._fill(n, time.monotonic() + (self.timeout if timeout is None else timeout))
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_frame(self, timeout: float | None = None) -> RawFrame:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._fill(7, deadline)
        if self.buf.startswith(b"AMQP"):
            self._fill(8, deadline)
            data, self.buf = self.buf[:8], self.buf[8:]
            return RawFrame(-1, 0, data)
        ftype, channel, size = struct.unpack_from(">BHI", self.buf)
        self._fill(7 + size + 1, deadline)
        raw = self.buf[:8 + size]
        self.buf = self.buf[8 + size:]
        if raw[-1] != FRAME_END:
            raise AssertionError(f"broker sent a bad frame-end octet {raw[-1]:#x}")
        value: Any = None
        if ftype in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            _, _, value = frame.unmarshal(raw)
        elif ftype == FRAME_HEARTBEAT:
            value = heartbeat.Heartbeat()
        if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
            self._observe(f"{value.name} {value.reply_code} {value.reply_text!r} "
                          f"(class {value.class_id}, method {value.method_id})")
        return RawFrame(ftype, channel, raw[7:-1], value)

    def read_until(self, kinds: tuple[type, ...], timeout: float | None = None,
                   skip_heartbeats: bool = True) -> RawFrame:
        """Next frame whose value is one of *kinds*; heartbeats are skipped."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if skip_heartbeats and f.type == FRAME_HEARTBEAT:
                continue
            if isinstance(f.value, kinds):
                return f
            raise AssertionError(f"expected {[k.__name__ for k in kinds]}, got {f!r}")

    def expect_close(self, timeout: float | None = None) -> commands.Connection.Close | None:
        """Read until a connection.close (answered with close-ok) or EOF (returns None)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                f = self.read_frame(max(0.0, deadline - time.monotonic()))
            except RawClosed:
                return None
            if isinstance(f.value, commands.Connection.Close):
                try:
                    self.send_method(commands.Connection.CloseOk())
                except OSError:
                    pass
                return f.value

    def wait_eof(self, timeout: float) -> bool:
        """True if the broker closes the socket within *timeout* (frames are discarded)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.read_frame(max(0.0, deadline - time.monotonic()))
            except RawClosed:
                return True
            except RawTimeout:
                return False

    # -- handshake ----------------------------------------------------------------
    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                  frame_max: int | None = None, channel_max: int | None = None,
                  heartbeat: int = 0, mechanism: str = "PLAIN",
                  response: bytes | None = None, open_vhost: bool = True,
                  capabilities: dict[str, Any] | None = None) -> None:
        self.send(PROTOCOL_HEADER)
        start = self.read_until((commands.Connection.Start,)).value
        self.start = start
        self.server_properties = dict(start.server_properties or {})
        caps = {"authentication_failure_close": True, "basic.nack": True,
                "publisher_confirms": True, "consumer_cancel_notify": True,
                "connection.blocked": True}
        caps.update(capabilities or {})
        if response is None:
            response = f"\0{user}\0{password}".encode()
        client_props: Any = {"product": "amqpd-conformance-raw", "capabilities": caps}
        self.send_method(commands.Connection.StartOk(
            client_properties=client_props,
            mechanism=mechanism, response=response.decode("latin-1"), locale="en_US"))
        f = self.read_until((commands.Connection.Tune, commands.Connection.Close))
        if isinstance(f.value, commands.Connection.Close):
            raise RawConnectionClosed(f.value)
        tune = f.value
        self.tune = tune
        self.frame_max = frame_max if frame_max is not None else tune.frame_max
        self.channel_max = channel_max if channel_max is not None else tune.channel_max
        self.heartbeat = heartbeat
        self.send_method(commands.Connection.TuneOk(channel_max=self.channel_max,
                                                    frame_max=self.frame_max,
                                                    heartbeat=heartbeat))
        if open_vhost:
            self.send_method(commands.Connection.Open(virtual_host=vhost))
            f = self.read_until((commands.Connection.OpenOk, commands.Connection.Close))
            if isinstance(f.value, commands.Connection.Close):
                raise RawConnectionClosed(f.value)

    def open_channel(self, channel: int = 1) -> None:
        self.send_method(commands.Channel.Open(), channel)
        f = self.read_until((commands.Channel.OpenOk, commands.Connection.Close,
                             commands.Channel.Close))
        if not isinstance(f.value, commands.Channel.OpenOk):
            raise AssertionError(f"expected channel.open-ok, got {f!r}")

    def rpc(self, method: Any, channel: int, reply: tuple[type, ...],
            timeout: float | None = None) -> Any:
        """Send a method; return the first reply among *reply* or a close (returned too)."""
        self.send_method(method, channel)
        kinds = (*reply, commands.Connection.Close, commands.Channel.Close)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if isinstance(f.value, kinds):
                return f.value

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawConnectionClosed(Exception):
    def __init__(self, close: commands.Connection.Close) -> None:
        super().__init__(f"{close.reply_code} {close.reply_text}")
        self.close = close
