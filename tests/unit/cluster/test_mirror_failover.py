"""Whether the consumers of a mirrored queue whose leader is lost are kept for the
failover (amqpd.cluster.mirror: ``Mirrors.failover_expected``, ``failover_kept``),
decided on a fake cluster view, fake etcd and a fake remote queue.

The case CI met (``keeper-b was stopped: Basic.Cancel``): the leader is killed a few
tenths of a second after its mirrors became synchronised, before a mirror has read the
queue's mirror record from etcd (it reads them every ``2 * TICK``). That mirror holds a
copy of the queue and will be promoted; its own consumers of the queue must be kept.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

from amqpd.cluster.mirror import MirrorCopy, Mirrors
from amqpd.config import ClusterConfig
from amqpd.coord.etcd import EtcdError
from amqpd.store.memory import MemoryStore

HA_ALL = {"ha-mode": "all"}


class FakeCluster:
    """The parts of the cluster view :class:`Mirrors` reads."""

    def __init__(self, node: str, running: set[str]) -> None:
        self.node_name = node
        self.running = running
        self.etcd = FakeEtcd()
        self.root = "/amqpd/c1"
        self.config = ClusterConfig(mirror_sync_timeout=5.0)
        self.catalogue: dict[tuple[str, str], str] = {}
        self.members = ["node-a", "node-b", "node-c"]
        # the definitions' mirror: QuorumGroups.start adds its declare hook here
        self.mirror = SimpleNamespace(queue_listeners=[], synced=True)

    def nodes(self) -> dict[str, Any]:
        return dict.fromkeys(self.members)

    def is_running(self, node: str) -> bool:
        return node in self.running


class FakeEtcd:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.failures = 0  # the next reads that fail

    async def get(self, key: str) -> Any:
        if self.failures:
            self.failures -= 1
            raise EtcdError("etcd out of reach")
        value = self.values.get(key)
        return None if value is None else SimpleNamespace(value=value, mod_revision=1)


class FakeRemote:
    """A remote queue led by ``leader`` whose link to it went."""

    real_type = "classic"
    type_name = "classic"

    def __init__(self, leader: str, policy: dict[str, Any] | None = HA_ALL) -> None:
        self.vhost = SimpleNamespace(name="/")
        self.name = "mirrored"
        self.leader = leader
        self.policy = policy
        self.link = None
        self.deleted = False
        self.cancelled = 0

    def cancel_kept(self) -> None:
        self.cancelled += 1

    def listed_type(self) -> str:  # as RemoteQueue answers it: its leader's queue's type
        return self.real_type


def remote(leader: str, policy: dict[str, Any] | None = HA_ALL) -> Any:
    """A :class:`FakeRemote` where the code under test wants a queue (duck-typed)."""
    return FakeRemote(leader, policy)


def mirrors_on(node: str, running: set[str]) -> Mirrors:
    cluster = FakeCluster(node, running)
    broker = SimpleNamespace(store=MemoryStore())
    api = SimpleNamespace(cluster_port=lambda: broker)
    return Mirrors(api, cluster, SimpleNamespace())  # type: ignore[arg-type]


def record(leader: str = "node-a", mirrors: list[str] | None = None,
           synchronised: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    mirrors = ["node-b", "node-c"] if mirrors is None else mirrors
    return {"leader": leader, "mirrors": mirrors,
            "synchronised": mirrors if synchronised is None else synchronised,
            "wanted": mirrors, **extra}


def hold_copy(m: Mirrors, leader: str, synced: bool) -> MirrorCopy:
    copy = MirrorCopy(m.store.inner, leader, 1, "/", "mirrored", 0)
    copy.synced = synced
    m.copy_of[("/", "mirrored")] = copy
    return copy


def test_a_mirror_keeps_its_consumers_before_it_has_read_the_mirror_record() -> None:
    # node-b holds a synchronised copy of node-a's queue; its records (read every
    # 2 * TICK) do not have the queue's yet; node-a's link just went (the view still
    # sees node-a running)
    m = mirrors_on("node-b", {"node-a", "node-b", "node-c"})
    hold_copy(m, "node-a", synced=True)
    assert m.records == {}
    assert m.failover_expected(remote("node-a"))
    # ... even if the policy did not say so here yet
    assert m.failover_expected(remote("node-a", policy=None))
    # a copy of another leader's log is no reason
    assert not m.failover_expected(remote("node-c", policy=None))
    # nor one that declined to take over (the record said it may not): the record
    # decides then
    m.copy_of[("/", "mirrored")].declined = 1.0
    assert not m.failover_expected(remote("node-a", policy=None))
    m.records[("/", "mirrored")] = record()
    assert m.failover_expected(remote("node-a", policy=None))


def test_an_unsynchronised_copy_counts_where_the_policy_lets_it_take_over() -> None:
    m = mirrors_on("node-b", {"node-a", "node-b", "node-c"})
    hold_copy(m, "node-a", synced=False)
    assert m.failover_expected(remote("node-a", policy=None))  # "always": default
    when_synced = {"ha-mode": "nodes", "ha-params": ["node-a", "node-b"],
                   "ha-promote-on-failure": "when-synced"}
    cast(FakeCluster, m.cluster).members = ["node-a", "node-b"]
    # when-synced: not on the copy's word; the policy's mirror node-b is this one...
    assert m.failover_expected(remote("node-a", policy=when_synced))
    # ... but the record, once read, decides: node-b is not synchronised
    m.records[("/", "mirrored")] = record(mirrors=["node-b"], synchronised=[],
                                          promote_on_failure="when-synced")
    assert not m.failover_expected(remote("node-a", policy=when_synced))


def test_without_a_copy_or_a_record_the_policy_decides() -> None:
    m = mirrors_on("node-c", {"node-a", "node-b", "node-c"})
    assert m.failover_expected(remote("node-a", policy=HA_ALL))
    assert not m.failover_expected(remote("node-a", policy=None))
    assert not m.failover_expected(remote("node-a", policy={"ha-mode": "nodes",
                                                                "ha-params": ["node-a"]}))


def test_the_record_decides_by_the_mirrors_that_run() -> None:
    m = mirrors_on("node-c", {"node-a", "node-b", "node-c"})
    q = remote("node-a", policy=None)
    m.records[("/", "mirrored")] = record(mirrors=["node-b"])
    assert m.failover_expected(q)
    m.cluster.running.discard("node-b")  # type: ignore[attr-defined]
    assert not m.failover_expected(q)  # its only mirror is down too
    m.records[("/", "mirrored")] = record(mirrors=["node-b", "node-c"], synchronised=[])
    assert m.failover_expected(q)  # unsynchronised node-c may take over ("always")
    m.records[("/", "mirrored")] = record(mirrors=["node-b", "node-c"], synchronised=[],
                                          promote_on_failure="when-synced")
    assert not m.failover_expected(q)
    m.records[("/", "mirrored")] = record(mirrors=[], synchronised=[])
    assert not m.failover_expected(q)  # mirrored by policy, but no mirror yet
    # the record names a new leader already: the catalogue follows it
    m.records[("/", "mirrored")] = record(leader="node-b", mirrors=[], synchronised=[])
    assert m.failover_expected(q)


async def _check(m: Mirrors, q: Any) -> None:
    m.failover_kept(q)
    assert len(m._checks) == 1
    await asyncio.wait_for(asyncio.gather(*m._checks), 5)


def put(m: Mirrors, rec: dict[str, Any]) -> None:
    m.etcd.values[m.record_key(("/", "mirrored"))] = json.dumps(rec).encode()  # type: ignore[attr-defined]


async def test_kept_consumers_are_cancelled_when_etcd_has_no_record() -> None:
    # kept on the policy's word; the leader never wrote a record (no mirror ever)
    m = mirrors_on("node-c", {"node-a", "node-b", "node-c"})
    q = remote("node-a")
    assert m.failover_expected(q)
    await _check(m, q)
    assert q.cancelled == 1


async def test_kept_consumers_stay_when_etcd_has_a_mirror_to_promote() -> None:
    m = mirrors_on("node-c", {"node-a", "node-b", "node-c"})
    put(m, record())
    m.etcd.failures = 2  # type: ignore[attr-defined]  # read again after a failure
    q = remote("node-a")
    await _check(m, q)
    assert q.cancelled == 0
    # a record whose mirrors are all down: cancelled
    put(m, record(mirrors=["node-b"]))
    m.cluster.running.discard("node-b")  # type: ignore[attr-defined]
    await _check(m, q)
    assert q.cancelled == 1


async def test_the_check_leaves_a_queue_that_followed_a_new_leader_alone() -> None:
    m = mirrors_on("node-c", {"node-a", "node-b", "node-c"})
    q = remote("node-a")
    m.failover_kept(q)  # type: ignore[arg-type]
    q.leader = "node-b"  # the catalogue named the promoted mirror meanwhile
    await asyncio.wait_for(asyncio.gather(*m._checks), 5)
    assert q.cancelled == 0
    quorum = remote("node-a")
    quorum.real_type = "quorum"  # amqpd.cluster.quorum_group's business
    assert not m.failover_expected(quorum)  # type: ignore[arg-type]
    m.failover_kept(quorum)  # type: ignore[arg-type]
    assert not m._checks
