"""Single active consumer groups of the stream protocol (RabbitMQ 3.11+), as pure state.

A subscription with the properties ``single-active-consumer=true`` and ``name=G`` joins
the group (vhost, stream, G); exactly one member of a group is active (gets chunks),
the others wait. The rules are RabbitMQ 3.11's ``rabbit_stream_sac_coordinator``:

- a group on a plain stream (partition index -1): the first member to join is active;
  when it leaves, the next in joining order becomes active. Joining never changes who
  is active.
- a group on a partition of a super stream (the subscription names the super stream in
  the ``super-stream`` property; the partition index is its binding's
  ``x-stream-partition-order``): the active member is the one at position
  ``partition index mod group size`` in joining order. When a member joins or leaves
  and that position points elsewhere, the active member is first told to step down
  (``active=false``, *stepping down*); only once it has answered that consumer update
  (:meth:`Coordinator.activate`) does the member at the position become active, so two
  consumers never read a partition at once. A stepping-down member that leaves without
  answering (its connection died) hands over at once.

Every change returns :class:`Notice` values (who to send a consumer update, with which
flag); the connections send them (:mod:`amqpd.streamproto.connection`). Members are
identified by their connection object and subscription id; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GroupKey = tuple[str, str, str]  # vhost, stream, consumer name


@dataclass(slots=True)
class Member:
    owner: Any  # the connection (compared by identity)
    subscription_id: int
    active: bool = False
    stepping_down: bool = False  # told to step down; its answer is awaited


@dataclass(slots=True)
class Group:
    partition_index: int  # -1: a plain stream
    members: list[Member] = field(default_factory=list)

    def active(self) -> Member | None:
        return next((m for m in self.members if m.active), None)

    def find(self, owner: Any, subscription_id: int) -> Member | None:
        return next((m for m in self.members
                     if m.owner is owner and m.subscription_id == subscription_id), None)

    def chosen(self) -> Member:
        """The member the partition rule picks (the group is not empty)."""
        return self.members[self.partition_index % len(self.members)]


@dataclass(frozen=True, slots=True)
class Notice:
    """Send ``owner`` a consumer update for ``subscription_id``."""

    owner: Any
    subscription_id: int
    active: bool
    stepping_down: bool = False


class Coordinator:
    """Every group of a node (the node's stream listener holds one)."""

    def __init__(self) -> None:
        self.groups: dict[GroupKey, Group] = {}

    def register(self, key: GroupKey, partition_index: int, owner: Any,
                 subscription_id: int) -> tuple[bool, list[Notice]]:
        """A subscription joins: (whether it is active now, notices to send)."""
        group = self.groups.setdefault(key, Group(partition_index))
        member = Member(owner, subscription_id)
        if not group.members:
            member.active = True
            group.members.append(member)
            return True, [Notice(owner, subscription_id, True)]
        group.members.append(member)
        if group.partition_index < 0:
            if group.active() is None and not _awaiting(group):
                member.active = True
                return True, [Notice(owner, subscription_id, True)]
            return False, []
        return False, self._rebalance(group)

    def unregister(self, key: GroupKey, owner: Any, subscription_id: int) -> list[Notice]:
        """A subscription leaves (unsubscribe, its connection closed, the stream gone)."""
        group = self.groups.get(key)
        member = group.find(owner, subscription_id) if group is not None else None
        if group is None or member is None:
            return []
        group.members.remove(member)
        if not group.members:
            del self.groups[key]
            return []
        if group.partition_index < 0:
            if not member.active:
                return []
            nxt = group.members[0]
            nxt.active = True
            return [Notice(nxt.owner, nxt.subscription_id, True)]
        if member.active or member.stepping_down:
            return self._activate_chosen(group)  # nobody reads now: hand over at once
        return self._rebalance(group)

    def activate(self, key: GroupKey, owner: Any, subscription_id: int) -> list[Notice]:
        """A member told to step down answered: the chosen member becomes active."""
        group = self.groups.get(key)
        member = group.find(owner, subscription_id) if group is not None else None
        if group is None or member is None or not member.stepping_down:
            return []
        member.stepping_down = False
        if group.active() is not None or _awaiting(group):
            return []
        return self._activate_chosen(group)

    def _rebalance(self, group: Group) -> list[Notice]:
        current = group.active()
        if current is None:
            return []  # a former active's answer is awaited; it activates then
        if current is group.chosen():
            return []
        current.active = False
        current.stepping_down = True
        return [Notice(current.owner, current.subscription_id, False, stepping_down=True)]

    def _activate_chosen(self, group: Group) -> list[Notice]:
        chosen = group.members[0] if group.partition_index < 0 else group.chosen()
        chosen.active = True
        chosen.stepping_down = False
        return [Notice(chosen.owner, chosen.subscription_id, True)]


def _awaiting(group: Group) -> bool:
    return any(m.stepping_down for m in group.members)


__all__ = ["Coordinator", "Group", "GroupKey", "Member", "Notice"]
