"""No commit waits for ever on the mirrors' acknowledgements (issue 28, "a node that goes
silent"): the node-wide :class:`~amqpd.cluster.mirror_state.CommitGate` releases its
waiters in order, so one that can never be released held every later store commit of
the node -- declare-oks (passive ones too: they wait behind earlier changes), HTTP
``PUT`` responses and the confirms of every queue the node leads.

The case found by reading the code: a mirrored queue's leader that stops leading it
(deposed by a failover while it was stopped, or the queue replaced) removed its
replica set from the gate, but a commit already waiting for that set's mirrors stayed
waiting; their acknowledgements never come (the streams were dropped), and nothing
expired it (``laggards`` only acts on queues still led here).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqpd.cluster.deadlines import CommitDeadlines, ConfirmDeadlines, describe_waiter
from amqpd.cluster.mirror import Mirrors
from amqpd.cluster.mirror_state import CommitGate, ReplicaSet
from amqpd.config import ClusterConfig
from amqpd.store.api import NotReplicated, StoredMessage
from amqpd.store.memory import MemoryStore
from tests.support.deferred_store import DeferredCommitStore


def _gate_with(rs: ReplicaSet) -> CommitGate:
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    return gate


def test_abandoning_a_set_fails_its_waiters_and_releases_those_behind() -> None:
    rs = ReplicaSet("a", ["b"])
    other = ReplicaSet("a", ["c"])
    gate = _gate_with(rs)
    gate.sets.append(other)
    rs.next_seq()
    done: list[Any] = []
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append(("first", e)))
    gate.wait([], 0.0, lambda e: done.append(("second", e)))  # waits behind it
    other.next_seq()
    gate.wait([(other, 1)], 0.0, lambda e: done.append(("third", e)))
    assert done == []
    gate.sets.remove(rs)
    error = NotReplicated("deposed")
    assert gate.abandon(rs, error) == 1
    assert done == [("first", error), ("second", None)]  # third still needs c
    other.ack("c", 1)
    gate.release()
    assert done[-1] == ("third", None)
    assert not gate.waiting


def test_abandoning_a_deleted_queues_set_waives_its_needs() -> None:
    rs = ReplicaSet("a", ["b"])
    gate = _gate_with(rs)
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 0.0, done.append)
    assert gate.abandon(rs, None) == 0
    assert done == [None]


def test_expire_fails_only_the_waiters_past_the_limit_in_order() -> None:
    rs = ReplicaSet("a", ["b"])
    gate = _gate_with(rs)
    rs.next_seq()
    done: list[Any] = []
    gate.wait(gate.needs_now(), 10.0, lambda e: done.append(("old", e)))
    gate.wait(gate.needs_now(), 20.0, lambda e: done.append(("new", e)))
    error = NotReplicated("too late")
    assert gate.expire(24.0, 15.0, error) == []
    expired = gate.expire(25.0, 15.0, error)
    assert len(expired) == 1 and done == [("old", error)]
    assert gate.waiting and gate.waiting[0].started == 20.0


# ------------------------------------------------------------------ through Mirrors
class _Cluster:
    node_name = "node-a"
    etcd = SimpleNamespace()
    root = "/amqpd/c1"
    config = ClusterConfig(mirror_sync_timeout=5.0)


class _Queue:
    name = "mirrored"
    store_key = "/\x00mirrored"
    policy: dict[str, Any] | None = {"ha-mode": "all"}
    keeps_all = False

    def replicated(self, on: bool) -> None:  # QueueType.replicated, without the count
        self.keeps_all = on


def _mirrors() -> Mirrors:
    inner = MemoryStore()
    inner.open()
    broker = SimpleNamespace(store=inner, publisher=SimpleNamespace(keeping_queues=0))
    return Mirrors(SimpleNamespace(cluster_port=lambda: broker), _Cluster(),  # type: ignore[arg-type]
                   SimpleNamespace())  # type: ignore[arg-type]


def _leading(m: Mirrors) -> Any:
    from amqpd.cluster.mirror import Leading

    lead = Leading(m, "/", _Queue(), {})  # type: ignore[arg-type]
    m.leading[lead.ident] = lead
    m.store.by_key[lead.key] = lead
    m.gate.sets.append(lead.rs)
    lead.rs.join("node-b")  # a synchronised mirror that will never answer again
    return lead


def test_a_deposed_leader_does_not_hold_the_nodes_commits_for_ever() -> None:
    m = _mirrors()
    lead = _leading(m)
    m.store.append_enqueue([lead.key], StoredMessage("", "mirrored", b"", b"x"))
    confirm: list[BaseException | None] = []
    m.store.commit(confirm.append)  # a publisher confirm waiting for node-b
    declare: list[BaseException | None] = []
    # a declare-ok recorded after it: every commit covers the records before it, so
    # it needs node-b's acknowledgement as well
    m.store.commit(declare.append)
    assert confirm == [] and declare == []
    m.stop_leading(lead, delete_record=False)  # deposed: another node leads it now
    assert len(confirm) == 1 and isinstance(confirm[0], NotReplicated)
    assert len(declare) == 1 and isinstance(declare[0], NotReplicated)  # a 541, not silence
    later: list[BaseException | None] = []
    m.store.commit(later.append)
    assert later == [None]


def test_the_deadline_names_what_a_stuck_commit_waits_for() -> None:
    m = _mirrors()
    lead = _leading(m)
    m.store.append_enqueue([lead.key], StoredMessage("", "mirrored", b"", b"x"))
    done: list[BaseException | None] = []
    m.store.commit(done.append)
    waiter = m.gate.waiting[0]
    text = describe_waiter(waiter, {lead.rs: lead.ident})
    assert "queue 'mirrored' in vhost '/'" in text and "node-b" in text
    deadlines = CommitDeadlines(definition_timeout=10.0)
    deadlines.watch("mirrored queues", m.gate, lambda: {lead.rs: lead.ident})
    assert deadlines.sweep(waiter.started + 14.0) == 0  # 5 s gate + 10 s definitions
    assert deadlines.sweep(waiter.started + 15.5) == 1
    assert len(done) == 1 and isinstance(done[0], NotReplicated)
    assert "node-b" in str(done[0])


# ------------------------------------------------------------------ forwarded confirms
def test_a_forwarded_confirm_is_nacked_once_past_its_deadline(
        monkeypatch: Any) -> None:
    import amqpd.cluster.deadlines as deadlines_module

    clock = [100.0]
    monkeypatch.setattr(deadlines_module.time, "monotonic", lambda: clock[0])
    confirms = ConfirmDeadlines(limit=25.0)
    got: list[Any] = []
    late = confirms.track(lambda e: got.append(("late", e)), "queue 'q' on node-b")
    clock[0] = 101.0
    fine = confirms.track(lambda e: got.append(("fine", e)), "queue 'q' on node-b")
    fine(None)  # the leader confirmed it
    assert confirms.waits(110.0) == [(100.0, "a confirm from queue 'q' on node-b")]
    assert confirms.sweep(124.9) == 0
    assert confirms.sweep(125.0) == 1
    assert got[0] == ("fine", None)
    assert got[1][0] == "late" and isinstance(got[1][1], NotReplicated)
    assert "node-b" in str(got[1][1])
    late(None)  # the leader's answer after the nack: ignored
    assert len(got) == 2
    assert confirms.waits(130.0) == [] and confirms.sweep(200.0) == 0


def _mirrors_over(inner: Any) -> Mirrors:
    broker = SimpleNamespace(store=inner, publisher=SimpleNamespace(keeping_queues=0))
    return Mirrors(SimpleNamespace(cluster_port=lambda: broker), _Cluster(),  # type: ignore[arg-type]
                   SimpleNamespace())  # type: ignore[arg-type]


def test_a_commit_whose_store_write_outlives_the_leadership_does_not_wait_for_ever() -> None:
    """Found by the chaos test (seed 3, 120 s): the commit's needs are taken when it
    starts, the gate gets it after the store's own commit; a leader that stopped
    leading in between left it waiting for acknowledgements that never come (refused
    only by the hard deadline, 15 s later, with every commit behind it)."""
    slow = DeferredCommitStore(MemoryStore())  # an fsync under load
    slow.inner.open()
    m = _mirrors_over(slow)
    lead = _leading(m)
    m.store.append_enqueue([lead.key], StoredMessage("", "mirrored", b"", b"x"))
    confirm: list[BaseException | None] = []
    m.store.commit(confirm.append)  # needs node-b's ack; the store has not answered
    m.stop_leading(lead, delete_record=False)  # deposed meanwhile
    slow.release()
    assert len(confirm) == 1 and isinstance(confirm[0], NotReplicated)
    assert not m.gate.waiting
    after: list[BaseException | None] = []
    m.store.commit(after.append)
    slow.release()
    assert after == [None]


def test_a_late_commit_of_a_deleted_queue_is_released() -> None:
    rs = ReplicaSet("a", ["b"])
    gate = _gate_with(rs)
    rs.next_seq()
    needs = gate.needs_now()  # taken when the commit started
    gate.sets.remove(rs)
    gate.abandon(rs, None)  # the queue was deleted (Mirrors.stop_leading)
    done: list[BaseException | None] = []
    gate.wait(needs, 0.0, done.append)  # the store's commit answered only now
    assert done == [None] and not gate.waiting


async def test_the_sweep_runs_on_its_own_and_stops() -> None:
    import asyncio
    import time

    rs = ReplicaSet("a", ["b"])
    gate = _gate_with(rs)
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), time.monotonic() - 60.0, done.append)  # long overdue
    deadlines = CommitDeadlines(definition_timeout=1.0)
    deadlines.watch("mirrored queues", gate, lambda: {rs: ("/", "q")})
    deadlines.start()
    try:
        for _ in range(50):
            if done:
                break
            await asyncio.sleep(0.1)
        assert len(done) == 1 and isinstance(done[0], NotReplicated)
        assert deadlines.refused == 1
    finally:
        await deadlines.stop()
    assert deadlines._task is None
