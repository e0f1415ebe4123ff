"""The link's frame format and cookie proofs (amqpd.cluster.link_wire), no sockets."""

from __future__ import annotations

import struct

import pytest

from amqpd.cluster import link_wire as W


def test_every_layout_round_trips_split_anywhere() -> None:
    samples = {"I": 7, "Q": 2**40 + 3, "B": 1, "s": "vh/é", "b": b"\x00body\xff",
               "j": {"x-max-length": 5, "a": [1, "b"]}, "L": [1, 2**63, 5]}
    frames = []
    for kind, layout in sorted(W.LAYOUTS.items()):
        fields = [samples[c] for c in layout]
        frames.append((kind, 9, fields))
    data = b"".join(W.encode(k, s, *f) for k, s, f in frames)
    for cut in (1, 3, 17, len(data) // 2):
        reader = W.FrameReader()
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert got == frames


def test_wrong_field_count_is_refused_on_encode() -> None:
    with pytest.raises(ValueError):
        W.encode(W.CONFIRM, 1, 5)


def _frame(kind: int, body: bytes, length: int | None = None) -> bytes:
    return struct.pack(">IBI", len(body) + 5 if length is None else length, kind, 1) + body


@pytest.mark.parametrize("raw", [
    _frame(W.CONFIRM, b"\x00" * 8),  # its u8 field missing
    _frame(W.CREDIT, b"\x00" * 5),  # a byte too many
    _frame(99, b""),  # unknown type
    _frame(W.CREDIT, b"", length=2),  # length below the head
    _frame(W.OPEN, b"\x00\x0aab" + b"\x00\x00"),  # a string longer than the frame
    _frame(W.OPEN, b"\x00\x02\xff\xfe\x00\x00"),  # not UTF-8
])
def test_malformed_frames_raise_wire_error(raw: bytes) -> None:
    with pytest.raises(W.WireError):
        W.FrameReader().feed(raw)


def test_proofs_bind_role_names_and_nonces() -> None:
    base = W.proof(b"cookie", "client", "a", "b", b"n1", b"n2")
    assert W.proof_ok(base, W.proof(b"cookie", "client", "a", "b", b"n1", b"n2"))
    for other in (W.proof(b"cookie2", "client", "a", "b", b"n1", b"n2"),
                  W.proof(b"cookie", "server", "a", "b", b"n1", b"n2"),
                  W.proof(b"cookie", "client", "b", "a", b"n1", b"n2"),
                  W.proof(b"cookie", "client", "a", "b", b"n2", b"n1")):
        assert not W.proof_ok(base, other)
    assert b"cookie" not in base
