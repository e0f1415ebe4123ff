"""LeaseKeeper: an etcd lease renewed from a thread of its own.

Two owners use it: the warren's active (its leader lease, :mod:`amqpd.coord.election`)
and a cluster node (its membership lease, :mod:`amqpd.cluster.membership`).

Why a thread: the broker's event loop can be busy for seconds at a time (a takeover
loading a large backlog, a burst of publishes, a slow catch-up); a keep-alive that waits
behind that work lets the lease run out while the node is perfectly healthy (issue 34:
"lease not renewed for 2.68s" right after taking over with 850k messages queued; issue
28: a cluster node's loop starved for ~35 s, its membership lease ran out, it paused
and another node promoted an unsynchronised mirror of a queue it led). Here the
keep-alives run on a private asyncio loop in a daemon thread, with an etcd client of
their own, so the broker's loop being busy cannot delay them.

The monotonic-clock rule is the election's, unchanged: a renewal's *send* time counts
(etcd restarts the TTL when it receives it, which is later), and the owner must treat
the lease as lost ``fence_after`` seconds after the send of the last renewal that
succeeded. This thread moves ``fence_at`` (and ``renewed_at``) forward after each
success; it never acts on the node by itself. When a renewal finds the lease gone, or
the fence time has passed, it tells the owner on the broker's loop
(``call_soon_threadsafe``); the owner also compares ``fence_at`` / ``renewed_at`` with
the clock on its own loop, so a loop that wakes late still sees the lease as lost.

The opposite risk: a thread that renews whatever the loop does would keep a node whose
loop is *hung* (a deadlock, an endless synchronous loop) present forever while it
serves nothing, and the others would never count it lost. So an owner may give
``progress``, the monotonic time of its loop's latest sign of life, and ``hang_after``:
while the loop has shown none for longer than that, the thread sends no renewal (it says
so in the log, once), and the lease runs out ``fence_after`` after the last one; when the
loop comes back before that, renewals resume. ``hang_after`` must be well above any
stall the node should survive (the cluster's ``loop_hang_timeout``, 60 s by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Callable, Sequence

from amqpd.coord.etcd import EtcdClient, EtcdError

log = logging.getLogger("amqpd.coord.lease")


class LeaseKeeper:
    """Renews ``lease_id`` every ``ttl / 6`` seconds until stopped or the lease is lost.

    ``fence_at`` and ``renewed_at`` (monotonic) are read by the owner on the broker's
    loop; a float assignment is atomic, so no lock is needed. ``on_lost(reason)`` is
    called on ``loop`` (once) when the lease is gone or was not renewed in time.
    ``what`` names the owner in the log and the thread's name ("warren", "cluster")."""

    def __init__(self, endpoints: Sequence[str], lease_id: int, ttl: float,
                 fence_after: float, sent: float, clock: Callable[[], float],
                 loop: asyncio.AbstractEventLoop, on_lost: Callable[[str], None],
                 what: str = "warren", progress: Callable[[], float] | None = None,
                 hang_after: float = math.inf) -> None:
        self.endpoints = list(endpoints)
        self.lease_id = lease_id
        self.ttl = ttl
        self.fence_after = fence_after
        self.clock = clock
        self.renewed_at = sent
        self.fence_at = sent + fence_after
        self.what = what
        self.progress = progress
        self.hang_after = hang_after
        self.withheld = False  # renewals held back now: the owner's loop shows no progress
        self._loop = loop
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"{what}-lease-{lease_id:x}")

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Renew no more (the thread ends after its current call, at the latest at the
        fence time)."""
        self._stop.set()

    def _main(self) -> None:
        try:
            asyncio.run(self._renew())
        except Exception:  # a bug here must not pass silently: the lease would run out
            log.exception("%s: the lease thread failed", self.what)
            self._lost("the lease thread failed")

    def _loop_hung(self) -> bool:
        """Whether the owner's loop has shown no progress for over ``hang_after``
        (logged when that starts and when it ends)."""
        if self.progress is None:
            return False
        idle = self.clock() - self.progress()
        hung = idle > self.hang_after
        if hung and not self.withheld:
            log.error("%s: the event loop has run nothing for %.1fs (limit %gs): lease "
                      "renewals stop; the lease runs out in %.1fs unless the loop comes "
                      "back", self.what, idle, self.hang_after,
                      max(self.fence_at - self.clock(), 0.0))
        elif not hung and self.withheld:
            log.warning("%s: the event loop runs again; lease renewals resume", self.what)
        self.withheld = hung
        return hung

    async def _renew(self) -> None:
        interval = self.ttl / 6
        async with EtcdClient(self.endpoints, timeout=interval) as client:
            while not self._stop.is_set():
                sent = self.clock()
                if self._loop_hung():
                    if self.fence_at <= sent:
                        self._lost(f"lease not renewed for {sent - self.renewed_at:.2f}s: "
                                   f"the event loop ran nothing for over {self.hang_after:g}s")
                        return
                    await asyncio.sleep(min(interval, self.fence_at - sent))
                    continue
                # a renewal counts from its send, so one answered late is as good as one
                # answered at once, up to the fence time: wait for it that long. Given up
                # after ttl / 6, four slow answers in a row (etcd and both nodes' fsyncs
                # on one busy disk) fenced a healthy active (test_warren_backlog, load 20+)
                patience = max(interval, self.fence_at - sent)
                try:
                    ttl = await client.keepalive(self.lease_id, timeout=patience)
                except EtcdError as exc:
                    if self._stop.is_set():
                        return
                    left = self.fence_at - self.clock()
                    log.warning("%s: lease renewal failed: %s (lease lost in %.2fs)",
                                self.what, exc, max(left, 0.0))
                    if left <= 0:
                        self._lost(f"lease not renewed for "
                                   f"{self.clock() - self.renewed_at:.2f}s (ttl {self.ttl}s)")
                        return
                else:
                    if ttl <= 0:
                        self._lost("the lease is gone (expired or revoked in etcd)")
                        return
                    if not self._stop.is_set():
                        self.renewed_at = sent
                        self.fence_at = sent + self.fence_after
                wait = max(interval - (self.clock() - sent), 0.0)
                await asyncio.sleep(wait)

    def _lost(self, reason: str) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(RuntimeError):  # the broker's loop closed at shutdown
            self._loop.call_soon_threadsafe(self._on_lost, reason)


__all__ = ["LeaseKeeper"]
