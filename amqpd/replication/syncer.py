"""SyncThread: the standby's group commit, on a thread of its own.

A standby acknowledges a sequence number only once the bytes up to it are durable in its
segment files *and* CRC-checked. The follower (loop thread) writes each DATA frame with
``pwrite`` and at once calls :meth:`SyncThread.written`; this thread wakes, takes
everything written since its last round (the files to fdatasync, whether a file was
created) and fsyncs once for all of it, *while* the loop checks the frame's records and
then reports them (:meth:`SyncThread.checked`). The ACK goes out for the last record
that is both checked and covered by a finished fsync (:class:`AckPoint`), from this
thread, which then tells the loop (``loop.call_soon_threadsafe``), which keeps the
follower's figures. Over TLS the bytes must go through the loop's transport, so there
the loop sends the ACK.

Why the check runs beside the fsync, not before it: checking a group commit's records
(a CRC and a header per record, ~500 records per frame at full rate) took the
standby's loop about 1.1 ms per frame, as long as its fsync; done first, it came
before the fsync on every confirm's path (``bench.sync_profile --trace``,
bench/RESULTS.md "the warren's sync cost"). Side by side, a confirm waits for the
longer of the two.

Why a thread of its own instead of ``asyncio.to_thread`` per round: the thread-pool
hand-off (a work item, a concurrent future chained to an asyncio one, the pool's queue
and condition variables) cost the standby about as much CPU as the fdatasync itself did
(py-spy, bench/notes.md "Warren, issue 34"), and every round paid two loop hops before
the fsync could even start, and one more before the ACK left. Here a round starts as
soon as the event is set, while the loop goes on receiving; one fsync covers everything
that arrived meanwhile, and the ACK leaves from the thread that made the bytes durable.

The ACK socket: a ``dup`` of the connection's descriptor, owned by this thread and
closed when it ends, so a connection the loop closes meanwhile can never turn into
someone else's file under us. It shares the non-blocking mode with the loop's
descriptor: what the socket cannot take now is kept and goes out first next round
(only this thread writes to the connection once the session has begun).

File descriptors: the loop owns them, but never closes one this thread may still
fsync. It hands the ones it is done with to :meth:`close_later` (fsync'd first if
dirty, then closed here) and waits for :meth:`barrier` before anything that must
follow durability (installing a checkpoint, deleting a segment, ending the session).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from amqpd.replication import trace, wire
from amqpd.store.segment import fsync_directory

log = logging.getLogger("amqpd.replication")


class AckPoint:
    """What may be acknowledged: the last record both checked and durable (pure state).

    Every write the loop hands over gets a generation number (:meth:`wrote`); a
    round's fsync covers every generation handed over before it began
    (:meth:`fsync_began`, then :meth:`fsynced`); the loop's check reports, per
    generation, the last whole record it holds (:meth:`checked`). :meth:`ackable` is
    the newest checked record whose generation is durable. Checks come in generation
    order; either may finish first.
    """

    def __init__(self) -> None:
        self.written_gen = 0  # generations handed over so far
        self.durable_gen = 0  # every generation up to this one is fsync'd
        self._checked: collections.deque[tuple[int, int, int]] = collections.deque()
        self._ackable: tuple[int, int] | None = None

    def wrote(self) -> int:
        self.written_gen += 1
        return self.written_gen

    def checked(self, gen: int, seq: int, pos: int) -> None:
        self._checked.append((gen, seq, pos))

    def fsync_began(self) -> int:
        return self.written_gen

    def fsynced(self, gen: int) -> None:
        if gen > self.durable_gen:
            self.durable_gen = gen

    def ackable(self) -> tuple[int, int] | None:
        """(seq, pos) newly safe to acknowledge, or None; each is returned once."""
        checked = self._checked
        found = None
        while checked and checked[0][0] <= self.durable_gen:
            _, seq, pos = checked.popleft()
            found = (seq, pos)
        return found


class SyncThread:
    """One standby session's fsync thread (see the module docstring)."""

    def __init__(self, directory: Path, loop: asyncio.AbstractEventLoop,
                 synced: Callable[[int, int, bool], None],
                 failed: Callable[[OSError], None], ack_fd: int | None = None) -> None:
        self.directory = directory
        self.loop = loop
        # (seq, position, acked): durable now, and whether this thread sent the ACK;
        # called on the loop
        self.synced = synced
        self.failed = failed  # an fsync failed; called on the loop, once
        self.ack_fd = ack_fd  # ours, closed at the end (module docstring); None: TLS
        self._unsent = b""
        self._acked = -1
        self.rounds = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._dirty: set[int] = set()
        self._new_files = False
        self._point = AckPoint()  # guarded by _lock
        self._idle = False  # waiting for work (guarded by _lock)
        self._started = threading.Event()  # a round took the work handed over
        self._closing: list[int] = []
        self._barriers: list[asyncio.Future[None]] = []
        self._stop = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="amqpd-standby-fsync",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- loop side --------------------------------------------------------------------

    def written(self, fd: int, new_file: bool, wait: bool = True) -> int:
        """``fd`` holds new bytes (not yet checked): fsync them. Returns their
        generation, for :meth:`checked`.

        If this thread is idle and ``wait``, waits (at most 2 ms) until it has taken the
        round: the caller goes on to check the records holding the GIL, and a thread
        woken meanwhile might get the GIL only once the loop blocks (or after the
        interpreter's 5 ms switch interval), so the fsync would start after the check
        instead of beside it. Not worth the wake-up when no ACK waits for the fsync
        (``standby_ack = "write"``)."""
        with self._lock:
            self._dirty.add(fd)
            self._new_files |= new_file
            gen = self._point.wrote()
            idle = self._idle and wait
            if idle:
                self._started.clear()
        self._wake.set()
        if idle:
            self._started.wait(0.002)
        return gen

    def checked(self, gen: int, seq: int, pos: int) -> None:
        """The bytes of generation ``gen`` are checked: whole records reach (``seq``,
        ``pos``). Acknowledged once an fsync covers them (perhaps already)."""
        with self._lock:
            self._point.checked(gen, seq, pos)
        self._wake.set()

    def close_later(self, fd: int) -> None:
        """Close ``fd`` on this thread, after its fsync if it is dirty."""
        with self._lock:
            self._closing.append(fd)
        self._wake.set()

    async def barrier(self) -> None:
        """Return once everything written before the call is durable (OSError if an
        fsync failed)."""
        fut: asyncio.Future[None] = self.loop.create_future()
        with self._lock:
            if self._error is not None:
                raise self._error
            self._barriers.append(fut)
        self._wake.set()
        await fut

    def stop_and_join(self) -> None:
        """Fsync and close everything handed over, then end the thread. Blocks the
        caller for at most one fsync round: synchronous on purpose, so that a task
        cancelled while it waits cannot close files under a running fsync."""
        with self._lock:
            self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    # -- thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            # an ACK the socket could not take is retried every 50 ms until it goes
            with self._lock:
                self._idle = True
            self._wake.wait(0.05 if self._unsent else None)
            self._wake.clear()
            with self._lock:
                self._idle = False
                dirty, self._dirty = self._dirty, set()
                new_files, self._new_files = self._new_files, False
                gen = self._point.fsync_began()
                closing, self._closing = self._closing, []
                barriers, self._barriers = self._barriers, []
                stop = self._stop
            self._started.set()
            error = self._error
            if trace.ON and dirty:
                trace.mark("s", gen)
            if error is None:
                try:
                    for fd in dirty:
                        os.fdatasync(fd)
                    if new_files:
                        fsync_directory(self.directory)
                except OSError as exc:
                    log.error("replication: fsync of the received log failed: %s", exc)
                    with self._lock:
                        self._error = error = exc
                    self._post(self.failed, exc)
            for fd in closing:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.rounds += 1
            target = None
            if error is None:
                if trace.ON and dirty:
                    trace.mark("e", gen)
                with self._lock:
                    self._point.fsynced(gen)
                    target = self._point.ackable()
            if target is not None and target[0] > self._acked:
                self._acked = target[0]
                self._post(self.synced, *target, self._ack(*target))
                if trace.ON:
                    trace.mark("k", target[0])
            elif self._unsent:
                self._ack(-1, -1)
            for fut in barriers:
                self._post(_settle, fut, error)
            if stop:
                if self.ack_fd is not None:
                    os.close(self.ack_fd)
                return

    def _ack(self, seq: int, pos: int) -> bool:
        """Send ACK(seq, pos) (``seq < 0``: only what is left of earlier ones) on our
        descriptor, never blocking. False: the loop must send it (TLS, or our
        descriptor failed: the connection is broken and the loop's reads end it)."""
        if self.ack_fd is None:
            return False
        data = self._unsent + (wire.pair(wire.ACK, seq, pos) if seq >= 0 else b"")
        try:
            sent = os.write(self.ack_fd, data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            os.close(self.ack_fd)
            self.ack_fd = None
            return False
        self._unsent = data[sent:]
        return True

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _settle(fut: asyncio.Future[None], error: OSError | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
