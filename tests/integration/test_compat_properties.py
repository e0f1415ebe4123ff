"""Any well-formed content property a client can encode is carried through untouched.

Go's amqp091 client fuzzed with ``testing/quick`` publishes any 64-bit timestamp, any
priority byte, arbitrary strings and header tables of every field type;
RabbitMQ carries them through byte for byte, and amqpd once closed the connection with
541 (a ValueError while decoding a timestamp it needed no part of). Hypothesis builds the
property bytes itself (pamqp could not encode most of these) and checks that basic.get
returns exactly the bytes that were published, on amqpd and on a private RabbitMQ 3.10.

Left out, because RabbitMQ refuses them by design: a delivery mode other than 1 or 2
(406 ``{delivery_mode_unknown,N}``, a conformance case), an ``expiration`` (it must be a
number, and would expire the message), a ``user-id`` other than the login, ``CC``/``BCC``
headers (routing, stripped), and NaN or infinite floats (RabbitMQ's table parser cannot
take them: connection.close 541).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from tests.support import wire
from tests.support.targets import both_brokers

__all__ = ["both_brokers"]  # the fixture, imported for pytest

# content property flag bits, in wire order (AMQP 0-9-1 basic class)
FIELDS = (
    ("content_type", 15, "shortstr"), ("content_encoding", 14, "shortstr"),
    ("headers", 13, "table"), ("delivery_mode", 12, "octet"), ("priority", 11, "octet"),
    ("correlation_id", 10, "shortstr"), ("reply_to", 9, "shortstr"),
    ("message_id", 7, "shortstr"), ("timestamp", 6, "timestamp"), ("type", 5, "shortstr"),
    ("app_id", 3, "shortstr"), ("cluster_id", 2, "shortstr"),
)


def _shortstr(data: bytes) -> bytes:
    return bytes((len(data),)) + data


def _sized(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


short_bytes = st.binary(max_size=40)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
finite64 = st.floats(allow_nan=False, allow_infinity=False)

scalar_values = st.one_of(
    st.sampled_from([b"t\x00", b"t\x01", b"V"]),
    st.integers(-(2**7), 2**7 - 1).map(lambda v: b"b" + struct.pack(">b", v)),
    st.integers(0, 2**8 - 1).map(lambda v: b"B" + struct.pack(">B", v)),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: b"s" + struct.pack(">h", v)),
    st.integers(0, 2**16 - 1).map(lambda v: b"u" + struct.pack(">H", v)),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: b"I" + struct.pack(">i", v)),
    st.integers(0, 2**32 - 1).map(lambda v: b"i" + struct.pack(">I", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: b"l" + struct.pack(">q", v)),
    finite32.map(lambda v: b"f" + struct.pack(">f", v)),
    finite64.map(lambda v: b"d" + struct.pack(">d", v)),
    st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1)).map(
        lambda v: b"D" + struct.pack(">BI", *v)),
    st.binary(max_size=60).map(lambda v: b"S" + _sized(v)),
    st.binary(max_size=60).map(lambda v: b"x" + _sized(v)),
    st.integers(0, 2**64 - 1).map(lambda v: b"T" + struct.pack(">Q", v)),
)
header_keys = short_bytes.filter(lambda k: k not in (b"CC", b"BCC"))


def _table(items: list[tuple[bytes, bytes]]) -> bytes:
    return _sized(b"".join(_shortstr(k) + v for k, v in items))


field_values = st.recursive(
    scalar_values,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda vs: b"A" + _sized(b"".join(vs))),
        st.lists(st.tuples(header_keys, inner), max_size=4).map(lambda kv: b"F" + _table(kv)),
    ),
    max_leaves=8,
)
tables = st.lists(st.tuples(header_keys, field_values), max_size=6).map(_table)


@st.composite
def properties(draw: Callable[..., Any]) -> bytes:
    """Raw property bytes: flags, then each present field in order."""
    flags = 0
    parts: list[bytes] = []
    for name, bit, kind in FIELDS:
        if not draw(st.booleans()):
            continue
        flags |= 1 << bit
        if kind == "shortstr":
            parts.append(_shortstr(draw(short_bytes)))
        elif name == "delivery_mode":  # RabbitMQ refuses other values (406)
            parts.append(bytes((draw(st.sampled_from([1, 2])),)))
        elif kind == "octet":
            parts.append(bytes((draw(st.integers(0, 255)),)))
        elif kind == "timestamp":
            parts.append(struct.pack(">Q", draw(st.integers(0, 2**64 - 1))))
        else:
            parts.append(draw(tables))
    return struct.pack(">H", flags) + b"".join(parts)


class Peer:
    """One raw AMQP connection with a channel and an exclusive queue; frames are split
    but never decoded beyond the method, so what came back can be compared bytewise."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.sock.sendall(wire.PROTOCOL_HEADER)
        self._expect_method()  # start
        self.sock.sendall(wire.method(0, commands.Connection.StartOk(
            client_properties={"product": "amqpd-tests"}, mechanism="PLAIN",
            response="\0guest\0guest", locale="en_US")))
        self._expect_method()  # tune
        self.sock.sendall(wire.method(0, commands.Connection.TuneOk(
            channel_max=10, frame_max=131072, heartbeat=0))
            + wire.method(0, commands.Connection.Open(virtual_host="/"))
            + wire.method(1, commands.Channel.Open())
            + wire.method(1, commands.Queue.Declare(queue="", exclusive=True)))
        self._expect_method()  # open-ok
        self._expect_method()  # channel open-ok
        _, payload = self._expect_method()  # declare-ok
        self.queue = payload[5:5 + payload[4]].decode()

    def frame(self, timeout: float = 10) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                ftype, _channel, size = struct.unpack_from(">BHI", self.buf)
                if len(self.buf) >= 8 + size:
                    payload = self.buf[7:7 + size]
                    self.buf = self.buf[8 + size:]
                    if ftype == 8:
                        continue
                    return ftype, payload
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the broker")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            self.buf += chunk

    def _expect_method(self) -> tuple[int, bytes]:
        ftype, payload = self.frame()
        assert ftype == 1, f"expected a method frame, got type {ftype}"
        index = struct.unpack_from(">I", payload)[0]
        assert index not in (0x000A0032, 0x00140028), f"closed by the broker: {payload!r}"
        return index, payload

    def round_trip(self, props: bytes, body: bytes) -> bytes:
        """Publish with these property bytes, basic.get it back; the returned bytes."""
        header = struct.pack(">HHQ", 60, 0, len(body)) + props
        self.sock.sendall(
            wire.method(1, commands.Basic.Publish(exchange="", routing_key=self.queue))
            + wire.raw_frame(2, 1, header) + wire.raw_frame(3, 1, body)
            + wire.method(1, commands.Basic.Get(queue=self.queue, no_ack=True)))
        index, _ = self._expect_method()
        assert index == 0x003C0047, f"expected basic.get-ok, got method {index:#x}"
        ftype, got_header = self.frame()
        assert ftype == 2
        ftype, got_body = self.frame()
        assert (ftype, got_body) == (3, body)
        return got_header[12:]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def peer(both_brokers: int) -> Iterator[list[Peer]]:
    holder = [Peer(both_brokers)]
    yield holder
    holder[0].close()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(props=properties(), body=st.binary(min_size=1, max_size=64))
def test_any_well_formed_properties_are_carried_through(
        peer: list[Peer], both_brokers: int, props: bytes, body: bytes) -> None:
    try:
        got = peer[0].round_trip(props, body)
    except BaseException:
        peer[0].close()  # a fresh connection for the next example (and the shrinking)
        peer[0] = Peer(both_brokers)
        raise
    assert got == props


def test_extreme_timestamps_and_non_utf8_strings(both_brokers: int) -> None:
    """The cases that failed before, spelled out: the largest timestamp (past year 9999)
    with reply-to and user-id decoding forced, and non-UTF-8 short strings."""
    p = Peer(both_brokers)
    try:
        for props in (
            struct.pack(">H", 1 << 9 | 1 << 6 | 1 << 4) + _shortstr(b"reply-here")
            + struct.pack(">Q", 2**64 - 1) + _shortstr(b"guest"),
            struct.pack(">H", 1 << 15 | 1 << 13) + _shortstr(b"\xff\xfe")
            + _table([(b"\xc3(", b"T" + struct.pack(">Q", 2**63)), (b"k", b"S" + _sized(
                b"\x80"))]),
        ):
            assert p.round_trip(props, b"m") == props
    finally:
        p.close()
