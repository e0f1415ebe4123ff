"""Publisher confirms go out coalesced without ever acking a tag twice."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

from amqpd.broker.channel import Channel


class FakeConn:
    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []

    def write(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            _t, _ch, size = struct.unpack_from(">BHI", data, pos)
            payload = data[pos + 7 : pos + 7 + size]
            cls, meth = struct.unpack_from(">HH", payload, 0)
            tag = struct.unpack_from(">Q", payload, 4)[0]
            bits = payload[12]
            assert cls == 60 and meth in (80, 120)
            self.frames.append(("ack" if meth == 80 else "nack", tag, bool(bits & 1)))
            pos += size + 8


def make_channel() -> tuple[Channel, FakeConn]:
    conn = FakeConn()
    session: Any = SimpleNamespace(conn=conn, broker=SimpleNamespace(_loop=None),
                                   vhost=None)
    ch = Channel(session, 1)
    ch._acks = []
    return ch, conn


def confirmed(frames: list[tuple[str, int, bool]], upto: int) -> dict[int, str]:
    """What a client concludes: each tag's outcome; a second outcome is an error."""
    out: dict[int, str] = {}
    for kind, tag, multiple in frames:
        tags = [t for t in range(1, tag + 1) if t not in out] if multiple else [tag]
        for t in tags:
            assert t not in out, f"tag {t} confirmed twice"
            out[t] = kind
    assert sorted(out) == list(range(1, upto + 1))
    return out


def test_in_order_confirms_coalesce_into_one_multiple_ack() -> None:
    ch, conn = make_channel()
    # a loop that never runs the scheduled flush: the test flushes, like the tick's end
    ch.session.broker._loop = SimpleNamespace(call_soon=lambda f: None)
    for seq in (1, 2, 3, 4):
        ch.confirm(seq, True)
    ch._flush_acks()
    assert conn.frames == [("ack", 4, True)]
    confirmed(conn.frames, 4)


def test_out_of_order_and_nacks_never_double_confirm() -> None:
    ch, conn = make_channel()
    ch.session.broker._loop = SimpleNamespace(call_soon=lambda f: None)
    # 3 and 4 confirm first (transient), 1-2 wait for a commit, 5 is nacked, then 6-8
    for seq in (3, 4):
        ch.confirm(seq, True)
    ch._flush_acks()
    ch.confirm(5, False)
    for seq in (1, 2, 6, 7, 8):
        ch.confirm(seq, True)
    ch._flush_acks()
    outcome = confirmed(conn.frames, 8)
    assert outcome[5] == "nack"
    assert all(outcome[t] == "ack" for t in (1, 2, 3, 4, 6, 7, 8))
    # after the gap closed, later confirms coalesce again
    for seq in (9, 10, 11):
        ch.confirm(seq, True)
    ch._flush_acks()
    assert conn.frames[-1] == ("ack", 11, True)
    confirmed(conn.frames, 11)
