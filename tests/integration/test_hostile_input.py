"""Hostile input over raw sockets against a live broker: each case gets its close code,
and the broker goes on serving another client (a pika publish + get after each).

Recorded against RabbitMQ 3.10.8 with the same bytes, for comparison:

* oversize frame: both 501 FRAME_ERROR (amqpd names size and frame_max);
* a 200-deep nested field table and an 8,000-entry table: both accept;
* a 5,000-deep nested table: RabbitMQ accepts, amqpd refuses with 501 (decoding it
  would exhaust the interpreter's stack; refusing is the safe answer);
* invalid UTF-8 in a queue name (shortstr): both 501 "Malformed UTF-8 in shortstr";
  in a table key RabbitMQ accepts, amqpd 501;
* unknown field type ('Z'): RabbitMQ drops the socket without a close, amqpd sends 501;
* a table length running past the frame: both 501;
* a slow handshake: the connection is dropped after ``handshake_timeout`` (RabbitMQ's
  10 s by default; 2 s here to keep the test short).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands as C

from tests.support import wire
from tests.support.brokerproc import BrokerProcess
from tests.support.wire import RawClosed, RawSocket


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("hostile"),
                         env={"AMQPD_HANDSHAKE_TIMEOUT": "2"}).start()
    yield proc
    proc.stop()


def still_serving(proc: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(proc.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"still here")
        _m, _p, body = ch.basic_get(q, auto_ack=True)
        assert body == b"still here"
    finally:
        conn.close()


def _table(entries: bytes) -> bytes:
    return struct.pack(">I", len(entries)) + entries


def _sstr(raw: bytes) -> bytes:
    return bytes([len(raw)]) + raw


def _declare(queue: bytes, arguments: bytes) -> bytes:
    payload = struct.pack(">HHH", 50, 10, 0) + _sstr(queue) + b"\x00" + arguments
    return wire.raw_frame(1, 1, payload)


def _nested(depth: int) -> bytes:
    table = _table(b"")
    for _ in range(depth):
        table = _table(_sstr(b"k") + b"F" + table)
    return table


def _answer(proc: BrokerProcess, frames: bytes, frame_max: int = 131072) -> object:
    raw = RawSocket(proc.port, timeout=10)
    try:
        raw.open(frame_max=frame_max, channel_max=10)
        raw.open_channel(1)
        raw.send(frames)
        return raw.next(timeout=10).value
    finally:
        raw.close()


CASES = {
    "oversize frame": (wire.raw_frame(1, 1, b"\x00" * 5000), 4096, 501,
                       "FRAME_ERROR - frame size 5008 exceeds negotiated frame_max 4096"),
    "deeply nested table": (_declare(b"h.deep", _nested(5000)), 131072, 501,
                            "FRAME_ERROR - cannot decode Declare arguments"),
    "invalid UTF-8 in a shortstr": (_declare(b"\xff\xfeq", _table(b"")), 131072, 501,
                                    "FRAME_ERROR - Malformed UTF-8 in shortstr"),
    "invalid UTF-8 in a table key": (
        _declare(b"h.key", _table(_sstr(b"\xff") + b"I" + struct.pack(">i", 1))), 131072,
        501, "FRAME_ERROR - Malformed UTF-8 in shortstr"),
    "unknown field type": (_declare(b"h.type", _table(_sstr(b"k") + b"Z\x00\x00")), 131072,
                           501, "FRAME_ERROR - cannot decode Declare arguments: Unknown type"),
    "table length past the frame": (_declare(b"h.len", struct.pack(">I", 1000) + _sstr(b"k")),
                                    131072, 501,
                                    "FRAME_ERROR - cannot decode Declare arguments"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_frames_get_their_close_code(hostile: BrokerProcess, case: str) -> None:
    frames, frame_max, code, text = CASES[case]
    answer = _answer(hostile, frames, frame_max)
    assert isinstance(answer, C.Connection.Close), answer
    assert answer.reply_code == code
    assert answer.reply_text.startswith(text), answer.reply_text
    still_serving(hostile)


@pytest.mark.parametrize("case", ["nested 200 deep", "8000 entries"])
def test_big_but_legal_tables_are_accepted(hostile: BrokerProcess, case: str) -> None:
    if case == "nested 200 deep":
        args = _nested(200)
    else:
        args = _table(b"".join(_sstr(b"k%d" % i) + b"I" + struct.pack(">i", i)
                               for i in range(8000)))
    answer = _answer(hostile, _declare(b"h.big." + case[:6].encode(), args))
    assert isinstance(answer, C.Queue.DeclareOk), answer
    still_serving(hostile)


def test_a_frame_trickled_one_byte_at_a_time(hostile: BrokerProcess) -> None:
    raw = RawSocket(hostile.port, timeout=10)
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        raw.open(channel_max=10)
        raw.open_channel(1)
        data = (wire.method(1, C.Queue.Declare(queue="h.trickle", exclusive=True))
                + wire.publish(1, "", "h.trickle", b"drip" * 50)
                + wire.method(1, C.Basic.Get(queue="h.trickle", no_ack=True)))
        for i in range(len(data)):
            raw.send(data[i:i + 1])
            time.sleep(0.0005)  # pacing, so the broker really sees single bytes
        assert isinstance(raw.next().value, C.Queue.DeclareOk)
        assert isinstance(raw.next().value, C.Basic.GetOk)
    finally:
        raw.close()
    still_serving(hostile)


@pytest.mark.parametrize("send", [b"", wire.PROTOCOL_HEADER])
def test_a_slow_handshake_is_dropped(hostile: BrokerProcess, send: bytes) -> None:
    raw = RawSocket(hostile.port, timeout=15)
    try:
        if send:
            raw.send(send)
            assert isinstance(raw.next().value, C.Connection.Start)
        still_serving(hostile)  # others are served while it dawdles
        with pytest.raises((RawClosed, ConnectionResetError)):
            raw.next(timeout=15)
    finally:
        raw.close()


def test_the_default_handshake_timeout_is_rabbitmqs(tmp_path: Path) -> None:
    from amqpd.config import load_settings

    assert load_settings(environ={}).handshake_timeout == 10.0
