"""The replica core's rules one by one (amqpd.cluster.replica_core): the commit point
under both policies, the promotion choice under RabbitMQ's ``ha-promote-*`` settings
and the quorum's majority, catch-up, and their edge cases. The stateful model over a
faulty network is test_replica_core_model.py."""

from __future__ import annotations

import random

import pytest

from amqpd.cluster.replica_core import (
    NOTHING,
    AllInSync,
    Candidate,
    CatchUp,
    Majority,
    MajorityPromotion,
    MirroredPromotion,
    holding_up,
    majority,
)

ALWAYS = MirroredPromotion(unsynchronised_ok=True)
WHEN_SYNCED = MirroredPromotion(unsynchronised_ok=False)


def synced(node: str, position: int) -> Candidate:
    return Candidate(node, position, in_sync=True, was_in_sync=True)


def was(node: str, position: int) -> Candidate:
    return Candidate(node, position, in_sync=False, was_in_sync=True)


def never(node: str, position: int) -> Candidate:
    return Candidate(node, position)


def elect(offers: dict[str, int], members: list[str]) -> str | None:
    """A quorum election over offers as GroupBallot reads them (-1: nothing complete)."""
    return MajorityPromotion(tuple(members)).choose(
        [Candidate(n, s, in_sync=s >= 0, was_in_sync=s >= 0) for n, s in offers.items()])


# ------------------------------------------------------------------ the commit point
def test_all_in_sync_is_the_lowest_in_sync_position_and_the_leaders() -> None:
    policy = AllInSync()
    assert policy.commit_point(10, {"b": 7, "c": 9}, ["b", "c"]) == 7
    assert policy.commit_point(10, {"b": 7, "c": 9}, ["c"]) == 9  # b is not counted
    assert policy.commit_point(10, {}, []) == 10  # no mirror in sync: the leader alone
    assert policy.commit_point(10, {}, ["b"]) == 0  # in sync, acknowledged nothing yet
    assert policy.commit_point(4, {"b": 7}, ["b"]) == 4  # never past the leader


def test_majority_counts_the_leader_and_needs_enough_copies() -> None:
    three = Majority.of(3)
    assert three.needed == 2 == majority(3)
    assert three.commit_point(10, {"b": 7, "c": 3}, ["b", "c"]) == 7
    assert three.commit_point(10, {"b": 7, "c": 9}, ["b", "c"]) == 9
    assert three.commit_point(10, {"b": 7}, []) == NOTHING  # the leader alone of three
    five = Majority.of(5)
    assert five.commit_point(10, {"b": 8, "c": 6, "d": 2, "e": 9}, "bcde") == 8
    assert five.commit_point(10, {"b": 12}, ["b", "c"]) == 0  # c acknowledged nothing
    assert Majority.of(1).commit_point(5, {}, []) == 5


def test_a_fenced_majority_commits_nothing() -> None:
    """One more than the members: no set of acknowledgements reaches it."""
    fenced = Majority(3 + 1)
    assert fenced.commit_point(10, {"b": 10, "c": 10}, ["b", "c"]) == NOTHING
    assert not fenced.reached(3)


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 7])
def test_majority_commit_point_is_held_by_a_majority(members: int) -> None:
    """Random acknowledgements: everything up to the commit point is held by at least
    a majority of the copies, and nothing above it is."""
    rng = random.Random(members)
    policy = Majority.of(members)
    followers = [f"f{i}" for i in range(members - 1)]
    for _ in range(300):
        leader = rng.randrange(0, 30)
        acked = {f: rng.randrange(0, leader + 1) for f in followers}
        counted = [f for f in followers if rng.random() < 0.8]
        point = policy.commit_point(leader, acked, counted)
        holders = [leader, *(acked[f] for f in counted)]
        if point == NOTHING:
            assert len(holders) < majority(members)
            continue
        assert sum(1 for h in holders if h >= point) >= majority(members)
        assert sum(1 for h in holders if h >= point + 1) < majority(members) or \
            point == leader


def test_holding_up_names_the_counted_followers_behind() -> None:
    assert holding_up(5, {"b": 5, "c": 4, "d": 1}, ["b", "c"]) == ["c"]
    assert holding_up(5, {}, ["c", "b"]) == ["b", "c"]


# ------------------------------------------------------------------ catch-up
def test_catch_up_is_done_once_the_durable_position_reaches_the_target() -> None:
    due = CatchUp(12)
    assert not due.done(11)
    assert due.done(12) and due.done(40)
    assert CatchUp(0).done(0)


# ------------------------------------------------------------------ mirrored promotion
def test_promote_settings_follow_rabbitmq() -> None:
    """ha-promote-on-failure decides after a failure; after a controlled stop
    ha-promote-on-shutdown does, and when-synced on failure overrides always."""
    assert MirroredPromotion.from_policy("always", "when-synced", shutdown=False) == ALWAYS
    assert MirroredPromotion.from_policy("when-synced", "always", False) == WHEN_SYNCED
    assert MirroredPromotion.from_policy("always", "when-synced", True) == WHEN_SYNCED
    assert MirroredPromotion.from_policy("always", "always", True) == ALWAYS
    assert MirroredPromotion.from_policy("when-synced", "always", True) == WHEN_SYNCED


