"""The election ballots ask the replica core (amqpd.cluster.replica_core) and offer what
it needs: a mirrored queue's ballot on a fake cluster (the fakes of
test_mirror_failover), a quorum queue's on its offers alone.

Issue 28's rule "a member that was never in sync is never promoted over one that was":
under ``ha-promote-on-failure: always`` with no synchronised mirror left, the ballot
chose the most up-to-date mirror, even one whose copy never became complete over one
that was complete and only fell out of the synchronised set."""

from __future__ import annotations

import json
from typing import Any

from amqpd.cluster.mirror_failover import MirrorBallot
from amqpd.cluster.quorum_failover import GroupBallot
from tests.unit.cluster.test_mirror_failover import hold_copy, mirrors_on, record


def offer(seq: int, synced: bool, was: bool) -> bytes:
    return json.dumps({"seq": seq, "synced": synced, "was": was}).encode()


def test_a_mirror_that_was_in_sync_is_promoted_over_one_that_never_was() -> None:
    m = mirrors_on("node-b", {"node-b", "node-c"})
    m.cluster.records = {}  # type: ignore[attr-defined]  # node-a's lease is gone too
    copy = hold_copy(m, "node-a", synced=True)  # complete, but out of the set now
    copy.last_seq = 5
    ballot = MirrorBallot(m, ("/", "mirrored"), copy, record(synchronised=[]))
    assert ballot.stand() is None  # ha-promote-on-failure always (the default)
    assert json.loads(ballot.offer()) == {"seq": 5, "synced": False, "was": True}
    ballot.take("node-b", ballot.offer().encode())
    ballot.take("node-c", offer(9, synced=False, was=False))  # further on, never complete
    assert ballot.choose() == "node-b"


def test_a_synchronised_mirror_wins_over_more_up_to_date_ones() -> None:
    m = mirrors_on("node-b", {"node-b", "node-c"})
    copy = hold_copy(m, "node-a", synced=True)
    ballot = MirrorBallot(m, ("/", "mirrored"), copy, record(synchronised=["node-c"]))
    ballot.take("node-b", offer(9, synced=False, was=True))
    ballot.take("node-c", offer(3, synced=True, was=True))
    assert ballot.choose() == "node-c"


def test_when_synced_promotes_no_unsynchronised_mirror() -> None:
    m = mirrors_on("node-b", {"node-b", "node-c"})
    copy = hold_copy(m, "node-a", synced=True)
    rec = record(synchronised=[], promote_on_failure="when-synced")
    ballot = MirrorBallot(m, ("/", "mirrored"), copy, rec)
    assert ballot.stand() is True  # declines: the queue waits for its leader
    ballot.take("node-b", offer(9, synced=False, was=True))
    assert ballot.choose() is None


def test_an_offer_without_was_counts_as_never_in_sync() -> None:
    """An offer from a node of the version before (no ``was``) is not taken for one
    that was in sync: the stricter reading."""
    m = mirrors_on("node-b", {"node-b", "node-c"})
    copy = hold_copy(m, "node-a", synced=False)
    ballot = MirrorBallot(m, ("/", "mirrored"), copy, record(synchronised=[]))
    ballot.take("node-b", offer(2, synced=False, was=True))
    ballot.take("node-c", json.dumps({"seq": 7, "synced": False}).encode())
    assert ballot.choose() == "node-b"


def group_ballot(members: list[str]) -> GroupBallot:
    rec: dict[str, Any] = {"leader": "a", "members": members, "term": 1}
    return GroupBallot(None, ("/", "q"), None, rec)  # type: ignore[arg-type]


def test_a_group_elects_the_longest_complete_log_of_a_majority() -> None:
    ballot = group_ballot(["a", "b", "c"])
    ballot.take("b", b"-1")
    assert ballot.choose() is None  # one of three offered: no majority
    ballot.take("c", b"4")
    assert ballot.choose() == "c"  # b votes, never leads (nothing complete)
    ballot.take("b", b"6")
    assert ballot.choose() == "b"
