"""The MessageStore contract, run against every implementation (NATS style)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from amqpd.store.api import MessageStore, StoreError
from amqpd.store.log import SharedLog
from amqpd.store.memory import MemoryStore

from .conftest import Q1, Q2, Q3, msg, wait_commit


def test_implements_protocol(store: Any) -> None:
    s: MessageStore = store  # mypy checks the structural type
    assert callable(s.append_enqueue)


def test_append_and_read(store: Any) -> None:
    positions = [store.append_enqueue([Q1], msg(i)) for i in range(50)]
    assert positions == sorted(set(positions)), "positions grow monotonically"
    for i, p in enumerate(positions):
        assert store.read(p) == msg(i)
    assert wait_commit(store) is None
    for i, p in enumerate(positions):
        assert store.read(p) == msg(i)


def test_large_body_and_empty_body(store: Any) -> None:
    big = msg(1, size=300_000)
    empty = msg(2, size=0)
    p1 = store.append_enqueue([Q1], big)
    p2 = store.append_enqueue([Q1], empty)
    assert wait_commit(store) is None
    assert store.read(p1) == big
    assert store.read(p2) == empty


def test_fan_out_shares_one_position(store: Any) -> None:
    p = store.append_enqueue([Q1, Q2, Q3], msg(7))
    assert store.stats()["live_messages"] == 3
    store.append_settle(Q1, [p])
    store.append_settle(Q2, [p])
    assert store.read(p) == msg(7)  # still live in Q3
    store.append_settle(Q3, [p])
    assert store.stats()["live_messages"] == 0


def test_settle_and_double_settle(store: Any) -> None:
    ps = [store.append_enqueue([Q1], msg(i)) for i in range(10)]
    store.append_settle(Q1, ps[:5])
    store.append_settle(Q1, ps[:5])  # a double ack must not go negative
    store.append_settle(Q2, ps)  # a queue that never held them
    assert store.stats()["live_messages"] == 5
    store.append_settle(Q1, [ps[9], ps[7], ps[5]])  # out of order
    assert store.stats()["live_messages"] == 2


def test_drop_queue(store: Any) -> None:
    ps = [store.append_enqueue([Q1, Q2], msg(i)) for i in range(20)]
    store.drop_queue(Q1)
    store.drop_queue("/\x00never-existed")
    assert store.stats()["live_messages"] == 20
    store.append_settle(Q2, ps)
    assert store.stats()["live_messages"] == 0


def test_delivered_is_accepted(store: Any) -> None:
    p = store.append_enqueue([Q1], msg(1))
    store.append_delivered(Q1, p)
    store.append_delivered(Q1, p)
    store.append_delivered(Q2, p)
    assert wait_commit(store) is None


def test_commit_callbacks_all_fire_once(store: Any) -> None:
    fired: list[BaseException | None] = []
    lock = threading.Lock()
    done = threading.Event()

    def cb(exc: BaseException | None) -> None:
        with lock:
            fired.append(exc)
            if len(fired) == 100:
                done.set()

    for i in range(100):
        store.append_enqueue([Q1], msg(i))
        store.commit(cb)
    assert done.wait(10)
    assert fired == [None] * 100


def test_stats_keys(store: Any) -> None:
    store.append_enqueue([Q1], msg(1))
    wait_commit(store)
    stats = store.stats()
    for key in ("bytes_on_disk", "segments", "fsyncs", "fsync_last_us", "fsync_avg_us",
                "records_written", "live_messages", "failed"):
        assert isinstance(stats[key], int), key
    assert stats["records_written"] >= 1


def test_closed_store_refuses_appends(store: Any) -> None:
    store.close()
    with pytest.raises(StoreError):
        store.append_enqueue([Q1], msg(1))
    store.close()  # idempotent


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_callbacks_run_on_the_loop_thread(kind: str, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    s: Any = (
        MemoryStore(loop=loop)
        if kind == "memory"
        else SharedLog(tmp_path / "log", loop=loop, segment_size=1 << 16)
    )
    s.open()
    try:
        futs = []
        for i in range(20):
            s.append_enqueue([Q1], msg(i))
            fut = loop.create_future()

            def cb(exc: BaseException | None, fut: asyncio.Future[Any] = fut) -> None:
                fut.set_result((exc, threading.get_ident()))

            s.commit(cb)
            futs.append(fut)
        results = await asyncio.wait_for(asyncio.gather(*futs), 10)
        assert results == [(None, threading.get_ident())] * 20
    finally:
        s.close()
