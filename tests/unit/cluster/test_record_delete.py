"""Deleting a queue's mirror or group record when its leader stops leading it
(amqpd.coord.etcd.delete_own, used by Mirrors.stop_leading).

The case a helper's run met: the queue was deleted on its leader while a write of the
leader's record was in flight, so the delete, guarded by the revision known before
that write, failed; the record stayed, naming that node the leader, and the queue
declared again on another node was never led there ("the group record names node-b its
leader: not leading it")."""

from __future__ import annotations

import json
from typing import Any, cast

from amqpd.coord.etcd import Compare, Delete, EtcdClient, KeyValue, TxnResult, delete_own

KEY = "/amqpd/c1/quorum/%2F/q"


class FakeEtcd:
    """One key's value and mod revision; txn understands a mod guard and a delete."""

    def __init__(self, value: dict[str, Any] | None, revision: int) -> None:
        self.value = None if value is None else json.dumps(value).encode()
        self.revision = revision
        self.txns = 0

    async def txn(self, compare: list[Compare], success: list[Any]) -> TxnResult:
        self.txns += 1
        (guard,) = compare
        now = self.revision if self.value is not None else 0
        if guard.target != "mod" or guard.operand != now:
            return TxnResult(False, self.revision, [])
        assert isinstance(success[0], Delete)
        self.value = None
        self.revision += 1
        return TxnResult(True, self.revision, [[]])

    async def get(self, key: str) -> KeyValue | None:
        if self.value is None:
            return None
        return KeyValue(key.encode(), self.value, 1, self.revision, 1, 0)


def ours(value: bytes) -> bool:
    rec = json.loads(value)
    return bool(rec["leader"] == "node-b" and rec["term"] == 3)


async def test_the_record_this_node_wrote_last_is_deleted() -> None:
    etcd = FakeEtcd({"leader": "node-b", "term": 3}, revision=7)
    assert await delete_own(cast(EtcdClient, etcd), KEY, 7, ours)
    assert etcd.value is None and etcd.txns == 1


async def test_a_write_that_landed_after_the_known_revision_is_deleted_too() -> None:
    etcd = FakeEtcd({"leader": "node-b", "term": 3, "mirrors": ["node-c"]}, revision=9)
    assert await delete_own(cast(EtcdClient, etcd), KEY, 7, ours)
    assert etcd.value is None and etcd.txns == 2


async def test_without_a_known_revision_the_record_is_read_first() -> None:
    etcd = FakeEtcd({"leader": "node-b", "term": 3}, revision=4)
    assert await delete_own(cast(EtcdClient, etcd), KEY, -1, ours)
    assert etcd.value is None and etcd.txns == 1
    assert await delete_own(cast(EtcdClient, FakeEtcd(None, 0)), KEY, 0, ours)


async def test_a_successors_record_stays() -> None:
    for rec in ({"leader": "node-c", "term": 4}, {"leader": "node-b", "term": 5}):
        etcd = FakeEtcd(rec, revision=9)
        assert not await delete_own(cast(EtcdClient, etcd), KEY, 7, ours)
        assert etcd.value is not None
