"""Heartbeat datagrams: authenticated by the cookie, bound to the cluster's name."""

from __future__ import annotations

from amqpd.cluster.heartbeat import decode, encode


def test_round_trip() -> None:
    assert decode(b"k", "c1", encode(b"k", "c1", "node-a", 7)) == "node-a"


def test_refused_datagrams() -> None:
    good = encode(b"k", "c1", "node-a", 1)
    assert decode(b"other", "c1", good) is None  # another cookie
    assert decode(b"k", "c2", good) is None  # another cluster
    assert decode(b"k", "c1", good[:-1] + bytes([good[-1] ^ 1])) is None  # tampered tag
    assert decode(b"k", "c1", good.replace(b"node-a", b"node-b")) is None  # tampered body
    assert decode(b"k", "c1", b"") is None
    assert decode(b"k", "c1", b"\n" + b"x" * 32) is None
