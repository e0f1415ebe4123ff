"""File store details: reads from the write buffer, fsync policies, stats, cadence."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amqpd.store import checkpoint
from amqpd.store.api import StoreError
from amqpd.store.log import SharedLog
from amqpd.store.segment import Segment

from .conftest import Q1, crash_copy, msg, wait_commit


def test_read_from_write_buffer_without_cache(make_log: Any) -> None:
    s = make_log(body_cache_bytes=0)
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(100)]
    # no commit yet: the writer has not been asked to write anything
    assert [s.read(p) for p in ps] == [msg(i) for i in range(100)]
    assert wait_commit(s) is None
    assert s.stats()["cache_bytes"] == 0
    assert [s.read(p) for p in ps] == [msg(i) for i in range(100)]


def test_fsync_never_still_writes(make_log: Any, tmp_path: Path) -> None:
    s = make_log(fsync="never")
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(10)]
    assert wait_commit(s) is None
    assert s.stats()["fsyncs"] == 0
    copy = crash_copy(s, tmp_path / "copy")
    s2 = SharedLog(copy)
    try:
        assert list(s2.open().queues[Q1].positions) == ps
    finally:
        s2.close()


def test_group_commit_shares_fsyncs(make_log: Any) -> None:
    s = make_log()
    done = threading.Event()
    count = [0]

    def cb(exc: BaseException | None) -> None:
        count[0] += 1
        if count[0] == 1000:
            done.set()

    for i in range(1000):
        s.append_enqueue([Q1], msg(i))
        s.commit(cb)
    assert done.wait(10)
    stats = s.stats()
    assert 1 <= stats["fsyncs"] < 1000
    assert stats["fsync_avg_us"] > 0 and stats["fsync_last_us"] > 0
    assert stats["records_written"] >= 1000
    assert stats["bytes_on_disk"] > 1000 * 16


def test_callbacks_without_loop_run_on_writer_thread(make_log: Any) -> None:
    s = make_log()
    where: list[str] = []
    done = threading.Event()

    def cb(exc: BaseException | None) -> None:
        where.append(threading.current_thread().name)
        done.set()

    s.commit(cb)
    assert done.wait(10)
    assert where == ["amqpd-store-writer"]


def test_periodic_checkpoints(make_log: Any, tmp_path: Path) -> None:
    s = make_log(checkpoint_every_bytes=4096, segment_size=1 << 20)
    for i in range(200):
        s.append_enqueue([Q1], msg(i))
    s.sync()
    assert s.stats()["checkpoints"] >= 2
    assert (tmp_path / "log" / checkpoint.FILE_NAME).exists()


def test_segments_roll_at_size(make_log: Any, tmp_path: Path) -> None:
    s = make_log(segment_size=2048)
    ps = [s.append_enqueue([Q1], msg(i, size=100)) for i in range(100)]
    big = s.append_enqueue([Q1], msg(7, size=10_000))  # bigger than a segment: still one
    s.sync()
    assert s.stats()["segments"] > 5
    assert s.read(big) == msg(7, size=10_000)
    assert [s.read(p) for p in ps[::10]] == [msg(i, size=100) for i in range(0, 100, 10)]


def test_open_twice_and_bad_policy(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SharedLog(tmp_path, fsync="always")  # type: ignore[arg-type]
    s = SharedLog(tmp_path / "log")
    s.open()
    with pytest.raises(StoreError):
        s.open()
    s.close()


def test_read_of_unknown_position(make_log: Any) -> None:
    s = make_log()
    p = s.append_enqueue([Q1], msg(1))
    s.sync()
    with pytest.raises(StoreError):
        s.read(p + 3)


def test_read_while_the_writer_is_busy(make_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks handed to the writer but not yet written are readable too."""
    s = make_log(body_cache_bytes=0)
    gate = threading.Event()
    real = Segment.append

    def slow_append(self: Segment, data: bytes) -> None:
        assert gate.wait(10)
        real(self, data)

    monkeypatch.setattr(Segment, "append", slow_append)
    first = [s.append_enqueue([Q1], msg(i)) for i in range(50)]
    done = threading.Event()
    s.commit(lambda exc: done.set())
    second = [s.append_enqueue([Q1], msg(50 + i)) for i in range(50)]
    assert not done.is_set()
    assert [s.read(p) for p in first + second] == [msg(i) for i in range(100)]
    gate.set()
    assert done.wait(10)
    assert wait_commit(s) is None
    assert [s.read(p) for p in first + second] == [msg(i) for i in range(100)]


