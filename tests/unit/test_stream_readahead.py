"""Stream consumers' read-ahead (amqpd.broker.stream_readahead): readers behind read in a
worker within the node's bounds (reads in flight, bytes read ahead, one batch per
consumer), readers at the tail read in place, and every reader gets exactly its range
in order, also when a consumer gives records back."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpd.broker.stream_readahead import ReadAhead, ReadAheadPool
from amqpd.store.stream_log import RECORD_SIZE, Reader, Record, StreamLog, parse_records

N = 3020  # 10 full 64 KiB segments of 300 records, then 20 in the active one
PAYLOAD = 200


@pytest.fixture
def log_(tmp_path: Path) -> Iterator[StreamLog]:
    sl = StreamLog(tmp_path / "s", max_segment_bytes=64 * 1024)
    sl.open()
    for i in range(N):
        sl.append(i.to_bytes(4, "big") * (PAYLOAD // 4), 1000 + i)
        if i % 50 == 49:
            sl.flush()
    sl.flush()
    # as where the page cache cannot be asked: every read behind goes to a worker (the
    # tests of reads from the page cache on the loop turn it back on)
    sl.nowait = False
    yield sl
    sl.close()


def _drain(readers: dict[int, ReadAhead], pool: ReadAheadPool, want: dict[int, int],
           got: dict[int, list[Record]], credit: int) -> None:
    """Run the loop until every reader has its ``want`` records, taking ``credit`` at a
    time from each (as a consumer's prefetch would), checking the bounds each turn."""
    loop = pool.loop
    assert loop is not None

    async def run() -> None:
        for _ in range(20_000):  # bounded: each turn moves at least one batch or waits
            for key, ra in readers.items():
                if len(got[key]) < want[key]:
                    got[key] += ra.next_batch(min(credit, want[key] - len(got[key])))
                assert ra.buffered <= pool.batch_records
            assert pool.inflight <= pool.max_inflight
            assert pool.used_bytes <= pool.budget_bytes
            if all(len(got[k]) >= want[k] for k in readers):
                return
            await asyncio.sleep(0.001)
        raise AssertionError("readers did not finish")

    loop.run_until_complete(asyncio.wait_for(run(), 60))


class _ThreadSpy:
    """The log as a ReadAhead sees it, noting the thread of every ``read_shared_raw`` (the
    method of a compiled StreamLog cannot be replaced on the instance)."""

    def __init__(self, log_: StreamLog, threads: set[str]) -> None:
        self._log = log_
        self._threads = threads

    def __getattr__(self, name: str) -> object:
        return getattr(self._log, name)

    def read_shared_raw(self, reader: Reader, records: int, nbytes: int) -> tuple[bytes, int]:
        self._threads.add(threading.current_thread().name)
        return self._log.read_shared_raw(reader, records, nbytes)


def test_readers_behind_read_in_a_worker_within_the_bounds(log_: StreamLog) -> None:
    loop = asyncio.new_event_loop()
    try:
        pool = ReadAheadPool(loop, max_inflight=2, budget_bytes=4 * 8 * 1024,
                             batch_records=32, batch_bytes=8 * 1024)
        threads: set[str] = set()
        spy = _ThreadSpy(log_, threads)
        woken: set[int] = set()
        starts = {k: k * 97 for k in range(30)}  # 30 consumers at different offsets
        readers = {k: ReadAhead(log_, start, pool, functools.partial(woken.add, k))
                   for k, start in starts.items()}
        for ra in readers.values():
            ra.log = spy  # type: ignore[assignment]
        got: dict[int, list[Record]] = {k: [] for k in readers}
        want = {k: N - starts[k] for k in readers}
        _drain(readers, pool, want, got, credit=50)
        assert woken == set(readers)  # each was woken by a landed batch
        for k, records in got.items():
            assert [r.offset for r in records] == list(range(starts[k], N)), k
            assert all(r.payload == r.offset.to_bytes(4, "big") * (PAYLOAD // 4)
                       for r in records)
        assert pool.reads > 0 and threads and threading.main_thread().name not in threads
        assert pool.used_bytes == 0 and pool.inflight == 0
    finally:
        loop.close()


def test_a_reader_at_the_tail_reads_in_place(log_: StreamLog) -> None:
    loop = asyncio.new_event_loop()
    try:
        pool = ReadAheadPool(loop)
        ra = ReadAhead(log_, N - 10, pool, lambda: None)
        first = ra.next_batch(5)  # not positioned yet: counts as behind, one worker read
        assert first == [] and ra.loading
        _settle(loop, ra)
        assert [r.offset for r in ra.next_batch(5)] == list(range(N - 10, N - 5))
        assert pool.reads == 1
        # buffer drained, positioned in the active segment near its end: in place
        assert [r.offset for r in ra.next_batch(100)] == list(range(N - 5, N))
        assert ra.next_batch(5) == [] and not ra.loading and pool.reads == 1
        log_.append(b"new", 1)
        log_.flush()
        assert [r.offset for r in ra.next_batch(5)] == [N] and pool.reads == 1
    finally:
        loop.close()


def test_records_given_back_come_first_and_the_budget_follows(log_: StreamLog) -> None:
    loop = asyncio.new_event_loop()
    try:
        pool = ReadAheadPool(loop, batch_records=20, batch_bytes=64 * 1024)
        ra = ReadAhead(log_, 0, pool, lambda: None)
        assert ra.next_batch(10) == []  # behind: one worker read of the credit asked
        _settle(loop, ra)
        assert ra.buffered == 10 and pool.used_bytes == 10 * PAYLOAD
        taken = ra.next_batch(4)
        assert [r.offset for r in taken] == [0, 1, 2, 3]
        assert pool.used_bytes == 6 * PAYLOAD
        ra.unread(taken[1:])  # the consumer took one, then stalled
        assert pool.used_bytes == 9 * PAYLOAD and ra.offset == 1
        assert [r.offset for r in ra.next_batch(20)] == list(range(1, 10))
        assert pool.used_bytes == 0
        ra.next_batch(3)
        ra.close()  # gone with a read in flight: dropped when it lands
        _settle(loop, ra)
        assert pool.used_bytes == 0 and ra.buffered == 0 and pool.inflight == 0
    finally:
        loop.close()


def test_without_a_loop_everything_reads_in_place(log_: StreamLog) -> None:
    ra = ReadAhead(log_, 100, None, lambda: None)
    assert [r.offset for r in ra.next_batch(7)] == list(range(100, 107))


def _settle(loop: asyncio.AbstractEventLoop, ra: ReadAhead) -> None:
    """Run the loop until ``ra``'s read in flight has landed (bounded)."""
    async def run() -> None:
        for _ in range(5000):
            if not ra.loading:
                return
            await asyncio.sleep(0.001)
        raise AssertionError("read-ahead did not land")

    loop.run_until_complete(run())


def test_peek_and_take_hand_out_stored_records_and_the_budget_follows(log_: StreamLog) -> None:
    loop = asyncio.new_event_loop()
    try:
        pool = ReadAheadPool(loop, batch_records=20, batch_bytes=64 * 1024)
        ra = ReadAhead(log_, 100, pool, lambda: None)
        assert ra.peek(10)[2] == 0  # behind: one worker read of the credit asked
        _settle(loop, ra)
        data, at, n = ra.peek(10)
        assert n == 10 == ra.buffered and pool.used_bytes == 10 * PAYLOAD
        records = parse_records(data[at:])
        assert [r.offset for r in records] == list(range(100, 110))
        # the consumer took three: the next one is where the fourth is stored
        third = at + 3 * (RECORD_SIZE + PAYLOAD)
        ra.take(3, third)
        assert ra.offset == 103 and pool.used_bytes == 7 * PAYLOAD
        data, at, n = ra.peek(10)
        assert (at, n) == (third, 7)
        ra.take(7, len(data))
        assert ra.buffered == 0 and pool.used_bytes == 0 and ra.offset == 110
        ra.close()
    finally:
        loop.close()


def test_readers_behind_read_what_the_page_cache_holds_on_the_loop(log_: StreamLog) -> None:
    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no preadv RWF_NOWAIT on this platform: readers behind use workers")
    log_.nowait = True
    loop = asyncio.new_event_loop()
    try:
        pool = ReadAheadPool(loop, batch_records=32, batch_bytes=8 * 1024)
        starts = {k: k * 97 for k in range(10)}
        readers = {k: ReadAhead(log_, start, pool, lambda: None) for k, start in starts.items()}
        got: dict[int, list[Record]] = {k: [] for k in readers}
        _drain(readers, pool, {k: N - starts[k] for k in readers}, got, credit=50)
        if not log_.nowait:
            pytest.skip("this file system refuses RWF_NOWAIT reads")
        for k, records in got.items():
            assert [r.offset for r in records] == list(range(starts[k], N)), k
        assert pool.reads == 0 and pool.used_bytes == 0  # no worker was needed
    finally:
        loop.close()


def test_a_reader_behind_goes_to_a_worker_when_the_page_cache_lacks_its_records(
        log_: StreamLog) -> None:
    if not hasattr(os, "RWF_NOWAIT") or not hasattr(os, "posix_fadvise"):
        pytest.skip("no preadv RWF_NOWAIT or posix_fadvise on this platform")
    log_.nowait = True
    log_.sync()  # clean pages, so the kernel may drop them
    for seg in log_.segments:
        os.posix_fadvise(seg.fd, 0, 0, os.POSIX_FADV_DONTNEED)
    first = log_.segments[0]
    try:
        os.preadv(first.fd, [bytearray(4096)], 4096, os.RWF_NOWAIT)
        pytest.skip("the kernel kept the pages cached (cannot test a cold read here)")
    except BlockingIOError:
        pass
    except OSError:
        pytest.skip("this file system refuses RWF_NOWAIT reads")
    loop = asyncio.new_event_loop()
    try:
        pool = ReadAheadPool(loop, batch_records=32, batch_bytes=8 * 1024)
        # a segment's first record: found without reading a record header
        start = log_.segments[1].base
        ra = ReadAhead(log_, start, pool, lambda: None)
        assert ra.peek(10) == (b"", 0, 0) and ra.loading  # not cached: a worker reads
        _settle(loop, ra)
        assert pool.reads == 1
        assert [r.offset for r in ra.next_batch(10)] == list(range(start, start + 10))
    finally:
        loop.close()
