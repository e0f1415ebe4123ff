"""The lease is renewed on time while etcd answers slowly (issue 28: under load a node
paused with "it cannot reach etcd" although etcd answered every call, its renewals
queued behind three slow reads of the poll until the lease ran out)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqpd.cluster.membership import Membership
from amqpd.cluster.view import ClusterView
from amqpd.coord.etcd import KeyValue, Lease

READ_DELAY = 0.4  # each read answers, slowly: a poll takes 1.2 s
TTL = 1.5  # renewed every 0.5 s


class SlowReads:
    """An etcd client whose reads answer after READ_DELAY and whose lease calls answer
    at once; it records when each renewal came."""

    def __init__(self) -> None:
        self.on_answer: Callable[[], None] | None = None
        self.renewals: list[float] = []
        self.timeouts: list[float | None] = []

    async def _read(self) -> None:
        await asyncio.sleep(READ_DELAY)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        await self._read()
        if prefix.endswith("/nodes/"):  # this node's record is there: no new lease
            return [KeyValue(b"/t/nodes/n1", json.dumps({"name": "n1"}).encode(),
                             1, 1, 1, 7)]
        return []

    async def txn(self, compare: Any, success: Any) -> Any:
        await self._read()
        return type("Txn", (), {"responses": []})()

    timeout = 1.0

    async def keepalive(self, lease_id: int, timeout: float | None = None) -> int:
        self.renewals.append(time.monotonic())
        self.timeouts.append(timeout)
        return int(TTL)

    async def grant(self, ttl: int) -> Lease:
        return Lease(7, ttl)

    async def put(self, key: str, value: str, lease: int = 0) -> None:
        return None


async def test_renewals_are_not_held_up_by_slow_polls(tmp_path: Path) -> None:
    etcd = SlowReads()
    m = Membership(ClusterView("n1"), etcd, "/t", TTL,  # type: ignore[arg-type]
                   lambda: {"name": "n1"}, str(tmp_path), "c1")
    await m.register()
    start = time.monotonic()
    task = asyncio.create_task(m.run())
    try:
        await asyncio.sleep(3.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    times = [start, *etcd.renewals]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(etcd.renewals) >= 4, etcd.renewals
    # every third of the TTL, give or take the event loop: never near the TTL
    assert max(gaps) < TTL / 3 + 0.3, gaps
    assert set(etcd.timeouts) == {1.0}, etcd.timeouts  # the client's, when longer


async def test_a_renewal_is_waited_for_up_to_a_third_of_the_ttl(tmp_path: Path) -> None:
    # a late answer still renews the lease: not abandoned after the client's 1 s
    etcd = SlowReads()
    m = Membership(ClusterView("n1"), etcd, "/t", 6.0,  # type: ignore[arg-type]
                   lambda: {"name": "n1"}, str(tmp_path), "c1")
    await m.register()
    task = asyncio.create_task(m.renew())
    try:
        for _ in range(100):  # the first renewal is due after 2 s
            if etcd.timeouts:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert etcd.timeouts == [2.0]
