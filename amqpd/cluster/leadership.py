"""Leadership: whether this node may claim the queues it holds as their leader now.

A queue's leader is etcd's record (the catalogue, ``amqpd.cluster.definitions``); the
local queue object is this node's belief. The belief lags the record whenever this
node could not hear it change: while it was starting (its queues come back from its
own log before it has read etcd), while its event loop was stopped (a SIGSTOP, a long
stall: the others count it down after ``heartbeat_timeout`` of silence and promote a
mirror or elect a member meanwhile) and while it was paused or cut off from etcd (a
partition). Until the record has been read again, the node claimed queues another
node served: a restarted node for 0.3-0.6 s, a woken one for up to 1.9 s (issue 28).

So a node doubts its leadership from its start and after each such event, and
confirms it only by reading etcd's definitions afresh (a linearizable read, applied
ahead of the watch) once it serves again: what the read shows another node leading
is handed over by the applier (``ClusterQueues.materialise``) before the doubt ends.
While in doubt, ``/api/queues`` shows its queues ``down``, and the queues it leads
deliver nothing (``on_doubt`` / ``on_confirmed``: amqpd.cluster.delivery_hold). A stall
is seen by the first callback after it that asks (:meth:`LoopClock.ongoing`), and by
the clock's tick, a timer that runs on waking before the dispatch the woken node's
first reads scheduled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from amqpd.cluster.loop_clock import LoopClock
from amqpd.coord.etcd import EtcdError

log = logging.getLogger("amqpd.cluster")

RETRY = 0.1  # seconds between tries while the node cannot confirm yet


class Leadership:
    def __init__(self, clock: LoopClock, stall_limit: float, ready: Callable[[], bool],
                 read: Callable[[], Awaitable[None]]) -> None:
        """``stall_limit``: a stall this long may have let the others act (half the
        heartbeat timeout); ``ready``: the node serves and reaches etcd; ``read``: read
        etcd's definitions and apply them."""
        self.clock = clock
        self.stall_limit = stall_limit
        self.ready = ready
        self.read = read
        self.doubted = "this node is starting"  # why it doubts ("": it does not)
        self.generation = 0  # doubts raised so far: a read older than the last one is void
        self.confirmations = 0
        self._wake = asyncio.Event()
        self._wake.set()
        # called on every doubt, and once each doubt is confirmed away (the delivery
        # hold of the queues this node leads)
        self.on_doubt: list[Callable[[], None]] = []
        self.on_confirmed: list[Callable[[], None]] = []
        clock.on_stall.append(self._stalled)

    def _stalled(self, seconds: float) -> None:
        if seconds >= self.stall_limit:
            self.doubt(f"its event loop stalled for {seconds:.1f}s")

    def doubt(self, why: str) -> None:
        """Something may have moved leadership without this node hearing it."""
        self.generation += 1
        if not self.doubted:
            log.info("cluster: leadership of this node's queues unconfirmed: %s", why)
            self.doubted = why
        for listener in self.on_doubt:
            listener()
        self._wake.set()

    def confirmed(self) -> bool:
        """May this node claim the queues it holds now?"""
        stall = self.clock.ongoing()
        if stall >= self.stall_limit:
            self.doubt(f"its event loop stalled for {stall:.1f}s")
        return not self.doubted

    async def run(self) -> None:
        """Confirm each doubt once the node serves again; runs until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.doubted:
                generation = self.generation
                if not self.ready():
                    await asyncio.sleep(RETRY)
                    continue
                try:
                    await self.read()
                except EtcdError as exc:
                    log.debug("cluster: leadership not confirmed yet: %s", exc)
                    await asyncio.sleep(RETRY)
                    continue
                if generation == self.generation and self.ready() \
                        and self.clock.ongoing() < self.stall_limit:
                    log.info("cluster: leadership of this node's queues confirmed with "
                             "etcd (was unconfirmed: %s)", self.doubted)
                    self.doubted = ""
                    self.confirmations += 1
                    for listener in self.on_confirmed:
                        listener()


__all__ = ["Leadership"]
