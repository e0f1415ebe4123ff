"""SyncGate: synchronous confirms. A group commit's callbacks (publisher confirms,
tx.commit-ok) are released only once the records are durable here AND acknowledged
durable by the standbys the mode asks for:

``min_insync_standbys >= 1`` ("no confirm without a second copy")
    by that many in-sync standbys; nacked (:class:`NotReplicated`) after
    ``insync_timeout`` seconds with too few in sync.
``min_insync_standbys = 0`` with ``peers`` (degraded, never lossy: Kafka's in-sync set)
    by every *member*: each standby that joined the in-sync set and has not yet been
    dropped from it. A standby joins here as soon as it has caught up, before the
    election records it in etcd as eligible; it leaves only once etcd records the set
    without it (``recorded``), with static roles (no etcd) at once. So a standby that
    etcd lists as in sync holds every confirmed record, and with no member left the
    active confirms alone. Confirms that wait ``insync_timeout`` (etcd unreachable, so
    the shrink cannot be recorded) are nacked.

The hook in the confirm path is one line in ``SharedLog._push`` (``commit_gate``): the
publish pipeline keeps waiting on the store's commit callback as before, and that
callback now fires at min(local durable, replicated).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqpd.replication import trace
from amqpd.store.api import NotReplicated

if TYPE_CHECKING:
    from amqpd.replication.source import ReplicationSource

log = logging.getLogger("amqpd.replication")

Callback = Callable[[BaseException | None], None]
_ALL = 1 << 62


class SyncGate:
    """Holds commit callbacks until enough in-sync standbys hold the records.

    ``wrap`` is the log's ``commit_gate``: it replaces one group commit's callbacks by
    one that, once the records are durable here, waits for the standbys. Waiters are
    in sequence order (group commits complete in order), so releasing is a pop from
    the left; a timer nacks those that waited ``insync_timeout`` while too few standbys
    were in sync."""

    def __init__(self, source: ReplicationSource, minimum: int, timeout: float,
                 isr: bool = False, record: bool = False) -> None:
        self.source = source
        self.minimum = minimum
        self.timeout = timeout
        self.isr = isr  # degraded mode: wait for the members, whoever they are
        self.record = record  # members leave only once etcd recorded it (election)
        self.members: set[str] = set()
        self.waiters: collections.deque[tuple[int, list[Callback], float]] = \
            collections.deque()
        self.nacked = 0
        self.released = 0
        # what synchronous replication costs a confirm (bench/sync_profile.py): group
        # commits the standbys already held when they were durable here, and the
        # seconds the others waited past their local fsync
        self.ahead = 0
        self.waited_s = 0.0

    def wrap(self, seq: int, callbacks: list[Callback]) -> list[Callback]:
        def local_done(exc: BaseException | None) -> None:
            if trace.ON:
                trace.mark("g", seq)
            if exc is not None:
                _fire(callbacks, exc)
            elif self.replicated() >= seq:
                self.ahead += 1
                _fire(callbacks, None)
            else:
                self.waiters.append((seq, callbacks, time.monotonic() + self.timeout))

        return [local_done]

    def join(self, name: str) -> None:
        """``name`` caught up: from now on confirms wait for it too (degraded mode)."""
        if self.isr and name not in self.members:
            self.members.add(name)
            log.info("replication: confirms now wait for standby %s", name)

    def leave(self, name: str) -> None:
        """``name`` fell out of sync or disconnected. Under an election it stays a member
        until etcd records the set without it (``recorded``)."""
        if self.isr and not self.record and name in self.members:
            self.members.discard(name)
            log.warning("replication: confirms no longer wait for standby %s", name)
            self.release()

    def recorded(self, names: set[str]) -> None:
        """etcd now records ``names`` as the in-sync set: the members are those, plus any
        standby that caught up since the set was read (it joined here first)."""
        if not self.isr:
            return
        members = set(names) | {p.name for p in self.source.peers if p.in_sync}
        for gone in sorted(self.members - members):
            log.warning("replication: standby %s is out of the in-sync set recorded in etcd; "
                        "confirms no longer wait for it", gone)
        self.members = members
        self.release()

    def replicated(self) -> int:
        """The highest sequence held durably by ``minimum`` in-sync standbys (degraded
        mode: by every member)."""
        if self.isr:
            by_name = self.source.acked_by_name
            return min((by_name.get(n, -1) for n in self.members), default=_ALL)
        if self.minimum <= 0:
            return _ALL
        acked = sorted((p.acked_seq for p in self.source.peers if p.in_sync), reverse=True)
        return acked[self.minimum - 1] if len(acked) >= self.minimum else -1

    def release(self) -> None:
        waiters = self.waiters
        if not waiters:
            return
        done = self.replicated()
        now = time.monotonic()
        if trace.ON and waiters[0][0] <= done:
            trace.mark("r", done)
        while waiters and waiters[0][0] <= done:
            _, callbacks, deadline = waiters.popleft()
            _fire(callbacks, None)
            self.released += 1
            self.waited_s += now - (deadline - self.timeout)
        if not waiters:
            return
        if waiters[0][2] > now:
            return
        if self.isr:
            err = NotReplicated(f"standbys {sorted(self.members)} of the in-sync set did not "
                                f"acknowledge within {self.timeout:g}s, and leaving the set "
                                "was not recorded in etcd")
        else:
            insync = self.source.insync_count()
            if insync >= self.minimum:
                return
            err = NotReplicated(f"only {insync} of min_insync_standbys={self.minimum} "
                                f"standbys in sync for {self.timeout:g}s")
        n = 0
        while waiters and waiters[0][2] <= now:
            _fire(waiters.popleft()[1], err)
            n += 1
        self.nacked += n
        log.warning("replication: nacked %d group commits: %s", n, err)

    def fail_all(self, reason: str) -> None:
        err = NotReplicated(reason)
        while self.waiters:
            _fire(self.waiters.popleft()[1], err)


def _fire(callbacks: list[Callback], exc: BaseException | None) -> None:
    for cb in callbacks:
        try:
            cb(exc)
        except Exception:
            log.exception("commit callback failed")
