"""The raw-frame client's reader, against a scripted loopback peer (no broker needed)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from pamqp import commands as C

from conformance.rawclient import (
    PROTOCOL_HEADER,
    RawClient,
    RawClosed,
    RawTimeout,
    marshal_body,
    marshal_header,
    marshal_method,
    raw_frame,
)


@pytest.fixture
def peer() -> Iterator[tuple[RawClient, socket.socket]]:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    accepted: list[socket.socket] = []
    t = threading.Thread(target=lambda: accepted.append(srv.accept()[0]))
    t.start()
    rc = RawClient("127.0.0.1", port, timeout=1.0)
    t.join(2)
    yield rc, accepted[0]
    rc.close()
    accepted[0].close()
    srv.close()


def test_reads_a_method_frame_split_across_writes(peer: tuple[RawClient, socket.socket]) -> None:
    rc, s = peer
    data = marshal_method(C.Channel.OpenOk(), 3)

    def dribble() -> None:
        for i in range(len(data)):
            s.sendall(data[i:i + 1])
            time.sleep(0.001)

    threading.Thread(target=dribble).start()
    f = rc.read_frame()
    assert (f.type, f.channel, type(f.value)) == (1, 3, C.Channel.OpenOk)


def test_reads_header_and_body_frames(peer: tuple[RawClient, socket.socket]) -> None:
    rc, s = peer
    s.sendall(marshal_header(1, 5) + marshal_body(1, b"hello"))
    assert rc.read_frame().value.body_size == 5
    assert rc.read_frame().payload == b"hello"


def test_protocol_header_is_returned_raw(peer: tuple[RawClient, socket.socket]) -> None:
    rc, s = peer
    s.sendall(PROTOCOL_HEADER)
    assert rc.read_frame().payload == PROTOCOL_HEADER


def test_bad_frame_end_from_the_broker_is_an_assertion(
        peer: tuple[RawClient, socket.socket]) -> None:
    rc, s = peer
    s.sendall(raw_frame(1, 0, b"\x00\x14\x00\x0b", end=0x00))
    with pytest.raises(AssertionError, match="frame-end"):
        rc.read_frame()


def test_silence_is_a_timeout_and_eof_is_closed(peer: tuple[RawClient, socket.socket]) -> None:
    rc, s = peer
    with pytest.raises(RawTimeout):
        rc.read_frame(timeout=0.2)
    seen: list[str] = []
    rc.observer = seen.append
    s.close()
    with pytest.raises(RawClosed):
        rc.read_frame(timeout=1)
    assert seen and "closed" in seen[0]


def test_expect_close_answers_with_close_ok(peer: tuple[RawClient, socket.socket]) -> None:
    rc, s = peer
    s.sendall(marshal_method(C.Connection.Close(reply_code=501, reply_text="FRAME_ERROR",
                                                class_id=0, method_id=0), 0))
    close = rc.expect_close()
    assert close is not None and close.reply_code == 501
    s.settimeout(1)
    assert s.recv(64) == marshal_method(C.Connection.CloseOk(), 0)
