"""The replica core: the three decisions of a replica group, as pure code (issue 28).

A replicated queue -- a mirrored queue (``ha-mode``) or a quorum queue -- is one leader
and its followers. Whatever the transport, three questions decide whether a confirmed
message can be lost, and this module answers them with no sockets, no asyncio, no etcd
and nothing of the broker, so that the property tests
(``tests/unit/cluster/test_replica_core_model.py``) can drive them over a simulated
network exhaustively, as RabbitMQ keeps its quorum state machine a pure module apart
from the transport:

* **the commit point** (:meth:`CommitPolicy.commit_point`): given the leader's own
  position and each counted follower's durable acknowledged position, the highest
  position every record up to which is committed -- a confirm (a tx.commit-ok, a
  quorum queue's delivery) may leave once its record is at or below it.
  :class:`AllInSync` (mirrored queues, as RabbitMQ's classic mirrored queues: every
  in-sync mirror holds the record) or :class:`Majority` (quorum queues: a majority of
  the members, the leader included);
* **the promotion choice** (:meth:`PromotionPolicy.choose`): given the candidates of an
  election with their durable positions in the lost leader's log and whether each is
  (or ever was, in that leader's term) in sync, the one to lead, or nobody.
  :class:`MirroredPromotion` (``ha-promote-on-failure`` / ``ha-promote-on-shutdown``,
  RabbitMQ's semantics) or :class:`MajorityPromotion` (the most up to date of a
  majority). Under every policy a candidate that was never in sync is never chosen over
  one that was: what it lacks is not even bounded by the commit rule;
* **catch-up done** (:class:`CatchUp`): a follower that joins (again) becomes in sync
  -- may be promoted as such -- once its durable position reaches the target fixed at
  the moment of asking: records committed before it counted may still be on their way
  to it.

Mirrored and quorum queues differ only in the policy objects their leaders and
elections pass in. The callers: :mod:`amqpd.cluster.mirror_state` (``ReplicaSet``, the
leader's counts, which :mod:`amqpd.cluster.mirror_leading` and
:mod:`amqpd.cluster.quorum_leading` keep), :mod:`amqpd.cluster.mirror_failover` and
:mod:`amqpd.cluster.quorum_failover` (the ballots of :mod:`amqpd.cluster.election`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# a commit point below every position: not even the empty log is committed (a fenced
# quorum leader, whose majority can never answer, commits nothing at all)
NOTHING = -1


def majority(members: int) -> int:
    """How many of ``members`` (the leader included) make a majority: more than half.
    Any two majorities of one group share a member, which is why a record a majority
    holds survives any election a majority takes part in."""
    return members // 2 + 1


class CommitPolicy(Protocol):
    """Which acknowledgements make a record committed."""

    def commit_point(self, leader: int, acked: Mapping[str, int],
                     in_sync: Iterable[str]) -> int:
        """The highest position up to which every record is committed. ``leader``: the
        leader's own position (its records are durable on its disk before any confirm
        is asked for); ``acked``: follower -> the highest position it acknowledged as
        durable (a follower holds everything up to it); ``in_sync``: the followers
        counted."""
        ...


@dataclass(frozen=True, slots=True)
class AllInSync:
    """Mirrored queues: a record is committed once every in-sync mirror holds it, so
    any in-sync mirror promoted holds every confirmed message. A mirror out of the set
    is not waited for (that it left is recorded before it stops counting, so promotion
    never takes it for in sync)."""

    def commit_point(self, leader: int, acked: Mapping[str, int],
                     in_sync: Iterable[str]) -> int:
        point = leader
        for node in in_sync:
            point = min(point, acked.get(node, 0))
        return point


@dataclass(frozen=True, slots=True)
class Majority:
    """Quorum queues: a record is committed once ``needed`` copies hold it, the
    leader's own included. :meth:`of` gives a group's majority; a fenced leader (the
    cluster elected another) uses one more than its members, which no set of
    acknowledgements reaches, so it commits nothing more."""

    needed: int

    @classmethod
    def of(cls, members: int) -> Majority:
        return cls(majority(members))

    def reached(self, copies: int) -> bool:
        """Whether ``copies`` copies (the leader's included) are enough."""
        return copies >= self.needed

    def commit_point(self, leader: int, acked: Mapping[str, int],
                     in_sync: Iterable[str]) -> int:
        positions = sorted([leader, *(min(leader, acked.get(n, 0)) for n in in_sync)],
                           reverse=True)
        if self.needed < 1:
            return leader
        if len(positions) < self.needed:
            return NOTHING
        return positions[self.needed - 1]


def holding_up(position: int, acked: Mapping[str, int], in_sync: Iterable[str]) -> list[str]:
    """The counted followers that have not acknowledged ``position`` yet (by name): the
    ones a commit waiting too long names, so they can leave the set instead of stalling
    every publisher."""
    return sorted(n for n in in_sync if acked.get(n, 0) < position)


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A follower counted again (its copy is complete up to where its stream started)
    that is not yet *named* in sync: records committed while it was not counted may
    still be on their way to it. It is in sync once its durable position reaches
    ``target``, fixed when it joined: at least the leader's commit point then (callers
    may ask for more -- amqpd's leaders ask for their whole log, which is stricter)."""

    target: int

    def done(self, durable: int) -> bool:
        return durable >= self.target


@dataclass(frozen=True, slots=True)
class Candidate:
    """One member's offer in an election after its leader was lost.

    ``position``: how far it holds the lost leader's log durably and completely (-1:
    nothing of it it can vouch for); ``in_sync``: the lost leader named it in sync
    (counted for every commit); ``was_in_sync``: it held the lost leader's log
    completely at some point of that leader's term (it may have fallen behind since)."""

    node: str
    position: int
    in_sync: bool = False
    was_in_sync: bool = False


class PromotionPolicy(Protocol):
    """Which candidate leads after the leader was lost."""

    def choose(self, candidates: Sequence[Candidate],
               awaited: Collection[str] = ()) -> str | None:
        """The winner among ``candidates`` (those running that offered), or None: nobody
        may lead (yet). ``awaited``: running members named in sync that have not offered
        yet (slow to answer, not absent)."""
        ...


def _best(candidates: Iterable[Candidate]) -> str | None:
    """The most up to date; ties to the smallest name, so that every node running the
    choice on the same offers picks the same one."""
    pool = list(candidates)
    if not pool:
        return None
    return min(pool, key=lambda c: (-c.position, c.node)).node


@dataclass(frozen=True, slots=True)
class MirroredPromotion:
    """Mirrored queues (RabbitMQ 3.10's rules): an in-sync mirror if one offered (the
    most up to date); else, only where ``unsynchronised_ok``, another -- one that was
    in sync before one that never was -- and only once no in-sync mirror is awaited.
    What an out-of-sync mirror lacks is lost, as in RabbitMQ; that is what
    ``when-synced`` trades availability for."""

    unsynchronised_ok: bool

    @classmethod
    def from_policy(cls, on_failure: str, on_shutdown: str, shutdown: bool
                    ) -> MirroredPromotion:
        """``ha-promote-on-failure`` / ``ha-promote-on-shutdown`` (``always`` or
        ``when-synced``) and whether the leader's node stopped in a controlled way:
        after a failure an unsynchronised mirror may lead if on-failure is ``always``
        (the default); after a controlled stop only if on-shutdown is ``always`` too
        (``when-synced`` on failure overrides ``always`` on shutdown)."""
        if on_failure != "always":
            return cls(False)
        return cls(on_shutdown == "always" if shutdown else True)

    def choose(self, candidates: Sequence[Candidate],
               awaited: Collection[str] = ()) -> str | None:
        synced = [c for c in candidates if c.in_sync]
        if synced:
            return _best(synced)
        if not self.unsynchronised_ok:
            return None
        offered = {c.node for c in candidates}
        if any(n not in offered for n in awaited):
            return None  # an in-sync mirror is only slow: never lead over it
        was = [c for c in candidates if c.was_in_sync]
        return _best(was or candidates)


@dataclass(frozen=True, slots=True)
class MajorityPromotion:
    """Quorum queues: nobody until a majority of ``members`` offered; then the longest
    log among the offers that hold the lost leader's log completely (``was_in_sync``,
    position 0 or more). A committed record is held by a majority, so by at least one
    member of any majority, and a complete copy with a longer log holds every record of
    a shorter one: the winner holds every committed record."""

    members: tuple[str, ...]

    def enough(self, offers: int) -> bool:
        """Whether ``offers`` members (or members running) can elect."""
        return Majority.of(len(self.members)).reached(offers)

    def choose(self, candidates: Sequence[Candidate],
               awaited: Collection[str] = ()) -> str | None:
        offered = [c for c in candidates if c.node in self.members]
        if not self.members or not self.enough(len(offered)):
            return None
        return _best(c for c in offered if c.was_in_sync and c.position >= 0)


__all__ = [
    "NOTHING", "AllInSync", "Candidate", "CatchUp", "CommitPolicy", "Majority",
    "MajorityPromotion", "MirroredPromotion", "PromotionPolicy", "holding_up", "majority",
]
