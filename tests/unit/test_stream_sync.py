"""A stream's group commits (amqpd.broker.stream.StreamQueue.sync_log): a confirm is
called only once an fsync that began after its records were written returned, in the
order the confirms came; while waiters want more, the worker thread starts the next
fsync as soon as one returns, without waiting for the event loop to hear of it; an
fsync error reaches only the waiters it left unsynced.

A broker built in the process with a running loop; ``os.fsync`` is replaced by one
that notes each call and can be held, so the test decides when each fsync returns.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from amqpd.broker.stream import StreamQueue
from amqpd.config import Settings
from amqpd.server import Broker
from tests.unit.test_queue_type import message


class HeldFsync:
    """``os.fsync`` whose calls wait, one by one, until the test lets them return;
    ``fail`` makes the next released call raise."""

    def __init__(self) -> None:
        self.calls = 0
        self.released = 0
        self.fail: OSError | None = None
        self._cond = threading.Condition()

    def __call__(self, fd: int) -> None:
        with self._cond:
            self.calls += 1
            mine = self.calls
            self._cond.notify_all()
            ok = self._cond.wait_for(lambda: self.released >= mine, timeout=10.0)
            assert ok, f"fsync {mine} was never released"
            if self.fail is not None:
                error, self.fail = self.fail, None
                raise error

    def release(self) -> None:
        with self._cond:
            self.released += 1
            self._cond.notify_all()

    def wait_calls(self, n: int, timeout: float = 5.0) -> bool:
        """Block (the loop too) until ``n`` fsyncs began."""
        with self._cond:
            return self._cond.wait_for(lambda: self.calls >= n, timeout=timeout)


async def _until(cond: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.001)


def _stream(tmp_path: Path) -> StreamQueue:
    broker = Broker(Settings(data_dir=str(tmp_path), persistence=False))
    broker._loop = asyncio.get_running_loop()
    q = broker.api.declare_queue("/", "s", durable=True,
                                 arguments={"x-queue-type": "stream"})
    assert isinstance(q, StreamQueue)
    return q


def test_the_next_fsync_starts_without_the_loop_and_confirms_wait_for_theirs(
        tmp_path: Path, monkeypatch: Any) -> None:
    fsync = HeldFsync()
    monkeypatch.setattr(os, "fsync", fsync)

    async def run() -> None:
        q = _stream(tmp_path)
        got: list[tuple[str, BaseException | None]] = []
        q.enqueue(message(b"a"))
        q.sync_log(lambda e: got.append(("a", e)))
        assert fsync.wait_calls(1), "no fsync began"
        q.enqueue(message(b"b"))  # written while the first fsync runs
        q.sync_log(lambda e: got.append(("b", e)))
        assert q.log.flushed_offset == 2
        fsync.release()
        # the thread begins the fsync record b needs at once: the loop is blocked here
        # and has not run the first one's completion
        assert fsync.wait_calls(2), "the second fsync waited for the loop"
        assert got == []
        await _until(lambda: got, "record a was not confirmed")
        assert got == [("a", None)]  # b's fsync has not returned
        await asyncio.sleep(0.01)
        assert got == [("a", None)]
        fsync.release()
        await _until(lambda: len(got) == 2, "record b was not confirmed")
        assert got == [("a", None), ("b", None)]
        assert q.log.synced_offset == 2
        await _until(lambda: not q._syncing, "the sync job did not end")
        assert fsync.calls == 2

    asyncio.run(run())


def test_an_fsync_error_reaches_only_what_it_left_unsynced(
        tmp_path: Path, monkeypatch: Any) -> None:
    fsync = HeldFsync()
    monkeypatch.setattr(os, "fsync", fsync)

    async def run() -> None:
        q = _stream(tmp_path)
        got: list[tuple[str, BaseException | None]] = []
        q.enqueue(message(b"a"))
        q.sync_log(lambda e: got.append(("a", e)))
        assert fsync.wait_calls(1)
        q.enqueue(message(b"b"))
        q.sync_log(lambda e: got.append(("b", e)))
        fsync.release()
        assert fsync.wait_calls(2)
        error = OSError(5, "EIO")
        fsync.fail = error
        fsync.release()
        await _until(lambda: len(got) == 2, "the confirms were not called")
        assert got == [("a", None), ("b", error)]
        assert q.log.synced_offset == 1

    asyncio.run(run())


def test_a_waiter_within_the_linger_is_synced_by_the_same_job(
        tmp_path: Path, monkeypatch: Any) -> None:
    """After an fsync the job waits up to SYNC_LINGER for a waiter wanting more (here
    made 1 s, so a loaded machine cannot make the test take the other path): a confirm
    asked for after the first one was sent gets its fsync from the same worker job, not
    from a new one the loop would start once it heard that the first job ended."""
    fsync = HeldFsync()
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr("amqpd.broker.stream.SYNC_LINGER", 1.0)

    async def run() -> None:
        q = _stream(tmp_path)
        loop = asyncio.get_running_loop()
        jobs: list[Any] = []
        submit = loop.run_in_executor

        def counting(executor: Any, func: Any, *args: Any) -> Any:
            jobs.append(func)
            return submit(executor, func, *args)

        monkeypatch.setattr(loop, "run_in_executor", counting)
        got: list[tuple[str, BaseException | None]] = []
        q.enqueue(message(b"a"))
        q.sync_log(lambda e: got.append(("a", e)))
        assert fsync.wait_calls(1)
        fsync.release()
        await _until(lambda: got, "record a was not confirmed")
        q.enqueue(message(b"b"))
        q.sync_log(lambda e: got.append(("b", e)))
        assert fsync.wait_calls(2), "no fsync for record b"
        fsync.release()
        await _until(lambda: len(got) == 2, "record b was not confirmed")
        assert got == [("a", None), ("b", None)]
        assert len(jobs) == 1, jobs
        await _until(lambda: not q._syncing, "the job did not end", timeout=10.0)

    asyncio.run(run())
