"""A quorum queue's member without a copy votes in its election (issue 28): part of
:class:`amqpd.cluster.quorum_group.QuorumGroups`.

A member's election rounds used to start from its copy of the group
(:meth:`QuorumGroups.reconcile` walks ``copy_of``), so a member whose copy was never
started -- its node was down while the leader ran, and the leader was lost before it
came back -- never offered anything. Its vote was missing from the majority the
election needs (:class:`~amqpd.cluster.replica_core.MajorityPromotion`), and the group
waited for its lost leader although a running member held the lost leader's log
complete.

Such a member now runs the same rounds (:func:`amqpd.cluster.election.election_round`)
with a :class:`VoterBallot`: it offers -1 ("nothing of the lost leader's log"), as a
member whose copy is being rebuilt does, and never takes over. The rule that decides is
unchanged: a majority of the members must have offered, and only a complete copy of the
lost leader's log can win (the longest). A committed record is held by a majority, so by
one of any majority of offers; a member that was never in sync is never promoted, and
when no offer holds anything the group goes on waiting, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from amqpd.cluster.election import election_round
from amqpd.cluster.mirror_state import Ident
from amqpd.cluster.quorum_failover import GroupBallot
from amqpd.coord.etcd import EtcdError

if TYPE_CHECKING:
    from amqpd.cluster.mirror_copy import MirrorCopy
    from amqpd.cluster.quorum_failover import GroupFailover

log = logging.getLogger("amqpd.cluster.quorum")

ROUNDS = 20  # rounds one vote task runs at most (the next reconciliation starts another)
ROUND_PAUSE = 0.2  # seconds between its rounds


def lost_without_copy(records: Mapping[Ident, dict[str, Any]], node: str,
                      skip: Container[Ident], leader_of: Callable[[Ident], str | None],
                      running: Callable[[str], bool]) -> list[tuple[Ident, str]]:
    """The groups (with their lost leader) whose election ``node`` should vote in
    without a copy: ``node`` a member, the leader another node that the catalogue
    names too and that is not running, and the group not in ``skip`` (this node holds
    a copy, leads it, or runs rounds for it already)."""
    out = []
    for ident, rec in records.items():
        leader = str(rec.get("leader") or "")
        if not leader or leader == node or ident in skip or running(leader) \
                or node not in [str(m) for m in rec.get("members", [])] \
                or leader_of(ident) != leader:
            continue
        out.append((ident, leader))
    return out


@dataclass
class _NoCopy:
    """What a member without a copy brings to an election round: the lost leader's
    name. The round reads nothing else of a copy but to finish a take-over of this
    node's that etcd applied late, which a member that never wins never started."""

    leader: str


class VoterBallot(GroupBallot):
    """A quorum queue's ballot for a member without a copy: it offers -1 and never
    takes over (module docstring)."""

    def offer(self) -> str:
        return "-1"

    async def take_over(self, rec_rev: int, prefix: str) -> bool:
        # MajorityPromotion elects a complete copy only: an offer of -1 never wins
        log.error("queue '%s' in vhost '%s': a member without a copy was chosen; not "
                  "taking over", self.ident[1], self.ident[0])
        return False


async def vote_without_copy(groups: GroupFailover, ident: Ident, leader: str) -> None:
    """Election rounds for ``ident``, whose leader ``leader`` was lost, by a member of
    the group that holds no copy (:data:`ROUNDS` at most; ends once decided)."""
    voter = cast("MirrorCopy", _NoCopy(leader))  # only .leader is read (see _NoCopy)
    try:
        for _attempt in range(ROUNDS):
            if await election_round(groups, ident, voter,
                                    lambda rec: VoterBallot(groups, ident, voter, rec)):
                return
            await asyncio.sleep(ROUND_PAUSE)
    except EtcdError as exc:
        log.warning("queue '%s': election round (a vote, no copy here) failed: %s",
                    ident[1], exc)
    finally:
        groups.promoting.pop(ident, None)


__all__ = ["VoterBallot", "lost_without_copy", "vote_without_copy"]
