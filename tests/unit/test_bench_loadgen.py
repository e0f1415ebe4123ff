"""bench/loadgen.py's consumer loop, against a socket pair standing for the broker."""

from __future__ import annotations

import socket
import threading
import time

from pamqp import commands, frame, header

from bench.loadgen import (
    BODY,
    CLS_METH,
    HDR,
    RECV_SIZE,
    U64,
    ConsumerResult,
    ConsumerSpec,
    _ConsumerConn,
    run_consumers,
)


def _delivery(tag: int, seq: int) -> bytes:
    """A basic.deliver of consumer 'q', its content header and a 16-byte body carrying
    publisher 1's sequence number ``seq``."""
    body = BODY.pack(1, 0, seq, time.monotonic_ns())
    return (frame.marshal(commands.Basic.Deliver(consumer_tag="q", delivery_tag=tag,
                                                 exchange="", routing_key="q"), 1)
            + frame.marshal(header.ContentHeader(0, len(body)), 1)
            + HDR.pack(3, 1, len(body)) + body + b"\xce")


def _conn(sock: socket.socket, leftover: bytes) -> _ConsumerConn:
    """A consumer connection as ``_ConsumerConn`` leaves it after its set-up, with
    ``leftover`` read past consume-ok (no broker handshake: the socket pair is it)."""
    cc = _ConsumerConn.__new__(_ConsumerConn)
    cc.spec = ConsumerSpec(queues=["q"], prefetch=3, ack_every=1)
    cc.conn = type("FakeConn", (), {"close": lambda self: None})()
    cc.sock = sock
    cc.buf = bytearray(RECV_SIZE * 2)
    cc.view = memoryview(cc.buf)
    cc.buf[:len(leftover)] = leftover
    cc.end = len(leftover)
    cc.ack_every = 1
    cc.unacked = 0
    cc.last_tag = 0
    cc.done_tag = 0
    cc.ctag = b""
    cc.body_left = 0
    cc.need_header = False
    cc.ack_frame = bytearray(HDR.pack(1, 1, 13) + CLS_METH.pack(60, 80) + U64.pack(0)
                             + b"\x01" + b"\xce")
    cc.first_body = True
    cc.leftover = bytearray(leftover)
    return cc


def test_deliveries_read_with_consume_ok_are_counted_and_acked() -> None:
    """A broker that sends consume-ok and the whole prefetch in one write leaves those
    deliveries in the set-up's buffer: the loop counts and acks them at once, although
    nothing more arrives (before, it waited for the socket, which stayed quiet because
    the prefetch was spent: ci88's cluster failure, 0 of 2,000 received)."""
    ours, broker = socket.socketpair()
    try:
        leftover = b"".join(_delivery(tag, tag) for tag in (1, 2, 3))
        cc = _conn(ours, leftover)
        stop = threading.Event()
        progress = [0]
        out: dict[str, ConsumerResult] = {}
        t = threading.Thread(target=lambda: out.setdefault("res", run_consumers(
            "", [cc.spec], stop, progress, conns=[cc])))
        t.start()
        deadline = time.monotonic() + 5
        while progress[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        broker.settimeout(5)
        ack = broker.recv(64)  # the broker's side: the ack the loop sends when idle
        stop.set()
        t.join(5)
        assert not t.is_alive()
        res = out["res"]
        assert (res.received, res.gaps, res.disorder, res.error) == (3, 0, 0, None)
        assert ack[7:11] == CLS_METH.pack(60, 80) and U64.unpack_from(ack, 11)[0] == 3
    finally:
        ours.close()
        broker.close()
