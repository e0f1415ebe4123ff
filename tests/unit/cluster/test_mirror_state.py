"""Mirrored-queue replication without sockets (amqpd.cluster.mirror_state, MirrorCopy):
the synchronised set and the confirms that wait for it, the mirrors a policy asks for,
the promotion choice, and a mirror's copy applying the leader's records."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.mirror import Leading, MirrorCopy, ReplicatingStore
from amqpd.cluster.mirror_map import CopyMap, map_path
from amqpd.cluster.mirror_state import (
    CommitGate,
    ReplicaSet,
    ha_setting,
    mirror_nodes,
)
from amqpd.cluster.replica_core import Majority
from amqpd.coord.etcd import EtcdError
from amqpd.store.api import StoredMessage, StoreError
from amqpd.store.memory import MemoryStore


def everyone(_node: str) -> bool:
    return True


# ------------------------------------------------------------------ the synchronised set
def test_a_confirm_waits_for_every_synchronised_mirror() -> None:
    rs = ReplicaSet("a", ["b", "c"])
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.next_seq()
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 0.0, done.append)
    assert done == []
    rs.ack("b", 2)
    gate.release()
    assert done == []  # c has not acknowledged
    rs.ack("c", 1)
    gate.release()
    assert done == []
    rs.ack("c", 2)
    assert gate.release() == 1
    assert done == [None]


def test_a_mirror_not_synchronised_is_not_waited_for() -> None:
    rs = ReplicaSet("a", ["b"])
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.attach("c")  # catching up: not synchronised yet
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 0.0, done.append)
    rs.ack("b", 1)
    gate.release()
    assert done == [None]


def test_nothing_to_wait_for_answers_at_once_and_waiters_are_released_in_order() -> None:
    gate = CommitGate(timeout=5.0)
    done: list[str] = []
    gate.wait([], 0.0, lambda e: done.append("first"))
    assert done == ["first"]
    rs = ReplicaSet("a", ["b"])
    gate.sets.append(rs)
    rs.next_seq()
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append("second"))
    # a later commit with nothing of its own to wait for still waits behind it
    gate.wait([], 0.0, lambda e: done.append("third"))
    assert done == ["first"]
    rs.ack("b", 1)
    gate.release()
    assert done == ["first", "second", "third"]


def test_a_slow_mirror_is_named_after_the_timeout_and_leaving_releases() -> None:
    rs = ReplicaSet("a", ["b", "c"])
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 10.0, done.append)
    rs.ack("b", 1)
    gate.release()
    assert gate.laggards(14.9) == []
    assert gate.laggards(15.1) == [(rs, "c")]
    rs.leave("c")  # (after etcd recorded it)
    gate.release()
    assert done == [None]


def test_a_deposed_leaders_unacknowledged_commits_fail_and_stop_holding_others() -> None:
    """The queue is led elsewhere now (deposed, or replaced by the cluster's remote
    queue): a commit its mirrors never acknowledged is a nack, never a confirm; main
    left it waiting for ever, and every later commit of the node behind it."""
    gone, other = ReplicaSet("a", ["b"]), ReplicaSet("a", ["c"])
    gate = CommitGate(timeout=5.0)
    gate.sets += [gone, other]
    gone.next_seq()
    done: list[Any] = []
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append(("first", e)))
    other.next_seq()
    # a commit covers every record written before it: this one needs gone's too
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append(("second", e)))
    other.next_seq()
    other.ack("c", 2)
    gate.release()
    assert done == []  # held up by gone's record
    gate.abandon(gone, EtcdError("led elsewhere"))
    assert [(w, type(e)) for w, e in done] == [("first", EtcdError), ("second", EtcdError)]
    assert gate.sets == [other]
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append(("third", e)))
    assert done[-1] == ("third", None)  # nothing holds the node's commits up any more


def test_a_deleted_queues_commits_need_only_the_leaders_log() -> None:
    rs = ReplicaSet("a", ["b"])
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 0.0, done.append)
    gate.abandon(rs, None)
    assert done == [None] and gate.sets == []


def test_synced_mirror_joins_with_the_backlog_covering_its_start() -> None:
    rs = ReplicaSet("a")
    for _ in range(5):
        rs.next_seq()
    rs.attach("b")
    rs.ack("b", 5)  # MSYNCED: the backlog holds everything up to the start
    rs.join("b")
    assert rs.satisfied(5)
    rs.next_seq()
    assert not rs.satisfied(6)
    assert rs.laggards(6) == ["b"]


def test_majority_commit_counts_the_leader() -> None:
    rs = ReplicaSet("a", ["b", "c"], policy=Majority(2))
    rs.next_seq()
    assert not rs.satisfied(1)
    rs.ack("c", 1)
    assert rs.satisfied(1)


# ------------------------------------------------------------------ policy -> mirrors
def test_ha_mode_all_exactly_and_nodes() -> None:
    members = ["a", "b", "c", "d"]
    assert mirror_nodes({"ha-mode": "all"}, "a", members, everyone) == ["b", "c", "d"]
    assert mirror_nodes({"ha-mode": "exactly", "ha-params": 2}, "a", members,
                        everyone) == ["b"]
    assert mirror_nodes({"ha-mode": "exactly", "ha-params": 3}, "a", members,
                        lambda n: n != "b") == ["c", "d"]
    # the current mirrors are kept first
    assert mirror_nodes({"ha-mode": "exactly", "ha-params": 2}, "a", members, everyone,
                        current=["d"]) == ["d"]
    assert mirror_nodes({"ha-mode": "nodes", "ha-params": ["c", "x", "a"]}, "a", members,
                        everyone) == ["c"]
    assert mirror_nodes(None, "a", members, everyone) == []
    assert mirror_nodes({"max-length": 3}, "a", members, everyone) == []
    assert mirror_nodes({"ha-mode": "exactly", "ha-params": "two"}, "a", members,
                        everyone) == []


# ------------------------------------------------------------------ the mirror's copy
def _copy() -> tuple[MirrorCopy, MemoryStore]:
    store = MemoryStore()
    store.open()
    return MirrorCopy(store, "a", 1, "/", "q", 0), store


def _enq(copy: MirrorCopy, pos: int, delivered: bool = False) -> None:
    copy.enqueue(pos, delivered, "", "q", b"", b"%d" % pos, 0, 0, 0)


def test_copy_applies_enqueue_settle_and_delivered() -> None:
    copy, store = _copy()
    for pos in (10, 20, 30):
        _enq(copy, pos)
    copy.settle([20])
    copy.deliver([30])
    order = copy.in_order()
    assert [store.read(e[0]).body for e in order] == [b"10", b"30"]
    assert [e[2] for e in order] == [False, True]


def test_backlog_arriving_after_live_records_is_ordered_and_settles_apply() -> None:
    copy, store = _copy()
    _enq(copy, 50)  # a live enqueue after the copy started
    copy.settle([5])  # settles a backlog message not yet copied
    copy.deliver([7])
    _enq(copy, 5)  # backlog: dropped, it was settled
    _enq(copy, 7)  # backlog: comes marked delivered
    _enq(copy, 9)
    copy.backlog_end()
    order = copy.in_order()
    assert [store.read(e[0]).body for e in order] == [b"7", b"9", b"50"]
    assert [e[2] for e in order] == [True, False, False]
    # after the backlog, a settle for an unknown position is not remembered
    copy.settle([1000])
    assert copy.settled_early == set()


def test_drop_settles_everything_in_the_store() -> None:
    copy, store = _copy()
    _enq(copy, 1)
    local = copy.in_order()[0][0]
    copy.drop()
    assert copy.in_order() == []
    with pytest.raises(StoreError):
        store.read(local)


def test_stored_message_fields_round_trip() -> None:
    copy, store = _copy()
    copy.enqueue(3, False, "x", "rk", b"\x00\x00", b"body", 1234, 99, 4)
    local = copy.in_order()[0][0]
    assert store.read(local) == StoredMessage("x", "rk", b"\x00\x00", b"body", 1234, 99, 4)


# ------------------------------------------------------------------ the leader's store
class _FakeQueue:
    name = "q"
    store_key = "/\x00q"
    policy: dict[str, Any] | None = None
    message_count = 0
    unacked_count = 0



class _FakeMirrors:
    def __init__(self) -> None:
        self.node = "a"
        self.gate = CommitGate(timeout=5.0)
        self.next_rid = 0
        self.by_rid: dict[Any, Any] = {}
        self.store: Any = None


def _leader_store() -> tuple[ReplicatingStore, Leading, _FakeMirrors]:
    mirrors = _FakeMirrors()
    inner = MemoryStore()
    inner.open()
    store = ReplicatingStore(inner, mirrors)  # type: ignore[arg-type]
    mirrors.store = store
    lead = Leading(mirrors, "/", _FakeQueue(), {})  # type: ignore[arg-type]
    store.by_key[lead.key] = lead
    mirrors.gate.sets.append(lead.rs)
    return store, lead, mirrors


def test_the_leaders_commit_waits_for_the_synchronised_mirror() -> None:
    store, lead, mirrors = _leader_store()
    lead.rs.join("b")
    pos = store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"x"))
    assert lead.live == {pos: False} and lead.rs.seq == 1
    done: list[BaseException | None] = []
    store.commit(done.append)
    assert done == []  # durable here, not yet on b
    lead.rs.ack("b", 1)
    mirrors.gate.release()
    assert done == [None]
    # records of other queues pass through and need nothing
    store.append_enqueue(["/\x00other"], StoredMessage("", "other", b"", b"y"))
    store.commit(done.append)
    assert done == [None, None]


def test_the_leaders_records_settle_and_delivered_once() -> None:
    store, lead, _mirrors = _leader_store()
    pos = store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"x"))
    paged = store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"t", transient=True))
    assert list(lead.live) == [pos, paged]  # every message of a mirrored queue, transient too
    store.delivering(lead.key, pos)
    store.append_delivered_many(lead.key, [pos])  # the same mark again: no record
    assert lead.live == {pos: True, paged: False} and lead.rs.seq == 3
    store.append_settle(lead.key, iter([pos, paged]))
    assert lead.live == {} and lead.rs.seq == 4


def test_a_mirror_of_an_empty_queue_counts_from_its_start() -> None:
    """A queue with nothing in it (just declared): the mirror lacks nothing, so it is
    synchronised at once, behind MSTART comes MBACKLOG_END, and the first confirm
    waits for it (main confirmed without it and promoted the empty mirror)."""
    store, lead, mirrors = _leader_store()
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    assert link.kinds() == [M.MSTART, M.MBACKLOG_END]
    assert lead.rs.synchronised == {"b"} and lead.record()["synchronised"] == ["b"]
    store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"x"))
    done: list[BaseException | None] = []
    store.commit(done.append)
    assert done == []  # not before the mirror holds it
    lead.got_ack("b", lead.rs.seq)
    mirrors.gate.release()
    assert done == [None]


def test_a_mirror_of_a_queue_holding_messages_counts_only_once_synchronised() -> None:
    store, lead, _mirrors = _leader_store()
    store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"x"))
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    rid = lead.streams["b"].rid
    assert link.kinds() == [M.MSTART]
    assert lead.rs.synchronised == set()
    lead.got_have("b", rid, [])
    assert lead.streams["b"].missing  # it lacks the message; ha-sync-mode manual waits
    assert lead.rs.synchronised == set()


def test_a_queue_whose_messages_are_all_delivered_unacked_is_not_empty_for_a_mirror(
        ) -> None:
    """RabbitMQ's rule (3.10 classic mirrors get unacknowledged messages too): a mirror
    is synchronised only when it holds every message the leader still holds, ready or
    delivered and not yet acknowledged. With nothing ready but one delivery held by a
    consumer, a new mirror is not synchronised from its start: it lacks that message
    until it is settled (then a consumer's nack or close after a failover finds it on
    the promoted mirror). Checked for issue 28's chaos seed 108, where this was a
    suspect: the rule held."""
    store, lead, _mirrors = _leader_store()
    pos = store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"x"))
    store.delivering(lead.key, pos)  # handed to a consumer, not acked
    assert lead.live == {pos: True}
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    assert link.kinds() == [M.MSTART]  # no MBACKLOG_END: not synchronised from the start
    lead.got_have("b", lead.streams["b"].rid, [])
    assert lead.streams["b"].missing == {pos: None} and lead.rs.synchronised == set()
    store.append_settle(lead.key, [pos])  # acked: nothing it lacks is left
    assert link.kinds()[-1] == M.MBACKLOG_END
    # a delivery the mirrored state does not list (a transient message handed out
    # before the queue was mirrored) still makes the queue non-empty
    _store2, lead2, _m2 = _leader_store()
    lead2.q.unacked_count = 1  # type: ignore[misc]
    link2 = _FakeLink()
    lead2.attach("b", link2)  # type: ignore[arg-type]
    assert link2.kinds() == [M.MSTART]


# ------------------------------------------------------------------ promotion policy
def test_ha_settings_default_as_rabbitmq_3_10() -> None:
    assert ha_setting(None, "ha-sync-mode") == "manual"
    assert ha_setting({}, "ha-promote-on-failure") == "always"
    assert ha_setting({}, "ha-promote-on-shutdown") == "when-synced"
    assert ha_setting({"ha-sync-mode": "automatic"}, "ha-sync-mode") == "automatic"
    assert ha_setting({"ha-sync-mode": "sometimes"}, "ha-sync-mode") == "manual"


# ------------------------------------------------------------------ sync mode, returning mirrors
class _FakeLink:
    def __init__(self) -> None:
        self.frames: list[tuple[int, list[Any]]] = []
        self.closed = False
        self.transport = None

    def send(self, data: bytes) -> None:
        kind = data[4]
        self.frames.append((kind, W.decode_fields(kind, data[9:])))

    def kinds(self) -> list[int]:
        return [k for k, _f in self.frames]

    def of(self, kind: int) -> list[list[Any]]:
        return [f for k, f in self.frames if k == kind]


def _with_messages(n: int, policy: dict[str, Any] | None = None,
                   ) -> tuple[ReplicatingStore, Leading, list[int]]:
    store, lead, _mirrors = _leader_store()
    lead.q.policy = policy  # type: ignore[misc]
    positions = [store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"m%d" % i))
                 for i in range(n)]
    return store, lead, positions


async def test_manual_sync_copies_nothing_and_syncs_once_the_old_messages_are_gone() -> None:
    store, lead, pos = _with_messages(3)
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    assert link.kinds() == [M.MSTART]
    rid = lead.streams["b"].rid
    lead.got_have("b", rid, [])
    store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"new"))  # live: mirrored
    await asyncio.sleep(0)
    assert M.MBACKLOG not in link.kinds() and M.MBACKLOG_END not in link.kinds()
    assert M.MENQ in link.kinds()
    store.append_settle(lead.key, pos[:2])
    assert M.MBACKLOG_END not in link.kinds()
    store.append_settle(lead.key, pos[2:])
    assert link.of(M.MBACKLOG_END) == [[0]]  # nothing it lacks is left: it may sync


async def test_automatic_sync_and_sync_queue_copy_in_batches_what_the_mirror_lacks() -> None:
    _store, lead, pos = _with_messages(5, {"ha-sync-mode": "automatic",
                                           "ha-sync-batch-size": 2})
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    s = lead.streams["b"]
    lead.got_have("b", s.rid, [])
    assert s.task is not None
    s.batches_durable = 10  # the mirror holds every batch at once (no flow control wait)
    await asyncio.wait_for(s.task, 5)
    assert [f[0] for f in link.of(M.MBACKLOG)] == pos
    assert link.of(M.MBATCH) == [[1], [2]]
    assert link.of(M.MBACKLOG_END) == [[5]]
    assert s.backlog_bytes == sum(len(W.encode(M.MBACKLOG, s.rid, *f))
                                  for f in link.of(M.MBACKLOG))

    # manual: nothing until sync_queue; cancel_sync_queue stops it
    _store2, lead2, pos2 = _with_messages(4)
    link2 = _FakeLink()
    lead2.attach("b", link2)  # type: ignore[arg-type]
    s2 = lead2.streams["b"]
    lead2.got_have("b", s2.rid, [])
    assert s2.task is None
    assert lead2.sync() == 1
    assert lead2.cancel_sync() == 1
    await asyncio.sleep(0)
    assert s2.missing is not None and len(s2.missing) == 4
    assert lead2.sync() == 1
    assert s2.task is not None
    await asyncio.wait_for(s2.task, 5)
    assert [f[0] for f in link2.of(M.MBACKLOG)] == pos2
    assert link2.of(M.MBACKLOG_END) == [[4]]


async def test_sync_queue_before_the_mirrors_answer_starts_the_copy_when_it_comes() -> None:
    # issue 28: a manual-mode mirror asked to sync before its MHAVE arrived (a busy
    # machine) was skipped by sync_queue and never synchronised
    _store, lead, pos = _with_messages(3)
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    s = lead.streams["b"]
    assert lead.sync() == 1  # counted: it starts with the answer
    assert s.task is None
    lead.got_have("b", s.rid, [])
    assert s.task is not None
    s.batches_durable = 10
    await asyncio.wait_for(s.task, 5)
    assert [f[0] for f in link.of(M.MBACKLOG)] == pos
    assert link.of(M.MBACKLOG_END) == [[3]]

    # cancel_sync_queue before the answer withdraws the request
    _store2, lead2, _pos2 = _with_messages(2)
    link2 = _FakeLink()
    lead2.attach("b", link2)  # type: ignore[arg-type]
    s2 = lead2.streams["b"]
    assert lead2.sync() == 1
    assert lead2.cancel_sync() == 1
    lead2.got_have("b", s2.rid, [])
    assert s2.task is None
    assert M.MBACKLOG not in link2.kinds()


async def test_a_returning_mirror_keeps_what_it_holds_and_gets_only_the_tail() -> None:
    store, lead, pos = _with_messages(6, {"ha-sync-mode": "automatic"})
    store.append_settle(lead.key, [pos[0]])  # settled while the mirror was away
    link = _FakeLink()
    lead.attach("b", link)  # type: ignore[arg-type]
    s = lead.streams["b"]
    store.delivering(lead.key, pos[1])
    # it held the first four (as of when it left): keeps 1-3, drops 0, lacks 4 and 5
    lead.got_have("b", s.rid, pos[:4])
    assert link.of(M.MSETTLE)[-1][1] == [pos[0]]
    assert link.of(M.MDELIV)[-1][1] == [pos[1]]
    assert s.kept == 3
    assert s.task is not None
    await asyncio.wait_for(s.task, 5)
    assert [f[0] for f in link.of(M.MBACKLOG)] == pos[4:]
    assert link.of(M.MBACKLOG_END) == [[2]]


def test_the_copy_map_survives_a_restart_and_ignores_a_torn_record(tmp_path: Path) -> None:
    store = MemoryStore()
    store.open()
    path = map_path(tmp_path, "/\x00q")
    cmap = CopyMap(path, "/", "q", "node-a")
    copy = MirrorCopy(store, "node-a", 1, "/", "q", 0, cmap)
    cmap.rewrite(())
    _enq(copy, 10)
    _enq(copy, 20)
    cmap.flush()
    with path.open("ab") as f:
        f.write(b"\x00" * 5)  # a torn record
    loaded = CopyMap.load(path)
    assert loaded is not None
    again, to_leader = loaded
    assert again.leader == "node-a" and (again.vhost, again.queue) == ("/", "q")
    assert to_leader == {e[0]: lp for lp, e in copy.entries.items()}
    copy.restart(2, 0)  # rewritten from the entries
    assert CopyMap.load(path)[1] == to_leader  # type: ignore[index]
    copy.drop()
    assert not path.exists() and CopyMap.load(path) is None


def test_a_copy_restarted_by_the_same_leader_keeps_its_entries() -> None:
    copy, store = _copy()
    _enq(copy, 10)
    _enq(copy, 20)
    copy.backlog_end()
    copy.synced = True
    copy.restart(7, 40)
    assert sorted(copy.entries) == [10, 20] and not copy.synced and copy.rid == 7
    copy.settle([10])  # the leader settles what went while it was away
    copy.seen(30)  # a record numbered before the restart does not move it back
    assert copy.last_seq == 40
    assert [store.read(e[0]).body for e in copy.in_order()] == [b"20"]


def test_policy_values_of_the_ha_keys_are_checked_as_rabbitmq_does() -> None:
    from amqpd.broker.policy import validate_definition
    from amqpd.protocol.errors import PreconditionFailed

    ok = {"ha-mode": "all", "ha-sync-mode": "automatic", "ha-sync-batch-size": 10,
          "ha-promote-on-failure": "when-synced", "ha-promote-on-shutdown": "always"}
    assert validate_definition(ok) == ok
    for key, bad in (("ha-sync-mode", "sometimes"), ("ha-promote-on-failure", "never"),
                     ("ha-promote-on-shutdown", 1), ("ha-sync-batch-size", 0)):
        with pytest.raises(PreconditionFailed, match=key):
            validate_definition({"ha-mode": "all", key: bad})


def test_a_copy_follows_the_leader_promoted_after_its_own_and_keeps_what_it_maps() -> None:
    """Leader a is lost, b promoted: this copy of a's log is kept aside for b (main
    dropped it) and placed under b's positions by b's MREKEY; what b does not map
    goes; live records of b that came first (a settle, a delivery) apply."""
    copy, store = _copy()
    for pos in (10, 20, 30, 40):
        _enq(copy, pos)
    copy.follow("b", 5, 0, None)
    assert copy.leader == "b" and copy.origin == "a" and sorted(copy.foreign) == [10, 20, 30, 40]
    assert copy.entries == {}
    _enq(copy, 10)  # b's own new message at a position a also used: no clash
    copy.settle([102])  # b settled (a's 20) before its MREKEY came
    copy.deliver([103])  # and handed out (a's 30)
    kept, dropped = copy.rekey([20, 30, 40], [102, 103, 104])
    assert (kept, dropped) == (2, 1)  # 10 was not mapped: b does not hold it
    assert sorted(copy.entries) == [10, 103, 104]
    assert copy.entries[103][2] is True  # delivered
    assert [store.read(e[0]).body for e in copy.in_order()] == [b"10", b"30", b"40"]
    assert copy.foreign == {} and copy.origin == ""


def test_the_promoted_leader_maps_the_old_leaders_positions_for_a_mirror() -> None:
    store, lead, _mirrors = _leader_store()
    p1 = store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"x"))
    p2 = store.append_enqueue([lead.key], StoredMessage("", "q", b"", b"y"))
    lead.origin, lead.origin_map = "x", {7: p1, 8: p2, 9: p2 + 100}  # 9: settled since
    link = _FakeLink()
    lead.attach("c", link)  # type: ignore[arg-type]
    rid = lead.streams["c"].rid
    lead.got_have_from("c", rid, [], "x", [7, 8, 9])
    assert link.of(M.MREKEY) == [[[7, 8], [p1, p2]]]
    s = lead.streams["c"]
    assert s.missing == {} and s.ended  # it lacks nothing: synchronised next
    assert link.kinds()[-1] == M.MBACKLOG_END
    other = _FakeLink()  # a copy of another leader's log maps nothing
    lead.detach("c", drop=False)
    lead.attach("c", other)  # type: ignore[arg-type]
    lead.got_have_from("c", lead.streams["c"].rid, [], "z", [7, 8])
    assert other.of(M.MREKEY) == [[[], []]]
    assert lead.streams["c"].missing == {p1: None, p2: None}
    own = _FakeLink()  # a copy of this leader's own log (it followed another for a
    lead.detach("c", drop=False)  # while, a deposed one): the positions are the same
    lead.attach("c", own)  # type: ignore[arg-type]
    lead.got_have_from("c", lead.streams["c"].rid, [], "a", [p1, p2 + 50])
    assert own.of(M.MREKEY) == [[[p1], [p1]]]
    assert lead.streams["c"].missing == {p2: None}
