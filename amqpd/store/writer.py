"""The one writer thread: write, fsync, and answer every waiting commit at once.

Group commit (DESIGN.md "Hot path"): the event-loop thread gathers records in a
bytearray and hands over one *chunk* (many records) per commit, as a job on a
``collections.deque`` (append/popleft are atomic, no lock on the hot path). Jobs are
processed strictly in order, so a commit callback queued after some records is
answered only after those records are written (and fsync'd in ``"batch"`` mode)::

    loop thread                           writer thread
    -----------                           -------------
    WRITE(base, pos, chunk)  --+          wake (commit / backlog / close)
    WRITE(...)                 |  deque   take the jobs present now:
    COMMIT([callbacks]) -------+------->    WRITE: coalesce per segment, pwrite
    CHECKPOINT(covered, data,  |            CHECKPOINT/DELETE: flush+fsync first
      definitions)             |              (and encode the definitions part)
    DELETE(base)               |          fsync dirty segments once   <- group commit
    STOP  ---------------------+          loop.call_soon_threadsafe(fire all callbacks)

Errors: the first OSError (ENOSPC, EIO...) puts the writer in the *failed* state.
The segment being written is cut back to its last good size (``Segment.append``),
every callback of the batch and every later one receives a :class:`StoreError`, and
every later WRITE is discarded, because writing past a hole would put garbage in
the middle of a segment. So what is on disk is always a clean prefix of each
segment. Discarded SETTLE/DELIVERED/DROP_QUEUE/DEFINITION records are kept in
:attr:`Writer.discarded` so the log can re-append them once it has re-opened itself
from disk (ENQUEUEs are not: their commits failed, the publisher was nacked). A failed
writer is never reused: the log stops it and starts a new one.

Replication (amqpd/replication/source.py) watches through :attr:`Writer.observer`:
called on this thread with a list of events, as soon as written bytes are in the
files (before their fsync, so a standby's fsync runs in parallel with ours) and after
checkpoints and deletions: ``("w", base, size, last_seq)`` segment ``base`` now holds
``size`` bytes of whole records up to sequence ``last_seq``; ``("c", covered, data)`` a
checkpoint file with these bytes is durable; ``("d", base)`` the segment was deleted.
The observer may return a function for the event loop that can wait for the batch's
fsync: the writer then runs it on the loop just before that batch's callbacks, with the
same ``call_soon_threadsafe`` (at once when the batch has none), so a group commit
wakes the loop once, not twice.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqpd.store import checkpoint
from amqpd.store import format as fmt
from amqpd.store.api import StoreError
from amqpd.store.segment import Segment, fsync_directory

log = logging.getLogger("amqpd.store")

Callback = Callable[[BaseException | None], None]
Later = Callable[[], None]  # loop work an observer lets wait for the batch's fsync

# job kinds (first tuple element)
WRITE = 0  # (WRITE, base, position, chunk, last_seq): whole records from position on
COMMIT = 1  # (COMMIT, [callbacks][, direct]): direct = call on this thread, not the loop
CHECKPOINT = 2  # (CHECKPOINT, covered, index data[, definitions]): see checkpoint.finish
DELETE = 3  # (DELETE, base)
STOP = 5  # (STOP,)

_KEEP_ON_FAILURE = (2, 3, 4, 32)  # format.SETTLE, DELIVERED, DROP_QUEUE, DEFINITION
_TYPE_OFFSET = 16  # record header: crc u32, length u32, sequence u64, type u8


def fire(callbacks: list[tuple[Callback, BaseException | None]]) -> None:
    """Run commit callbacks; one that raises must not starve the others."""
    for cb, exc in callbacks:
        try:
            cb(exc)
        except Exception:
            log.exception("store commit callback failed")


def fire_after(later: list[Later], callbacks: list[tuple[Callback, BaseException | None]]
               ) -> None:
    """Run the observer's deferred loop work, then the batch's commit callbacks (which
    may read what that work records)."""
    for fn in later:
        try:
            fn()
        except Exception:
            log.exception("store observer's deferred work failed")
    fire(callbacks)


class Writer:
    """Owns the segment files for writing. Started by ``SharedLog.open``."""

    def __init__(
        self,
        directory: Path,
        segments: dict[int, Segment],
        pending: dict[int, bytes],
        *,
        sync: bool,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.directory = directory
        self.segments = segments  # shared with the loop thread (reads)
        self.pending = pending  # chunk position -> chunk, popped once written (reads)
        self.sync = sync
        self.loop = loop
        self.jobs: collections.deque[tuple[Any, ...]] = collections.deque()
        self.wake = threading.Event()
        self.failed: str | None = None
        self.failed_at = 0.0
        self.discarded: list[bytes] = []  # records not written because of the failure
        self.checkpoint_durable = -1  # covered position of the last durable checkpoint
        # the sequence of the last record written (this thread), and of the last one
        # known durable: set after a good fsync, before that batch's callbacks are
        # answered; the log's commit reads it (an int, swapped whole) to answer at once
        # when nothing was appended since (SharedLog.commit)
        self.written_seq = -1
        self.durable_seq = -1
        self.fsyncs = 0
        self.fsync_last_us = 0
        self.fsync_total_us = 0
        self.records_bytes = 0
        self.checkpoints = 0
        self.observer: Callable[[list[tuple[Any, ...]]], Later | None] | None = None
        self._events: list[tuple[Any, ...]] = []
        self._later: list[Later] = []  # what the observer left for this batch's delivery
        self._dirty: set[Segment] = set()
        self._thread = threading.Thread(target=self._run, name="amqpd-store-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.jobs.append((STOP,))
        self.wake.set()
        self._thread.join()

    # -- thread body ----------------------------------------------------------------

    def _run(self) -> None:
        jobs = self.jobs
        while True:
            self.wake.wait()
            self.wake.clear()
            # Take what is there now, not what keeps arriving: a busy publisher must not
            # keep the batch open (and every confirm in it waiting) indefinitely.
            batch = [jobs.popleft() for _ in range(len(jobs))]
            if not batch:
                continue
            stop = self._process(batch)
            if stop:
                return

    def _process(self, batch: list[tuple[Any, ...]]) -> bool:
        callbacks: list[tuple[Callback, BaseException | None]] = []
        direct: list[tuple[Callback, BaseException | None]] = []
        pending: list[tuple[Any, ...]] = []  # WRITE jobs not yet written
        stop = False
        for job in batch:
            kind = job[0]
            if kind == WRITE:
                if self.failed is None:
                    pending.append(job)
                else:
                    self._discard(job[3])
                continue
            if kind == COMMIT:
                (direct if len(job) > 2 else callbacks).extend((cb, None) for cb in job[1])
                continue
            # CHECKPOINT, DELETE, STOP: everything before must be on disk first.
            self._flush(pending)
            pending = []
            self._fsync()
            if kind == CHECKPOINT:
                data = job[2] if len(job) < 4 else checkpoint.finish(job[2], job[3])
                self._checkpoint(job[1], data)
            elif kind == DELETE:
                self._delete(job[1])
            else:
                stop = True
        self._flush(pending)
        self._notify()
        if callbacks or direct or stop:
            self._fsync()
            if self.failed is None:
                self.durable_seq = self.written_seq
        self._answer_failed(callbacks)
        self._answer_failed(direct)
        later, self._later = self._later, []
        if callbacks or later:
            self._deliver(callbacks, later)
        fire(direct)
        return stop

    def _answer_failed(self, callbacks: list[tuple[Callback, BaseException | None]]) -> None:
        if self.failed is not None:
            err = StoreError(self.failed)
            callbacks[:] = [(cb, err) for cb, _ in callbacks]

    def _deliver(self, callbacks: list[tuple[Callback, BaseException | None]],
                 later: list[Later]) -> None:
        if self.loop is None:
            fire_after(later, callbacks)
            return
        try:
            if later:
                self.loop.call_soon_threadsafe(fire_after, later, callbacks)
            else:
                self.loop.call_soon_threadsafe(fire, callbacks)
        except RuntimeError:  # loop closed during shutdown: nobody is waiting any more
            pass

    def _fail(self, what: str, exc: OSError) -> None:
        if self.failed is None:
            self.failed = f"{what}: {exc}"
            self.failed_at = time.monotonic()
            log.error("store %s failed, refusing writes until retry: %s", what, exc)

    def _segment(self, base: int) -> Segment:
        seg = self.segments.get(base)
        if seg is None:
            seg = Segment.create(self.directory, base)
            self.segments[base] = seg
            if self.sync:
                seg.fsync()
                fsync_directory(self.directory)
        return seg

    def _flush(self, pending: list[tuple[Any, ...]]) -> None:
        """Write WRITE jobs, one pwrite per contiguous run within a segment."""
        i, n = 0, len(pending)
        while i < n and self.failed is None:
            base = pending[i][1]
            j = i
            parts = []
            while j < n and pending[j][1] == base:
                parts.append(pending[j][3])
                j += 1
            try:
                seg = self._segment(base)
                expected = pending[i][2] - base
                if seg.size != expected:
                    raise OSError(f"segment {base} is {seg.size} bytes, next write at {expected}")
                seg.append(b"".join(parts) if len(parts) > 1 else parts[0])
            except OSError as exc:
                self._fail("write", exc)
                for k in range(i, n):
                    self._discard(pending[k][3])
                return
            self._dirty.add(seg)
            self.written_seq = pending[j - 1][4]
            for k in range(i, j):
                self.pending.pop(pending[k][2], None)
                self.records_bytes += len(pending[k][3])
            if self.observer is not None:
                self._events.append(("w", base, seg.size, pending[j - 1][4]))
            i = j

    def _notify(self) -> None:
        """Hand the events gathered so far to the observer (replication)."""
        if self._events and self.observer is not None:
            events, self._events = self._events, []
            try:
                later = self.observer(events)
            except Exception:
                log.exception("store observer failed")
                return
            if later is not None:
                self._later.append(later)

    def _discard(self, chunk: bytes) -> None:
        """Keep the settle-type records of a chunk that will not be written."""
        offset = 0
        while offset < len(chunk):
            try:
                _, _, _, end = fmt.decode_record(chunk, offset)
            except fmt.FormatError:  # cannot happen: we framed it ourselves
                return
            if chunk[offset + _TYPE_OFFSET] in _KEEP_ON_FAILURE:
                self.discarded.append(chunk[offset:end])
            offset = end

    def _fsync(self) -> None:
        if not self._dirty or self.failed is not None:
            return
        if not self.sync:
            self._dirty.clear()
            return
        t0 = time.perf_counter()
        try:
            for seg in self._dirty:
                if seg.fd >= 0:
                    seg.fsync()
        except OSError as exc:
            self._fail("fsync", exc)
            return
        self._dirty.clear()
        us = int((time.perf_counter() - t0) * 1e6)
        self.fsyncs += 1
        self.fsync_last_us = us
        self.fsync_total_us += us

    def _checkpoint(self, covered: int, data: bytes) -> None:
        if self.failed is not None:
            return  # the log is not durable up to `covered`
        try:
            checkpoint.write_atomic(self.directory, data, sync=self.sync)
        except OSError as exc:
            # Not fatal for the log: recovery uses the previous checkpoint.
            log.error("store checkpoint at %d failed: %s", covered, exc)
            return
        self.checkpoints += 1
        self.checkpoint_durable = covered
        if self.observer is not None:
            self._events.append(("c", covered, data))
            self._notify()

    def _delete(self, base: int) -> None:
        if self.failed is not None:
            return  # records before this job may not be durable; keep the file
        seg = self.segments.pop(base, None)
        if seg is None:
            return
        self._dirty.discard(seg)
        try:
            seg.unlink()
        except OSError as exc:
            log.error("store could not delete segment %s: %s", seg.path, exc)
        if self.observer is not None:
            self._events.append(("d", base))
            self._notify()
