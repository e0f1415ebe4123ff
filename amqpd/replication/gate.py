"""SyncGate: synchronous confirms. A group commit's callbacks (publisher confirms,
tx.commit-ok) are released only once the records are durable here AND acknowledged
durable by ``min_insync_standbys`` in-sync standbys; nacked (:class:`NotReplicated`)
after ``insync_timeout`` seconds with too few in sync.

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

    def __init__(self, source: ReplicationSource, minimum: int, timeout: float) -> None:
        self.source = source
        self.minimum = minimum
        self.timeout = timeout
        self.waiters: collections.deque[tuple[int, list[Callback], float]] = \
            collections.deque()
        self.nacked = 0
        self.released = 0

    def wrap(self, seq: int, callbacks: list[Callback]) -> list[Callback]:
        def local_done(exc: BaseException | None) -> None:
            if exc is not None:
                _fire(callbacks, exc)
            elif self.replicated() >= seq:
                _fire(callbacks, None)
            else:
                self.waiters.append((seq, callbacks, time.monotonic() + self.timeout))

        return [local_done]

    def replicated(self) -> int:
        """The highest sequence held durably by ``minimum`` in-sync standbys."""
        if self.minimum <= 0:
            return _ALL
        acked = sorted((p.acked_seq for p in self.source.peers if p.in_sync), reverse=True)
        return acked[self.minimum - 1] if len(acked) >= self.minimum else -1

    def release(self) -> None:
        waiters = self.waiters
        if not waiters:
            return
        done = self.replicated()
        while waiters and waiters[0][0] <= done:
            _fire(waiters.popleft()[1], None)
            self.released += 1
        if not waiters:
            return
        now = time.monotonic()
        insync = self.source.insync_count()
        if insync >= self.minimum or waiters[0][2] > now:
            return
        n = 0
        err = NotReplicated(f"only {insync} of min_insync_standbys={self.minimum} standbys "
                            f"in sync for {self.timeout:g}s")
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
