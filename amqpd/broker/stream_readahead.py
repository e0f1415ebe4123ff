"""Stream consumers' disk reads off the event loop: a reader far behind reads in a worker.

A stream consumer reads its records from the stream's segment files
(:class:`amqpd.store.stream_log.Reader`, one ``pread`` per batch). At the tail the pages
were just written and sit in the page cache, so the read is a memory copy; far behind,
on a cold cache, a ``pread`` waits for the disk, and on the event-loop thread that wait
stalls every connection of the node. So each consumer's position is a
:class:`ReadAhead`:

* A reader at the tail (nothing left to read, or within :data:`TAIL_BYTES` of the end of
  the active segment) reads in place, on the loop, as before: cheaper than a thread hop.
* A reader behind first reads what the page cache holds, in place too, without waiting
  for the disk (``preadv`` with ``RWF_NOWAIT``: :meth:`Reader.read_raw` with a scratch
  buffer); a thread hop per batch cost more than the read (a profile of 5 consumers
  replaying a stream put ~15 % of the loop's busy time in handing reads to workers and
  taking their results back). Only when the page cache does not hold its next record
  (or the platform cannot tell) does it ask the node's :class:`ReadAheadPool` for one
  batch (at most the consumer's credit, :data:`BATCH_RECORDS` records and about
  :data:`BATCH_BYTES` bytes).
  The pool runs at most :data:`MAX_INFLIGHT` reads at once in the loop's default
  executor, and starts one only while the bytes read ahead and not yet delivered, over
  every consumer of every stream, stay within :data:`BUDGET_BYTES`. The batch lands on
  the loop, into the consumer's buffer, and the stream dispatches it.
* A batch stays as the file stores it (one ``bytes``, :meth:`Reader.read_raw`): the
  stream's delivery loop cuts each message from it (:mod:`amqpd.broker.stream_records`,
  :meth:`ReadAhead.peek` and :meth:`ReadAhead.take`), with no Python object per record
  on the way; :meth:`ReadAhead.next_batch` makes :class:`Record` objects for readers
  that want them.

Memory: a consumer buffers at most one batch, and all of them together at most the
budget (plus one record larger than a batch per read in flight), so the node's memory
is flat in the number of consumers; a reader waiting for its turn holds only its
place in the pool's queue. Order: while a batch is in flight or buffered, the reader
is not read anywhere else, so records come out in offset order with no gap or repeat.
The worker holds the log's lock for its read (:meth:`StreamLog.read_shared_raw`), so
retention and close never close a file under it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Callable

from amqpd.store.stream_log import (
    AMQP10,
    RECORD_SIZE,
    Reader,
    Record,
    StreamLog,
    encode_record,
    parse_records,
)

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
        # where a reader behind reads what the page cache holds, on the loop (one for
        # every reader: the loop runs one read at a time)
        self.scratch = bytearray(batch_bytes)
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
        future = self.loop.run_in_executor(None, ra.log.read_shared_raw, ra.reader, records,
                                           self.batch_bytes)

        def done(fut: asyncio.Future[tuple[bytes, int]]) -> None:
            self.inflight -= 1
            error = fut.exception()
            if error is not None:
                ra.loading = False
                if not ra.closed:
                    log.error("stream read-ahead at offset %d failed: %s", ra.reader.offset,
                              error)
                self._pump()
                return
            data, n = fut.result()
            ra.landed(data, n)
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
    """One consumer's position in a stream: its reader, and the records read ahead for
    it and not yet delivered, kept as the file stores them (``_block`` from ``_at`` on,
    ``_count`` records: no Python object per record until one is delivered). ``wake``
    is called on the loop when a batch lands."""

    __slots__ = ("_at", "_block", "_count", "_pooled", "closed", "loading", "log", "pool",
                 "reader", "wake")

    def __init__(self, log_: StreamLog, offset: int, pool: ReadAheadPool | None,
                 wake: Callable[[], None]) -> None:
        self.log = log_
        self.reader: Reader = log_.reader(offset)
        self.pool = pool
        self.wake = wake
        self.loading = False
        self.closed = False
        self._block = b""
        self._at = 0
        self._count = 0
        # the block came from a worker (or was given back) and its payload bytes are
        # counted in the pool's budget until delivered
        self._pooled = False

    @property
    def offset(self) -> int:
        """The next offset this consumer gets."""
        if self._count:
            return int.from_bytes(self._block[self._at + 8:self._at + 16], "big")
        return self.reader.offset

    @property
    def buffered(self) -> int:
        """Records read ahead and not yet delivered."""
        return self._count

    def at_tail(self) -> bool:
        """Reading in place is cheap: nothing to read yet, or the rest is near the end
        of the active segment (recently written, in the page cache)."""
        if self.reader.offset >= self.log.flushed_offset:
            return True
        behind = self.reader.bytes_to_end()
        return behind is not None and behind <= TAIL_BYTES

    def peek(self, records: int) -> tuple[bytes, int, int]:
        """``(data, at, n)``: the next ``n`` records in order, stored in ``data`` from
        position ``at`` on, not yet taken (:meth:`take`). The buffered ones, else up to
        ``records`` read in place at the tail; a reader behind gets ``n == 0`` and a
        read-ahead is queued (``wake`` follows)."""
        if self._count:
            return self._block, self._at, self._count
        if self.loading:
            return b"", 0, 0
        pool = self.pool
        if pool is None or self.at_tail():
            data, n = self.reader.read_raw(records)
        else:  # behind: in place too if the page cache has it, else in a worker
            data, n = self.reader.read_raw(records, pool.batch_bytes, pool.scratch)
            if n < 0:
                pool.request(self, records)
                return b"", 0, 0
        if n:
            self._block, self._at, self._count, self._pooled = data, 0, n, False
        return data, 0, n

    def take(self, n: int, at: int) -> None:
        """The consumer took the first ``n`` records of :meth:`peek`; the next one is
        at position ``at``."""
        if not n:
            return
        if self._pooled:
            self._release(at - self._at - n * RECORD_SIZE)
        self._count -= n
        if self._count:
            self._at = at
        else:
            self._block, self._at = b"", 0

    def next_batch(self, records: int) -> list[Record]:
        """Up to ``records`` records in order, as :class:`Record` objects (for readers
        that want them: a cluster member's consumers); see :meth:`peek`."""
        data, at, n = self.peek(records)
        n = min(n, records)
        end = at
        for _ in range(n):
            end += RECORD_SIZE + int.from_bytes(data[end + 4:end + 8], "big")
        out = parse_records(data[at:end]) if n else []
        self.take(n, end)
        return out

    def unread(self, records: list[Record]) -> None:
        """Put back records the consumer could not take (they come first next time)."""
        if not records:
            return
        data = b"".join(encode_record(r.offset, r.timestamp, r.chunk_start, r.payload,
                                      AMQP10 if r.amqp10 else 0) for r in records)
        if not self._count:
            self._pooled = self.pool is not None
        if self._pooled:
            self._charge(sum(len(r.payload) for r in records))
        self._block = data + self._block[self._at:]
        self._at = 0
        self._count += len(records)

    def landed(self, data: bytes, n: int) -> None:
        """A worker read finished (on the loop): buffer it and wake the stream."""
        self.loading = False
        if self.closed or not n:
            return
        self._charge(len(data) - n * RECORD_SIZE)
        if self._count:  # records given back meanwhile come first
            if not self._pooled:
                self._charge(self._payload_left())
            data = self._block[self._at:] + data
        self._block, self._at, self._count, self._pooled = data, 0, self._count + n, True
        self.wake()

    def close(self) -> None:
        """The consumer went: drop what was read ahead (a read in flight is dropped when
        it lands)."""
        self.closed = True
        if self._count and self._pooled:
            self._release(self._payload_left())
        self._block, self._at, self._count = b"", 0, 0

    def _payload_left(self) -> int:
        """Payload bytes of the records buffered (what the pool's budget counts)."""
        return len(self._block) - self._at - self._count * RECORD_SIZE

    def _charge(self, nbytes: int) -> None:
        if self.pool is not None:
            self.pool.used_bytes += nbytes

    def _release(self, nbytes: int) -> None:
        if self.pool is not None and nbytes:
            self.pool.release(nbytes)


__all__ = ["BATCH_BYTES", "BATCH_RECORDS", "BUDGET_BYTES", "MAX_INFLIGHT", "TAIL_BYTES",
           "ReadAhead", "ReadAheadPool", "pool_for"]
