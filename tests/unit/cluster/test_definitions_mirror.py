"""DefinitionMirror against a real private etcd, with stand-in brokers: the ordering
rules of amqpd/cluster/definitions.py without amqpd processes.

Each "node" is a mirror over a dict broker (``FakeAPI``: entries in, entries applied).
Checked: a fresh cluster is seeded by the first node; changes reach the others and are
not applied back on the node that made them; concurrent writes of one key end equal on
every node (etcd's last write); a guarded create loses to the first creator; a node that
was away applies what was deleted meanwhile; queue entries carry their leader.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from amqpd.broker.api import DEFINITION_KINDS
from amqpd.cluster.definitions import DefinitionMirror
from amqpd.cluster.view import ClusterView
from amqpd.coord.etcd import EtcdClient
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)

KIND = {name: kind for kind, name in DEFINITION_KINDS.items()}


class FakeAPI:
    """A broker reduced to its definitions: what the mirror reads and applies."""

    def __init__(self, entries: dict[tuple[int, str], bytes] | None = None) -> None:
        self.entries = dict(entries or {})
        self.applied: list[tuple[int, str, bytes | None]] = []
        self.mirror: DefinitionMirror | None = None

    def definition_entries(self) -> dict[tuple[int, str], bytes]:
        return dict(self.entries)

    def apply_definition(self, kind: int, key: str, body: bytes | None) -> None:
        self.applied.append((kind, key, body))
        if body:
            self.entries[(kind, key)] = body
        else:
            self.entries.pop((kind, key), None)

    def find_queue(self, vhost: str, name: str) -> object | None:
        return self.entries.get((KIND["queue"], f"{vhost}\x00{name}"))

    def find_exchange(self, vhost: str, name: str) -> object | None:
        return self.entries.get((KIND["exchange"], f"{vhost}\x00{name}"))

    def change(self, kind: str, key: str, body: dict[str, Any] | None) -> None:
        """A change made on this node: applied, then recorded (as the journal does)."""
        raw = json.dumps(body).encode() if body is not None else b""
        if body is not None:
            self.entries[(KIND[kind], key)] = raw
        else:
            self.entries.pop((KIND[kind], key), None)
        assert self.mirror is not None
        self.mirror.recorded(KIND[kind], key, raw)


async def node(etcd: EtcdProcess, root: str, name: str,
               entries: dict[tuple[int, str], bytes] | None = None,
               ) -> tuple[DefinitionMirror, FakeAPI]:
    api = FakeAPI(entries)
    mirror = DefinitionMirror(ClusterView(name), api, EtcdClient([etcd.url]),  # type: ignore[arg-type]
                              root)
    api.mirror = mirror
    await mirror.initial_sync()
    mirror.start()
    return mirror, api


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def body(entries: dict[tuple[int, str], bytes], kind: str, key: str) -> Any:
    raw = entries.get((KIND[kind], key))
    return json.loads(raw) if raw else None


async def stop(*mirrors: DefinitionMirror) -> None:
    for m in mirrors:
        await m.stop()
        await m.etcd.close()


async def test_seed_spread_and_no_echo(etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    seed = {(KIND["vhost"], "/"): b'{"name":"/"}', (KIND["user"], "guest"): b'{"name":"guest"}'}
    m1, a1 = await node(etcd, root, "n1", seed)
    m2, a2 = await node(etcd, root, "n2", {(KIND["user"], "guest"): b'{"name":"other"}'})
    try:
        # n2 took etcd's (n1's) definitions over its own
        assert body(a2.entries, "user", "guest") == {"name": "guest"}
        assert body(a2.entries, "vhost", "/") == {"name": "/"}
        a1.applied.clear()
        a1.change("exchange", "/\x00orders", {"name": "orders", "type": "topic"})
        a1.change("queue", "/\x00q1", {"name": "q1", "vhost": "/"})
        await until(lambda: m2.view.queue_leader("/", "q1") == "n1")
        assert body(a2.entries, "exchange", "/\x00orders")["type"] == "topic"
        # the queue's leader is n1 in both catalogues; n2 has no local copy of it (the
        # inter-node links stand for it there), but exports it from the catalogue
        assert m1.view.queue_leader("/", "q1") == "n1"
        assert body(a2.entries, "queue", "/\x00q1") is None
        assert [q["name"] for q in m2.catalogue_items(KIND["queue"])] == ["q1"]
        await until(lambda: m1.pushed == m1.enqueued and not m1.inflight)
        await asyncio.sleep(0.3)  # the watch has delivered n1's own changes back by now
        assert a1.applied == []  # its own echo is never applied
        a2.change("exchange", "/\x00orders", None)
        await until(lambda: body(a1.entries, "exchange", "/\x00orders") is None)
    finally:
        await stop(m1, m2)


async def test_concurrent_writes_converge(etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    m1, a1 = await node(etcd, root, "n1")
    m2, a2 = await node(etcd, root, "n2")
    try:
        for i in range(20):
            a1.change("policy", "/\x00p", {"name": "p", "n": f"a{i}"})
            a2.change("policy", "/\x00p", {"name": "p", "n": f"b{i}"})
        await until(lambda: m1.pushed == m1.enqueued and m2.pushed == m2.enqueued)
        final = await m1.etcd.get(m1.etcd_key(KIND["policy"], "/\x00p"))
        assert final is not None
        await until(lambda: body(a1.entries, "policy", "/\x00p") == json.loads(final.value)
                    == body(a2.entries, "policy", "/\x00p"))
    finally:
        await stop(m1, m2)


async def test_guarded_create_first_wins(etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    m1, a1 = await node(etcd, root, "n1")
    m2, a2 = await node(etcd, root, "n2")
    try:
        await m2.stop()  # n2 does not hear of n1's queue before declaring its own
        a1.change("queue", "/\x00dup", {"name": "dup", "vhost": "/", "arguments": {"a": 1}})
        await until(lambda: m1.pushed == m1.enqueued)
        m2.start()
        a2.change("queue", "/\x00dup", {"name": "dup", "vhost": "/", "arguments": {"b": 2}})
        await until(lambda: m2.pushed == m2.enqueued)
        # n1 declared first: its definition and leadership stand on both nodes
        assert m2.view.queue_leader("/", "dup") == "n1"
        stored = await m1.etcd.get(m1.etcd_key(KIND["queue"], "/\x00dup"))
        assert stored is not None and json.loads(stored.value)["arguments"] == {"a": 1}
    finally:
        await stop(m1, m2)


async def test_returning_node_applies_deletes(etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    m1, a1 = await node(etcd, root, "n1")
    a1.change("vhost", "gone", {"name": "gone"})
    a1.change("vhost", "stays", {"name": "stays"})
    await until(lambda: m1.pushed == m1.enqueued)
    m2, a2 = await node(etcd, root, "n2")
    assert body(a2.entries, "vhost", "gone") == {"name": "gone"}
    await stop(m2)
    try:
        a1.change("vhost", "gone", None)
        await until(lambda: m1.pushed == m1.enqueued)
        # n2 comes back with its own copy (as from its log) and etcd wins
        m3, a3 = await node(etcd, root, "n2", a2.entries)
        try:
            assert body(a3.entries, "vhost", "gone") is None
            assert body(a3.entries, "vhost", "stays") == {"name": "stays"}
            assert (KIND["vhost"], "gone", None) in a3.applied
        finally:
            await stop(m3)
    finally:
        await stop(m1)


async def test_a_reply_waits_for_etcd_a_bounded_time() -> None:
    """etcd out of reach (partition_handling = ignore serves on): the reply to a
    definition change gets an error after cluster.definition_timeout instead of waiting
    for ever."""
    from amqpd.coord.etcd import EtcdUnavailable

    api = FakeAPI()
    mirror = DefinitionMirror(ClusterView("lonely"), api,  # type: ignore[arg-type]
                              EtcdClient(["http://127.0.0.1:9"], timeout=0.2), "/nowhere",
                              timeout=0.5)
    api.mirror = mirror
    mirror.start()
    try:
        api.change("queue", "/\x00q", {"name": "q", "vhost": "/", "durable": True})
        got: list[BaseException | None] = []
        mirror.after_mirrored(got.append)(None)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(got) == 1 and isinstance(got[0], EtcdUnavailable), got
        assert "within 0.5 s" in str(got[0])
        assert len(mirror.pending) == 1  # still queued for etcd
    finally:
        await mirror.stop(drain=0)
        await mirror.etcd.close()


async def test_a_push_loop_that_fails_unexpectedly_is_logged_and_started_again(
        etcd: EtcdProcess, caplog: pytest.LogCaptureFixture) -> None:
    """A bug in the push loop (any exception but etcd's) used to end its task silently:
    no change of the node reached etcd again, and every declare there waited out its
    deadline (issue 28's silent node). Now it is logged and the loop starts again."""
    root = f"/t/{uuid.uuid4().hex}"
    mirror, api = await node(etcd, root, "node-a")
    real_txn = mirror.etcd.txn
    fails = [1]

    async def txn(*args: Any, **kwargs: Any) -> Any:
        if fails[0]:
            fails[0] -= 1
            raise RuntimeError("a bug")
        return await real_txn(*args, **kwargs)

    mirror.etcd.txn = txn  # type: ignore[method-assign]
    try:
        api.change("exchange", "/\x00x1", {"name": "x1", "vhost": "/", "type": "direct"})
        await until(lambda: mirror.pushed >= mirror.enqueued and not fails[0])
        assert await mirror.etcd.get(mirror.etcd_key(KIND["exchange"], "/\x00x1"))
        assert any("cluster-defs-push ended" in r.message for r in caplog.records)
    finally:
        await stop(mirror)
