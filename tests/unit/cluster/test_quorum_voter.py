"""A quorum queue's member without a copy votes (amqpd.cluster.quorum_voter): which
groups it votes in, and that its vote completes a majority for a complete copy without
ever making it, or anyone without the lost leader's log, the winner."""

from __future__ import annotations

from typing import Any

from amqpd.cluster.quorum_voter import VoterBallot, _NoCopy, lost_without_copy

IDENT = ("/", "q")


def rec(leader: str, members: list[str]) -> dict[str, Any]:
    return {"leader": leader, "members": members, "term": 3}


def due(records: dict[Any, dict[str, Any]], node: str = "a", skip: set[Any] | None = None,
        catalogue: dict[Any, str] | None = None,
        running: tuple[str, ...] = ("a", "b")) -> list[tuple[Any, str]]:
    cat = catalogue if catalogue is not None else \
        {i: r.get("leader", "") for i, r in records.items()}
    return lost_without_copy(records, node, skip or set(), cat.get, running.__contains__)


def test_a_member_votes_where_the_leader_is_lost_and_it_holds_no_copy() -> None:
    assert due({IDENT: rec("c", ["a", "b", "c"])}) == [(IDENT, "c")]


def test_no_vote_without_cause() -> None:
    assert due({IDENT: rec("b", ["a", "b", "c"])}) == []  # the leader runs
    assert due({IDENT: rec("c", ["b", "c", "d"])}) == []  # not a member
    assert due({IDENT: rec("a", ["a", "b", "c"])}) == []  # this node leads it
    assert due({IDENT: rec("c", ["a", "b", "c"])}, skip={IDENT}) == []  # a copy, a round
    # the catalogue names another leader (a take-over under way, or the queue gone)
    assert due({IDENT: rec("c", ["a", "b", "c"])}, catalogue={IDENT: "b"}) == []
    assert due({IDENT: rec("c", ["a", "b", "c"])}, catalogue={}) == []
    assert due({IDENT: {"members": ["a", "b"]}}) == []  # no leader recorded


def ballot(members: list[str]) -> VoterBallot:
    return VoterBallot(None, IDENT, _NoCopy("c"), rec("c", members))  # type: ignore[arg-type]


def test_the_vote_offers_nothing_and_completes_a_majority_for_the_complete_copy() -> None:
    b = ballot(["a", "b", "c"])
    assert b.offer() == "-1"
    b.take("b", b"300")
    assert b.choose() is None  # one of three: no majority yet
    b.take("a", b.offer().encode())
    assert b.choose() == "b"


def test_votes_alone_elect_nobody() -> None:
    b = ballot(["a", "b", "c"])
    b.take("a", b"-1")
    b.take("b", b"-1")
    assert b.choose() is None  # nothing complete among a majority: the group waits
