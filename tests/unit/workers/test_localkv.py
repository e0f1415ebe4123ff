"""The node-local coordination store, driven by the cluster's own etcd client.

What matters is that :class:`amqpd.coord.etcd.EtcdClient` (the client the cluster
layer uses, unchanged) gets etcd's answers: guarded creates, revisions, leases whose
expiry deletes their keys, watches from a revision, and durability across restarts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from amqpd.coord.etcd import (
    Compare,
    Delete,
    EtcdClient,
    EtcdRequestError,
    Get,
    Put,
    WatchCompacted,
)
from amqpd.workers import kvstate
from amqpd.workers.localkv import LocalKV


async def _started(path: Path | None) -> tuple[LocalKV, EtcdClient]:
    kv = LocalKV(path)
    await kv.start()
    return kv, EtcdClient([kv.url], timeout=2.0)


async def test_put_get_prefix_and_revisions(tmp_path: Path) -> None:
    kv, etcd = await _started(tmp_path / "kv.log")
    try:
        rev1 = await etcd.put("/a/x", b"1")
        rev2 = await etcd.put("/a/y", b"2")
        await etcd.put("/b/z", b"3")
        assert rev2 == rev1 + 1
        got = await etcd.get("/a/x")
        assert got is not None and got.value == b"1" and got.create_revision == rev1
        rev, kvs = await etcd.range_prefix("/a/")
        assert [k.key for k in kvs] == [b"/a/x", b"/a/y"]
        assert rev == rev2 + 1
        await etcd.put("/a/x", b"one")
        again = await etcd.get("/a/x")
        assert again is not None and again.version == 2 and again.create_revision == rev1
        assert await etcd.delete("/a/y") == 1
        assert await etcd.delete("/a/y") == 0
        assert await etcd.get("/a/y") is None
    finally:
        await etcd.close()
        await kv.stop()


async def test_txn_guarded_create_first_wins() -> None:
    kv, etcd = await _started(None)
    try:
        first = await etcd.txn([Compare("create", "/q", "==", 0)], [Put("/q", b"A")],
                               [Get("/q")])
        second = await etcd.txn([Compare("create", "/q", "==", 0)], [Put("/q", b"B")],
                                [Get("/q")])
        assert first.succeeded and not second.succeeded
        assert second.responses[0][0].value == b"A"
        mod = (await etcd.get("/q")).mod_revision  # type: ignore[union-attr]
        stale = await etcd.txn([Compare("mod", "/q", "==", mod - 1)], [Delete("/q")])
        assert not stale.succeeded
        fresh = await etcd.txn([Compare("mod", "/q", "==", mod)], [Delete("/q")])
        assert fresh.succeeded and await etcd.get("/q") is None
        await etcd.put("/v", b"x")
        assert (await etcd.txn([Compare("value", "/v", "==", b"x")], [])).succeeded
        assert not (await etcd.txn([Compare("value", "/v", "!=", b"x")], [])).succeeded
    finally:
        await etcd.close()
        await kv.stop()


async def test_lease_expiry_deletes_keys_and_revoke() -> None:
    kv, etcd = await _started(None)
    try:
        lease = await etcd.grant(1)
        await etcd.put("/node/a", b"up", lease=lease.id)
        assert await etcd.keepalive(lease.id) == 1
        deadline = asyncio.get_running_loop().time() + 5
        while await etcd.get("/node/a") is not None:
            assert asyncio.get_running_loop().time() < deadline, "lease never expired"
            await asyncio.sleep(0.05)
        assert await etcd.keepalive(lease.id) == 0
        assert not await etcd.revoke(lease.id)  # already gone: etcd's NOT_FOUND
        other = await etcd.grant(10)
        await etcd.put("/node/b", b"up", lease=other.id)
        assert await etcd.revoke(other.id)
        assert await etcd.get("/node/b") is None
        with pytest.raises(EtcdRequestError):
            await etcd.put("/node/c", b"x", lease=other.id)
    finally:
        await etcd.close()
        await kv.stop()


async def test_watch_replays_from_revision_then_follows() -> None:
    kv, etcd = await _started(None)
    try:
        rev = await etcd.put("/w/1", b"a")
        await etcd.put("/other", b"b")
        await etcd.delete("/w/1")
        seen: list[tuple[bool, bytes, bytes]] = []

        async def follow() -> None:
            async for events in etcd.watch_prefix("/w/", rev):
                seen.extend((e.deleted, e.kv.key, e.kv.value) for e in events)
                if len(seen) >= 3:
                    return

        task = asyncio.create_task(follow())
        deadline = asyncio.get_running_loop().time() + 5
        while len(seen) < 2:
            assert asyncio.get_running_loop().time() < deadline, seen
            await asyncio.sleep(0.02)
        await etcd.put("/w/2", b"c")
        await asyncio.wait_for(task, 5)
        assert seen == [(False, b"/w/1", b"a"), (True, b"/w/1", b""), (False, b"/w/2", b"c")]
    finally:
        await etcd.close()
        await kv.stop()


async def test_watch_behind_history_is_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvstate, "HISTORY", 4)
    kv, etcd = await _started(None)
    try:
        first = await etcd.put("/h/0", b"0")
        for i in range(1, 8):
            await etcd.put(f"/h/{i}", b"x")
        with pytest.raises(WatchCompacted):
            async for _events in etcd.watch_prefix("/h/", first):
                pass
    finally:
        await etcd.close()
        await kv.stop()


async def test_restart_keeps_keys_not_leases_and_revisions_grow(tmp_path: Path) -> None:
    path = tmp_path / "kv.log"
    kv, etcd = await _started(path)
    lease = await etcd.grant(30)
    await etcd.put("/keep", b"1")
    await etcd.put("/keep", b"2")
    await etcd.put("/leased", b"x", lease=lease.id)
    last = await etcd.put("/gone", b"y")
    await etcd.delete("/gone")
    await etcd.close()
    await kv.stop()
    kv, etcd = await _started(path)
    try:
        kept = await etcd.get("/keep")
        assert kept is not None and kept.value == b"2" and kept.version == 2
        assert await etcd.get("/leased") is None
        assert await etcd.get("/gone") is None
        assert await etcd.put("/new", b"z") > last + 1
    finally:
        await etcd.close()
        await kv.stop()
    # a torn last line (a crash in the middle of a write) was never answered: ignored
    with open(path, "a") as fh:
        fh.write('{"rev": 99, "ops": [["put", "2f74"')
    kv, etcd = await _started(path)
    try:
        assert (await etcd.get("/keep")) is not None
        assert await etcd.get("/t") is None
    finally:
        await etcd.close()
        await kv.stop()
