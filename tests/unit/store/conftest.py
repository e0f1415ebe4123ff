"""Store test helpers: a [memory, file] store fixture (NATS style) and crash copies."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpd.store.api import StoredMessage
from amqpd.store.log import SharedLog
from amqpd.store.memory import MemoryStore

Q1 = "/\x00q1"
Q2 = "/\x00q2"
Q3 = "other\x00q1"


def msg(i: int, size: int = 16) -> StoredMessage:
    body = (b"%08d" % i) * (size // 8 + 1)
    return StoredMessage("amq.direct", f"rk.{i}", b"\x80\x00\x02", body[:size])


def wait_commit(store: Any, timeout: float = 10.0) -> BaseException | None:
    """Commit and block until the callback fires; return what it was given."""
    done = threading.Event()
    got: list[BaseException | None] = []

    def cb(exc: BaseException | None) -> None:
        got.append(exc)
        done.set()

    store.commit(cb)
    assert done.wait(timeout), "commit callback never fired"
    return got[0]


def open_log(directory: Path, **kwargs: Any) -> SharedLog:
    kwargs.setdefault("segment_size", 64 * 1024)
    kwargs.setdefault("checkpoint_every_bytes", 1 << 30)
    store = SharedLog(directory, **kwargs)
    store.open()
    return store


def crash_copy(store: SharedLog, dst: Path) -> Path:
    """What a kill -9 would leave: the files as they are now, no closing checkpoint."""
    store.sync()
    shutil.copytree(store.directory, dst)
    return dst


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    s: Any
    if request.param == "memory":
        s = MemoryStore()
        s.open()
    else:
        s = open_log(tmp_path / "log")
    yield s
    s.close()


@pytest.fixture
def make_log(tmp_path: Path) -> Iterator[Callable[..., SharedLog]]:
    """Open SharedLogs on tmp dirs; all closed at teardown."""
    opened: list[SharedLog] = []

    def make(directory: Path | None = None, **kwargs: Any) -> SharedLog:
        s = open_log(directory or tmp_path / "log", **kwargs)
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()
