"""The publish fast path reads method, header and body in place in the received bytes:
the same results as the frame-by-frame path, for every way the bytes can arrive, and
queued messages share the property bytes and names they have in common."""

from __future__ import annotations

from typing import Any

from pamqp import commands as C

from amqpd.protocol.connection import State
from tests.support import wire
from tests.unit.protocol.peer import Pair, last_close


class Recording:
    """A delegate that keeps the objects the connection hands over."""

    def __init__(self, pair: Pair) -> None:
        self.published: list[tuple[Any, ...]] = []
        orig = pair.delegate.on_publish

        def on_publish(channel: int, exchange: str, routing_key: str, mandatory: bool,
                       immediate: bool, properties: bytes, body: bytes) -> None:
            self.published.append((channel, exchange, routing_key, mandatory, properties, body))
            orig(channel, exchange, routing_key, mandatory, immediate, properties, body)

        pair.delegate.on_publish = on_publish  # type: ignore[method-assign]


def opened() -> tuple[Pair, Recording]:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.open_channel(2)
    return pair, Recording(pair)


def stream() -> tuple[bytes, list[tuple[Any, ...]]]:
    """Publishes on two channels, with an ack, a multi-frame body and an empty body."""
    parts, expected = [], []
    for n in range(20):
        ch = 1 + n % 2
        body = b"m%d" % n if n % 7 else b""
        parts.append(wire.publish(ch, "ex" if n % 3 else "", f"rk{n % 4}", body,
                                  mandatory=n % 5 == 0, frame_max=4096, content_type="t"))
        expected.append((ch, "ex" if n % 3 else "", f"rk{n % 4}", n % 5 == 0, body))
        if n == 10:
            parts.append(wire.method(1, C.Basic.Ack(delivery_tag=1)))
    big = bytes(range(256)) * 40  # three body frames at frame_max 4096
    parts.append(wire.publish(2, "", "big", big, frame_max=4096))
    expected.append((2, "", "big", False, big))
    return b"".join(parts), expected


def test_every_chunking_gives_the_same_publishes() -> None:
    data, expected = stream()
    for size in (len(data), 1, 2, 3, 7, 13, 64, 1000):
        pair, rec = opened()
        for i in range(0, len(data), size):
            pair.send(data[i:i + size])
        got = [(ch, ex, rk, mand, body) for ch, ex, rk, mand, _props, body in rec.published]
        assert got == expected, size
        assert pair.delegate.named("on_ack") == [("on_ack", 1, 1, False)]


def test_queued_messages_share_properties_and_names() -> None:
    pair, rec = opened()
    pair.send(b"".join(wire.publish(1, "ex", "key", b"x%d" % n, content_type="text/plain")
                       for n in range(3)))
    (_, ex0, rk0, _, p0, _), *rest = rec.published
    for _, ex, rk, _, props, _ in rest:
        assert props is p0 and ex is ex0 and rk is rk0
    assert p0 == wire.content(1, b"", content_type="text/plain")[19:-1]


def test_a_truncated_publish_method_in_a_triplet_is_502() -> None:
    pair, rec = opened()
    method = bytearray(wire.method(1, C.Basic.Publish(exchange="", routing_key="rk")))
    # the routing key's length octet now points past the end of the method frame
    method[7 + 4 + 2 + 1] = 200
    out = pair.send(bytes(method), wire.content(1, b"body"))
    assert last_close(out).reply_code == 502
    assert rec.published == []


def test_an_oversized_frame_after_publishes_closes_once_they_are_handled() -> None:
    pair, rec = opened()
    out = pair.send(wire.publish(1, "", "a", b"1"), wire.publish(1, "", "b", b"2"),
                    b"\x03\x00\x01\x7f\xff\xff\xff")  # only the header of a huge frame
    assert [p[2] for p in rec.published] == ["a", "b"]
    assert last_close(out).reply_code == 501
    assert pair.server.should_close_transport and pair.server.state is State.CLOSING


def test_slices_are_worked_off_in_order() -> None:
    pair, rec = opened()
    data = b"".join(wire.publish(1, "", "q", b"%d" % n) for n in range(250))
    pair.server.in_flow = True  # small slices: FLOW_FRAME_BUDGET frames at a time
    pair.server.receive_data(data)
    assert pair.server.has_pending and 0 < len(rec.published) < 250
    rounds = 0
    while pair.server.process_pending() and rounds < 100:
        rounds += 1
    assert not pair.server.has_pending
    assert [p[5] for p in rec.published] == [b"%d" % n for n in range(250)]


def test_a_publish_like_the_one_before_reuses_it_and_a_different_one_does_not() -> None:
    # the fast path reuses the previous publish's properties and decoded method when
    # their bytes are equal: runs of equal publishes, interrupted by different ones
    shapes = [("", "a", False, "t"), ("", "a", False, "t"), ("ex", "a", False, "t"),
              ("ex", "a", True, "t"), ("ex", "a", True, "u"), ("", "b", False, "u"),
              ("", "a", False, "t"), ("", "a", False, "t")]
    pair, rec = opened()
    pair.server.receive_data(b"".join(
        wire.publish(1, ex, rk, b"m%d" % n, mandatory=mandatory, content_type=ct)
        for n, (ex, rk, mandatory, ct) in enumerate(shapes)))
    assert [(ex, rk, mandatory, body) for _, ex, rk, mandatory, _, body in rec.published] == [
        (ex, rk, mandatory, b"m%d" % n) for n, (ex, rk, mandatory, _) in enumerate(shapes)]
    props = [p for _, _, _, _, p, _ in rec.published]
    assert [p == props[0] for p in props] == [ct == "t" for _, _, _, ct in shapes]
    assert all(p is props[0] for p in props if p == props[0])  # one shared copy
