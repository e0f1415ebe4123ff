"""Deadlines for store commits waiting on other nodes (issue 28, "no silent node").

Why: a store commit of a node that leads mirrored or quorum queues waits, in a
:class:`~amqpd.cluster.mirror_state.CommitGate`, for the replicas' acknowledgements.
The gate releases in order, so one waiter that never ends holds every later commit of
the node: the confirms of every queue it leads, and also its declare-oks (passive ones
as well: a channel's -ok waits behind the node's earlier definition changes) and its
HTTP ``PUT`` responses, since the definitions journal commits through the same store.
The gates' own rules end most waits (a mirror that does not acknowledge within
``mirror_sync_timeout`` leaves the synchronised set once etcd has recorded that; a
quorum commit without a majority in that time is refused), but the first needs etcd and
a running reconciliation, which a node paused or cut from etcd does not have.

So every gate also gets a hard deadline here: a commit still waiting
``mirror_sync_timeout + definition_timeout`` seconds after it started is refused with
:class:`~amqpd.store.api.NotReplicated` -- a publisher nack, a 541 for a declare or an
HTTP 500, what a RabbitMQ client expects of a change the broker could not make safe --
and a log line names what it waited for (which queues, which replicas). Refusing is
always safe: nothing is promised that might not hold. The sweep runs in its own task,
not in the gates' reconciliations, so it runs whatever state those are in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from amqpd.broker.api import NotReplicated
from amqpd.cluster.mirror_state import CommitGate, ReplicaSet, Waiter

log = logging.getLogger("amqpd.cluster.deadlines")

Ident = tuple[str, str]  # (vhost, queue)
IdentsOf = Callable[[], Mapping[ReplicaSet, Ident]]
OnConfirm = Callable[[BaseException | None], None]
SWEEP_INTERVAL = 0.5  # seconds between sweeps


def describe_waiter(waiter: Waiter, idents: Mapping[ReplicaSet, Ident]) -> str:
    """What a waiting commit waits for: per queue, the replicas that have not
    acknowledged the record it needs."""
    parts = []
    for rs, seq in waiter.needs:
        if rs.satisfied(seq):
            continue
        ident = idents.get(rs)
        where = (f"queue '{ident[1]}' in vhost '{ident[0]}'" if ident is not None
                 else "a queue no longer led here")
        late = ", ".join(rs.laggards(seq)) or "too few replicas"
        parts.append(f"{where} (record {seq}; not acknowledged by {late})")
    return "; ".join(parts) or "earlier commits"


@dataclass
class _Watched:
    name: str
    gate: CommitGate
    idents: IdentsOf


class CommitDeadlines:
    """The hard deadline of every watched gate (module docstring)."""

    def __init__(self, definition_timeout: float) -> None:
        self.definition_timeout = definition_timeout
        self.watched: list[_Watched] = []
        self.refused = 0  # commits refused so far (for tests and the status)
        self._task: asyncio.Task[None] | None = None
        # forwarded publishes' confirms: a little longer than the leader's own deadline
        # (its nack, when it gives one, comes first)
        self.confirms = ConfirmDeadlines(0.0)

    def watch(self, name: str, gate: CommitGate, idents: IdentsOf) -> None:
        """Keep ``gate`` (``name``: whose, for the log) within its deadline;
        ``idents`` maps its replica sets to their queues, for the log lines."""
        self.watched.append(_Watched(name, gate, idents))

    def confirm_limit(self, gate_timeout: float) -> float:
        """How long a forwarded publish waits for its leader's confirm."""
        return gate_timeout + 2 * self.definition_timeout

    def limit(self, gate: CommitGate) -> float:
        return gate.timeout + self.definition_timeout

    def sweep(self, now: float) -> int:
        """Refuse every waiter past its gate's deadline; how many."""
        total = 0
        for w in self.watched:
            gate = w.gate
            if not gate.waiting or now - gate.waiting[0].started < self.limit(gate):
                continue
            idents = w.idents()
            head = gate.waiting[0]
            what = describe_waiter(head, idents)
            error = NotReplicated(f"not acknowledged by the replicas within "
                                  f"{self.limit(gate):g} s: {what}")
            expired = gate.expire(now, self.limit(gate), error)
            total += len(expired)
            log.error("%s: %d commit(s) waited over %.1f s and were refused (publisher "
                      "nack, 541 for a declare); the oldest waited for %s", w.name,
                      len(expired), self.limit(gate), what)
        self.refused += total
        return total

    def waits(self, now: float) -> list[tuple[float, str]]:
        """Every commit waiting now, as ``(started, what it waits for)`` (the
        watchdog's report, amqpd/watchdog.py)."""
        out: list[tuple[float, str]] = []
        for w in self.watched:
            if not w.gate.waiting:
                continue
            idents = w.idents()
            for waiter in w.gate.waiting:
                out.append((waiter.started,
                            f"{w.name} commit: {describe_waiter(waiter, idents)}"))
        return out + self.confirms.waits(now)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="cluster-deadlines")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its CancelledError

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                now = time.monotonic()
                self.sweep(now)
                self.confirms.sweep(now)
            except Exception:
                log.exception("cluster: commit deadline sweep failed")


