"""The link's frame format and cookie proofs (amqpd.cluster.link_wire), no sockets."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest

from amqpd.cluster import link_wire as W


def test_every_layout_round_trips_split_anywhere() -> None:
    samples: dict[str, object] = {
        "I": 7, "Q": 2**40 + 3, "B": 1, "s": "vh/é", "b": b"\x00body\xff",
        "j": {"x-max-length": 5, "a": [1, "b"]}, "L": [1, 2**63, 5]}
    samples["P"] = [(2**40 + 3, 1, "vh/é", "rk", b"p", b"\x00body\xff")] * 2
    samples["D"] = [(7, 1, 2**40 + 3, "vh/é", "rk", b"p", b"\x00body\xff", 5)] * 2
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


PER_MESSAGE = [
    (W.PUBLISH, [2**40 + 1, 1, "amq.direct", "rk/é", b"\x90\x00props", b"\x00body\xff"]),
    (W.PUBLISH, [0, 0, "", "", b"", b""]),
    (W.DELIVER, [7, 2**50, 1, 12, "ex", "key", b"\x10p", b"b" * 300, 2**33]),
    (W.GET_OK, [3, 1, 0, 0, "", "q", b"", b"", 0]),
]


@pytest.mark.parametrize(("kind", "fields"), PER_MESSAGE)
def test_per_message_encoders_write_the_generic_bytes(kind: int, fields: list[object]) -> None:
    """PUBLISH, DELIVER and GET_OK have hand-written encoders: a peer running the
    generic codec must read them (and the other way round)."""
    generic = W.encode(kind, 5, *fields)
    fast = (W.encode_publish(5, *fields) if kind == W.PUBLISH  # type: ignore[arg-type]
            else W.encode_deliver(kind, 5, *fields))  # type: ignore[arg-type]
    assert fast == generic
    assert W.FrameReader().feed(fast) == [(kind, 5, fields)]
    assert W.decode_fields(kind, fast[9:]) == fields


@pytest.mark.parametrize(("kind", "fields"), PER_MESSAGE)
def test_per_message_decoders_refuse_what_the_generic_refuses(kind: int,
                                                              fields: list[object]) -> None:
    """A frame one byte short or long, read alone or followed by another frame (so the
    buffer holds bytes past its end), is a WireError from the fast decoders as from
    :func:`decode_fields`."""
    good = W.encode(kind, 5, *fields)
    body = good[9:]
    _refused(kind, [body[:-1], body + b"\x00"])


def _refused(kind: int, bads: list[bytes]) -> None:
    """Each body in ``bads`` is a WireError: decoded alone, read as a frame, and read
    as a frame with a good one after it (whose bytes must not complete it)."""
    follow = W.encode(W.CREDIT, 5, 1)
    for bad in bads:
        with pytest.raises(W.WireError):
            W.decode_fields(kind, bad)
        raw = _frame(kind, bad)
        for data in (raw, raw + follow):
            with pytest.raises(W.WireError):
                W.FrameReader().feed(data)


def test_a_string_field_past_its_frame_is_refused_even_with_bytes_after() -> None:
    """The exchange's length claims more than the frame holds; the next frame's bytes
    are in the buffer, and must not be read as this frame's."""
    body = W.encode(W.PUBLISH, 1, 1, 0, "", "", b"", b"")[9:]
    bad = body[:9] + b"\x00\x20" + body[11:]
    with pytest.raises(W.WireError):
        W.FrameReader().feed(_frame(W.PUBLISH, bad) + W.encode(W.CREDIT, 1, 1) * 8)


def test_a_large_frame_arriving_in_many_reads_is_read_once_whole() -> None:
    """Reads of a frame not yet whole give nothing; the read that completes it gives it,
    with the frames after it, and a cut inside the next frame's head is kept too."""
    big = W.encode(W.PUBLISH, 1, 9, 1, "", "q", b"", bytes(range(256)) * 4096)
    small = W.encode(W.CREDIT, 2, 5)
    data = big + small + small[:4]
    reader = W.FrameReader()
    got = []
    step = 65536
    for at in range(0, len(data), step):
        got.extend(reader.feed(data[at:at + step]))
    assert [(k, s) for k, s, _ in got] == [(W.PUBLISH, 1), (W.CREDIT, 2)]
    assert got[0][2][5] == bytes(range(256)) * 4096
    assert reader.feed(small[4:]) == [(W.CREDIT, 2, [5])]


