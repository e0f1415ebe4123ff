"""The mirrored-queue replication state machine, without sockets, etcd or asyncio.

:mod:`amqpd.cluster.mirror` drives it; the unit tests drive it directly.

* :class:`ReplicaSet` -- the leader's view of one mirrored queue's mirrors: the
  replication sequence numbers it handed out, what each mirror acknowledged as durable,
  and the *synchronised* (in-sync) set whose acknowledgements a confirm waits for.
* :class:`CommitGate` -- the publisher confirms (and tx.commit-oks, and any other store
  commit) waiting for the in-sync mirrors: a waiter holds, per mirrored queue that had
  records when it started, the sequence number it needs; it is released once every
  in-sync mirror of each acknowledged that far. Waiters are released in order (a later
  waiter needs at least what an earlier one needs). The head waiter waiting longer than
  the timeout names the mirrors that hold it up (:meth:`CommitGate.laggards`): they
  leave the synchronised set (after etcd has recorded that) instead of stalling
  publishers.
* :func:`mirror_nodes` -- the nodes a policy's ``ha-mode`` / ``ha-params`` ask for.
* the rules themselves -- the commit point, the promotion choice, catch-up -- are the
  pure replica core's (:mod:`amqpd.cluster.replica_core`): a :class:`ReplicaSet` holds
  the counts and asks its commit policy (:class:`~amqpd.cluster.replica_core.AllInSync`
  for mirrored queues, :class:`~amqpd.cluster.replica_core.Majority` for a quorum
  queue's group), so mirrored and quorum leaders differ only in the policy they pass.
"""

from __future__ import annotations

import contextlib
import urllib.parse
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from amqpd.cluster.replica_core import AllInSync, CommitPolicy, holding_up

OnCommit = Callable[[BaseException | None], None]
Ident = tuple[str, str]  # a replicated queue: (vhost, queue)
# seconds between reconciliations of the replica groups (policies, timeouts, failover)
TICK: Final = 0.25


def key_part(part: str) -> str:
    """A vhost or queue name as one segment of an etcd key (the mirror and group
    records, the election candidates)."""
    return urllib.parse.quote(part, safe="")


class ReplicaSet:
    """One mirrored queue on its leader: sequence numbers, acks, the synchronised set."""

    def __init__(self, leader: str, synchronised: Iterable[str] = (),
                 policy: CommitPolicy | None = None) -> None:
        self.leader = leader
        self.seq = 0  # the last replication sequence number handed out
        self.acked: dict[str, int] = {}  # mirror -> highest seq it holds durable
        self.synchronised: set[str] = set(synchronised)
        # mirrors every commit waits for that have no copy yet: a mirrored queue's
        # birth members (amqpd.cluster.mirror_leading.Leading.born_without). While any
        # is here nothing new is committed; each leaves once its copy is synchronised
        # (then it counts as any synchronised mirror) or when it is given up
        self.pending: set[str] = set()
        # which acknowledgements commit a record (amqpd.cluster.replica_core): every
        # synchronised mirror's by default; a quorum queue's leader sets a majority
        self.policy: CommitPolicy = policy if policy is not None else AllInSync()

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def attach(self, node: str) -> None:
        """A mirror's copy (re)starts: it holds nothing yet."""
        self.acked[node] = 0

    def ack(self, node: str, seq: int) -> None:
        if seq > self.acked.get(node, 0):
            self.acked[node] = seq

    def join(self, node: str) -> None:
        self.synchronised.add(node)

    def leave(self, node: str) -> None:
        self.synchronised.discard(node)

    def satisfied(self, seq: int) -> bool:
        """Every record up to ``seq`` (at most :attr:`seq`: the leader holds it) is
        durable where the commit policy needs it."""
        if self.pending and seq > 0:
            return False
        return self.policy.commit_point(self.seq, self.acked, self.synchronised) >= seq

    def laggards(self, seq: int) -> list[str]:
        return sorted({*holding_up(seq, self.acked, self.synchronised), *self.pending})


@dataclass
class Waiter:
    started: float
    needs: list[tuple[ReplicaSet, int]]
    callback: OnCommit = field(repr=False)