def test_the_most_up_to_date_synchronised_mirror_is_promoted() -> None:
    for policy in (ALWAYS, WHEN_SYNCED):
        assert policy.choose([synced("b", 10), synced("c", 12)]) == "c"
        assert policy.choose([synced("b", 12), synced("c", 12)]) == "b"  # by name
        # an unsynchronised mirror never while a synchronised one offered
        assert policy.choose([synced("b", 10), was("d", 99), never("e", 99)]) == "b"
        assert policy.choose([]) is None


def test_when_synced_promotes_no_unsynchronised_mirror() -> None:
    assert WHEN_SYNCED.choose([was("b", 10), never("c", 12)]) is None


def test_always_promotes_one_that_was_in_sync_before_one_that_never_was() -> None:
    assert ALWAYS.choose([never("c", 7), never("d", 9)]) == "d"
    assert ALWAYS.choose([was("b", 2), never("d", 9)]) == "b"
    assert ALWAYS.choose([was("b", 2), was("c", 5), never("d", 9)]) == "c"


def test_an_awaited_synchronised_mirror_holds_the_unsynchronised_back() -> None:
    """b is named in sync and runs but has not offered (a slow node): c is not
    promoted over it; once b offers, b wins; with nobody awaited, c may be."""
    assert ALWAYS.choose([never("c", 9)], awaited=["b"]) is None
    assert ALWAYS.choose([synced("b", 3), never("c", 9)], awaited=["b"]) == "b"
    assert ALWAYS.choose([never("c", 9)], awaited=[]) == "c"


# ------------------------------------------------------------------ quorum election
def test_no_leader_without_a_majority_of_offers() -> None:
    assert elect({"b": 10}, ["a", "b", "c"]) is None
    assert elect({"b": 10, "c": 9}, ["a", "b", "c"]) == "b"
    # offers from non-members do not count
    assert elect({"b": 10, "x": 99}, ["a", "b", "c"]) is None
    assert elect({"b": 1}, []) is None


def test_the_longest_complete_log_wins_ties_to_the_smallest_name() -> None:
    members = ["a", "b", "c", "d", "e"]
    assert elect({"b": 5, "c": 7, "d": 7}, members) == "c"
    # an incomplete copy votes but never leads
    assert elect({"b": -1, "c": 3, "d": -1}, members) == "c"
    assert elect({"b": -1, "c": -1, "d": -1}, members) is None


def test_a_never_complete_member_never_leads_a_group_even_if_further() -> None:
    members = ("a", "b", "c")
    policy = MajorityPromotion(members)
    assert policy.choose([never("b", 50), was("c", 3)]) == "c"
    assert policy.choose([never("b", 50), never("c", 3)]) is None
    assert policy.enough(2) and not policy.enough(1)
@pytest.mark.parametrize("size", [3, 5])
def test_the_elected_member_holds_every_record_a_majority_confirmed(size: int) -> None:
    """Random runs: members receive the leader's records in order, some lag; a record
    is confirmed once a majority (the leader included) holds it; the leader dies; any
    majority of the survivors elects a member holding every confirmed record."""
    rng = random.Random(size)
    members = [f"n{i}" for i in range(size)]
    leader, others = members[0], members[1:]
    for _run in range(500):
        held = dict.fromkeys(others, 0)
        confirmed = 0
        for seq in range(1, rng.randrange(2, 40)):
            for m in others:
                if held[m] == seq - 1 and rng.random() < 0.6:
                    held[m] = seq
            if 1 + sum(1 for m in others if held[m] >= seq) >= majority(size):
                confirmed = seq
        survivors = rng.sample(others, rng.randrange(majority(size), size))
        winner = elect({m: held[m] for m in survivors}, members)
        assert winner is not None
        assert held[winner] >= confirmed
    assert leader not in others


@pytest.mark.parametrize("size", [3, 5])
def test_members_down_at_declare_never_win_over_members_holding_more(size: int) -> None:
    """Issue 28: members down at the declare are members from the start; each comes
    back at a random record, copies the backlog (offering -1 until it is complete, and
    acknowledging nothing before), then follows. Whatever survives as a majority, the
    winner holds every record a majority confirmed, and a member that never received
    anything never wins."""
    rng = random.Random(28 + size)
    members = [f"n{i}" for i in range(size)]
    others = members[1:]
    for _run in range(500):
        late = set(rng.sample(others, rng.randrange(0, majority(size))))
        back_at = {m: rng.randrange(1, 60) for m in late}  # the record it returns at
        complete_at = {m: back_at[m] + rng.randrange(0, 20) for m in late}
        held = dict.fromkeys(others, 0)
        complete = {m: m not in late for m in others}
        confirmed = 0
        for seq in range(1, rng.randrange(2, 50)):
            for m in others:
                if m in late:
                    if seq >= complete_at[m]:
                        complete[m] = True
                    if seq >= back_at[m]:
                        held[m] = seq  # a live stream: every record from its return on
                elif held[m] == seq - 1 and rng.random() < 0.6:
                    held[m] = seq
            acks = sum(1 for m in others if complete[m] and held[m] >= seq)
            if 1 + acks >= majority(size):
                confirmed = seq
        survivors = rng.sample(others, rng.randrange(majority(size), size))
        offers = {m: (held[m] if complete[m] else -1) for m in survivors}
        winner = elect(offers, members)
        if winner is None:
            assert all(o < 0 for o in offers.values())
            continue
        assert complete[winner] and held[winner] >= confirmed
        assert held[winner] == max(offers.values())  # never a shorter log


