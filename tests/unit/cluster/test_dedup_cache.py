"""amqpd/cluster/dedup_cache.py against a real private etcd: one publish takes a value,
every other node sees a duplicate once it is done and waits while it is pending; a
released value is free again; an expired one is taken over; a pending value whose node's
lease ended is free; x-cache-size trims the oldest keys."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from amqpd.cluster.dedup_cache import DedupCaches, PendingTooLong
from amqpd.coord.etcd import EtcdClient
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)


@pytest.fixture
async def nodes(etcd: EtcdProcess) -> AsyncIterator[tuple[DedupCaches, DedupCaches]]:
    """Two nodes' registries under one fresh root, each with a lease of its own (2 s)."""
    root = f"/t/{uuid.uuid4().hex}"
    admin = EtcdClient([etcd.url])
    leases = [(await admin.grant(2)).id, (await admin.grant(2)).id]
    a = DedupCaches([etcd.url], root, "node-a", lambda: leases[0], 2.0)
    b = DedupCaches([etcd.url], root, "node-b", lambda: leases[1], 2.0)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()
        await admin.close()


def _ms(seconds: float) -> int:
    return int((time.time() + seconds) * 1000)


async def test_one_publish_takes_a_value(nodes: tuple[DedupCaches, DedupCaches]) -> None:
    a, b = nodes
    ca, cb = a.get("/", "x"), b.get("/", "x")
    revision = await ca.take(b"\x53v1")
    assert revision > 0
    # pending: node-b waits for the outcome; once done it is a duplicate
    waiting = asyncio.ensure_future(cb.take(b"\x53v1"))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await ca.settle(b"\x53v1", revision, 0)
    assert await asyncio.wait_for(waiting, 5) == 0
    assert await ca.take(b"\x53v1") == 0
    # another exchange, another cache
    assert await b.get("/", "y").take(b"\x53v1") > 0


async def test_a_released_value_is_free(nodes: tuple[DedupCaches, DedupCaches]) -> None:
    a, b = nodes
    ca, cb = a.get("/", "x"), b.get("/", "x")
    revision = await ca.take(b"v")
    waiting = asyncio.ensure_future(cb.take(b"v"))
    await asyncio.sleep(0.2)
    await ca.release(b"v", revision)
    assert await asyncio.wait_for(waiting, 5) > 0  # node-b took it


async def test_an_expired_value_is_taken_again(nodes: tuple[DedupCaches, DedupCaches]) -> None:
    a, b = nodes
    ca, cb = a.get("/", "x"), b.get("/", "x")
    revision = await ca.take(b"v")
    await ca.settle(b"v", revision, _ms(0.3))
    assert await cb.take(b"v") == 0
    await asyncio.sleep(0.4)
    assert await cb.take(b"v") > 0


async def test_a_dead_nodes_pending_value_goes_with_its_lease(
        etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    admin = EtcdClient([etcd.url])
    lease = (await admin.grant(2)).id  # node-a's, never renewed: node-a "died"
    mine = (await admin.grant(30)).id
    a = DedupCaches([etcd.url], root, "node-a", lambda: lease, 2.0)
    b = DedupCaches([etcd.url], root, "node-b", lambda: mine, 2.0)
    try:
        assert await a.get("/", "x").take(b"v") > 0
        started = time.monotonic()
        assert await b.get("/", "x").take(b"v") > 0  # once the lease ran out
        assert time.monotonic() - started > 0.5
        # a pending value whose node lives is waited for at most pending_wait
        a.pending_wait = 0.3
        with pytest.raises(PendingTooLong):
            await a.get("/", "x").take(b"v")
    finally:
        await a.close()
        await b.close()
        await admin.close()


async def test_the_size_trims_the_oldest(nodes: tuple[DedupCaches, DedupCaches]) -> None:
    a, _b = nodes
    cache = a.get("/", "x")
    cache.size = 10  # a trim every size // 10 = 1 settles
    for i in range(15):
        value = b"v%d" % i
        await cache.settle(value, await cache.take(value), 0)
    assert cache.entries == 10
    assert await cache.take(b"v0") > 0  # the oldest went
    assert await cache.take(b"v14") == 0


async def test_drop_empties_the_cache(nodes: tuple[DedupCaches, DedupCaches]) -> None:
    a, b = nodes
    cache = a.get("/", "x")
    await cache.settle(b"v", await cache.take(b"v"), 0)
    await b.get("/", "x").drop()
    assert await cache.take(b"v") > 0
