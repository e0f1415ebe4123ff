"""The membership lease is renewed from a thread of its own (issue 28), against a real
private etcd.

A node's event loop once starved for ~35 s (a quadratic catch-up): its renewals, a task
on that loop, stopped, the lease ran out, the node paused, and the others promoted an
unsynchronised mirror of a queue it led. Here the loop is blocked with ``time.sleep``
for longer than the TTL: the lease must survive. The opposite risk is tested too: a
loop that runs nothing for longer than ``hang_after`` is hung, and its lease must run
out (and the node register again once the loop is back)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpd.cluster.loop_clock import LoopClock
from amqpd.cluster.membership import EtcdReach, Membership
from amqpd.cluster.view import ClusterView
from amqpd.coord.etcd import EtcdClient
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)

TTL = 2.0  # etcd's minimum: renewed every third of a second by the thread


@contextlib.asynccontextmanager
async def running(etcd: EtcdProcess, tmp_path: Path,
                  **kw: Any) -> AsyncIterator[tuple[Membership, EtcdClient]]:
    """A started Membership polling (``run``) and a client of the test's own."""
    m = Membership(ClusterView("n1"), EtcdClient([etcd.url]), f"/t/{uuid.uuid4().hex}",
                   TTL, lambda: {"name": "n1"}, str(tmp_path), "c1", **kw)
    other = EtcdClient([etcd.url])
    await m.start()
    task = asyncio.create_task(m.run())
    try:
        yield m, other
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await m.leave()
        await m.etcd.close()
        await other.close()


@contextlib.contextmanager
def ticking() -> Iterator[LoopClock]:
    """A running LoopClock, the node's sign of loop progress."""
    clock = LoopClock()
    task = asyncio.get_running_loop().create_task(clock.run())
    try:
        yield clock
    finally:
        task.cancel()


async def record_lease(m: Membership, other: EtcdClient) -> int:
    """The lease the node's record is attached to in etcd (0: no record)."""
    kv = await other.get(m.key("nodes", "n1"))
    return kv.lease if kv is not None else 0


async def until(cond: Callable[[], Any], deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while not await cond():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_the_lease_survives_a_loop_stalled_past_its_ttl(etcd: EtcdProcess,
                                                              tmp_path: Path) -> None:
    with ticking() as clock:  # as a node runs it: last_ok on the loop clock
        async with running(etcd, tmp_path, clock=clock) as (m, other):
            lease = m.lease_id
            assert lease and await record_lease(m, other) == lease
            reach = EtcdReach(max(TTL * 0.6, 2.0), clock)  # as node.py makes it
            assert reach.check(m.last_ok, m.last_renewal, m.lease_ttl)
            time.sleep(TTL * 2.5)  # the loop runs nothing: no task, no timer
            # right after the stall, before any task ran: renewed meanwhile, so the
            # pause decision (node.py) sees etcd reached and the lease held
            assert time.monotonic() - m.last_renewal < TTL, "not renewed during the stall"
            assert reach.check(m.last_ok, m.last_renewal, m.lease_ttl)
            assert await record_lease(m, other) == lease  # the others still see the node


async def test_a_slow_loop_within_the_hang_limit_keeps_its_lease(etcd: EtcdProcess,
                                                                 tmp_path: Path) -> None:
    with ticking() as clock:
        async with running(etcd, tmp_path, progress=lambda: clock.last_tick,
                           hang_after=TTL * 5) as (m, other):
            lease = m.lease_id
            time.sleep(TTL * 2.5)  # a stall, well under hang_after
            assert time.monotonic() - m.last_renewal < TTL
            assert await record_lease(m, other) == lease


async def test_a_hung_loop_lets_the_lease_run_out(etcd: EtcdProcess, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with ticking() as clock:
        async with running(etcd, tmp_path, progress=lambda: clock.last_tick,
                           hang_after=1.0) as (m, other):
            lease = m.lease_id
            time.sleep(1.0 + TTL + 3.0)  # hung past the limit, then the whole TTL
            assert time.monotonic() - m.last_renewal > TTL  # nothing renewed it
            assert await record_lease(m, other) == 0  # gone: the others count it lost
            assert any("lease renewals stop" in r.getMessage() for r in caplog.records)
            # the loop is back: the thread's report, then the poll, register it again

            async def registered_again() -> bool:
                return m.lease_id != lease and await record_lease(m, other) == m.lease_id

            await until(registered_again)
            assert time.monotonic() - m.last_renewal < TTL


async def test_renewals_resume_when_the_loop_comes_back_in_time(
        etcd: EtcdProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with ticking() as clock:
        async with running(etcd, tmp_path, progress=lambda: clock.last_tick,
                           hang_after=0.5) as (m, other):
            lease = m.lease_id
            time.sleep(1.2)  # past the limit, back before the lease is due to run out
            assert any("lease renewals stop" in r.getMessage() for r in caplog.records)

            async def resumed() -> bool:
                return any("renewals resume" in r.getMessage() for r in caplog.records) \
                    and time.monotonic() - m.last_renewal < 0.5

            await until(resumed)
            assert m.lease_id == lease and await record_lease(m, other) == lease


async def test_a_lease_revoked_elsewhere_is_replaced(etcd: EtcdProcess,
                                                     tmp_path: Path) -> None:
    async with running(etcd, tmp_path) as (m, other):
        lease = m.lease_id
        await other.revoke(lease)  # as if it had run out: the record goes with it

        async def registered_again() -> bool:
            return m.lease_id != lease and await record_lease(m, other) == m.lease_id

        await until(registered_again)


async def test_leave_revokes_and_stops_renewing(etcd: EtcdProcess, tmp_path: Path) -> None:
    async with running(etcd, tmp_path) as (m, other):
        name = f"cluster-lease-{m.lease_id:x}"
        assert name in {t.name for t in threading.enumerate()}
        await m.leave()
        assert await record_lease(m, other) == 0  # gone at once, not after the TTL
        end = time.monotonic() + 5.0
        while name in {t.name for t in threading.enumerate()}:
            assert time.monotonic() < end, "the lease thread still runs after leave()"
            await asyncio.sleep(0.05)
