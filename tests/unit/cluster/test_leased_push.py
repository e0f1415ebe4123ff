"""The keys a node keeps under its lease (amqpd.cluster.leased_push, shared by the
non-durable queues and the node info board) and the read-then-watch loop
(amqpd.cluster.prefix_watch), on a fake etcd: every key again under a new lease, a
refused write tried again, a key changed during its write written again, a deleted key
deleted; a watch that ends is followed by a full read from the revision it reached."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

from amqpd.cluster.leased_push import LeasedPush
from amqpd.cluster.prefix_watch import follow_prefix
from amqpd.coord.etcd import EtcdError, KeyValue, WatchEvent

log = logging.getLogger("test")


class FakeEtcd:
    def __init__(self) -> None:
        self.puts: list[tuple[str, str, int]] = []
        self.deletes: list[str] = []
        self.refuse = 0  # writes to refuse before accepting again
        self.gate: asyncio.Event | None = None  # a put waits for it when set

    async def put(self, key: str, value: str, lease: int = 0) -> None:
        if self.refuse:
            self.refuse -= 1
            raise EtcdError("refused")
        if self.gate is not None:
            await self.gate.wait()
        self.puts.append((key, value, lease))

    async def delete(self, key: str) -> None:
        self.deletes.append(key)


class Board(LeasedPush[str]):
    def __init__(self, etcd: FakeEtcd) -> None:
        self.cluster = SimpleNamespace(membership=SimpleNamespace(lease_id=0))  # type: ignore[assignment]
        self.etcd = etcd  # type: ignore[assignment]
        self.mine = {}
        self.pending = {}
        self.lease = 0
        self._wake = asyncio.Event()
        self.failures: list[str] = []

    def _etcd_key(self, ident: str) -> str:
        return f"k/{ident}"

    def _not_written(self, ident: str, exc: EtcdError) -> None:
        self.failures.append(ident)


async def until(cond: Any, what: str) -> None:
    for _ in range(400):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within 4 s: {what}")


async def test_keys_are_written_under_the_lease_and_again_under_a_new_one() -> None:
    etcd = FakeEtcd()
    board = Board(etcd)
    board._keep("a", "1")
    task = asyncio.create_task(board._push_loop())
    try:
        await asyncio.sleep(0.05)
        assert etcd.puts == []  # no lease yet: nothing written
        board.cluster.membership.lease_id = 7
        await until(lambda: etcd.puts == [("k/a", "1", 7)], "written under lease 7")
        board._keep("b", "2")
        await until(lambda: ("k/b", "2", 7) in etcd.puts, "the new key written")
        board.cluster.membership.lease_id = 8
        board._wake.set()
        await until(lambda: {("k/a", "1", 8), ("k/b", "2", 8)} <= set(etcd.puts),
                    "every key again under lease 8")
        board._forget("a")
        await until(lambda: etcd.deletes == ["k/a"], "the forgotten key deleted")
        assert not board.pending
    finally:
        task.cancel()


async def test_a_refused_write_is_tried_again_and_a_newer_body_wins() -> None:
    etcd = FakeEtcd()
    board = Board(etcd)
    board.cluster.membership.lease_id = 3
    etcd.refuse = 2
    board._keep("a", "1")
    task = asyncio.create_task(board._push_loop())
    try:
        await until(lambda: etcd.puts == [("k/a", "1", 3)], "written after two refusals")
        assert board.failures == ["a", "a"]
        etcd.gate = asyncio.Event()
        board._keep("a", "2")
        await asyncio.sleep(0.05)  # the write of "2" is under way ...
        board._keep("a", "3")  # ... when the key changes again
        etcd.gate.set()
        await until(lambda: etcd.puts[-1] == ("k/a", "3", 3) and not board.pending,
                    "the newer body written last")
    finally:
        task.cancel()


async def test_a_watch_that_ends_is_followed_by_a_full_read_from_where_it_was() -> None:
    reads: list[int] = []
    seen: list[bytes] = []
    starts: list[int] = []

    class Etcd:
        async def watch_prefix(self, prefix: str, start: int) -> Any:
            starts.append(start)
            kv = KeyValue(b"p/x", b"v%d" % len(starts), 1, 40 + len(starts), 1, 0)
            yield [WatchEvent(False, kv)]
            raise EtcdError("watch ended")

    async def read_all() -> int:
        reads.append(len(reads))
        return 10

    task = asyncio.create_task(follow_prefix(
        Etcd(), "p/", read_all, lambda ev: seen.append(ev.kv.value), log,  # type: ignore[arg-type]
        "test"))
    try:
        await until(lambda: len(starts) >= 2, "the watch started again")
    finally:
        task.cancel()
    assert starts[:2] == [11, 42]  # after the read's revision, then after the event's
    assert seen[:2] == [b"v1", b"v2"] and len(reads) >= 2
