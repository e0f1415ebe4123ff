"""Stream consumers' disk reads off the event loop: a reader far behind reads in a worker.

A stream consumer reads its records from the stream's segment files
(:class:`amqpd.store.stream_log.Reader`, one ``pread`` per batch). At the tail the pages
were just written and sit in the page cache, so the read is a memory copy; far behind,
on a cold cache, a ``pread`` waits for the disk, and on the event-loop thread that wait
stalls every connection of the node. So each consumer's position is a
:class:`ReadAhead`:

* A reader at the tail (nothing left to read, or within :data:`TAIL_BYTES` of the end of
  the active segment) reads in place, on the loop, as before: cheaper than a thread hop.
* A reader behind asks the node's :class:`ReadAheadPool` for one batch (at most the
  consumer's credit, :data:`BATCH_RECORDS` records and about :data:`BATCH_BYTES` bytes).
  The pool runs at most :data:`MAX_INFLIGHT` reads at once in the loop's default
  executor, and starts one only while the bytes read ahead and not yet delivered, over
  every consumer of every stream, stay within :data:`BUDGET_BYTES`. The batch lands on
  the loop, into the consumer's buffer, and the stream dispatches it.

Memory: a consumer buffers at most one batch, and all of them together at most the
budget (plus one record larger than a batch per read in flight), so the node's memory
is flat in the number of consumers; a reader waiting for its turn holds only its
place in the pool's queue. Order: while a batch is in flight or buffered, the reader
is not read anywhere else, so records come out in offset order with no gap or repeat.
The worker holds the log's lock for its read (:meth:`StreamLog.read_shared`), so
retention and close never close a file under it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Callable

from amqpd.store.stream_log import Reader, Record, StreamLog

log = logging.getLogger("amqpd.stream")

TAIL_BYTES = 1024 * 1024  # within this of the active segment's end: read in place
BATCH_RECORDS = 128  # records one read-ahead fetches at most
BATCH_BYTES = 64 * 1024  # and about this many bytes (one pread)
MAX_INFLIGHT = 2  # worker reads under way at once, node-wide
BUDGET_BYTES = 8 * 1024 * 1024  # bytes read ahead and not yet delivered, node-wide


class ReadAheadPool:
    """The node's worker reads for stream consumers behind: a queue of consumers waiting
    for a read, at most ``max_inflight`` reads at once, and a byte budget for what was
    read and not yet delivered (module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, *,
                 max_inflight: int = MAX_INFLIGHT, budget_bytes: int = BUDGET_BYTES,
                 batch_records: int = BATCH_RECORDS, batch_bytes: int = BATCH_BYTES) -> None:
        self.loop = loop
        self.max_inflight = max_inflight
        self.budget_bytes = budget_bytes
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.inflight = 0
        self.used_bytes = 0  # read ahead, not yet delivered
        self.reads = 0  # worker reads started (for tests and curiosity)
        self._waiting: deque[tuple[ReadAhead, int]] = deque()

    def request(self, ra: ReadAhead, records: int) -> None:
        """Queue a read of up to ``records`` for ``ra`` (its buffer is empty)."""
        ra.loading = True
        self._waiting.append((ra, records))
        self._pump()

    def release(self, nbytes: int) -> None:
        """``nbytes`` of read-ahead were delivered or dropped: room for the next read."""
        self.used_bytes -= nbytes
        self._pump()

    def _pump(self) -> None:
        while (self._waiting and self.inflight < self.max_inflight
               and self.used_bytes + self.inflight * self.batch_bytes + self.batch_bytes
               <= self.budget_bytes):
            ra, records = self._waiting.popleft()
            if ra.closed:
                continue
            self._start(ra, min(records, self.batch_records))

    def _start(self, ra: ReadAhead, records: int) -> None:
        assert self.loop is not None
        self.inflight += 1
        self.reads += 1
        future = self.loop.run_in_executor(None, ra.log.read_shared, ra.reader, records,
                                           self.batch_bytes)

        def done(fut: asyncio.Future[list[Record]]) -> None:
            self.inflight -= 1
            error = fut.exception()
            if error is not None:
                ra.loading = False
                if not ra.closed:
                    log.error("stream read-ahead at offset %d failed: %s", ra.reader.offset,
                              error)
                self._pump()
                return
            ra.landed(fut.result())
            self._pump()

        future.add_done_callback(done)


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadAheadPool] = \
    weakref.WeakKeyDictionary()


def pool_for(loop: asyncio.AbstractEventLoop | None) -> ReadAheadPool | None:
    """The node's pool (one per event loop); None without a loop (everything in place)."""
    if loop is None:
        return None
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = ReadAheadPool(loop)
    return pool


class ReadAhead:
    """One consumer's position in a stream: its reader, and the batch read ahead for it
    and not yet delivered. ``wake`` is called on the loop when a batch lands."""

    __slots__ = ("_buffer", "_buffered_bytes", "closed", "loading", "log", "pool", "reader",
                 "wake")

    def __init__(self, log_: StreamLog, offset: int, pool: ReadAheadPool | None,
                 wake: Callable[[], None]) -> None:
        self.log = log_
        self.reader: Reader = log_.reader(offset)
        self.pool = pool
        self.wake = wake
        self.loading = False
        self.closed = False
        self._buffer: deque[Record] = deque()
        self._buffered_bytes = 0

    @property
    def offset(self) -> int:
        """The next offset this consumer gets."""
        return self._buffer[0].offset if self._buffer else self.reader.offset

    @property
    def buffered(self) -> int:
        """Records read ahead and not yet delivered."""
        return len(self._buffer)

    def at_tail(self) -> bool:
        """Reading in place is cheap: nothing to read yet, or the rest is near the end
        of the active segment (recently written, in the page cache)."""
        if self.reader.offset >= self.log.flushed_offset:
            return True
        behind = self.reader.bytes_to_end()
        return behind is not None and behind <= TAIL_BYTES

    def next_batch(self, records: int) -> list[Record]:
        """Up to ``records`` records in order: from the buffer, else read in place at the
        tail; a reader behind gets [] and a read-ahead is queued (``wake`` follows)."""
        if self._buffer:
            n = min(records, len(self._buffer))
            out = [self._buffer.popleft() for _ in range(n)]
            self._charge(-sum(len(r.payload) for r in out))
            return out
        if self.loading:
            return []
        if self.pool is None or self.at_tail():
            return self.reader.read(records)
        self.pool.request(self, records)
        return []

    def unread(self, records: list[Record]) -> None:
        """Put back records the consumer could not take (they come first next time)."""
        self._buffer.extendleft(reversed(records))
        self._charge(sum(len(r.payload) for r in records))

    def landed(self, records: list[Record]) -> None:
        """A worker read finished (on the loop): buffer it and wake the stream."""
        self.loading = False
        if self.closed:
            return
        self._buffer.extend(records)
        self._charge(sum(len(r.payload) for r in records), pump=False)
        if records:
            self.wake()

    def close(self) -> None:
        """The consumer went: drop what was read ahead (a read in flight is dropped when
        it lands)."""
        self.closed = True
        self._buffer.clear()
        self._charge(-self._buffered_bytes)

    def _charge(self, nbytes: int, pump: bool = True) -> None:
        self._buffered_bytes += nbytes
        if self.pool is not None and nbytes:
            if nbytes < 0 and pump:
                self.pool.release(-nbytes)
            else:
                self.pool.used_bytes += nbytes


__all__ = ["BATCH_BYTES", "BATCH_RECORDS", "BUDGET_BYTES", "MAX_INFLIGHT", "TAIL_BYTES",
           "ReadAhead", "ReadAheadPool", "pool_for"]
