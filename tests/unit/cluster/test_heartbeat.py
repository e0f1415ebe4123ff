"""Heartbeat datagrams: authenticated by the cookie, bound to the cluster's name."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amqpd.cluster.heartbeat import TAG_SIZE, decode, encode


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


def test_tag_holding_a_newline_decodes() -> None:
    """Sequence 1 under cookie b"k" has a newline inside its tag: main dropped it."""
    packets = [encode(b"k", "c", "n", seq) for seq in range(200)]
    assert any(b"\n" in p[-TAG_SIZE:] for p in packets)
    assert all(decode(b"k", "c", p) == "n" for p in packets)


_names = st.text(min_size=1, max_size=40)
_keys = st.binary(min_size=1, max_size=64)
_seqs = st.integers(min_value=0, max_value=2**63)


@settings(max_examples=300, deadline=None)
@given(cookie=_keys, cluster=_names, node=_names, seq=_seqs)
def test_every_valid_heartbeat_decodes(cookie: bytes, cluster: str, node: str, seq: int) -> None:
    assert decode(cookie, cluster, encode(cookie, cluster, node, seq)) == node


@settings(max_examples=300, deadline=None)
@given(cookie=_keys, cluster=_names, node=_names, seq=_seqs, data=st.data())
def test_tampered_heartbeats_do_not_decode(cookie: bytes, cluster: str, node: str, seq: int,
                                           data: st.DataObject) -> None:
    good = encode(cookie, cluster, node, seq)
    index = data.draw(st.integers(min_value=0, max_value=len(good) - 1), label="byte")
    flip = data.draw(st.integers(min_value=1, max_value=255), label="xor")
    tampered = good[:index] + bytes([good[index] ^ flip]) + good[index + 1:]
    assert decode(cookie, cluster, tampered) is None
    cut = data.draw(st.integers(min_value=0, max_value=len(good) - 1), label="cut")
    assert decode(cookie, cluster, good[:cut]) is None  # truncated
    assert decode(cookie, cluster, good + b"x") is None  # trailing garbage
    # HMAC pads a short key with zero bytes, so b"k" and b"k\0" are one key
    other = data.draw(_keys.filter(lambda k: k.rstrip(b"\0") != cookie.rstrip(b"\0")),
                      label="other cookie")
    assert decode(other, cluster, good) is None