class CommitGate:
    """Store commits waiting for the synchronised mirrors (module docstring)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.waiting: deque[Waiter] = deque()
        self.sets: list[ReplicaSet] = []  # every mirrored queue this node leads
        # sets abandoned (:meth:`abandon`) -> the error their needs end with (None:
        # waived), for the commits that computed their needs before and arrive after
        # (the store's own commit runs in between): weak, gone with the set
        self.retired: weakref.WeakKeyDictionary[ReplicaSet, BaseException | None] = \
            weakref.WeakKeyDictionary()

    def needs_now(self) -> list[tuple[ReplicaSet, int]]:
        """What a commit asked for now must wait for: each set's current sequence
        number, where some synchronised mirror has not acknowledged it yet."""
        return [(rs, rs.seq) for rs in self.sets if rs.seq and not rs.satisfied(rs.seq)]

    def wait(self, needs: list[tuple[ReplicaSet, int]], now: float,
             callback: OnCommit) -> None:
        """Call ``callback(None)`` once ``needs`` are met (at once if they are and
        nobody waits before it)."""
        if needs and self.retired:
            kept = []
            for rs, seq in needs:
                if rs not in self.retired:
                    kept.append((rs, seq))
                    continue
                error = self.retired[rs]
                if error is not None:
                    callback(error)
                    return
            needs = kept
        if not needs and not self.waiting:
            callback(None)
            return
        self.waiting.append(Waiter(now, needs, callback))
        self.release()

    def release(self) -> int:
        """Release the waiters whose needs are met, in order; how many."""
        n = 0
        waiting = self.waiting
        while waiting and all(rs.satisfied(seq) for rs, seq in waiting[0].needs):
            waiter = waiting.popleft()
            n += 1
            waiter.callback(None)
        return n

    def laggards(self, now: float) -> list[tuple[ReplicaSet, str]]:
        """The mirrors holding up a waiter older than the timeout (they must leave the
        synchronised set)."""
        if not self.waiting or now - self.waiting[0].started < self.timeout:
            return []
        out: list[tuple[ReplicaSet, str]] = []
        for rs, seq in self.waiting[0].needs:
            for node in rs.laggards(seq):
                out.append((rs, node))
        return out

    def abandon(self, rs: ReplicaSet, error: BaseException | None) -> int:
        """``rs`` stops counting: its queue is no longer led here (deleted, no longer
        mirrored, deposed, replaced). No acknowledgement of its mirrors will come any
        more, so a waiter that needs it would wait for ever and, the gate releasing in
        order, every commit of the node behind it (declare-oks, HTTP responses and
        confirms of unrelated queues: the silent node of issue 28). With ``error`` None
        (deleted, or no longer mirrored: the leader's own durability is all it needs)
        those needs are waived; else (another node leads it, and what its mirrors have
        not acknowledged may not be in the cluster's copy) the waiters that still need
        an acknowledgement fail with ``error`` -- a nack, never a confirm. A commit that
        computed its needs before and reaches :meth:`wait` only after (its store commit
        ran in between) is treated the same way there. Answers how many waiters failed."""
        with contextlib.suppress(ValueError):
            self.sets.remove(rs)
        self.retired[rs] = error
        kept: deque[Waiter] = deque()
        failed: list[Waiter] = []
        for waiter in self.waiting:
            needed = [(r, seq) for r, seq in waiter.needs if r is rs]
            if needed and error is not None and not all(r.satisfied(q) for r, q in needed):
                failed.append(waiter)
                continue
            if needed:
                waiter.needs = [(r, seq) for r, seq in waiter.needs if r is not rs]
            kept.append(waiter)
        self.waiting = kept
        for waiter in failed:
            waiter.callback(error)
        self.release()
        return len(failed)

    def expire(self, now: float, limit: float, error: BaseException) -> list[Waiter]:
        """Fail, in order, the waiters that started ``limit`` seconds or more before
        ``now``; the expired ones (their needs say what they waited for)."""
        out: list[Waiter] = []
        waiting = self.waiting
        while waiting and now - waiting[0].started >= limit:
            waiter = waiting.popleft()
            out.append(waiter)
            waiter.callback(error)
        if out:
            self.release()
        return out

    def fail_all(self, error: BaseException) -> None:
        waiting, self.waiting = self.waiting, deque()
        for waiter in waiting:
            waiter.callback(error)


def mirror_nodes(policy: dict[str, Any] | None, leader: str, members: Iterable[str],
                 running: Callable[[str], bool], current: Iterable[str] = ()) -> list[str]:
    """The nodes (other than ``leader``) that should hold a mirror of a queue with this
    policy definition: ``ha-mode`` ``all`` (every member), ``exactly`` (``ha-params``
    replicas in total, the leader included: running nodes, the current mirrors first,
    then by name), ``nodes`` (the listed nodes that are members). Empty: not mirrored."""
    if not policy:
        return []
    mode = policy.get("ha-mode")
    others = sorted(m for m in members if m != leader)
    if mode == "all":
        return others
    if mode == "exactly":
        count = policy.get("ha-params")
        if not isinstance(count, int) or isinstance(count, bool) or count < 2:
            return []
        now = [m for m in current if m in others and running(m)]
        rest = [m for m in others if m not in now and running(m)]
        return sorted((now + rest)[:count - 1])
    if mode == "nodes":
        listed = policy.get("ha-params")
        if not isinstance(listed, list):
            return []
        return sorted({str(n) for n in listed} & set(others))
    return []


# The ``ha-*`` keys that change what a mirror does, their RabbitMQ 3.10 defaults, and
# the values RabbitMQ accepts (REFERENCE.md 2.1; an unknown value counts as the default)
HA_DEFAULTS: dict[str, str] = {
    "ha-sync-mode": "manual",
    "ha-promote-on-failure": "always",
    "ha-promote-on-shutdown": "when-synced",
}
HA_VALUES: dict[str, tuple[str, ...]] = {
    "ha-sync-mode": ("manual", "automatic"),
    "ha-promote-on-failure": ("always", "when-synced"),
    "ha-promote-on-shutdown": ("always", "when-synced"),
}


def ha_setting(policy: dict[str, Any] | None, key: str) -> str:
    """The value of ``key`` (one of :data:`HA_DEFAULTS`) a policy definition gives."""
    value = (policy or {}).get(key)
    return value if value in HA_VALUES[key] else HA_DEFAULTS[key]


__all__ = [
    "HA_DEFAULTS",
    "HA_VALUES",
    "TICK",
    "CommitGate",
    "Ident",
    "ReplicaSet",
    "Waiter",
    "ha_setting",
    "key_part",
    "mirror_nodes",
]
