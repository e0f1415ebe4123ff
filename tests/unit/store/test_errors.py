"""File store only: an injected write error (ENOSPC) fails the commits that needed
it, is visible in ``failed``/``stats()``, and leaves the log consistent on reopen."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from amqpd.store.api import StoreError
from amqpd.store.log import SharedLog

from .conftest import Q1, msg, wait_commit


class DiskFull:
    """Replacement for os.pwrite: writes ``allow`` bytes in total, then ENOSPC."""

    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.real = os.pwrite

    def __call__(self, fd: int, data: Any, offset: int) -> int:
        if self.allow <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), self.allow)
        self.allow -= n
        return self.real(fd, bytes(data[:n]), offset)  # a short write, like a filling disk


@pytest.mark.parametrize("allow", [0, 30, 100])
def test_enospc_fails_commits_and_store_stays_consistent(
    make_log: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allow: int
) -> None:
    s = make_log(retry_after=3600.0)
    good = [s.append_enqueue([Q1], msg(i)) for i in range(10)]
    assert wait_commit(s) is None

    monkeypatch.setattr(os, "pwrite", DiskFull(allow))
    lost = [s.append_enqueue([Q1], msg(100 + i)) for i in range(5)]
    err = wait_commit(s)
    assert isinstance(err, StoreError)
    assert "No space left" in str(err)
    assert s.failed is not None and "No space left" in s.failed
    assert s.stats()["failed"] == 1
    with pytest.raises(StoreError):
        s.append_enqueue([Q1], msg(200))
    s.append_settle(Q1, good[:2])  # settles are accepted and kept for later
    assert isinstance(wait_commit(s), StoreError)

    # space returns: the next append after retry_after re-opens the log
    monkeypatch.undo()
    s.retry_after = 0.0
    after = [s.append_enqueue([Q1], msg(300 + i)) for i in range(5)]
    assert wait_commit(s) is None
    assert s.failed is None and s.stats()["failed"] == 0
    assert min(after) > max(lost), "positions of lost messages are never reused"
    s.append_settle(Q1, lost)  # the broker settling what it was nacked for: harmless
    assert [s.read(p) for p in good[2:] + after] == [
        *(msg(i) for i in range(2, 10)),
        *(msg(300 + i) for i in range(5)),
    ]
    s.close()

    s2 = SharedLog(tmp_path / "log")
    state = s2.open()
    try:
        positions = list(state.queues[Q1].positions)
        assert positions == good[2:] + after, "settled gone, failed ones absent, in order"
        assert not set(lost) & set(positions)
    finally:
        s2.close()


def test_enospc_then_crash_reopens_cleanly(
    make_log: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_log(retry_after=3600.0)
    good = [s.append_enqueue([Q1], msg(i, size=100)) for i in range(10)]
    assert wait_commit(s) is None
    monkeypatch.setattr(os, "pwrite", DiskFull(57))

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    for i in range(5):
        s.append_enqueue([Q1], msg(100 + i, size=100))
    assert isinstance(wait_commit(s), StoreError)
    monkeypatch.undo()
    # the process dies here: a torn record is on disk (ftruncate failed too)
    s2 = SharedLog(tmp_path / "log")
    state = s2.open()
    try:
        assert list(state.queues[Q1].positions) == good
        assert state.truncated_bytes == 57
    finally:
        s2.close()


def test_fsync_error_fails_commit(
    make_log: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_log(retry_after=0.0)
    s.append_enqueue([Q1], msg(1))
    assert wait_commit(s) is None

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    s.append_enqueue([Q1], msg(2))
    err = wait_commit(s)
    assert isinstance(err, StoreError) and "fsync" in str(err)
    monkeypatch.undo()
    p = s.append_enqueue([Q1], msg(3))
    assert wait_commit(s) is None
    assert s.read(p) == msg(3)


def test_callback_exceptions_do_not_break_the_writer(make_log: Any) -> None:
    s = make_log()
    s.append_enqueue([Q1], msg(1))

    def bad(exc: BaseException | None) -> None:
        raise RuntimeError("broker bug")

    s.commit(bad)
    assert wait_commit(s) is None


def test_close_while_failed_answers_every_commit(
    make_log: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_log(retry_after=3600.0)
    s.append_enqueue([Q1], msg(1))
    monkeypatch.setattr(os, "pwrite", DiskFull(0))
    assert isinstance(wait_commit(s), StoreError)
    answers: list[BaseException | None] = []
    s.commit(answers.append)
    s.close()
    assert len(answers) == 1 and isinstance(answers[0], StoreError)


async def test_close_right_after_commit_on_a_loop(tmp_path: Path) -> None:
    """A commit made in the same tick as close() is still answered."""
    import asyncio

    loop = asyncio.get_running_loop()
    s = SharedLog(tmp_path / "log", loop=loop)
    s.open()
    s.append_enqueue([Q1], msg(1))
    fut: asyncio.Future[BaseException | None] = loop.create_future()
    s.commit(fut.set_result)
    s.close()
    assert await asyncio.wait_for(fut, 10) is None
