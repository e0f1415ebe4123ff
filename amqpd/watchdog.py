"""The watchdog: a node that stops answering says so in its log (issue 28).

Why: a node once answered no declare for 11 minutes with nothing in its log, while its
HTTP API answered and ``cluster_status`` looked healthy. Two things can make a node
silent, and each gets a log line here:

* **The event loop stalls** (a long synchronous step; the process starved of CPU). A
  thread posts a no-op to the loop every :data:`INTERVAL` and waits for it to run;
  while it waits longer than ``stall`` seconds (0.5 by default), it samples the loop
  thread's Python stack (``sys._current_frames``), and when the loop comes back it logs
  how long the stall lasted and the code seen running most often. The thread holds no
  lock the loop needs; it only reads frames. (A whole-process SIGSTOP stops this thread
  too: such a pause is seen by the cluster's LoopClock, not here.)
* **A request waits on something that does not come** (another node, etcd, the
  replicas' acknowledgements). Whatever can make a client wait registers a *source*: a
  callable answering the waits in progress as ``(started, what it waits on)``, started
  on ``time.monotonic()``. Every second the loop logs each wait older than
  ``wait_limit`` (the cluster's ``definition_timeout``), once, naming what it waits on.
  The deadlines that end such waits live with the waits (amqpd/cluster/deadlines.py,
  the definitions mirror's timer); this only makes sure none goes unseen.

``/api/health/checks/node-can-declare`` reads the same sources (amqpd/http/health.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("amqpd.watchdog")

INTERVAL = 0.1  # seconds between the thread's probes of the loop
STALL = 0.5  # a loop that runs nothing for this long is stalled (logged)
WAIT_LIMIT = 10.0  # seconds a request may wait before it is logged (definition_timeout)
REPORT_INTERVAL = 1.0  # seconds between scans of the wait sources
FRAMES = 4  # stack entries a stall's log line names

Waits = Callable[[float], list[tuple[float, str]]]


def _where(frame: FrameType | None) -> str:
    """The innermost frames of a stack, amqpd's first ("file:line function", inner
    first)."""
    ours: list[str] = []
    other: list[str] = []
    while frame is not None and len(ours) < FRAMES:
        code = frame.f_code
        entry = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"
        (ours if f"{os.sep}amqpd{os.sep}" in code.co_filename else other).append(entry)
        frame = frame.f_back
    return " < ".join(ours or other[:FRAMES])


class Watchdog:
    def __init__(self, stall: float = STALL, wait_limit: float = WAIT_LIMIT,
                 interval: float = INTERVAL) -> None:
        self.stall = stall
        self.wait_limit = wait_limit
        self.interval = interval
        self.sources: dict[str, Waits] = {}
        self.stalls = 0  # stalls logged so far
        self.longest = 0.0  # the longest, in seconds
        self.last_stall: tuple[float, str] | None = None  # (seconds, what ran)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._reported: set[tuple[float, str]] = set()

    def add_source(self, name: str, waits: Waits) -> None:
        """Something that can make a client wait: ``waits(now)`` answers the waits in
        progress. A name given again replaces the source (a restarted component)."""
        self.sources[name] = waits

    def waits(self, now: float) -> list[tuple[float, str, str]]:
        """Every wait in progress: ``(started, source, what)``, oldest first."""
        out: list[tuple[float, str, str]] = []
        for name, source in list(self.sources.items()):
            try:
                out += [(started, name, what) for started, what in source(now)]
            except Exception:  # a broken source must not silence the others
                log.exception("watchdog: wait source %s failed", name)
        return sorted(out)

    def overdue(self, now: float, source: str | None = None) -> list[tuple[float, str, str]]:
        """The waits older than ``wait_limit`` (of one source, if given)."""
        return [w for w in self.waits(now) if now - w[0] >= self.wait_limit
                and (source is None or w[1] == source)]

    # ------------------------------------------------------------------ waits
    def report(self, now: float) -> int:
        """Log the waits that became overdue since the last report, once each: a line
        per source, with how many and the oldest of them; how many lines."""
        overdue = self.overdue(now)
        keys = {(started, what) for started, _name, what in overdue}
        self._reported &= keys  # forget the waits that ended
        fresh: dict[str, list[tuple[float, str]]] = {}
        for started, name, what in overdue:  # oldest first
            if (started, what) not in self._reported:
                self._reported.add((started, what))
                fresh.setdefault(name, []).append((started, what))
        for name, waits in fresh.items():
            started, what = waits[0]
            log.warning("watchdog: %d request(s) have waited over %g s on %s; the oldest "
                        "%.1f s: %s", len(waits), self.wait_limit, name, now - started, what)
        return len(fresh)

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(REPORT_INTERVAL)
            try:
                self.report(time.monotonic())
            except Exception:
                log.exception("watchdog: wait report failed")

    # ------------------------------------------------------------------ stalls
    def _sample(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return _where(frame)

    def _watch(self) -> None:
        loop = self._loop
        assert loop is not None
        answered = threading.Event()
        while not self._stop.wait(self.interval):
            answered.clear()
            posted = time.monotonic()
            try:
                loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed
                return
            seen: Counter[str] = Counter()
            while not answered.wait(self.interval):
                if self._stop.is_set():
                    return
                if time.monotonic() - posted >= self.stall:
                    seen[self._sample() or "no Python frame (waiting in C or the OS)"] += 1
            lag = time.monotonic() - posted
            if lag >= self.stall:
                running = seen.most_common(1)[0][0] if seen else "not sampled"
                self.stalls += 1
                self.longest = max(self.longest, lag)
                self.last_stall = (lag, running)
                log.warning("watchdog: event loop stalled for %.2f s; running: %s",
                            lag, running)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="amqpd-watchdog",
                                        daemon=True)
        self._thread.start()
        self._task = self._loop.create_task(self._report_loop(), name="watchdog-waits")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._thread is not None:
            # the thread wakes within one interval; never block the loop long on it
            self._thread.join(timeout=self.interval * 5)
            self._thread = None


__all__ = ["Watchdog"]
