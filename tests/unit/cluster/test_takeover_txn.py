"""A take-over transaction whose answer is lost is settled by reading the keys back
(amqpd/cluster/takeover_txn.py): applied -> its revision; not applied -> None; etcd
silent for the whole window -> EtcdError. Before, a lost answer was read as a failed
take-over although etcd had applied it: the definition named this node the leader and
no node hosted the queue (chaos seed 107, namespace partitions)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from amqpd.cluster.takeover_txn import applied, names_this_node, take_over_txn
from amqpd.coord.etcd import Compare, EtcdError, KeyValue, Put, TxnResult


class LossyEtcd:
    """A dict of keys; ``apply`` says whether a txn whose answer is lost was applied,
    ``silent`` how many reads fail before etcd answers again."""

    def __init__(self, apply: bool, lose_answer: bool = True, silent: int = 0) -> None:
        self.data: dict[bytes, tuple[bytes, int]] = {b"def": (b"old", 5), b"rec": (b"old", 5)}
        self.revision = 5
        self.apply = apply
        self.lose_answer = lose_answer
        self.silent = silent

    async def txn(self, compare: list[Compare], success: list[Put]) -> TxnResult:
        ok = all(self.data[_b(c.key)][1] == c.operand for c in compare)
        if ok and (self.apply or not self.lose_answer):
            self.revision += 1
            for put in success:
                self.data[_b(put.key)] = (_b(put.value), self.revision)
        if self.lose_answer:
            raise EtcdError("kv/txn: no endpoint answered in time")
        return TxnResult(ok, self.revision, [])

    async def get(self, key: bytes | str) -> KeyValue | None:
        if self.silent > 0:
            self.silent -= 1
            raise EtcdError("kv/range: no endpoint answered in time")
        value, rev = self.data[_b(key)]
        return KeyValue(_b(key), value, 1, rev, 1, 0)


def _b(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else x


GUARDS = [Compare("mod", "def", "==", 5), Compare("mod", "rec", "==", 5)]
PUTS = [Put("def", '{"node":"node-c"}'), Put("rec", '{"leader":"node-c"}')]


async def test_an_answered_txn_is_taken_as_answered() -> None:
    etcd = LossyEtcd(apply=True, lose_answer=False)
    assert await take_over_txn(etcd, GUARDS, PUTS, "q") == 6  # type: ignore[arg-type]
    refused = LossyEtcd(apply=True, lose_answer=False)
    refused.data[b"rec"] = (b"other", 7)
    assert await take_over_txn(refused, GUARDS, PUTS, "q") is None  # type: ignore[arg-type]


async def test_a_lost_answer_of_an_applied_txn_counts_as_applied() -> None:
    etcd = LossyEtcd(apply=True, silent=3)
    assert await take_over_txn(etcd, GUARDS, PUTS, "q") == 6  # type: ignore[arg-type]


async def test_a_lost_answer_of_a_txn_not_applied_counts_as_refused() -> None:
    etcd = LossyEtcd(apply=False, silent=2)
    assert await take_over_txn(etcd, GUARDS, PUTS, "q") is None  # type: ignore[arg-type]


async def test_etcd_silent_for_the_whole_window_raises() -> None:
    etcd = LossyEtcd(apply=True, silent=10**6)
    with pytest.raises(EtcdError):
        await take_over_txn(etcd, GUARDS, PUTS, "q", window=0.3)  # type: ignore[arg-type]


async def test_applied_needs_every_key() -> None:
    etcd = LossyEtcd(apply=True, lose_answer=False)
    etcd.data[b"def"] = (b'{"node":"node-c"}', 6)
    assert await applied(etcd, PUTS) is None  # type: ignore[arg-type]


def test_names_this_node_needs_record_and_definition() -> None:
    rec: dict[str, Any] = {"leader": "node-c"}
    assert names_this_node(rec, json.dumps({"node": "node-c"}).encode(), "node-c")
    assert not names_this_node(rec, json.dumps({"node": "node-b"}).encode(), "node-c")
    assert not names_this_node({"leader": "node-b"}, b'{"node":"node-c"}', "node-c")
    assert not names_this_node(rec, None, "node-c")
    assert not names_this_node(rec, b"not json", "node-c")
