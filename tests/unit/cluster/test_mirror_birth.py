"""A mirrored queue declared while the links to the nodes its policy wants are down
(issue 28; found by the random fault test, seed 149 on 9ad39ce): node-a woke from an
8.6 s SIGSTOP, saw node-b and node-c running again, but both still refused its new
links for another 0.3 s. A client declared an ``ha-mode: all`` queue on node-a in that
gap: no mirror could start, so the commit rule counted no mirror, node-a confirmed 50
persistent messages on its own disk only, the mirrors started a moment later
unsynchronised (``ha-sync-mode: manual``: never copied), and the kill of node-a lost all
50. A node the policy wants that runs is now a *birth member* of the queue: every
confirm waits for it until its copy, made whatever ha-sync-mode says, is synchronised,
or until it is given up (no longer running or wanted, or silent past the gate's
timeout), as for any mirror that stops acknowledging.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from amqpd.cluster.mirror import Mirrors
from amqpd.cluster.mirror_state import ReplicaSet
from amqpd.config import ClusterConfig
from amqpd.store.api import StoredMessage
from amqpd.store.memory import MemoryStore


def test_a_pending_member_holds_every_commit_and_is_named_as_laggard() -> None:
    rs = ReplicaSet("node-a")
    rs.pending.add("node-b")
    seq = rs.next_seq()
    assert not rs.satisfied(seq)
    assert rs.satisfied(0)
    assert rs.laggards(seq) == ["node-b"]
    rs.pending.discard("node-b")
    assert rs.satisfied(seq)  # given up: the leader's own copy is all the rule counts


class _Queue:
    name = "born"
    store_key = "/\x00born"
    policy: dict[str, Any] | None = {"ha-mode": "all"}
    policy_name = "ha"
    keeps_all = False
    forwards_publish = False
    durable = True
    exclusive = False
    type_name = "classic"
    message_count = 0
    unacked_count = 0

    def ready_positions(self) -> list[int]:
        return []

    def replicated(self, on: bool) -> None:
        self.keeps_all = on


class _View:
    node_name = "node-a"
    etcd = SimpleNamespace()
    root = "/amqpd/c1"
    config = ClusterConfig(mirror_sync_timeout=5.0)

    paused = False
    mirror = SimpleNamespace(synced=True)  # the definitions are in line with etcd

    def __init__(self) -> None:
        self.running = {"node-a", "node-b", "node-c"}

    def nodes(self) -> list[str]:
        return ["node-a", "node-b", "node-c"]

    def is_running(self, node: str) -> bool:
        return node in self.running


def _mirrors(view: _View, vhosts: dict[str, Any] | None = None) -> Mirrors:
    inner = MemoryStore()
    inner.open()
    broker = SimpleNamespace(store=inner, publisher=SimpleNamespace(keeping_queues=0),
                             transports=[], vhosts=vhosts or {})
    links = SimpleNamespace(link=lambda node: None)  # every link down
    queues = SimpleNamespace(links=links, served={})
    return Mirrors(SimpleNamespace(cluster_port=lambda: broker), view,  # type: ignore[arg-type]
                   queues)  # type: ignore[arg-type]


async def test_no_confirm_before_the_mirrors_a_declare_could_not_start() -> None:
    view = _View()
    q = _Queue()
    vh = SimpleNamespace(name="/", queues={q.name: q})
    m = _mirrors(view, {"/": vh})
    writes: list[Any] = []

    async def no_etcd(self: Any) -> None:  # the record's write is not under test
        writes.append(self.ident)

    import amqpd.cluster.mirror_leading as leading_mod

    orig = leading_mod.Leading.write
    leading_mod.Leading.write = no_etcd  # type: ignore[method-assign]
    try:
        m.queue_recorded("/", "born")  # the declare's hook, before its declare-ok
        lead = m.leading[("/", "born")]
        assert lead.streams == {}
        m.store.append_enqueue([lead.key], StoredMessage("", "born", b"", b"x"))
        confirm: list[BaseException | None] = []
        m.store.commit(confirm.append)
        await asyncio.sleep(0)
        assert confirm == []  # 9ad39ce confirmed here: no mirror counted at all
        assert lead.rs.pending == {"node-b", "node-c"}
        assert "node-b" not in lead.record()["synchronised"]  # never promoted for it
        lead.detach("node-b", drop=False)  # a link that went (or MREFUSE): still waited for
        assert lead.rs.pending == {"node-b", "node-c"}
        # node-c stops running: given up; node-b still holds the confirm
        view.running.discard("node-c")
        m._reconcile_queue(vh, q, ["node-a", "node-b", "node-c"])  # type: ignore[arg-type]
        m.gate.release()
        assert lead.rs.pending == {"node-b"} and confirm == []
        # node-b is no longer wanted (removed from the cluster): the leader alone
        m._reconcile_queue(vh, q, ["node-a"])  # type: ignore[arg-type]
        m.gate.release()
        assert lead.rs.pending == set()
        assert confirm == [None]
    finally:
        leading_mod.Leading.write = orig  # type: ignore[method-assign]
        await asyncio.sleep(0)


async def test_a_reconciliation_after_the_declare_makes_no_birth_member() -> None:
    """Only the declare makes birth members: a policy applied to a queue that already
    holds messages starts its mirrors unsynchronised, as RabbitMQ's ha-sync-mode
    says, and confirms do not wait for them."""
    view = _View()
    m = _mirrors(view)
    q = _Queue()
    vh = SimpleNamespace(name="/", queues={q.name: q})
    import amqpd.cluster.mirror_leading as leading_mod

    async def no_etcd(self: Any) -> None:
        return None

    orig = leading_mod.Leading.write
    leading_mod.Leading.write = no_etcd  # type: ignore[method-assign]
    try:
        assert m._reconcile_queue(vh, q, ["node-a", "node-b"])  # type: ignore[arg-type]
        assert m.leading[("/", "born")].rs.pending == set()
    finally:
        leading_mod.Leading.write = orig  # type: ignore[method-assign]
        await asyncio.sleep(0)
