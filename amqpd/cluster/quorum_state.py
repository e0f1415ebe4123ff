"""The replica-group rules of quorum queues across nodes, without sockets, etcd or asyncio.

:mod:`amqpd.cluster.quorum_group` drives them; the unit tests drive them directly.

* :func:`majority` -- how many members (the leader included) make a record committed,
  and how many must be reachable for an election: more than half.
* :func:`group_size` / :func:`initial_members` -- the members a new quorum queue gets:
  ``x-quorum-initial-group-size`` of them (RabbitMQ 3.10's default: 3, its
  ``quorum_cluster_size``; a size above the cluster's size means every node), chosen
  among the cluster's members whether they run or not, as RabbitMQ 3.10 picks among
  ``rabbit_mnesia:cluster_nodes(all)``: the leader (the declaring node) first, then the
  running members by name, then the members not running (or not reachable) now by name.
  A member that is down at declare is a member all the same: its copy starts, and
  catches up from the leader, when it is back (issue 28: a node restarting at that
  moment was left out for ever). RabbitMQ picks at random when the cluster has more
  nodes than the size; amqpd prefers the running ones so that a majority holds the
  queue from its declare whenever the cluster can give one.
* the election's choice is the pure replica core's
  (:class:`amqpd.cluster.replica_core.MajorityPromotion`): among the offers of the
  surviving members (member -> the replication sequence number of the lost leader's log
  up to which it holds that log completely, even while its copy is being rebuilt after
  its link or its node came back: ``quorum_failover.election_offer``; -1: nothing of
  that log, so it may vote but never lead), nobody when fewer than a majority of the
  members offered; else the longest log, ties to the smallest name.
* :func:`quorum_critical` -- what ``node-is-quorum-critical`` reports.
* :func:`add_member` / :func:`remove_member` -- membership edits with RabbitMQ's refusals.
* :func:`expire_waiters` -- the bounded wait: commits a group without a majority holds
  longer than the timeout are failed (the publisher gets a nack) instead of waiting for
  ever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from amqpd.broker.api import MembershipError as MembershipError
from amqpd.broker.api import NotReplicated
from amqpd.cluster.mirror_state import CommitGate
from amqpd.cluster.replica_core import majority as majority

DEFAULT_GROUP_SIZE = 3  # RabbitMQ 3.10's quorum_cluster_size


class NoQuorum(NotReplicated):
    """A commit that a quorum queue's majority did not acknowledge in time: a nack for
    the publisher, and (as a warren's NotReplicated) no store alarm: the disk is fine."""


def group_size(arguments: dict[str, Any]) -> int:
    """The initial group size a declare asks for (validated at declare by
    :meth:`amqpd.broker.quorum.QuorumQueue.validate_arguments`)."""
    value = arguments.get("x-quorum-initial-group-size")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return DEFAULT_GROUP_SIZE
    return value


def initial_members(leader: str, size: int, nodes: Iterable[str],
                    running: Callable[[str], bool]) -> list[str]:
    """The members of a new group among the cluster's members ``nodes``: the leader,
    then the running ones by name, then those not running by name, ``size`` in all
    (fewer when the cluster has fewer members). Not running is no reason to leave a
    member out (module docstring): it joins when it is back."""
    others = sorted(set(nodes) - {leader}, key=lambda n: (not running(n), n))
    return [leader, *others[:max(size - 1, 0)]]


def has_majority(members: Iterable[str], up: Callable[[str], bool]) -> bool:
    members = list(members)
    return sum(1 for m in members if up(m)) >= majority(len(members))


def quorum_critical(records: dict[tuple[str, str], dict[str, Any]], node: str,
                    running: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The quorum queues with a member on ``node`` whose running members are no more
    than a majority: stopping ``node`` would leave them without one (RabbitMQ's
    ``length(Up) =< MinQuorum``)."""
    out = []
    for ident, rec in records.items():
        members = [str(m) for m in rec.get("members", [])]
        if node not in members:
            continue
        up = [m for m in members if m == node or running(m)]
        if len(up) <= majority(len(members)):
            out.append(ident)
    return sorted(out)


def add_member(members: list[str], node: str, known: Iterable[str]) -> list[str]:
    if node not in set(known):
        raise MembershipError(f"{node} is not a member of the cluster")
    if node in members:
        raise MembershipError(f"{node} is already a member of the group")
    return [*members, node]


def remove_member(members: list[str], node: str, leader: str) -> list[str]:
    if node not in members:
        raise MembershipError(f"{node} is not a member of the group")
    if len(members) == 1:
        raise MembershipError("cannot remove the last member of the group (last_node)")
    if node == leader:
        raise MembershipError(f"{node} leads the group: amqpd moves no leader on "
                              "request; stop that node first (a new leader is elected)")
    return [m for m in members if m != node]


def grow_targets(records: dict[tuple[str, str], dict[str, Any]], node: str,
                 strategy: str) -> list[tuple[str, str]]:
    """``rabbitmq-queues grow <node> all|even``: the queues that gain ``node`` as a
    member (``even``: only those with an even number of members)."""
    out = []
    for ident, rec in records.items():
        members = list(rec.get("members", []))
        if node in members:
            continue
        if strategy == "even" and len(members) % 2:
            continue
        out.append(ident)
    return sorted(out)


def expire_waiters(gate: CommitGate, now: float, error: BaseException) -> int:
    """Fail, in order, the waiters older than the gate's timeout; how many."""
    return len(gate.expire(now, gate.timeout, error))


__all__ = [
    "DEFAULT_GROUP_SIZE", "MembershipError", "NoQuorum", "add_member",
    "expire_waiters", "group_size", "grow_targets", "has_majority", "initial_members",
    "majority", "quorum_critical", "remove_member",
]
