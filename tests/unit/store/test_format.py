"""format.py alone: round trips, truncation at every byte, bit flips -> CRC errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqpd.store import format as fmt
from amqpd.store.api import StoredMessage

names = st.text(min_size=0, max_size=40)


@given(
    queues=st.lists(names, min_size=1, max_size=5),
    exchange=names,
    rk=names,
    props=st.binary(max_size=64),
    body=st.binary(max_size=300),
    origin=st.integers(min_value=0, max_value=2**62),
    seq=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_enqueue_round_trip(queues, exchange, rk, props, body, origin, seq):
    m = StoredMessage(exchange, rk, props, body)
    rec = fmt.encode_record(fmt.ENQUEUE, seq, fmt.encode_enqueue(origin, queues, m))
    rtype, got_seq, p, e = fmt.decode_record(rec)
    assert (rtype, got_seq, e) == (fmt.ENQUEUE, seq, len(rec))
    assert fmt.decode_enqueue(rec[p:e]) == (origin, queues, m)
    assert fmt.decode_enqueue_index(rec, p, e) == (origin, queues, len(body))


@given(queue=names, positions=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_settle_round_trip(queue, positions):
    payload = fmt.encode_settle(queue, positions)
    q, got = fmt.decode_settle(payload)
    assert (q, list(got)) == (queue, positions)


def test_small_records_round_trip():
    queue, positions = fmt.decode_delivered(fmt.encode_delivered("v\x00q", [42, 7]))
    assert (queue, list(positions)) == ("v\x00q", [42, 7])
    assert fmt.decode_drop_queue(fmt.encode_drop_queue("v\x00q")) == "v\x00q"
    assert fmt.decode_checkpoint(fmt.encode_checkpoint(123456)) == 123456


def test_file_header():
    fmt.check_file_header(fmt.file_header())
    with pytest.raises(fmt.TornRecord):
        fmt.check_file_header(fmt.file_header()[:5])
    with pytest.raises(fmt.CorruptRecord):
        fmt.check_file_header(b"XXXX" + fmt.file_header()[4:])
    with pytest.raises(ValueError):
        fmt.check_file_header(fmt.FILE_HEADER.pack(fmt.MAGIC, fmt.VERSION + 1, 0))


def _sample() -> bytes:
    m = StoredMessage("ex", "key", b"\x90\x00\x02", b"hello world")
    return fmt.encode_record(fmt.ENQUEUE, 7, fmt.encode_enqueue(0, ["a", "bb"], m))


def test_truncation_at_every_byte_is_torn():
    rec = _sample()
    for cut in range(len(rec)):
        with pytest.raises(fmt.TornRecord):
            fmt.decode_record(rec[:cut])


def test_every_bit_flip_is_detected():
    rec = _sample()
    for i in range(len(rec)):
        for bit in range(8):
            bad = bytearray(rec)
            bad[i] ^= 1 << bit
            with pytest.raises(fmt.FormatError):
                fmt.decode_record(bytes(bad))
            if not 4 <= i < 8:  # a flipped length may also look torn
                with pytest.raises(fmt.CorruptRecord):
                    fmt.decode_record(bytes(bad))


def test_records_back_to_back_and_offsets():
    a = fmt.encode_record(fmt.DROP_QUEUE, 1, fmt.encode_drop_queue("x"))
    b = fmt.encode_record(fmt.CHECKPOINT, 2, fmt.encode_checkpoint(len(a)))
    buf = a + b
    t1, s1, _, e1 = fmt.decode_record(buf, 0)
    t2, s2, p2, e2 = fmt.decode_record(buf, e1)
    assert (t1, s1, t2, s2, e2) == (fmt.DROP_QUEUE, 1, fmt.CHECKPOINT, 2, len(buf))
    assert fmt.decode_checkpoint(buf[p2:e2]) == len(a)


def test_absurd_length_is_corrupt_not_an_allocation():
    rec = bytearray(_sample())
    rec[4:8] = (2**31).to_bytes(4, "little")
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_record(bytes(rec))


def test_unknown_type_is_corrupt():
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_record(fmt.encode_record(99, 1, b""))


def test_short_payloads_are_corrupt():
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_settle(fmt.encode_settle("q", [1, 2])[:-3])
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_enqueue(b"\x00" * 5)
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_delivered(b"\x01\x00q")


def _run(seqs: list[int]) -> bytes:
    return b"".join(fmt.encode_record(fmt.ENQUEUE, s, bytes([s % 251]) * (s % 40))
                    for s in seqs)


@given(st.lists(st.integers(1, 10**12), min_size=1, max_size=30, unique=True),
       st.integers(0, 40))
def test_check_run_agrees_with_record_by_record(seqs: list[int], cut: int) -> None:
    """check_run (one call per run of records, the standby's check) finds the same last
    whole record and the same place as decode_record one by one, wherever the bytes end."""
    seqs.sort()
    buf = _run(seqs)
    buf = buf[: max(0, len(buf) - cut)]
    want_seq, want_off = 0, 0
    while True:
        try:
            _, rseq, _, end = fmt.decode_record(buf, want_off)
        except fmt.TornRecord:
            break
        want_seq, want_off = rseq, end
    assert fmt.check_run(buf, 0, 0) == (want_seq, want_off)


def test_check_run_refuses_what_a_standby_must_not_acknowledge() -> None:
    good = _run([1, 2, 3])
    flipped = bytearray(good)
    flipped[len(good) - 1] ^= 0x01
    with pytest.raises(fmt.CorruptRecord, match="CRC"):
        fmt.check_run(bytes(flipped), 0, 0)
    with pytest.raises(fmt.CorruptRecord, match="sequence went from 2 to 2"):
        fmt.check_run(_run([1, 2, 2]), 0, 0)
    with pytest.raises(fmt.CorruptRecord, match="sequence went from 3 to 1"):
        fmt.check_run(good, 0, 3)  # what we already hold must not come again
    absurd = bytearray(good)
    absurd[4:8] = (fmt.MAX_PAYLOAD + 1).to_bytes(4, "little")
    with pytest.raises(fmt.CorruptRecord, match="exceeds"):
        fmt.check_run(bytes(absurd), 0, 0)
    with pytest.raises(fmt.CorruptRecord, match="unknown record type 99"):
        fmt.check_run(fmt.encode_record(99, 1, b"abc"), 0, 0)  # its CRC matches
    assert fmt.check_run(good[:10], 0, 7) == (7, 0)  # not even a header: nothing yet
