"""Whether the consumers of a quorum queue whose leader is lost are kept for the
election (amqpd.cluster.quorum_group: ``QuorumGroups.failover_expected``,
``failover_kept``), decided on a fake cluster view, fake etcd and a fake remote queue
(those of test_mirror_failover).

Issue 16's case: a quorum queue is declared moments before its leader dies; a node has
not read the queue's group record from etcd yet (read every 0.5 s). The group elects a
new leader among the running members, so that node's consumers of the queue must be
kept (RabbitMQ 3.10: a quorum queue's consumers on surviving nodes keep consuming); they
were cancelled. And consumers kept on a guess are cancelled once etcd's record shows
that no majority of the members can elect a leader.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from amqpd.cluster.mirror import MirrorCopy
from amqpd.cluster.quorum_group import QuorumGroups
from amqpd.store.memory import MemoryStore
from tests.unit.cluster.test_mirror_failover import FakeCluster, FakeRemote

IDENT = ("/", "mirrored")  # FakeRemote's queue


def groups_on(node: str, running: set[str]) -> QuorumGroups:
    cluster = FakeCluster(node, running)
    broker = SimpleNamespace(store=MemoryStore())
    api = SimpleNamespace(cluster_port=lambda: broker)
    return QuorumGroups(api, cluster, SimpleNamespace())  # type: ignore[arg-type]


def quorum(leader: str = "node-a", **arguments: Any) -> FakeRemote:
    q = FakeRemote(leader, policy=None)
    q.real_type = "quorum"
    q.type_name = "quorum"
    q.arguments = {"x-queue-type": "quorum", **arguments}  # type: ignore[attr-defined]
    return q


def record(leader: str = "node-a", members: list[str] | None = None) -> dict[str, Any]:
    members = ["node-a", "node-b", "node-c"] if members is None else members
    return {"leader": leader, "members": members, "term": 2,
            "mirrors": [m for m in members if m != leader],
            "synchronised": [m for m in members if m != leader],
            "wanted": [m for m in members if m != leader]}


def test_a_member_keeps_its_consumers_before_it_has_read_the_group_record() -> None:
    # node-b is a member holding a copy of node-a's queue; its group records do not have
    # the queue's yet; node-a's link just went (the view still sees node-a running)
    g = groups_on("node-b", {"node-a", "node-b", "node-c"})
    g.copy_of[IDENT] = MirrorCopy(g.store.inner, "node-a", 1, "/", "mirrored", 0)
    assert g.records == {}
    assert g.failover_expected(quorum())  # type: ignore[arg-type]
    # the view says node-a is down: node-b and node-c are a majority of three
    g.cluster.running.discard("node-a")  # type: ignore[attr-defined]
    assert g.failover_expected(quorum())  # type: ignore[arg-type]


def test_without_a_record_the_running_nodes_decide() -> None:
    # node-c holds no copy (not a member, or its copy has not started yet)
    g = groups_on("node-c", {"node-b", "node-c"})
    assert g.failover_expected(quorum())  # type: ignore[arg-type]
    # one node of three left: no majority of a three-member group
    g.cluster.running.discard("node-b")  # type: ignore[attr-defined]
    assert not g.failover_expected(quorum())  # type: ignore[arg-type]
    # a group of one (x-quorum-initial-group-size 1) never elects anyone else
    g.cluster.running.add("node-b")  # type: ignore[attr-defined]
    assert not g.failover_expected(quorum(**{"x-quorum-initial-group-size": 1}))  # type: ignore[arg-type]
    # a group of two needs both members: the lost leader is one of them
    assert not g.failover_expected(quorum(**{"x-quorum-initial-group-size": 2}))  # type: ignore[arg-type]
    # a size above the cluster's is every node: three here
    assert g.failover_expected(quorum(**{"x-quorum-initial-group-size": 7}))  # type: ignore[arg-type]


def test_the_record_as_last_read_decides_by_the_members_that_run() -> None:
    g = groups_on("node-c", {"node-a", "node-b", "node-c"})
    q = quorum()
    g.records[IDENT] = record()
    assert g.failover_expected(q)  # type: ignore[arg-type]
    g.records[IDENT] = record(members=["node-a", "node-b"])
    assert not g.failover_expected(q)  # type: ignore[arg-type]  # node-b alone: 1 of 2
    g.records[IDENT] = record(members=["node-a", "node-b", "node-d"])
    assert not g.failover_expected(q)  # type: ignore[arg-type]  # node-d is not running
    g.records[IDENT] = record(members=["node-a"])
    assert not g.failover_expected(q)  # type: ignore[arg-type]
    # the record names a new leader already: the catalogue follows it
    g.records[IDENT] = record(leader="node-b", members=["node-a", "node-b"])
    assert g.failover_expected(q)  # type: ignore[arg-type]
    # a mirrored queue is amqpd.cluster.mirror's business
    assert not g.failover_expected(FakeRemote("node-a"))  # type: ignore[arg-type]


async def _check(g: QuorumGroups, q: FakeRemote) -> None:
    g.failover_kept(q)  # type: ignore[arg-type]
    assert len(g._checks) == 1
    await asyncio.wait_for(asyncio.gather(*g._checks), 5)


def put(g: QuorumGroups, rec: dict[str, Any]) -> None:
    g.etcd.values[g.record_key(IDENT)] = json.dumps(rec).encode()  # type: ignore[attr-defined]


async def test_kept_consumers_stay_when_etcd_has_a_majority_to_elect() -> None:
    g = groups_on("node-c", {"node-b", "node-c"})
    q = quorum()
    assert g.failover_expected(q)  # type: ignore[arg-type]  # kept on the type's word
    put(g, record())
    g.etcd.failures = 2  # type: ignore[attr-defined]  # read again after a failure
    await _check(g, q)
    assert q.cancelled == 0
    assert g.record_key(IDENT).startswith("/amqpd/c1/quorum/")


async def test_kept_consumers_are_cancelled_when_no_majority_can_elect() -> None:
    # kept on the type's word (two of three nodes run), but the group has two members
    g = groups_on("node-c", {"node-b", "node-c"})
    q = quorum()
    assert g.failover_expected(q)  # type: ignore[arg-type]
    put(g, record(members=["node-a", "node-c", "node-d"]))
    await _check(g, q)
    assert q.cancelled == 1
    # no group record at all: the leader died before it wrote one
    g.etcd.values.clear()  # type: ignore[attr-defined]
    q2 = quorum()
    await _check(g, q2)
    assert q2.cancelled == 1


async def test_the_check_leaves_a_queue_that_followed_a_new_leader_alone() -> None:
    g = groups_on("node-c", {"node-b", "node-c"})
    q = quorum()
    g.failover_kept(q)  # type: ignore[arg-type]
    q.leader = "node-b"  # the catalogue named the elected leader meanwhile
    await asyncio.wait_for(asyncio.gather(*g._checks), 5)
    assert q.cancelled == 0
    # a mirrored queue: not the groups' check
    g.failover_kept(FakeRemote("node-a"))  # type: ignore[arg-type]
    assert not g._checks


async def test_the_cluster_queues_ask_both_mirrors_and_groups() -> None:
    """QuorumGroups.start chains its failover_expected and failover_kept after the
    mirrors' (ClusterQueues holds one of each)."""
    from amqpd.cluster.mirror import Mirrors

    g = groups_on("node-c", {"node-b", "node-c"})
    queues = SimpleNamespace(extensions=[], retired={},
                             failover_expected=lambda queue: False,
                             failover_kept=lambda queue: None)
    m = Mirrors(SimpleNamespace(cluster_port=lambda: SimpleNamespace(store=MemoryStore())),  # type: ignore[arg-type]
                g.cluster, queues)  # type: ignore[arg-type]
    g.queues = queues  # type: ignore[assignment]
    queues.failover_expected = m.failover_expected
    queues.failover_kept = m.failover_kept
    g.broker.store = MemoryStore()
    g.start()
    try:
        q = quorum()
        assert queues.failover_expected(q)
        queues.failover_kept(q)
        assert len(g._checks) == 1 and not m._checks
        await asyncio.wait_for(asyncio.gather(*g._checks), 5)
        assert q.cancelled == 1  # etcd has no group record
    finally:
        for task in g._tasks:
            task.cancel()
