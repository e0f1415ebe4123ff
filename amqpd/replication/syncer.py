"""SyncThread: the standby's group commit, on a thread of its own.

A standby acknowledges a sequence number only once the bytes up to it are durable in its
segment files. The follower (loop thread) writes each DATA frame with ``pwrite`` and
then calls :meth:`SyncThread.written`; this thread wakes, takes everything written
since its last round (the files to fdatasync, whether a file was created, the last
checked record), fsyncs once for all of it and sends the ACK for the durable
``(seq, position)`` itself, then tells the loop (``loop.call_soon_threadsafe``), which
keeps the follower's figures. Over TLS the bytes must go through the loop's transport,
so there the loop sends the ACK.

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
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from amqpd.replication import trace, wire
from amqpd.store.segment import fsync_directory

log = logging.getLogger("amqpd.replication")


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
        self._target: tuple[int, int] | None = None
        self._closing: list[int] = []
        self._barriers: list[asyncio.Future[None]] = []
        self._stop = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="amqpd-standby-fsync",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- loop side --------------------------------------------------------------------

    def written(self, fd: int, new_file: bool, seq: int, pos: int) -> None:
        """``fd`` holds new bytes; whole checked records reach (``seq``, ``pos``)."""
        with self._lock:
            self._dirty.add(fd)
            self._new_files |= new_file
            self._target = (seq, pos)
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
            self._wake.wait(0.05 if self._unsent else None)
            self._wake.clear()
            with self._lock:
                dirty, self._dirty = self._dirty, set()
                new_files, self._new_files = self._new_files, False
                target, self._target = self._target, None
                closing, self._closing = self._closing, []
                barriers, self._barriers = self._barriers, []
                stop = self._stop
            error = self._error
            if trace.ON and target is not None:
                trace.mark("s", target[0])
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
            if trace.ON and target is not None:
                trace.mark("e", target[0])
            if error is None and target is not None and target[0] > self._acked:
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