SMALL = [
    (W.CONFIRM, [2**40 + 7, 1], lambda: W.encode_confirm(5, 2**40 + 7, True)),
    (W.CONFIRM, [3, 0], lambda: W.encode_confirm(5, 3, False)),
    (W.CREDIT, [2**32 - 1], lambda: W.encode_credit(5, 2**32 - 1)),
    (W.GRANT, [7, 250], lambda: W.encode_grant(5, 7, 250)),
    (W.SETTLE, [[1, 2**63, 5]], lambda: W.encode_ids(W.SETTLE, 5, [1, 2**63, 5])),
    (W.REQUEUE, [[]], lambda: W.encode_ids(W.REQUEUE, 5, [])),
    (W.REJECT, [[9]], lambda: W.encode_ids(W.REJECT, 5, [9])),
]


@pytest.mark.parametrize(("kind", "fields", "fast"), SMALL)
def test_small_frame_encoders_write_the_generic_bytes(kind: int, fields: list[object],
                                                      fast: object) -> None:
    """CONFIRM, CREDIT, GRANT and the id lists have hand-packed encoders and readers:
    the generic codec's bytes both ways, so peers of either kind read each other."""
    generic = W.encode(kind, 5, *fields)
    assert fast() == generic  # type: ignore[operator]
    assert W.FrameReader().feed(generic) == [(kind, 5, fields)]
    assert W.FrameReader().feed(generic + generic) == [(kind, 5, fields)] * 2


@pytest.mark.parametrize(("kind", "fields", "fast"), SMALL)
def test_small_frame_reader_refuses_what_the_generic_refuses(kind: int,
                                                             fields: list[object],
                                                             fast: object) -> None:
    """One byte short or long, alone or followed by another frame, and (for a list) a
    count past the frame's end: WireError from the reader as from decode_fields."""
    body = W.encode(kind, 5, *fields)[9:]
    bads = [body[:-1], body + b"\x00", b""]
    if kind in (W.SETTLE, W.REQUEUE, W.REJECT):
        bads.append(struct.pack(">I", len(fields[0]) + 1) + body[4:])  # type: ignore[arg-type]
        bads.append(body[:3])
    _refused(kind, bads)


PUBLISH_RECORDS = [(2**40 + 1, 1, "amq.direct", "rk/é", b"\x90\x00props", b"\x00body\xff"),
                   (0, 0, "", "", b"", b""), (3, True, "x", "q", b"p", b"b" * 300)]
DELIVER_RECORDS = [(2**50, 1, 12, "ex", "key", b"\x10p", b"b" * 300, 2**33),
                   (1, 0, 0, "", "q", b"", b"", 0), (7, False, 2, "é", "k", b"p", b"x", 5)]


def _publishes(stream: int, records: Sequence[tuple[object, ...]]) -> bytes:
    frame = W.publishes(stream, *records[0])  # type: ignore[arg-type]
    for record in records[1:]:
        assert W.add_publish(frame, *record)  # type: ignore[arg-type]
    W.seal(frame)
    return bytes(frame)


def _delivers(stream: int, cid: int, records: Sequence[tuple[object, ...]]) -> bytes:
    frame = W.delivers(stream, cid, *records[0])  # type: ignore[arg-type]
    for record in records[1:]:
        assert W.add_deliver(frame, *record)  # type: ignore[arg-type]
    W.seal(frame)
    return bytes(frame)


