"""The stream protocol's frame codec and AMQP 1.0 body extraction, sans-IO."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from amqpd.streamproto import amqp10, codec
from tests.unit.protocol.test_atheris import run_atheris


def _frame(key: int, body: bytes, version: int = 1) -> bytes:
    payload = struct.pack(">HH", key, version) + body
    return struct.pack(">I", len(payload)) + payload


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def test_reader_cuts_frames_split_anywhere() -> None:
    data = _frame(codec.HEARTBEAT, b"") + _frame(codec.OPEN, struct.pack(">I", 7) +
                                                 _string("/"))
    reader = codec.FrameReader(1024)
    frames: list[bytes] = []
    for i in range(len(data)):
        frames += reader.feed(data[i:i + 1])
    commands = [codec.decode(f) for f in frames]
    assert [(c.key, c.correlation_id, c.fields) for c in commands] == [
        (codec.HEARTBEAT, 0, ()), (codec.OPEN, 7, ("/",))]


def test_oversize_and_tiny_frames_are_refused_before_buffering() -> None:
    with pytest.raises(codec.FrameError) as exc:
        codec.FrameReader(1024).feed(struct.pack(">I", 2000))
    assert exc.value.code == codec.FRAME_TOO_LARGE
    with pytest.raises(codec.FrameError):
        codec.FrameReader(1024).feed(struct.pack(">I", 2) + b"\x00\x00")


def test_unknown_key_version_and_truncated_fields() -> None:
    with pytest.raises(codec.FrameError) as exc:
        codec.decode(struct.pack(">HHI", 0x7777, 1, 1))
    assert exc.value.code == codec.UNKNOWN_FRAME and exc.value.close
    with pytest.raises(codec.FrameError, match="version 9"):
        codec.decode(struct.pack(">HHI", codec.OPEN, 9, 1) + _string("/"))
    with pytest.raises(codec.FrameError, match="inside a field"):
        codec.decode(struct.pack(">HHI", codec.OPEN, 1, 1) + b"\x00\x05/")
    with pytest.raises(codec.FrameError, match="left over"):
        codec.decode(struct.pack(">HHI", codec.OPEN, 1, 1) + _string("/") + b"x")
    with pytest.raises(codec.FrameError, match="does not fit"):  # a huge array count
        codec.decode(struct.pack(">HHIi", codec.METADATA, 1, 1, 1_000_000))


def test_publish_simple_and_sub_entry_batch() -> None:
    batch = b"".join(struct.pack(">I", len(m)) + m for m in (b"a", b"bc"))
    # the sub-entry header: a byte (type bit, compression 0, reserved), count u16, sizes
    body = (struct.pack(">Bi", 3, 2) + struct.pack(">QI", 10, 3) + b"xyz"
            + struct.pack(">Q", 11) + struct.pack(">BH", 0x80, 2)
            + struct.pack(">II", len(batch), len(batch)) + batch)
    cmd = codec.decode(struct.pack(">HH", codec.PUBLISH, 1) + body)
    publisher, entries = cmd.fields
    assert publisher == 3
    assert entries[0] == (10, b"xyz")
    pid, (compression, n, _size, data) = entries[1]
    assert (pid, compression, n) == (11, 0, 2)
    assert codec.split_sub_batch(data, n) == [b"a", b"bc"]


def test_subscribe_offset_specifications() -> None:
    head = struct.pack(">HHIB", codec.SUBSCRIBE, 1, 5, 1) + _string("s")
    first = codec.decode(head + struct.pack(">HH", 1, 10) + struct.pack(">i", 0))
    assert first.fields == (1, "s", 1, None, 10, {})
    at = codec.decode(head + struct.pack(">HQH", 4, 42, 10))
    assert at.fields[2:5] == (4, 42, 10)
    stamp = codec.decode(head + struct.pack(">HqH", 5, -1, 10))
    assert stamp.fields[3] == -1
    with pytest.raises(codec.FrameError) as exc:  # answered, not fatal
        codec.decode(head + struct.pack(">HH", 9, 10))
    assert exc.value.code == codec.PRECONDITION_FAILED and not exc.value.close


def test_chunk_header_is_osiris_layout() -> None:
    data = codec.simple_entries([b"one", b"two!"])
    head = codec.chunk_header(100, 1234, 2, 2, data)
    assert len(head) == 48
    (magic, kind, entries, records, ts, epoch, first, crc, size, trailer,
     _reserved) = codec.CHUNK_HEADER.unpack(head)
    assert (magic, kind, entries, records, ts, epoch, first) == (0x50, 0, 2, 2, 1234, 1, 100)
    assert crc & 0xFFFFFFFF == zlib.crc32(data) and size == len(data) and trailer == 0
    frame = codec.deliver(7, head + data)
    assert struct.unpack_from(">IHHB", frame) == (len(frame) - 4, codec.DELIVER, 1, 7)


def test_amqp10_bodies() -> None:
    assert amqp10.body_of(amqp10.data_message(b"hello")) == b"hello"
    big = b"x" * 300
    assert amqp10.body_of(amqp10.data_message(big)) == big
    # properties section (a described list) then two data sections, then a string value
    props = b"\x00\x53\x73\xc0\x02\x01\x40"
    message = props + amqp10.data_message(b"ab") + amqp10.data_message(b"cd")
    assert amqp10.body_of(message) == b"abcd"
    assert amqp10.body_of(b"\x00\x53\x77\xa1\x02hi") == b"hi"
    with pytest.raises(amqp10.AMQP10Error):
        amqp10.body_of(b"\x00\x53\x75\xb0\xff\xff\xff\xff")
    with pytest.raises(amqp10.AMQP10Error):
        amqp10.body_of(b"plain bytes")


def test_short_atheris_run_of_the_frame_decoder(tmp_path: Path) -> None:
    run_atheris("fuzz.stream_frames", 20000, tmp_path)


@pytest.mark.parametrize(("tail", "fields"), [
    (struct.pack(">HQ", 4, 42), (1, 4, 42)),  # offset
    (struct.pack(">Hq", 5, -7), (1, 5, -7)),  # timestamp
    (struct.pack(">H", 1), (1, 1, None)),  # first, as the protocol writes it
    (struct.pack(">HQ", 3, 0), (1, 3, None)),  # next with rstream's 8 zero bytes
    (struct.pack(">H", 0), (1, 0, None)),  # none: the subscription's own offset
])
def test_consumer_update_answer(tail: bytes, fields: tuple[object, ...]) -> None:
    frame = struct.pack(">HHIH", codec.CONSUMER_UPDATE | codec.RESPONSE, 1, 9, 1) + tail
    cmd = codec.decode(frame)
    assert (cmd.correlation_id, cmd.fields) == (9, fields)


def test_consumer_update_request_and_bad_answers() -> None:
    assert codec.consumer_update(3, 2, True) == struct.pack(">IHHIBB", 10, 0x1A, 1, 3, 2, 1)
    head = struct.pack(">HHIH", codec.CONSUMER_UPDATE | codec.RESPONSE, 1, 9, 1)
    for tail in (struct.pack(">H", 9), struct.pack(">HI", 1, 0), struct.pack(">H", 4)):
        with pytest.raises(codec.FrameError):
            codec.decode(head + tail)


def test_reader_cuts_frames_from_reads_of_any_size() -> None:
    """Frames cut from a read with nothing held back and from a read that completes a
    held frame are the same frames, whatever the reads' sizes."""
    frames = [_frame(codec.HEARTBEAT, b"")] + [
        _frame(codec.OPEN, struct.pack(">I", 7) + _string("/" * n)) for n in range(40)]
    data = b"".join(frames)
    expected = [f[4:] for f in frames]
    for step in (1, 3, 7, 64, 100, 1000, len(data)):
        reader = codec.FrameReader(1024)
        got: list[bytes] = []
        for at in range(0, len(data), step):
            got += reader.feed(data[at:at + step])
        assert got == expected and all(type(f) is bytes for f in got)
    with pytest.raises(codec.FrameError) as exc:  # past a whole frame, unbuffered
        codec.FrameReader(1024).feed(frames[0] + struct.pack(">I", 2000))
    assert exc.value.code == codec.FRAME_TOO_LARGE


def test_split_plain_takes_a_frame_of_plain_entries_only() -> None:
    assert codec.split_plain([(5, b"a"), (3, b"bc"), (9, b"")]) == (
        [5, 3, 9], [b"a", b"bc", b""], 9)
    assert codec.split_plain([(5, b"a"), (6, (0, 1, 1, b"x"))]) is None  # a sub-batch
    assert codec.split_plain([]) is None
