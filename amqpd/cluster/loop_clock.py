"""LoopClock: a clock that stands still while this process's event loop is stalled.

Failure detection measures silence: no heartbeat from a node for ``heartbeat_timeout``, no
etcd answer for the etcd grace. Measured on the wall clock, a stall of this node's own
event loop (a long synchronous step, or the process starved of CPU on a loaded machine)
looks exactly like everybody else going silent: the datagrams and answers that arrived
meanwhile wait unread in the sockets, the first check after the stall sees every peer
"down" and etcd "out of reach", and pause_minority closes every client connection of a
node that was merely slow. The silence that means something is silence *while this node
was listening*.

So the cluster view reads time from this clock. A ticker wakes every ``tick``
seconds; whatever a wake-up comes later than ``tick + slack`` is a stall, and the clock
does not count it. The ticker is a timer callback (``call_later``), not a task sleeping:
on waking, the event loop runs the due timers before anything the woken node's first
socket reads scheduled with ``call_soon`` (a task's next step, the broker's dispatch of
a consumer whose ack was read), so the stall's listeners act first (the delivery hold
of a woken leader, amqpd.cluster.delivery_hold). A stall still in progress is not
counted either (``now()`` holds at the moment the stall began), so the first callback
after a stall, which may run before the ticker, sees no jump. While the loop runs
freely the clock moves with ``time.monotonic()``, so a dead peer is noticed as fast as
before.

What this does not cover, by design: the etcd *lease* is kept on etcd's clock, so the
fence that stops a node whose lease may have run out (``node.py``) stays on the wall
clock (the lease is renewed from a thread, so a stall alone no longer lets it run out,
membership.py); and peers still see this node's heartbeats stop during its stall (they
are sent from this loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("amqpd.cluster")

# a stall this long is worth a log line (shorter ones are counted, not logged)
LOG_STALL = 1.0


class LoopClock:
    def __init__(self, tick: float = 0.1, slack: float = 0.15,
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.tick = tick
        self.slack = slack
        self.wall = wall
        self.stalled = 0.0  # seconds of stalls already taken out of the clock
        self.stalls = 0  # how many stalls longer than LOG_STALL (for the status API)
        self.longest = 0.0  # the longest stall seen, seconds
        self._last_tick = wall()
        self._timer: asyncio.TimerHandle | None = None
        # called with each stall found (amqpd.cluster.leadership: a stall may have let
        # the others take this node's queues over)
        self.on_stall: list[Callable[[float], None]] = []

    def __call__(self) -> float:
        """Monotonic seconds, not counting this loop's stalls."""
        return self.wall() - self.stalled - self.ongoing()

    @property
    def last_tick(self) -> float:
        """``wall()`` when the ticker last ran: the loop's latest sign of life (the
        membership lease's thread renews only while it is recent, membership.py)."""
        return self._last_tick

    def ongoing(self) -> float:
        """The stall this loop is in right now, seconds (0.0: none): what the first
        callback after a SIGSTOP sees before the ticker has run."""
        ongoing = self.wall() - self._last_tick - self.tick - self.slack
        return ongoing if ongoing > 0 else 0.0

    def observe(self) -> float:
        """Account for the time since the last tick; what the ticker calls on waking.
        Returns the stall found (0.0: none)."""
        now = self.wall()
        excess = now - self._last_tick - self.tick - self.slack
        self._last_tick = now
        if excess <= 0:
            return 0.0
        self.stalled += excess
        for listener in self.on_stall:
            listener(excess)
        self.longest = max(self.longest, excess)
        if excess >= LOG_STALL:
            self.stalls += 1
            log.warning("cluster: this node's event loop stalled for %.1fs; failure "
                        "detection did not count it as silence of the others", excess)
        return excess

    async def run(self) -> None:
        """The ticker (a chain of timer callbacks); runs until cancelled."""
        loop = asyncio.get_running_loop()
        self._last_tick = self.wall()
        self._timer = loop.call_later(self.tick, self._ticked, loop)
        try:
            await loop.create_future()  # never set: the ticker runs until cancelled
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _ticked(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_later(self.tick, self._ticked, loop)
        try:
            self.observe()
        except Exception:  # a listener's bug must not stop the clock
            log.exception("cluster: a loop stall listener failed")


__all__ = ["LoopClock"]