class _Loop:
    """The event loop's part: ``call_soon`` queues, the writer thread's
    ``call_soon_threadsafe`` queues and wakes :meth:`run_until`."""

    def __init__(self) -> None:
        self.soon: list[tuple[Any, tuple[Any, ...]]] = []
        self.woken = threading.Event()

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.soon.append((callback, args))

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
        self.soon.append((callback, args))  # list.append is atomic
        self.woken.set()

    def run_until(self, done: Any, timeout: float = 10.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not done():
            while self.soon:
                callback, args = self.soon.pop(0)
                callback(*args)
            if done():
                return
            assert self.woken.wait(max(0.0, deadline - time.monotonic())), "never answered"
            self.woken.clear()


def test_commit_with_nothing_appended_skips_the_writer(make_log: Any) -> None:
    """A tick whose confirms wait only for a stream's own log still asks the shared log
    for a commit (Publisher.register_commit). Once everything appended is fsynced, that
    commit is answered on the loop at once: no job, no wake-up of the writer thread."""
    loop = _Loop()
    s = make_log(loop=loop)
    got: list[BaseException | None] = []
    s.append_enqueue([Q1], msg(1))
    s.commit(got.append)
    assert [cb for cb, _ in loop.soon] == [s._end_of_tick]  # the record needs the writer
    loop.run_until(lambda: got)
    assert got == [None]
    fsyncs = s.stats()["fsyncs"]
    assert fsyncs >= 1

    s.commit(got.append)  # nothing appended since: durable already
    assert loop.soon == [(got.append, (None,))]
    assert not s._writer.jobs and not s._tick_scheduled
    loop.run_until(lambda: len(got) == 2)
    assert got == [None, None] and s.stats()["fsyncs"] == fsyncs

    s.append_settle(Q1, [0])  # anything appended needs the writer again
    s.commit(got.append)
    assert [cb for cb, _ in loop.soon] == [s._end_of_tick]
    loop.run_until(lambda: len(got) == 3)
    assert got == [None, None, None] and s.stats()["fsyncs"] == fsyncs + 1


def test_commit_with_nothing_appended_waits_for_a_write_under_way(make_log: Any) -> None:
    """Records handed to the writer but not yet fsynced (their commit is still under
    way) are not durable: a commit asked meanwhile waits for the writer."""
    loop = _Loop()
    s = make_log(loop=loop)
    got: list[BaseException | None] = []
    s.append_enqueue([Q1], msg(1))
    s.commit(got.append)
    s._end_of_tick()  # the records and the commit go to the writer now
    loop.soon.clear()
    s.commit(got.append)  # before the writer's answer has come back
    assert [cb for cb, _ in loop.soon] in ([s._end_of_tick], [])
    loop.run_until(lambda: len(got) == 2)
    assert got == [None, None]


def test_commit_after_a_write_failure_still_reports_it(make_log: Any) -> None:
    """A failed writer: a commit with nothing new appended still gets the error."""
    loop = _Loop()
    s = make_log(loop=loop)
    got: list[BaseException | None] = []
    s.commit(got.append)
    loop.run_until(lambda: got)
    s._writer.failed = "write: injected"
    s.commit(got.append)
    loop.run_until(lambda: len(got) == 2)
    assert isinstance(got[1], StoreError)


def test_an_observers_deferred_work_runs_before_the_batchs_callbacks(make_log: Any) -> None:
    """What the observer (replication) returns runs with the batch's delivery, before
    its commit callbacks; a batch without callbacks delivers it on its own."""
    s = make_log()
    if not isinstance(s, SharedLog):
        pytest.skip("the in-memory store has no writer thread")
    order: list[str] = []
    seen = threading.Event()

    def later() -> None:
        order.append("later")
        seen.set()

    def observer(events: list[tuple[object, ...]]) -> Callable[[], None]:
        return later

    s.set_observer(observer)
    s.append_enqueue([Q1], msg(1))
    done = threading.Event()

    def callback(exc: BaseException | None) -> None:
        order.append(f"callback {exc}")
        done.set()

    s.commit(callback)
    assert done.wait(10)
    assert order[-2:] == ["later", "callback None"]
    order.clear()
    seen.clear()
    # more than the log's hand-over threshold without a commit: written, no callbacks
    for i in range(1500):
        s.append_enqueue([Q1], msg(i, size=1000))
    assert seen.wait(10), "the deferred work of a batch without callbacks never ran"
    assert order and set(order) == {"later"}
