"""SharedLog: the node-wide segmented log behind :class:`~amqpd.store.api.MessageStore`.

Theory of operation
-------------------
Everything a node persists is one append-only log, cut into segment files
(``<base:020d>.log``, see ``segment.py``; record layout in ``format.py``). A queue is
only an index over it (``index.py``). Two threads touch the log:

* the **event-loop thread** calls ``append_*``. Each call encodes one record, gives it
  the next position (= global byte offset; the log rolls to a new segment here, so
  positions are known at once), applies it to the in-memory index and adds it to a
  bytearray. ``commit`` only remembers the callback; at the end of the tick
  (``loop.call_soon``) the bytearray goes to the writer as one chunk followed by all
  of the tick's callbacks as one job (also every 1 MiB). No I/O, no lock, no fsync.
* the **writer thread** (``writer.py``) writes what is queued and, when a
  :meth:`commit` is waiting, fsyncs once for everybody (group commit), then hands the
  callbacks back with ``loop.call_soon_threadsafe``.

::

    loop thread                                          writer thread
    append_enqueue -encode-> index.enqueue -> bytearray
    commit(cb)     -> tick's callback list
    end of tick    -> deque.append(WRITE chunk, COMMIT [cbs]) -> pwrite chunk
                                                                fsync once
    cb(None) for every callback  <-- loop.call_soon_threadsafe --+

Reads (``read``) look in a bounded LRU of recent messages, then in records not yet
written (the bytearray and chunks in flight), then ``pread`` the segment.

Positions and relocation
------------------------
``append_enqueue`` returns the *stable position* of a message: the broker uses it for
``read``/``append_settle``/``append_delivered`` for as long as the message lives, and
recovery reports the same numbers. When compaction copies a message forward, the copy
records its stable position as ``origin`` and the index maps stable -> new place, so
nothing outside the store ever sees the move.

Checkpoints, GC, compaction
---------------------------
Every ``checkpoint_every_bytes`` of log (or four times the last snapshot's size, if
larger), at every segment roll and at close, the loop thread first compacts (copies
forward the live messages of old segments whose live share fell to
``compact_ratio``), then appends a CHECKPOINT record and hands a snapshot of the index
to the writer, which writes the ``checkpoint`` file once the log is durable up to
that record. A segment is deleted when it holds no live message, is not the active
one, *and* a durable checkpoint lies past its end: only then can no replay need its
SETTLE records.

Definitions
-----------
Durable topology changes arrive through ``append_definition`` and wait in a list until
the next record of any other kind, the end of the tick or a checkpoint; then they go
out as one DEFINITION record (all of them or none survive a crash) and are applied to
the :class:`~amqpd.store.defs.DefinitionState`, in log order with the messages. A
checkpoint carries a snapshot of that state, encoded by the writer from a copy.

Replication hooks
-----------------
A warren active (amqpd/replication/) sets three attributes, all None on a single node:
``observer`` (handed to the writer: told what was written, checkpointed, deleted),
``commit_gate`` (wraps the callbacks of each group commit with the last sequence they
cover, so a confirm also waits for the in-sync standbys: the confirm path itself is
unchanged) and ``retain`` (the lowest log position a connected standby still needs:
GC keeps every segment from there on). ``truncate_after`` cuts, on a closed log, a
tail that a new active never had (``tail.py``).

Failure policy
--------------
A write or fsync error (ENOSPC, EIO) fails every waiting and later commit with
:class:`StoreError` (the broker nacks) and :attr:`SharedLog.failed` says why
(``stats()["failed"] == 1``). ``append_enqueue`` raises StoreError for
``retry_after`` seconds (settles are still accepted); the next append after that
re-opens the log from disk (recovery, which cuts any torn record) and carries on, so
the disk is probed at most once per ``retry_after``. What
was committed before the error stays intact. Messages appended from the failed write
on are not stored (their commits failed); settles and delivered marks from that time
are re-appended after the re-open, so nothing acked comes back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

from amqpd.store import checkpoint, marks, recovery
from amqpd.store import format as fmt
from amqpd.store.api import RecoveredQueue, RecoveredState, StoredMessage, StoreError
from amqpd.store.defs import DefinitionState
from amqpd.store.index import LiveIndex
from amqpd.store.segment import Segment
from amqpd.store.writer import CHECKPOINT, COMMIT, DELETE, WRITE, Writer

log = logging.getLogger("amqpd.store")

MiB = 1 << 20
_WAKE_BYTES = 1 * MiB  # hand over and wake the writer without a commit at this size
_SETTLE_CHUNK = 65536  # positions per SETTLE record
_QCACHE_MAX = 4096


READ_AHEAD = 64 * 1024  # bytes read per disk read of a message: its neighbours come too


class SharedLog:
    """File-backed :class:`~amqpd.store.api.MessageStore`.

    Arguments (all but ``directory`` keyword-only):

    ``directory``               created if missing; holds ``*.log`` and ``checkpoint``
    ``segment_size``            roll to a new file past this many bytes (64 MiB)
    ``fsync``                   ``"batch"``: a commit is answered after fsync;
                                ``"never"``: after write(2) only (survives kill -9,
                                not power loss)
    ``loop``                    where commit callbacks run (``call_soon_threadsafe``);
                                commits are batched per tick of this loop. With None,
                                each commit goes to the writer at once and callbacks
                                run on the writer thread (tests, scripts): they must
                                then be thread-safe.
    ``checkpoint_every_bytes``  bounds replay after a crash (32 MiB)
    ``body_cache_bytes``        LRU of recently written/read messages (8 MiB)
    ``compact_ratio``           copy a segment's live messages forward once they are
                                at most this share of what it ever held (0.1)
    ``compact_max_bytes``       body bytes copied per checkpoint, about (16 MiB)
    ``retry_after``             seconds between disk probes after a write error (1.0)
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int = 64 * MiB,
        fsync: Literal["batch", "never"] = "batch",
        loop: asyncio.AbstractEventLoop | None = None,
        checkpoint_every_bytes: int = 32 * MiB,
        body_cache_bytes: int = 8 * MiB,
        compact_ratio: float = 0.1,
        compact_max_bytes: int = 16 * MiB,
        retry_after: float = 1.0,
    ) -> None:
        if fsync not in ("batch", "never"):
            raise ValueError(f"fsync must be 'batch' or 'never', not {fsync!r}")
        self.directory = Path(directory)
        self.on_disk = True  # what is appended can leave memory (MessageStore.on_disk)
        self.segment_size = segment_size
        self.fsync_policy = fsync
        self.loop = loop
        self.checkpoint_every_bytes = checkpoint_every_bytes
        self.body_cache_bytes = body_cache_bytes
        self.compact_ratio = compact_ratio
        self.compact_max_bytes = compact_max_bytes
        self.retry_after = retry_after

        self._index = LiveIndex()
        self._defs = DefinitionState()
        # definition changes of this stretch of the tick: one DEFINITION record, written
        # before the next record of any other kind (so the log keeps their order)
        self._defs_pending: list[fmt.DefinitionChange] = []
        self._segments: dict[int, Segment] = {}
        self._buf = bytearray()  # records not yet handed to the writer
        self._buf_start = 0  # position of self._buf[0]
        self._buf_base = 0  # segment the buffer belongs to
        self._pending: dict[int, bytes] = {}  # chunks handed over, not yet written
        self._callbacks: list[Callable[[BaseException | None], None]] = []  # this tick's
        self._tick_scheduled = False
        self._cache: collections.OrderedDict[int, StoredMessage] = collections.OrderedDict()
        self._cache_bytes = 0
        self._qcache: dict[tuple[str, ...], bytes] = {}
        self._writer: Writer | None = None
        self._active = 0
        self._end = 0
        self._seq = 0
        self._since_checkpoint = 0
        self._checkpoint_due = checkpoint_every_bytes
        self._checkpoint_seen = -1
        self._checkpoint_requested = -1
        self._records = 0
        self._relocated = 0
        self._truncated = 0
        self._state = "new"  # new -> open -> closed
        self._journal = marks.DeliveryJournal(self.directory)
        # the writer's observer (replication): may return loop work for the batch's
        # delivery (writer.py)
        self.observer: Callable[[list[tuple[object, ...]]],
                                Callable[[], None] | None] | None = None
        self.commit_gate: Callable[[int, list[Callable[[BaseException | None], None]]],
                                   list[Callable[[BaseException | None], None]]] | None = None
        self.retain: Callable[[], int] | None = None

    # -- lifecycle ----------------------------------------------------------------

    def open(self, rec: recovery.Recovered | None = None) -> RecoveredState:
        """Recover (see recovery.py), start the writer. Called once. ``rec``: what
        :func:`recovery.recover` found in this directory, when the caller ran it
        elsewhere (a worker thread: it only reads the files, and nothing writes them
        until the writer starts here)."""
        if self._state != "new":
            raise StoreError("open() called twice")
        self.directory.mkdir(parents=True, exist_ok=True)
        if rec is None:
            rec = recovery.recover(self.directory)
        self._index = rec.index
        self._defs = rec.definitions
        self._seq = rec.sequence
        self._truncated = rec.truncated_bytes
        for base, path in rec.segments.items():
            self._segments[base] = Segment.open(path, base)
        if rec.segments:
            self._active = next(reversed(rec.segments))
            self._end = rec.end
        else:
            self._active = rec.end
            self._end = rec.end + fmt.FILE_HEADER_SIZE
            self._index.add_segment(self._active)
        self._writer = Writer(
            self.directory,
            self._segments,
            self._pending,
            sync=self.fsync_policy == "batch",
            loop=self.loop,
        )
        self._writer.checkpoint_durable = rec.covered
        # what recovery found is what a commit with nothing appended answers for (it
        # fsyncs nothing: no segment is dirty yet), as before the first write
        self._writer.durable_seq = self._writer.written_seq = rec.sequence
        self._writer.observer = self.observer
        self._checkpoint_seen = rec.covered
        self._writer.start()
        self._state = "open"

        state = RecoveredState(truncated_bytes=rec.truncated_bytes, last_sequence=rec.sequence,
                               definitions=dict(self._defs.entries))
        self._apply_promises(marks.read(self.directory))
        self._journal.open()
        dropped = 0
        for name, q in list(self._index.queues.items()):
            transient = q.transient()
            if transient:  # paged out under memory pressure, never meant to survive
                self.append_settle(name, transient)
                dropped += len(transient)
        if dropped:
            log.info("dropped %d transient messages paged out before the restart", dropped)
        for name, q in self._index.queues.items():
            if len(q):
                positions, sizes = q.live()
                stamps, extra = q.live_meta()
                state.queues[name] = RecoveredQueue(positions, sizes, set(q.delivered),
                                                    stamps, extra)
        just_marker = fmt.HEADER_SIZE + 8  # replay always re-reads the CHECKPOINT record
        if rec.replayed_bytes > just_marker or rec.truncated_bytes or rec.covered < 0 \
                or dropped:
            self._checkpoint()  # so the next restart starts from here
        return state

    def close(self) -> None:
        """Checkpoint, flush, fsync and close. Later appends raise StoreError."""
        if self._state != "open":
            self._state = "closed"
            return
        assert self._writer is not None
        clean = self._writer.failed is None
        if clean:
            self._checkpoint()
        self._push()  # nobody waits forever: callbacks get their answer (maybe an error)
        self._writer.stop()
        clean = clean and self._writer.failed is None
        # After a clean close the log has every DELIVERED mark: promises are not needed.
        self._journal.close(remove=clean)
        self._state = "closed"
        for seg in self._segments.values():
            seg.close()
        self._pending.clear()
        self._cache.clear()

    @property
    def failed(self) -> str | None:
        """Why the store refuses writes (disk full, I/O error), or None when healthy."""
        return self._writer.failed if self._writer is not None else None

    @property
    def last_sequence(self) -> int:
        """The sequence number of the last record appended (0: none yet)."""
        return self._seq

    @property
    def end_position(self) -> int:
        """The log position just past the last record appended."""
        return self._end

    def segment_sizes(self) -> dict[int, int]:
        """base -> bytes written, of every segment file (in log order)."""
        return {base: self._segments[base].size for base in sorted(self._segments)}

    def set_observer(
        self, observer: Callable[[list[tuple[object, ...]]], Callable[[], None] | None] | None
    ) -> None:
        """Install (or remove) the writer's observer (replication; writer.py)."""
        self.observer = observer
        if self._writer is not None:
            self._writer.observer = observer

    def promises(self) -> dict[str, int]:
        """The delivery journal's standing promises (queue -> position; marks.py)."""
        return self._journal.promised

    def truncate_after(self, seq: int) -> int:
        """Cut every record after sequence ``seq`` (before ``open``): see ``tail.py``."""
        if self._state != "new":
            raise StoreError("truncate_after() needs a closed log")
        from amqpd.store.tail import truncate_after

        return truncate_after(self.directory, seq)

    # -- appends (event-loop thread) ----------------------------------------------

    def _writable(self, *, refuse_if_failed: bool = False) -> Writer:
        """The writer, after housekeeping. While failed (and not yet time to retry),
        ENQUEUEs are refused; settles are accepted: the failed writer keeps them
        and they are re-appended after the re-open."""
        w = self._writer
        if self._state != "open" or w is None:
            raise StoreError("store is not open")
        if w.checkpoint_durable != self._checkpoint_seen:
            self._collect_garbage()
        if w.failed is not None:
            if time.monotonic() - w.failed_at < self.retry_after:
                if refuse_if_failed:
                    raise StoreError(f"store failed: {w.failed}")
                return w
            self._reopen_after_failure()
            w = self._writer
            assert w is not None
        return w

    def _reopen_after_failure(self) -> None:
        """Probe the disk again after a write error: rebuild everything from what is
        really on disk (recovery cuts any torn bytes), then re-append the SETTLE /
        DELIVERED / DROP_QUEUE records that could not be written. Stable positions
        of stored messages do not change; messages whose ENQUEUE never reached the
        disk (their commits failed) are simply not in the store any more."""
        old = self._writer
        assert old is not None
        self._push()  # settles appended while failed go to `discarded` as well
        old.stop()  # it discards whatever is still queued
        redo = old.discarded
        old_end = self._end
        for seg in self._segments.values():
            seg.close()
        self._segments = {}
        self._pending = {}
        self._cache.clear()
        self._cache_bytes = 0
        self._state = "new"
        truncated = self._truncated
        try:
            self.open()
        except (OSError, StoreError) as exc:
            old.failed_at = time.monotonic()
            self._writer, self._state = old, "open"
            raise StoreError(f"store failed: {old.failed}; reopen failed: {exc}") from None
        self._truncated += truncated
        if self._end < old_end:
            # Positions handed out for records that never reached the disk may still
            # be held by the broker: never hand them out again.
            self._end = old_end
            self._roll()
        log.warning("store re-opened after %s; re-applying %d records", old.failed, len(redo))
        for record in redo:
            rtype, _, p, e = fmt.decode_record(record)
            payload = memoryview(record)[p:e]
            if rtype == fmt.SETTLE:
                self.append_settle(*fmt.decode_settle(payload))
            elif rtype == fmt.DELIVERED:
                self.append_delivered_many(*fmt.decode_delivered(payload))
            elif rtype == fmt.DROP_QUEUE:
                self.drop_queue(fmt.decode_drop_queue(payload))
            elif rtype == fmt.DEFINITION:
                self._defs_pending.extend(fmt.decode_definition(payload))
        self._flush_definitions()

    def _append(self, rtype: int, payload: bytes) -> int:
        """Frame, place and queue one record; return its position."""
        if self._defs_pending and rtype != fmt.DEFINITION:
            self._flush_definitions()
        n = fmt.HEADER_SIZE + len(payload)
        pos = self._end
        if pos + n > self._active + self.segment_size and pos > (
            self._active + fmt.FILE_HEADER_SIZE
        ):
            self._roll()
            pos = self._end
        self._seq += 1
        if rtype == fmt.CHECKPOINT:
            payload = fmt.encode_checkpoint(pos)
        buf = self._buf
        if not buf:
            self._buf_start = pos
            self._buf_base = self._active
        buf += fmt.encode_record(rtype, self._seq, payload)
        self._end = pos + n
        self._records += 1
        self._since_checkpoint += n
        if len(buf) >= _WAKE_BYTES:
            self._push()
            assert self._writer is not None
            self._writer.wake.set()
        return pos

    def _push(self) -> None:
        """Hand the buffered records to the writer as one chunk, then the commit
        callbacks waiting for them (no wake-up: callers decide)."""
        w = self._writer
        assert w is not None
        if self._defs_pending:
            self._flush_definitions()
        if self._buf:
            chunk = bytes(self._buf)
            self._buf.clear()
            self._pending[self._buf_start] = chunk
            w.jobs.append((WRITE, self._buf_base, self._buf_start, chunk, self._seq))
        if self._callbacks:
            callbacks = self._callbacks
            self._callbacks = []
            if self.commit_gate is not None:
                callbacks = self.commit_gate(self._seq, callbacks)
            w.jobs.append((COMMIT, callbacks))

    def _roll(self) -> None:
        self._push()  # a chunk never spans two segments
        self._active = self._end
        self._end = self._active + fmt.FILE_HEADER_SIZE
        self._index.add_segment(self._active)
        self._since_checkpoint = 1 << 62  # checkpoint after this op: lets GC start

    def _after_append(self) -> None:
        if self._since_checkpoint >= self._checkpoint_due:
            self._checkpoint()

    def append_enqueue(self, queues: Sequence[str], message: StoredMessage) -> int:
        """Write the message once for all ``queues``; return its stable position."""
        self._writable(refuse_if_failed=True)
        key = tuple(queues)
        if len(key) > 1 and len(set(key)) != len(key):
            key = tuple(dict.fromkeys(key))  # a queue holds a message once
        qbytes = self._qcache.get(key)
        if qbytes is None:
            if len(self._qcache) >= _QCACHE_MAX:
                self._qcache.clear()
            qbytes = self._qcache[key] = fmt.encode_queues(key)
        payload = fmt.encode_enqueue(0, qbytes, message)
        if fmt.has_meta(message):
            pos = self._append(fmt.ENQUEUE_META, fmt.encode_meta(message) + payload)
            self._index.enqueue(key, pos, len(message.body), self._active,
                                message.published << 1 | message.transient,
                                message.expires << 8 | message.priority)
        else:
            pos = self._append(fmt.ENQUEUE, payload)
            self._index.enqueue(key, pos, len(message.body), self._active)
        # Not cached here: the broker keeps recent messages itself, a paged-out one is
        # read long after it would have left an LRU, and one not yet written is read
        # from the write buffer. Caching on append cost ~11% of persistent publish CPU.
        self._after_append()
        return pos

    def append_settle(self, queue: str, positions: Iterable[int]) -> None:
        """The queue is done with these messages (ack, reject, expiry, purge)."""
        self._writable()
        if queue not in self._index.queues:
            return
        arr = positions if isinstance(positions, array) else array("q", positions)
        for i in range(0, len(arr), _SETTLE_CHUNK):
            chunk = arr[i : i + _SETTLE_CHUNK]
            self._append(fmt.SETTLE, fmt.encode_settle(queue, chunk))
            self._index.note_carry(self._active, queue, chunk)
            emptied = self._index.settle(queue, chunk)
            if emptied:
                self._collect_garbage()
        self._after_append()

    def append_delivered(self, queue: str, position: int) -> None:
        """Mark redelivered-on-recovery. Rides on the next commit; once per message."""
        self.append_delivered_many(queue, (position,))

    def append_delivered_many(self, queue: str, positions: Iterable[int]) -> None:
        """Many marks in one record (the broker batches a tick's deliveries)."""
        self._writable()
        q = self._index.queues.get(queue)
        if q is None:
            return
        delivered = q.delivered
        fresh = [p for p in positions if p not in delivered and p in q]
        if not fresh:
            return
        for i in range(0, len(fresh), _SETTLE_CHUNK):
            self._append(fmt.DELIVERED, fmt.encode_delivered(queue, fresh[i : i + _SETTLE_CHUNK]))
        delivered.update(fresh)
        self._after_append()

    def delivering(self, queue: str, position: int) -> None:
        """A message of ``queue`` is being handed to a consumer now: make sure a crash
        from here on brings it back redelivered (marks.py). Synchronous and cheap: at
        most one write(2), and only when the queue's promise does not cover it yet."""
        if position > self._journal.promised.get(queue, -1) and self._state == "open":
            self._journal.promise(queue, position, self._end)

    def _apply_promises(self, promised: dict[str, int]) -> int:
        """After a crash: messages the journal says may have been delivered become
        DELIVERED (durably, before the journal is started afresh); return how many."""
        n = 0
        for queue, upto in promised.items():
            q = self._index.queues.get(queue)
            if q is None:
                continue
            fresh = [p for p in q.range(-1, upto + 1) if p not in q.delivered]
            if fresh:
                self.append_delivered_many(queue, fresh)
                n += len(fresh)
        if n:
            self.sync()
            log.warning("unclean shutdown: %d messages that may have been delivered "
                        "come back marked redelivered", n)
        return n

    def drop_queue(self, queue: str) -> None:
        """Settle everything the queue holds (queue.delete)."""
        self._journal.forget(queue)
        self._writable()
        # a pending DEFINITION record deleting this durable queue drops it too (and
        # recovery replays it so): write that first, then only what is left needs a
        # DROP_QUEUE record
        self._flush_definitions()
        if queue not in self._index.queues:
            return
        self._append(fmt.DROP_QUEUE, fmt.encode_drop_queue(queue))
        if self._drop_carrying(queue):
            self._collect_garbage()
        self._after_append()

    def _drop_carrying(self, queue: str) -> bool:
        """Drop a queue from the index after a record that drops it (in the active
        segment), first noting its entries in older segments as carried settles
        (index.py), as recovery does. True when some segment became garbage."""
        q = self._index.queues.get(queue)
        if q is None:
            return False
        base = self._active
        self._index.note_carry(base, queue, [p for p in q.live_positions() if p < base])
        return bool(self._index.drop(queue))

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        """A durable definition changed (``body`` empty: deleted); see ``defs.py``.

        Changes made together (a queue delete and its bindings) share one record, so
        they survive a crash together or not at all; durable once a commit says so."""
        self._writable()
        self._defs_pending.append((kind, key, body))

    def definitions(self) -> dict[tuple[int, str], bytes]:
        """The durable definitions as recorded so far (a copy)."""
        self._flush_definitions()
        return dict(self._defs.entries)

    def _flush_definitions(self) -> None:
        changes = self._defs_pending
        if not changes or self._writer is None:
            return
        self._defs_pending = []
        self._append(fmt.DEFINITION, fmt.encode_definition_changes(changes))
        emptied = False
        for queue in self._defs.apply(changes):
            if self._drop_carrying(queue):
                emptied = True
        if emptied:
            self._collect_garbage()
        self._after_append()

    def commit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(None)`` once everything appended so far is durable, or
        ``callback(StoreError)``; on ``loop`` (or the writer thread if loop is None)."""
        w = self._writer
        if self._state != "open" or w is None:
            raise StoreError("store is not open")
        loop = self.loop
        if loop is not None and w.durable_seq == self._seq and not self._buf \
                and not self._callbacks and not self._defs_pending \
                and self.commit_gate is None and w.failed is None:
            # nothing appended since the writer's last fsync (a tick that published
            # only to streams, whose own logs sync them): durable already, so no job
            # and no wake-up of the writer thread, whose answer would only come back
            # through call_soon_threadsafe a moment later
            loop.call_soon(callback, None)
            return
        self._callbacks.append(callback)
        if loop is None:
            self._push()
            w.wake.set()
        elif not self._tick_scheduled:
            # Group commit per event-loop tick: every commit made during this tick
            # (one per confirm, typically) travels to the writer together, after the
            # tick's records, in one job.
            self._tick_scheduled = True
            loop.call_soon(self._end_of_tick)

    def _end_of_tick(self) -> None:
        self._tick_scheduled = False
        if self._state == "open" and self._writer is not None:
            self._push()
            self._writer.wake.set()

    def sync(self, timeout: float | None = 30.0) -> None:
        """Block until everything appended so far is durable (tests, shutdown).

        Does not go through ``loop``, so it is safe to call from the loop thread."""
        done = threading.Event()
        result: list[BaseException | None] = []

        def cb(exc: BaseException | None) -> None:
            result.append(exc)
            done.set()

        w = self._writer
        if self._state != "open" or w is None:
            raise StoreError("store is not open")
        for _ in range(2):  # twice if garbage collection queued segment deletions
            done.clear()
            result.clear()
            self._push()
            w.jobs.append((COMMIT, [cb], True))  # True: call on the writer thread
            w.wake.set()
            if not done.wait(timeout):
                raise StoreError("sync timed out")
            if result and result[0] is not None:
                raise StoreError(str(result[0]))
            if w.checkpoint_durable == self._checkpoint_seen or not self._collect_garbage():
                break

    # -- reads --------------------------------------------------------------------

    def read(self, position: int) -> StoredMessage:
        """The message at a stable position: from the cache, the write buffer, or disk."""
        cache = self._cache
        msg = cache.get(position)
        if msg is not None:
            cache.move_to_end(position)
            return msg
        cur = self._index.reloc.get(position, position)
        msg = self._read_unwritten(cur)
        if msg is None:
            msg = self._read_disk(cur)
        self._cache_put(position, msg)
        return msg

    def _read_unwritten(self, position: int) -> StoredMessage | None:
        """A record still in the loop buffer or in a chunk the writer has not written."""
        if self._buf and position >= self._buf_start:
            data: bytes | bytearray = self._buf
            offset = position - self._buf_start
        else:
            # list(): the writer pops from the dict concurrently
            for start, chunk in list(self._pending.items()):
                if start <= position < start + len(chunk):
                    data, offset = chunk, position - start
                    break
            else:
                return None
        try:
            length = fmt.RECORD_HEADER.unpack_from(data, offset)[1]
            record = bytes(data[offset : offset + fmt.HEADER_SIZE + length])
            rtype, _, p, e = fmt.decode_record(record)
            if rtype not in fmt.ENQUEUE_TYPES:
                raise fmt.CorruptRecord(f"record type {rtype}, expected ENQUEUE")
            return fmt.decode_any_enqueue(rtype, memoryview(record)[p:e])[2]
        except (fmt.FormatError, struct.error) as exc:
            raise StoreError(f"no message at position {position}: {exc}") from None

    def _read_disk(self, position: int) -> StoredMessage:
        try:
            base = self._index.segment_of(position)
        except KeyError:
            raise StoreError(f"no segment holds position {position}") from None
        seg = self._segments.get(base)
        if seg is None:
            raise StoreError(f"segment {base} for position {position} is gone")
        offset = position - base
        try:
            data = seg.read(offset, READ_AHEAD)
            if len(data) >= fmt.HEADER_SIZE:
                need = fmt.HEADER_SIZE + fmt.RECORD_HEADER.unpack_from(data, 0)[1]
                if need > len(data) and need <= fmt.HEADER_SIZE + fmt.MAX_PAYLOAD:
                    data = seg.read(offset, need)
            rtype, _, p, e = fmt.decode_record(data, 0)
            if rtype not in fmt.ENQUEUE_TYPES:
                raise fmt.CorruptRecord(f"record type {rtype}, expected ENQUEUE")
            msg = fmt.decode_any_enqueue(rtype, memoryview(data)[p:e])[2]
        except (OSError, fmt.FormatError) as exc:
            raise StoreError(f"cannot read message at {position} in {seg.path}: {exc}") from None
        self._read_ahead(data, e, position)
        return msg

    def _read_ahead(self, data: bytes, start: int, first: int) -> None:
        """Cache the small ENQUEUE records that follow one just read from disk.

        A backlog is drained in log order, so the next messages asked for are almost
        always the next records: one read of READ_AHEAD bytes serves dozens of them
        instead of one pread each. Only live-looking, unrelocated records are cached
        (a moved copy carries an origin and is cached under it when asked for).
        """
        view = memoryview(data)
        pos = start
        cached = 0  # ``first`` is the log position of data[0]
        while pos < len(data) and cached < 256:
            try:
                rtype, _, p, e = fmt.decode_record(view, pos)
            except fmt.FormatError:
                return  # a record cut by the window's end, or damage: stop here
            if rtype in fmt.ENQUEUE_TYPES:
                origin, _queues, msg = fmt.decode_any_enqueue(rtype, view[p:e])
                if not origin:  # never moved: its stable position is where it lies
                    self._cache_put(first + pos, msg)
                    cached += 1
            pos = e

    def _cache_put(self, position: int, msg: StoredMessage) -> None:
        limit = self.body_cache_bytes
        cost = len(msg.body) + len(msg.properties) + 128
        if cost > limit // 4:
            return
        cache = self._cache
        if position in cache:
            return
        cache[position] = msg
        self._cache_bytes += cost
        while self._cache_bytes > limit:
            _, old = cache.popitem(last=False)
            self._cache_bytes -= len(old.body) + len(old.properties) + 128

    # -- checkpoints, GC, compaction ----------------------------------------------

    def checkpoint(self) -> None:
        """Force a checkpoint now (normally automatic)."""
        self._writable()
        self._checkpoint()

    def _checkpoint(self) -> None:
        w = self._writer
        assert w is not None
        if w.failed is not None:
            return
        self._compact()
        pos = self._append(fmt.CHECKPOINT, b"\0" * 8)
        self._checkpoint_requested = pos
        data = checkpoint.encode_index(pos, self._seq, self._index)
        self._push()
        # the definitions part is encoded by the writer, from a copy taken now
        w.jobs.append((CHECKPOINT, pos, data, dict(self._defs.entries)))
        w.wake.set()
        self._since_checkpoint = 0
        # A big backlog makes a big snapshot: space them out so checkpoint writes stay
        # under ~25% of log traffic (replay after a crash grows alike, still bounded).
        self._checkpoint_due = max(self.checkpoint_every_bytes,
                                   4 * (len(data) + self._defs.nbytes))

    def maintain(self) -> None:
        """Optional housekeeping for quiet times; call it every second or so.

        A segment emptied by settles is deleted at once if a durable checkpoint lies
        past it (the one taken when the log rolled past it usually does), else when
        the next append notices that checkpoint finished. With no traffic that notice
        never comes: this delivers it, and takes a checkpoint only if an emptied
        segment is still not covered (e.g. the roll's checkpoint was skipped during a
        write error). Cheap when there is nothing to do."""
        w = self._writer
        if self._state != "open" or w is None or w.failed is not None:
            return
        if w.checkpoint_durable != self._checkpoint_seen:
            self._collect_garbage()
        if w.checkpoint_durable < self._checkpoint_requested:
            return  # one is on its way
        index = self._index
        bases = index.bases
        durable = w.checkpoint_durable
        for i in range(len(bases) - 1):
            if index.seg_live.get(bases[i]) == 0 and bases[i + 1] > durable:
                self._checkpoint()
                w.wake.set()
                return

    def _collect_garbage(self) -> bool:
        """Delete segments with nothing live that a durable checkpoint lies past."""
        w = self._writer
        assert w is not None
        durable = w.checkpoint_durable
        self._checkpoint_seen = durable
        index = self._index
        bases = index.bases
        doomed = []
        # a connected standby still reading a segment keeps it (replication)
        keep_from = self.retain() if self.retain is not None else durable
        for i in range(len(bases) - 1):  # the last one is the active segment
            base = bases[i]
            if index.seg_live.get(base) == 0 and bases[i + 1] <= durable \
                    and bases[i + 1] <= keep_from:
                doomed.append(base)
        if doomed:
            survivors = set(bases).difference(doomed)
            for base in doomed:
                for queue, (stables, currents) in index.carried_for(base, survivors).items():
                    self._append(fmt.SETTLE, fmt.encode_settle(queue, stables))
                    per_queue = index.carry.setdefault(self._active, {})
                    old = per_queue.get(queue)
                    if old is None:
                        per_queue[queue] = (stables, currents)
                    else:
                        old[0].extend(stables)
                        old[1].extend(currents)
            self._push()  # the settles that emptied them (and the carried ones) go first
        for base in doomed:
            index.remove_segment(base)
            w.jobs.append((DELETE, base))
        if doomed:
            w.wake.set()
        return bool(doomed)

    def _compact(self) -> None:
        """Copy forward the live messages of old, mostly-dead segments."""
        index = self._index
        budget = self.compact_max_bytes
        bases = list(index.bases)
        for i in range(len(bases) - 1):
            base = bases[i]
            live = index.seg_live.get(base, 0)
            total = index.seg_total.get(base, 0)
            if live == 0 or base == self._active or live > total * self.compact_ratio:
                continue
            found = index.live_in_segment(base, bases[i + 1])
            for stable in sorted(found):
                queues = found[stable]
                try:
                    msg = self.read(stable)
                except StoreError as exc:
                    # Unreadable: leave it (and its segment) where it is.
                    log.error("compaction skipped a message: %s", exc)
                    continue
                stamp, extra = index.queues[queues[0]].meta_of(stable)
                msg.published, msg.transient = stamp >> 1, bool(stamp & 1)
                msg.expires, msg.priority = extra >> 8, extra & 0xFF
                payload = fmt.encode_enqueue(stable, queues, msg)
                if fmt.has_meta(msg):
                    pos = self._append(fmt.ENQUEUE_META, fmt.encode_meta(msg) + payload)
                else:
                    pos = self._append(fmt.ENQUEUE, payload)
                index.relocate(stable, queues, pos, len(msg.body), self._active, stamp,
                               extra)
                for name in queues:
                    if stable in index.queues[name].delivered:
                        self._append(fmt.DELIVERED, fmt.encode_delivered(name, (stable,)))
                self._relocated += 1
                budget -= len(msg.body) + 64
            if budget <= 0:
                break

    # -- metrics ------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Numbers for metrics and health checks (``failed`` is 1 while refusing writes)."""
        w = self._writer
        segs = list(self._segments.values())
        fsyncs = w.fsyncs if w else 0
        return {
            "bytes_on_disk": sum(s.size for s in segs),
            "segments": len(segs),
            "fsyncs": fsyncs,
            "fsync_last_us": w.fsync_last_us if w else 0,
            "fsync_avg_us": (w.fsync_total_us // fsyncs) if w and fsyncs else 0,
            "records_written": self._records,
            "bytes_written": w.records_bytes if w else 0,
            "buffered_bytes": len(self._buf),
            "buffered_jobs": len(w.jobs) if w else 0,
            "live_messages": self._index.live_pairs,
            "queues": sum(1 for q in self._index.queues.values() if len(q)),
            "definitions": len(self._defs),
            "relocated": len(self._index.reloc),
            "relocations_total": self._relocated,
            "checkpoints": w.checkpoints if w else 0,
            "truncated_bytes": self._truncated,
            "cache_bytes": self._cache_bytes,
            "failed": int(bool(w and w.failed)),
        }
