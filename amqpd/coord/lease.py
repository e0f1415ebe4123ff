"""LeaseKeeper: the active's leader lease, renewed from a thread of its own.

Why a thread: the broker's event loop can be busy for seconds at a time (a takeover
loading a large backlog, a burst of publishes); a keep-alive that waits behind that
work lets the lease run out and the node fences itself while perfectly healthy (issue
34: "lease not renewed for 2.68s" right after taking over with 850k messages queued).
Here the keep-alives run on a private asyncio loop in a daemon thread, with an etcd
client of their own, so the broker's loop being busy cannot delay them.

The monotonic-clock rule is the election's, unchanged: a renewal's *send* time counts
(etcd restarts the TTL when it receives it, which is later), and the node must fence
``fence_after`` seconds after the send of the last renewal that succeeded. This thread
moves ``fence_at`` forward after each success; it never fences by itself. When a
renewal finds the lease gone, or the fence time has passed, it tells the election on
the broker's loop (``call_soon_threadsafe``); the election also keeps its own timer on
the loop, and ``Election.holds_lease()`` compares ``fence_at`` with the clock on every
call, so a loop that wakes late still sees the lease as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

from amqpd.coord.etcd import EtcdClient, EtcdError

log = logging.getLogger("amqpd.coord.election")


class LeaseKeeper:
    """Renews ``lease_id`` every ``ttl / 6`` seconds until stopped or the lease is lost.

    ``fence_at`` (monotonic) is read by the election on the broker's loop; a float
    assignment is atomic, so no lock is needed. ``on_lost(reason)`` is called on
    ``loop`` (once) when the lease is gone or was not renewed in time."""

    def __init__(self, endpoints: Sequence[str], lease_id: int, ttl: float,
                 fence_after: float, sent: float, clock: Callable[[], float],
                 loop: asyncio.AbstractEventLoop, on_lost: Callable[[str], None]) -> None:
        self.endpoints = list(endpoints)
        self.lease_id = lease_id
        self.ttl = ttl
        self.fence_after = fence_after
        self.clock = clock
        self.renewed_at = sent
        self.fence_at = sent + fence_after
        self._loop = loop
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"warren-lease-{lease_id:x}")

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
            log.exception("warren: the lease thread failed")
            self._lost("the lease thread failed")

    async def _renew(self) -> None:
        interval = self.ttl / 6
        async with EtcdClient(self.endpoints, timeout=interval) as client:
            while not self._stop.is_set():
                sent = self.clock()
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
                    log.warning("warren: lease renewal failed: %s (fencing in %.2fs)",
                                exc, max(left, 0.0))
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