class _Pending:
    """One forwarded publish's confirm: answered once, by the leader or the deadline."""

    __slots__ = ("callback", "done")

    def __init__(self, callback: OnConfirm) -> None:
        self.callback = callback
        self.done = False

    def answer(self, error: BaseException | None) -> None:
        if not self.done:
            self.done = True
            self.callback(error)


class ConfirmDeadlines:
    """Deadlines of the confirms a node waits for from another node (a publish
    forwarded to a queue's leader: amqpd/cluster/remote_queue.py). The leader's own
    commit is bounded (:class:`CommitDeadlines`) and a link that goes nacks what it
    carried; this bounds what is left (a leader that answers everything but that
    confirm): past ``limit`` seconds the publisher gets a nack and a log line names
    the queue and its leader; the leader's late answer is then ignored. Checked by a
    sweep (:meth:`sweep`), not a timer per message: forwarding is a hot path."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.refused = 0
        self._due: deque[tuple[float, _Pending, str]] = deque()

    def track(self, callback: OnConfirm, what: str) -> OnConfirm:
        """``callback`` as it must be handed on: answered at most once, with a nack
        after ``limit`` seconds (``what``: the queue and its leader, for the log)."""
        pending = _Pending(callback)
        self._due.append((time.monotonic() + self.limit, pending, what))
        return pending.answer

    def sweep(self, now: float) -> int:
        due = self._due
        n = 0
        late: dict[str, int] = {}
        while due and (due[0][1].done or due[0][0] <= now):
            _at, pending, what = due.popleft()
            if pending.done:
                continue
            n += 1
            late[what] = late.get(what, 0) + 1
            pending.answer(NotReplicated(f"no confirm from {what} within {self.limit:g} s"))
        for what, count in late.items():
            log.error("%d forwarded publish(es) to %s not confirmed within %.1f s: nacked",
                      count, what, self.limit)
        self.refused += n
        return n

    def waits(self, now: float) -> list[tuple[float, str]]:
        """The oldest confirm still waiting, per queue (for the watchdog)."""
        oldest: dict[str, float] = {}
        for at, pending, what in self._due:
            if not pending.done and what not in oldest:
                oldest[what] = at - self.limit
        return [(started, f"a confirm from {what}") for what, started in oldest.items()]


class GateOwner(Protocol):
    """Mirrors and QuorumGroups (amqpd/cluster/mirror.py, quorum_group.py): a gate and
    the queues they lead, each with its replica set."""

    gate: CommitGate

    @property
    def leading(self) -> Mapping[Ident, Any]: ...


def _idents_of(owner: GateOwner) -> IdentsOf:
    def idents() -> dict[ReplicaSet, Ident]:
        return {lead.rs: ident for ident, lead in owner.leading.items()}
    return idents


class ConfirmUser(Protocol):
    """ClusterQueues (amqpd/cluster/cluster_queues.py): where forwarded publishes'
    confirms are tracked."""

    confirm_deadlines: ConfirmDeadlines | None


def start(definition_timeout: float, mirrors: GateOwner, quorum: GateOwner,
          queues: ConfirmUser) -> CommitDeadlines:
    """The deadlines of the mirrored queues' and the quorum queues' gates and of the
    confirms of publishes forwarded to other nodes, running."""
    deadlines = CommitDeadlines(definition_timeout)
    deadlines.confirms.limit = deadlines.confirm_limit(mirrors.gate.timeout)
    queues.confirm_deadlines = deadlines.confirms
    for name, owner in (("mirrored queues", mirrors), ("quorum queues", quorum)):
        deadlines.watch(name, owner.gate, _idents_of(owner))
    deadlines.start()
    return deadlines


__all__ = ["CommitDeadlines", "ConfirmDeadlines", "describe_waiter", "start"]
