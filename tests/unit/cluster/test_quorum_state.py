"""Quorum queues' replica groups without sockets (amqpd.cluster.quorum_state, and the
term check of amqpd.cluster.quorum_group): the members at declare, majority commit
through the commit gate, the bounded wait, the election, the quorum-critical check,
membership edits, and a member refusing a deposed leader's stream."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqpd.cluster import mirror_wire as M
from amqpd.cluster.link import Link
from amqpd.cluster.mirror import STREAM_SPLIT, Mirrors
from amqpd.cluster.mirror_state import CommitGate, ReplicaSet
from amqpd.cluster.quorum_group import QTERM, QuorumGroups
from amqpd.cluster.quorum_state import (
    DEFAULT_GROUP_SIZE,
    MembershipError,
    NoQuorum,
    add_member,
    expire_waiters,
    group_size,
    grow_targets,
    has_majority,
    initial_members,
    majority,
    quorum_critical,
    remove_member,
)
from amqpd.cluster.replica_core import Majority


def everyone(_node: str) -> bool:
    return True


# ------------------------------------------------------------------ members at declare
def test_majority_counts_the_leader() -> None:
    assert [majority(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def test_group_size_defaults_to_three_as_rabbitmq_3_10() -> None:
    assert DEFAULT_GROUP_SIZE == 3
    assert group_size({}) == 3
    assert group_size({"x-quorum-initial-group-size": 5}) == 5
    assert group_size({"x-quorum-initial-group-size": 1}) == 1


def test_initial_members_leader_first_then_running_nodes_up_to_the_size() -> None:
    nodes = ["d", "c", "b", "a"]
    assert initial_members("c", 3, nodes, everyone) == ["c", "a", "b"]
    # a size above the cluster's means every node (RabbitMQ: 7 on 4 nodes gives 4)
    assert initial_members("c", 7, nodes, everyone) == ["c", "a", "b", "d"]
    assert initial_members("c", 1, nodes, everyone) == ["c"]
    # running members come first: a stopped one is picked only when the size needs it
    assert initial_members("a", 3, nodes, lambda n: n != "b") == ["a", "c", "d"]


def test_a_member_down_at_declare_is_a_member_all_the_same() -> None:
    """Issue 28: RabbitMQ picks among every cluster node, running or not; a node that was
    down (or restarting, its link not up yet) at the declare joins when it is back."""
    nodes = ["a", "b", "c"]
    assert initial_members("c", 3, nodes, lambda n: n != "a") == ["c", "b", "a"]
    assert initial_members("c", 3, nodes, lambda n: n == "c") == ["c", "a", "b"]
    assert initial_members("c", 2, nodes, lambda n: n != "a") == ["c", "b"]
    assert initial_members("c", 2, nodes, lambda n: n == "c") == ["c", "a"]
    # the group size is respected (the default: 3), and the leader counts even when the
    # view does not list it
    five = ["a", "b", "c", "d", "e"]
    assert initial_members("e", DEFAULT_GROUP_SIZE, five, lambda n: n in "de") == \
        ["e", "d", "a"]
    assert initial_members("z", 2, five, lambda n: False) == ["z", "a"]


@settings(max_examples=300, deadline=None)
@given(st.sets(st.sampled_from("abcdefg"), min_size=1), st.data())
def test_initial_members_properties(nodes: set[str], data: st.DataObject) -> None:
    """Whatever runs: the leader first, ``min(size, cluster)`` distinct members of the
    cluster, and no stopped member picked while a running one is left out."""
    leader = data.draw(st.sampled_from(sorted(nodes)))
    up = data.draw(st.sets(st.sampled_from(sorted(nodes))))
    size = data.draw(st.integers(1, 9))
    got = initial_members(leader, size, nodes, up.__contains__)
    assert got[0] == leader
    assert len(set(got)) == len(got) == min(size, len(nodes))
    assert set(got) <= nodes
    left_out_running = [n for n in nodes - set(got) if n in up]
    picked_stopped = [n for n in got[1:] if n not in up]
    assert not (left_out_running and picked_stopped)


# ------------------------------------------------------------------ majority commit
def test_a_confirm_waits_for_a_majority_not_for_every_member() -> None:
    rs = ReplicaSet("a", ["b", "c"], policy=Majority.of(3))
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 0.0, done.append)
    assert done == []
    rs.ack("c", 1)  # the leader and c: two of three
    gate.release()
    assert done == [None]


def test_a_member_still_copying_the_backlog_does_not_count() -> None:
    rs = ReplicaSet("a", [], policy=Majority.of(3))  # b and c attached, not complete
    rs.attach("b")
    rs.attach("c")
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.next_seq()
    done: list[BaseException | None] = []
    gate.wait(gate.needs_now(), 0.0, done.append)
    rs.ack("b", 1)
    rs.ack("c", 1)
    gate.release()
    assert done == []
    rs.join("b")  # b's copy is complete
    gate.release()
    assert done == [None]


def test_without_a_majority_commits_fail_after_the_timeout_in_order() -> None:
    rs = ReplicaSet("a", ["b", "c"], policy=Majority.of(3))
    gate = CommitGate(timeout=5.0)
    gate.sets.append(rs)
    rs.next_seq()
    done: list[Any] = []
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append(("first", e)))
    rs.next_seq()
    gate.wait(gate.needs_now(), 3.0, lambda e: done.append(("second", e)))
    error = NoQuorum("no majority")
    assert expire_waiters(gate, 4.9, error) == 0
    assert expire_waiters(gate, 5.0, error) == 1
    assert done == [("first", error)]
    assert expire_waiters(gate, 8.0, error) == 1
    assert done[1] == ("second", error)
    assert not gate.waiting


def test_an_expired_head_releases_the_satisfied_waiters_behind_it() -> None:
    stuck = ReplicaSet("a", ["b", "c"], policy=Majority(2))
    gate = CommitGate(timeout=1.0)
    gate.sets.append(stuck)
    stuck.next_seq()
    done: list[Any] = []
    gate.wait(gate.needs_now(), 0.0, lambda e: done.append(("stuck", e)))
    gate.wait([], 0.5, lambda e: done.append(("free", e)))  # needs nothing itself
    assert done == []
    expire_waiters(gate, 1.0, NoQuorum("x"))
    assert [d[0] for d in done] == ["stuck", "free"]
    assert done[1][1] is None


def test_has_majority() -> None:
    assert has_majority(["a", "b", "c"], lambda n: n != "c")
    assert not has_majority(["a", "b", "c"], lambda n: n == "a")


# ------------------------------------------------------------------ health
def test_quorum_critical_when_the_running_members_are_no_more_than_a_majority() -> None:
    records = {("/", "three"): {"members": ["a", "b", "c"]},
               ("/", "two"): {"members": ["a", "b"]},
               ("/", "one"): {"members": ["b"]},
               ("v", "five"): {"members": ["a", "b", "c", "d", "e"]}}
    # everyone running: a two-member group is critical (as RabbitMQ's 2 =< 2); a
    # single member is critical on its node only
    assert quorum_critical(records, "a", everyone) == [("/", "two")]
    assert quorum_critical(records, "b", everyone) == [("/", "one"), ("/", "two")]
    # c down: the three-member group is critical on a (and on b)
    down_c = quorum_critical(records, "a", lambda n: n != "c")
    assert down_c == [("/", "three"), ("/", "two")]
    # five members, two down: the other three are exactly a majority
    assert ("v", "five") in quorum_critical(records, "a", lambda n: n not in ("d", "e"))
    assert ("v", "five") not in quorum_critical(records, "a", lambda n: n != "e")


# ------------------------------------------------------------------ membership
def test_membership_edits_and_their_refusals() -> None:
    known = ["a", "b", "c", "d"]
    assert add_member(["a", "b"], "d", known) == ["a", "b", "d"]
    with pytest.raises(MembershipError, match="not a member of the cluster"):
        add_member(["a", "b"], "z", known)
    with pytest.raises(MembershipError, match="already a member"):
        add_member(["a", "b"], "b", known)
    assert remove_member(["a", "b", "c"], "c", "a") == ["a", "b"]
    with pytest.raises(MembershipError, match="not a member of the group"):
        remove_member(["a", "b"], "c", "a")
    with pytest.raises(MembershipError, match="last_node"):
        remove_member(["b"], "b", "a")
    with pytest.raises(MembershipError, match="leads the group"):
        remove_member(["a", "b"], "a", "a")


def test_grow_all_or_even() -> None:
    records = {("/", "q1"): {"members": ["a", "b"]},
               ("/", "q2"): {"members": ["a", "b", "c"]},
               ("/", "q3"): {"members": ["a", "d"]}}
    assert grow_targets(records, "d", "all") == [("/", "q1"), ("/", "q2")]
    assert grow_targets(records, "d", "even") == [("/", "q1")]
    assert grow_targets(records, "c", "all") == [("/", "q1"), ("/", "q3")]


# ------------------------------------------------------------------ terms on the member
class _Link(Link):
    """A link that is never connected: its peer, and the frames sent on it kept."""

    def __init__(self, peer: str) -> None:  # no Link.__init__: no manager, no transport
        self.peer = peer
        self.sent: list[bytes] = []

    def send(self, frame: bytes | bytearray) -> None:
        self.sent.append(bytes(frame))


def test_a_member_refuses_a_stream_whose_term_is_older_than_it_knows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    passed: list[tuple[str, int, int]] = []

    def frame(self: Any, link: Any, kind: int, stream: int, f: list[Any]) -> None:
        passed.append((link.peer, kind, stream))
        if kind == M.MSTART:  # the copy _start_copy makes
            self.copies[(link.peer, stream)] = SimpleNamespace(term=0)

    monkeypatch.setattr(Mirrors, "frame", frame)
    groups = QuorumGroups.__new__(QuorumGroups)
    groups.stream_terms = {}
    groups.known_terms = {}
    groups.frozen = set()
    groups.copies = {}
    new, old = _Link("node-b"), _Link("node-a")
    rid_new, rid_old = STREAM_SPLIT + 1, STREAM_SPLIT + 7
    # the new leader (term 2) starts its stream: accepted, term 2 known from now on
    groups.frame(new, QTERM, rid_new, [2])
    groups.frame(new, M.MSTART, rid_new, ["/", "qq", 0])
    assert passed == [("node-b", M.MSTART, rid_new)]
    assert groups.known_terms[("/", "qq")] == 2
    # the copy knows its stream's term: it names the marks it writes (issue 28)
    assert groups.copies[("node-b", rid_new)].term == 2
    # the deposed leader (term 1) tries again: refused, nothing reaches the copy
    groups.frame(old, QTERM, rid_old, [1])
    groups.frame(old, M.MSTART, rid_old, ["/", "qq", 0])
    assert passed == [("node-b", M.MSTART, rid_new)]
    assert len(old.sent) == 1 and old.sent[0][4] == M.MREFUSE
    # classic mirroring's streams (below STREAM_SPLIT) are not the groups' to take
    groups.frame(new, M.MSTART, 5, ["/", "mirrored", 0])
    assert len(passed) == 1
    # once this member offered itself in an election, the old leader's records on its
    # stream are refused (not applied, never acknowledged)
    groups.frozen.add(("node-b", rid_new))
    groups.frame(new, M.MENQ, rid_new, [1, 0, "", "qq", b"", b"x", 0, 0, 0])
    assert len(passed) == 1
    groups.frame(old, M.MENQ, STREAM_SPLIT + 9, [1, 0, "", "qq", b"", b"x", 0, 0, 0])
    assert passed[-1] == ("node-a", M.MENQ, STREAM_SPLIT + 9)
