"""The stream log (amqpd.store.stream_log): offsets, chunks, sparse indexes, reading,
retention by whole segments, recovery of torn tails, with temp directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amqpd.store.stream_log import (
    HEADER_SIZE,
    RECORD_SIZE,
    SCAN_BYTES,
    SEG,
    StreamLog,
    StreamLogError,
    parse_records,
)


def _log(path: Path, segment: int = 10_000, interval: int = 256) -> StreamLog:
    log = StreamLog(path, max_segment_bytes=segment, index_interval=interval)
    log.open()
    return log


def _fill(log: StreamLog, n: int, size: int = 100, ts: int = 1000, per_flush: int = 7) -> None:
    for i in range(n):
        log.append(i.to_bytes(4, "big") * (size // 4), ts + i)
        if i % per_flush == per_flush - 1:
            log.flush()
    log.flush()


def test_offsets_read_in_order_across_segments(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 1000)
    assert len(log.segments) > 5
    assert (log.first_offset, log.last_offset, log.next_offset) == (0, 999, 1000)
    got = [r.offset for r in log.reader(0).records(1000)]
    assert got == list(range(1000))
    for start in (0, 1, 137, 500, 999):
        first = log.reader(start).read(3)
        assert [r.offset for r in first] == list(range(start, min(start + 3, 1000)))
        assert first[0].payload == start.to_bytes(4, "big") * 25


def test_a_seek_skips_headers_across_scan_blocks(tmp_path: Path) -> None:
    """With one index entry per segment, a reader finds any offset by skipping record
    headers a block at a time (SCAN_BYTES): records larger than a block, records that
    straddle one, and many small ones in one."""
    log = _log(tmp_path, segment=50_000_000, interval=1 << 40)
    sizes = [8, 100_000, 12, 70_000, *([40] * 3000), 200_000, 5, SCAN_BYTES - RECORD_SIZE, 9]
    for i, size in enumerate(sizes):
        log.append(bytes((i % 251,)) * size, 1000 + i)
        if i % 5 == 4:
            log.flush()
    log.flush()
    assert len(log.segments) == 1 and len(log.segments[0].idx_offsets) == 1
    for start in (0, 1, 2, 3, 4, 1000, 3003, 3004, 3005, 3006, 3007, len(sizes) - 1):
        got = log.reader(start).read(2)
        assert [r.offset for r in got] == list(range(start, min(start + 2, len(sizes))))
        assert got[0].payload == bytes((start % 251,)) * sizes[start]


def test_unflushed_records_are_not_readable(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.append(b"a", 1)
    assert log.reader(0).read(10) == []
    log.flush()
    assert [r.payload for r in log.reader(0).read(10)] == [b"a"]


def test_last_is_the_first_record_of_the_last_chunk(tmp_path: Path) -> None:
    log = _log(tmp_path)
    for i in range(5):
        log.append(b"x", i)
    log.flush()
    for i in range(3):
        log.append(b"y", i)
    log.flush()
    assert log.last_chunk_offset == 5
    chunk_marks = [r.chunk_start for r in log.reader(0).read(10)]
    assert chunk_marks == [True, False, False, False, False, True, False, False]


def test_timestamp_lookup(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 500, ts=10_000)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(10_250) == 250
    assert log.offset_for_timestamp(10_499) == 499
    assert log.offset_for_timestamp(99_999) == 500  # future: next


def test_retention_by_size_deletes_whole_old_segments_and_readers_move_on(
        tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 1000)
    reader = log.reader(0)
    assert [r.offset for r in reader.read(2)] == [0, 1]
    before = len(log.segments)
    log.sync()
    gone = log.retain(30_000, None, 0)
    assert gone > 0 and len(log.segments) == before - gone
    assert log.size_bytes <= 30_000 + log.max_segment_bytes + 200
    assert log.first_offset == log.segments[0].base > 2
    assert len(list(tmp_path.glob("*" + SEG))) == len(log.segments)
    # the reader was in a deleted segment: it continues at the first kept record
    assert reader.read(1)[0].offset == log.first_offset


def test_retention_by_age_never_drops_the_active_segment(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 300, ts=1000)
    log.sync()
    log.retain(None, 1, 10**12)
    assert len(log.segments) == 1  # only the active one is left
    assert log.first_offset == log.segments[0].base
    log.append(b"new", 10**12)
    log.flush()
    assert log.reader(0).read(1000)[-1].payload == b"new"


def test_reopen_keeps_everything_and_continues_offsets(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 700)
    log.sync()
    log.close()
    again = _log(tmp_path)
    assert (again.first_offset, again.next_offset) == (0, 700)
    assert again.last_chunk_offset == log.last_chunk_offset
    again.append(b"more", 5)
    again.flush()
    assert [r.offset for r in again.reader(695).read(10)] == [695, 696, 697, 698, 699, 700]
    assert again.offset_for_timestamp(1350) == 350


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    log = _log(tmp_path, segment=10**9)
    _fill(log, 50)
    log.sync()
    seg = log.segments[-1].path
    log.close()
    with open(seg, "ab") as fh:  # half a record after the last good one
        fh.write(b"\x00\x01\x02\x03\x04\x05\x06")
    again = _log(tmp_path, segment=10**9)
    assert again.next_offset == 50 and again.truncated_bytes == 7
    assert os.path.getsize(seg) == again.segments[-1].size


def test_corrupt_record_cuts_it_and_what_follows(tmp_path: Path) -> None:
    log = _log(tmp_path, segment=10**9)
    _fill(log, 20, size=40)
    log.sync()
    seg = log.segments[-1].path
    log.close()
    data = bytearray(seg.read_bytes())
    record = 25 + 40
    data[HEADER_SIZE + 10 * record + 30] ^= 0xFF  # inside record 10's payload
    seg.write_bytes(bytes(data))
    again = _log(tmp_path, segment=10**9)
    assert again.next_offset == 10
    assert [r.offset for r in again.reader(0).read(100)] == list(range(10))


def test_sealed_segments_use_their_index_file(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 400)
    log.sync()
    log.close()
    idx = sorted(tmp_path.glob("*.idx"))
    assert idx and len(idx) == len(list(tmp_path.glob("*" + SEG))) - 1
    idx[0].write_bytes(b"garbage")  # a bad index: the segment is scanned instead
    again = _log(tmp_path)
    assert [r.offset for r in again.reader(0).records(400)] == list(range(400))
    assert again.retain(1, None, 0) == 0  # its index is not written yet: kept for now
    again.sync()  # writes it again
    assert idx[0].read_bytes() == again.segments[0].index_bytes()
    assert again.retain(1, None, 0) == len(idx)  # now every sealed segment may go
    assert len(again.segments) == 1


def test_sync_covers_a_segment_sealed_after_it_started(tmp_path: Path) -> None:
    """Records flushed into a segment that filled up are fsynced by the next sync even
    though a newer segment is the active one by then (the confirm waits for it)."""
    log = _log(tmp_path, segment=1000)
    _fill(log, 30, size=100, per_flush=30)
    assert log.rolls >= 1 and log.sync() == 30 and log.synced_offset == 30
    assert all(seg.indexed for seg in log.segments[:-1])


def test_replica_append_keeps_the_leaders_offsets(tmp_path: Path) -> None:
    leader = _log(tmp_path / "l")
    _fill(leader, 30)
    follower = _log(tmp_path / "f")
    for r in leader.reader(0).records(30):
        follower.append_replica(r.offset, r.timestamp, r.chunk_start, r.payload)
    follower.flush()
    assert follower.last_chunk_offset == leader.last_chunk_offset
    assert [r.payload for r in follower.reader(0).records(30)] == \
        [r.payload for r in leader.reader(0).records(30)]
    with pytest.raises(StreamLogError):
        follower.append_replica(40, 0, True, b"gap")


def test_destroy_removes_the_directory(tmp_path: Path) -> None:
    log = _log(tmp_path / "s")
    _fill(log, 10)
    log.destroy()
    assert not (tmp_path / "s").exists()


def test_a_cut_earlier_segment_drops_the_later_ones_for_good(tmp_path: Path) -> None:
    log = _log(tmp_path, segment=2000)
    _fill(log, 100, size=100, per_flush=100)
    log.sync()
    log.close()
    first = sorted(tmp_path.glob("*" + SEG))[0]
    first.with_suffix(".idx").unlink()
    data = bytearray(first.read_bytes())
    data[HEADER_SIZE + 5 * (25 + 100) + 40] ^= 0xFF  # record 5's payload
    first.write_bytes(bytes(data))
    again = _log(tmp_path, segment=2000)
    assert again.next_offset == 5 and len(list(tmp_path.glob("*" + SEG))) == 2
    again.append(b"new", 1)
    again.sync()
    again.close()
    third = _log(tmp_path, segment=2000)  # reopening keeps what the second open kept
    assert [r.payload for r in third.reader(0).records(10)][-1] == b"new"
    assert third.next_offset == 6


def test_append_many_writes_what_append_writes(tmp_path: Path) -> None:
    """The batch path (stream-protocol publish frames) stores byte for byte what
    record-by-record appends store, chunk marks and segment rolls included."""
    payloads = [bytes([i % 251]) * (50 + i % 7) for i in range(300)]
    one, many = _log(tmp_path / "one"), _log(tmp_path / "many")
    for batch in (payloads[:120], payloads[120:121], payloads[121:]):
        for p in batch:
            one.append(p, 5, 2)
        one.flush()
        assert many.append_many(batch, 5, 2) == many.next_offset
        many.flush()
    assert len(many.segments) > 2 and many.next_offset == 300
    assert [s.base for s in one.segments] == [s.base for s in many.segments]
    for a, b in zip(one.segments, many.segments, strict=True):
        assert a.path.read_bytes() == b.path.read_bytes()
    assert [r.payload for r in many.reader(0).records(300)] == payloads


def test_read_raw_returns_whole_stored_records(tmp_path: Path) -> None:
    log = _log(tmp_path, segment=1_000_000)
    _fill(log, 50, size=100)
    log.append(b"x" * 5000, 7)  # larger than one read below
    log.flush()
    reader = log.reader(10)
    data, n = reader.read_raw(5, max_bytes=10_000)
    assert n == 5 and [r.offset for r in parse_records(data)] == list(range(10, 15))
    data, n = reader.read_raw(1000, max_bytes=1000)  # the bytes bound: whole records only
    got = parse_records(data)
    assert n == len(got) == 1000 // (RECORD_SIZE + 100) and got[0].offset == 15
    reader = log.reader(50)
    data, n = reader.read_raw(10, max_bytes=100)
    assert n == 1 and parse_records(data)[0].payload == b"x" * 5000
    assert reader.read_raw(10) == (b"", 0) and reader.offset == 51


def test_append_parts_writes_what_append_of_the_joined_payload_writes(
        tmp_path: Path) -> None:
    """The AMQP 0-9-1 publish path hands a record's payload in parts (head, properties,
    body: no joined copy): the stored bytes, CRCs, offsets, chunk marks and segment
    rolls are those of appending the joined payload."""
    parts = [[bytes([i % 251]) * (i % 5), b"props" * (i % 3), bytes([i % 7]) * (40 + i % 9)]
             for i in range(300)]
    one, split = _log(tmp_path / "one"), _log(tmp_path / "split")
    for lo, hi in ((0, 120), (120, 121), (121, 300)):
        for i in range(lo, hi):
            assert one.append(b"".join(parts[i]), 7 + i) == i
            assert split.append_parts(parts[i], 7 + i) == i
        one.flush()
        split.flush()
    assert len(split.segments) > 2 and split.next_offset == 300
    assert [s.base for s in one.segments] == [s.base for s in split.segments]
    for a, b in zip(one.segments, split.segments, strict=True):
        assert a.path.read_bytes() == b.path.read_bytes()
    got = list(split.reader(0).records(300))
    assert [r.payload for r in got] == [b"".join(p) for p in parts]
    assert [r.timestamp for r in got] == [7 + i for i in range(300)]
    split.close()
    again = _log(tmp_path / "split")  # recovery checks every record's CRC: none is cut
    assert again.truncated_bytes == 0 and again.next_offset == 300


def test_peek_block_reads_without_moving_until_advanced(tmp_path: Path) -> None:
    """peek_block hands out a pread as it came, beginning with a whole record and
    maybe ending inside one, and leaves the reader where it was: advance moves it past
    the records the caller took; a record larger than the read comes whole."""
    log = _log(tmp_path, segment=1_000_000)
    _fill(log, 20, size=100)
    log.append(b"x" * 5000, 7)
    log.flush()
    reader = log.reader(0)
    data = reader.peek_block(1100)
    assert len(data) == 1100 and reader.offset == 0
    n = 1100 // (RECORD_SIZE + 100)  # whole records in it; the next one's head follows
    assert [r.offset for r in parse_records(data[:n * (RECORD_SIZE + 100)])] == list(
        range(n))
    assert reader.peek_block(1100) == data  # not moved
    reader.advance(n, n * (RECORD_SIZE + 100))
    data = reader.peek_block()
    assert [r.offset for r in parse_records(data)] == list(range(n, 21))
    reader.advance(20 - n, (20 - n) * (RECORD_SIZE + 100))
    data = reader.peek_block(100)  # the big record, whole
    assert parse_records(data)[0].payload == b"x" * 5000
    reader.advance(1, len(data))
    assert reader.peek_block() == b"" and reader.offset == 21


def test_a_flush_books_its_records_as_a_scan_of_the_file_does(tmp_path: Path) -> None:
    """The index, counts, newest timestamp and last chunk that flush books for its
    batches (Segment.note_all; a batch that fills a segment is split there) equal what
    reopening the log rebuilds record by record, in every segment."""
    for segment in (1_000_000, 3000):
        path = tmp_path / str(segment)
        log = _log(path, segment=segment, interval=300)
        for i in range(9):
            log.append_many([bytes(20 + 37 * j % 200) for j in range(i * 11 + 1)],
                            1000 + 5 * i - (i % 3) * 7, 2)
            log.append(b"amqp 0-9-1", 990 + i)
            log.flush()

        def booked(lg: StreamLog) -> list[tuple[object, ...]]:
            return [(s.base, list(s.idx_offsets), list(s.idx_positions),
                     list(s.idx_stamps), s.count, s.size, s.last_stamp, s.last_chunk,
                     s.since_index) for s in lg.segments]

        before = booked(log)
        if segment == 1_000_000:
            assert len(before) == 1
        log.close()
        assert booked(_log(path, segment=segment, interval=300)) == before
    assert len(before) > 3  # the small segments: batches were split where they filled


def test_records_carry_zlibs_crc32_whichever_module_computes_it(tmp_path: Path) -> None:
    """The CRC of a record is zlib's CRC-32 of everything after it, whether zlib-ng
    (the ``speed`` extra: the same function, faster) or zlib computes it: files
    written by either build read back with the other."""
    import struct
    import zlib

    from amqpd.store import stream_log

    payloads = [bytes(range(256)) * 4 + bytes([i]) * i for i in range(40)]
    for data in payloads:
        assert stream_log.crc32(data, 0) == zlib.crc32(data)
        assert stream_log.crc32(data, 12345) == zlib.crc32(data, 12345)
    log = _log(tmp_path, segment=1_000_000)
    for i, p in enumerate(payloads):
        if i % 2:
            log.append_parts([p[:7], p[7:]], 1000 + i)
        else:
            log.append(p, 1000 + i)
    log.flush()
    stored = log.segments[0].path.read_bytes()[HEADER_SIZE:]
    at = 0
    for i, p in enumerate(payloads):
        tail = struct.pack(">IQqB", len(p), i, 1000 + i, 1 if i == 0 else 0)
        crc = zlib.crc32(p, zlib.crc32(tail)) & 0xFFFFFFFF
        assert stored[at:at + RECORD_SIZE + len(p)] == struct.pack(">I", crc) + tail + p
        at += RECORD_SIZE + len(p)
    assert at == len(stored)


def test_zlib_ng_computes_the_crc_when_installed() -> None:
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng",
                                  reason="zlib-ng (the speed extra) is not installed")
    from amqpd.store import stream_log

    assert stream_log.crc32 is zlib_ng.crc32