def _ints(records: Sequence[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """As read back: a bool field comes back as the u8 it was sent as."""
    return [tuple(int(v) if isinstance(v, bool) else v for v in r) for r in records]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_batches_grown_in_place_read_back_whole_or_cut_anywhere(n: int) -> None:
    """A PUBLISHES or DELIVERS frame grown record by record and sealed is the generic
    codec's frame of those records, and reads back as them (each record the fields of
    that message's own PUBLISH / DELIVER frame), whole or cut at any point, between
    other frames."""
    pubs = PUBLISH_RECORDS[:n]
    dels = DELIVER_RECORDS[:n]
    fast_p = _publishes(5, pubs)
    fast_d = _delivers(6, 9, dels)
    assert fast_p == W.encode(W.PUBLISHES, 5, pubs)
    assert fast_d == W.encode(W.DELIVERS, 6, 9, dels)
    want_p = (W.PUBLISHES, 5, [_ints(pubs)])
    want_d = (W.DELIVERS, 6, [9, _ints(dels)])
    assert W.decode_fields(W.PUBLISHES, fast_p[9:]) == want_p[2]
    assert W.decode_fields(W.DELIVERS, fast_d[9:]) == want_d[2]
    credit = W.encode_credit(5, 3)
    data = fast_p + credit + fast_d + fast_p
    want = [want_p, (W.CREDIT, 5, [3]), want_d, want_p]
    for cut in range(0, len(data), 5):
        reader = W.FrameReader()
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == want
    singles = W.FrameReader().feed(b"".join(W.encode_publish(5, *r)  # type: ignore[arg-type]
                                            for r in pubs))
    assert [tuple(f) for _k, _s, f in singles] == _ints(pubs)
    singles = W.FrameReader().feed(b"".join(W.encode_deliver(W.DELIVER, 6, 9, *r)  # type: ignore[arg-type]
                                            for r in dels))
    assert [tuple(f[1:]) for _k, _s, f in singles] == _ints(dels)


def test_a_batch_takes_no_record_once_full() -> None:
    """Past BATCH_BYTES a batch refuses another record (the sender starts a new frame)
    and is left as it was."""
    frame = W.publishes(1, 0, 0, "", "q", b"", b"x" * W.BATCH_BYTES)
    before = bytes(frame)
    assert not W.add_publish(frame, 0, 0, "", "q", b"", b"y")
    assert bytes(frame) == before
    frame_d = W.delivers(1, 2, 1, 0, 0, "", "q", b"", b"x" * W.BATCH_BYTES, 0)
    assert not W.add_deliver(frame_d, 2, 0, 0, "", "q", b"", b"y", 0)
    W.seal(frame_d)
    assert W.FrameReader().feed(bytes(frame_d))[0][2][1][0][6] == b"x" * W.BATCH_BYTES


@pytest.mark.parametrize("kind", [W.PUBLISHES, W.DELIVERS])
def test_batch_reader_refuses_what_the_generic_refuses(kind: int) -> None:
    """A batch one byte short or long (a record cut in its head or in its strings, or
    bytes after the last that are no record), a length in a record's head past the
    frame's end, a routing key that is not UTF-8, a DELIVERS with no consumer id:
    WireError from the reader as from decode_fields, alone or with a good frame's
    bytes after it."""
    if kind == W.PUBLISHES:
        body = W.encode(kind, 5, PUBLISH_RECORDS)[9:]
        first = 0
        head = 21
    else:
        body = W.encode(kind, 5, 9, DELIVER_RECORDS)[9:]
        first = 4
        head = 37
    key_len_at = first + head - 10  # the u16 length of the first record's routing key
    too_long = body[:key_len_at] + b"\xff\xff" + body[key_len_at + 2:]
    if kind == W.PUBLISHES:  # an exchange name of one byte, 0xff
        not_utf8 = struct.pack(">QBHHII", 1, 0, 1, 0, 0, 0) + b"\xff"
    else:
        not_utf8 = struct.pack(">IQBQQHHII", 9, 1, 0, 0, 0, 1, 0, 0, 0) + b"\xff"
    bads = [body[:-1], body + b"\x00", body[:first + head - 1], too_long, not_utf8]
    if kind == W.DELIVERS:
        bads.append(body[:3])
    _refused(kind, bads)
