"""Delivered chunks (amqpd.streamproto.chunks): cut from the stored records
at chunk boundaries and the size limit, and shared between subscriptions through the
stream's chunk cache with the same bytes and positions as a chunk built afresh."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from amqpd.store.stream_log import AMQP10, StreamLog
from amqpd.streamproto import codec
from amqpd.streamproto.chunks import ChunkCache, next_chunk
from amqpd.streamproto.connection import Subscription, _as_amqp10

HEAD = codec.CHUNK_HEADER  # the osiris chunk header, 48 bytes


def _stream(tmp_path: Path, sizes: list[int]) -> StreamLog:
    """Chunks of ``sizes`` records (one flush each), small segments so chunks cross
    segment ends."""
    log = StreamLog(tmp_path, max_segment_bytes=4000, index_interval=256)
    log.open()
    n = 0
    for size in sizes:
        log.append_many([b"m%06d" % (n + i) for i in range(size)], 1000 + n, AMQP10)
        log.flush()
        n += size
    return log


def _chunks(sub: Subscription, limit: int, upto: int = 1 << 62) -> list[Any]:
    out: list[Any] = []
    assert sub.cut is not None
    for _ in range(10_000):  # bounded: each turn takes at least one record or ends
        chunk = next_chunk(sub.cut, sub.queue.chunk_cache, limit, _as_amqp10, upto)
        if chunk is None:
            return out
        out.append(chunk)
    raise AssertionError("no end")


def _records(chunk: Any) -> tuple[int, list[bytes]]:
    _, _, _, n, _, _, first, _, length, _, _ = HEAD.unpack_from(chunk.header, 0)
    data, at, out = chunk.entries, 0, []
    for _ in range(n):
        size = int.from_bytes(data[at:at + 4], "big")
        out.append(data[at + 4:at + 4 + size])
        at += 4 + size
    assert at == length == len(data)
    return first, out


def test_chunks_are_cut_at_boundaries_and_shared(tmp_path: Path) -> None:
    sizes = [3, 40, 1, 25, 60, 2]
    log = _stream(tmp_path, sizes)
    queue = SimpleNamespace(chunk_cache=ChunkCache())
    alone = SimpleNamespace(chunk_cache=ChunkCache(max_bytes=0))  # caches nothing

    def sub(q: Any, start: int) -> Subscription:
        return Subscription(1, q, log.reader(start), 10, {})

    limit = 200  # some stored chunks go as several
    fresh = _chunks(sub(alone, 0), limit)
    got = [_records(c) for c in fresh]
    assert [b for _, bs in got for b in bs] == [b"m%06d" % i for i in range(sum(sizes))]
    assert [f for f, _ in got][:3] == [0, 3, 3 + len(got[1][1])]
    assert all(len(c.entries) <= limit + 12 for c in fresh)
    first = _chunks(sub(queue, 0), limit)
    hits = queue.chunk_cache.hits
    second = _chunks(sub(queue, 0), limit)
    assert queue.chunk_cache.hits == hits + len(second)  # every one from the cache
    assert ([(c.header, c.entries) for c in first] == [(c.header, c.entries) for c in second]
            == [(c.header, c.entries) for c in fresh])
    # a subscription inside a chunk cuts its own pieces up to the next stored chunk
    # (offset 43), then meets the cached ones
    mid = [_records(c) for c in _chunks(sub(queue, 5), limit)]
    assert [b for _, bs in mid for b in bs] == [b"m%06d" % i for i in range(5, sum(sizes))]
    by_first = dict(got)
    assert [(f, bs) for f, bs in mid if f >= 43] == [(f, by_first[f]) for f in by_first
                                                     if f >= 43]


def test_a_subscription_moved_by_the_cache_reads_on_after_new_records(
        tmp_path: Path) -> None:
    log = _stream(tmp_path, [30, 30])
    queue: Any = SimpleNamespace(chunk_cache=ChunkCache())
    a = Subscription(1, queue, log.reader(0), 10, {})
    b = Subscription(2, queue, log.reader(0), 10, {})
    assert len(_chunks(a, 10_000)) == 2
    assert len(_chunks(b, 10_000)) == 2 and queue.chunk_cache.hits == 2
    log.append_many([b"late"], 5, AMQP10)
    log.flush()
    for s in (b, a):  # b was moved by the cache only: its reader must be right
        (chunk,) = _chunks(s, 10_000)
        assert _records(chunk) == (60, [b"late"])


def test_a_subscription_behind_retention_skips_cached_chunks_of_deleted_segments(
        tmp_path: Path) -> None:
    log = _stream(tmp_path, [40] * 10)
    queue: Any = SimpleNamespace(chunk_cache=ChunkCache())
    behind = Subscription(2, queue, log.reader(0), 10, {})
    assert len(_chunks(Subscription(1, queue, log.reader(0), 10, {}), 10_000)) >= 10
    log.sync()  # sealed segments get their index files: retention may take them
    assert log.retain(2000, None, 0) > 0 and log.first_offset > 0
    got = [_records(c) for c in _chunks(behind, 10_000)]
    assert got[0][0] == log.first_offset
    assert [b for _, bs in got for b in bs] == [b"m%06d" % i
                                                for i in range(log.first_offset, 400)]


def test_a_chunk_holds_at_most_the_entries_its_header_can_count(tmp_path: Path) -> None:
    """The osiris header counts entries in a u16: a stored chunk of more records (tiny
    messages) goes as several."""
    log = StreamLog(tmp_path)
    log.open()
    log.append_many([b""] * 70_000, 1, AMQP10)
    log.flush()
    queue: Any = SimpleNamespace(chunk_cache=ChunkCache())
    sub = Subscription(1, queue, log.reader(0), 10, {})
    chunks = _chunks(sub, 10 * 1024 * 1024)
    assert [c.records for c in chunks] == [0xFFFF, 70_000 - 0xFFFF]
    assert [_records(c)[0] for c in chunks] == [0, 0xFFFF]


def test_nothing_at_or_beyond_the_commit_point_is_cut(tmp_path: Path) -> None:
    """A commit point inside a stored chunk ends the delivered chunk there; the rest
    comes once the point moved, and a chunk another subscription cached below the old
    point is served, never one reaching beyond the point."""
    log = _stream(tmp_path, [10, 30, 5])
    queue: Any = SimpleNamespace(chunk_cache=ChunkCache())
    a = Subscription(1, queue, log.reader(0), 10, {})
    assert _chunks(a, 10_000, upto=0) == []
    got = [_records(c) for c in _chunks(a, 10_000, upto=25)]
    assert got == [(0, [b"m%06d" % i for i in range(10)]),
                   (10, [b"m%06d" % i for i in range(10, 25)])]
    assert _chunks(a, 10_000, upto=25) == []
    rest = [_records(c) for c in _chunks(a, 10_000, upto=45)]
    assert [f for f, _ in rest] == [25, 40]
    assert [b for _, bs in rest for b in bs] == [b"m%06d" % i for i in range(25, 45)]
    # the cache holds (10, 15 records): a subscription at 10 with the point at 12 cuts
    # its own two records instead
    b = Subscription(2, queue, log.reader(10), 10, {})
    hits = queue.chunk_cache.hits
    assert [_records(c) for c in _chunks(b, 10_000, upto=12)] == [
        (10, [b"m000010", b"m000011"])]
    assert queue.chunk_cache.hits == hits


def test_the_commit_point_bounds_a_reader_behind_retention(tmp_path: Path) -> None:
    """Offsets run on from the first kept one: a reader whose segment retention took
    reads from there, and still no further than the commit point."""
    log = _stream(tmp_path, [40] * 10)
    log.sync()
    assert log.retain(2000, None, 0) > 0 and log.first_offset > 0
    queue: Any = SimpleNamespace(chunk_cache=ChunkCache())
    reader = log.reader(0)
    reader.offset = 0  # as it was before retention took its segment
    sub = Subscription(1, queue, reader, 10, {})
    upto = log.first_offset + 7
    got = [_records(c) for c in _chunks(sub, 10_000, upto)]
    assert [b for _, bs in got for b in bs] == [b"m%06d" % i
                                                for i in range(log.first_offset, upto)]


def test_reads_ending_inside_a_record_deliver_every_record_once(tmp_path: Path) -> None:
    """One stored chunk of records of mixed sizes, several reads long: each read ends
    inside a record, which the next read takes whole; every record is delivered once,
    in order, with its own size field."""
    log = StreamLog(tmp_path, max_segment_bytes=50_000_000)
    log.open()
    payloads = [bytes([i % 251]) * (90 + (i // 50) % 3 * 41) for i in range(6000)]
    log.append_many(payloads, 1000, AMQP10)
    log.flush()
    sub = Subscription(1, SimpleNamespace(chunk_cache=ChunkCache()), log.reader(0), 10,
                       {})
    got: list[bytes] = []
    for chunk in _chunks(sub, 65_536):
        first, records = _records(chunk)
        assert first == len(got)
        got += records
    assert got == payloads
