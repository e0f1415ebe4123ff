"""Time-based extensions: message TTL, per-message ``expiration``, queue ``x-expires``.

No timer per message, ever. Two mechanisms:

* **At the head.** A queue's ready entries carry an absolute expiry (monotonic seconds).
  Before a queue hands out its head (:meth:`Queue.take`) it drops every expired entry at
  the head, dead-lettering them with reason ``expired``. As in RabbitMQ, an expired
  message behind an unexpired one (possible with per-message TTL or requeues) waits until
  it reaches the head; it is never delivered.
* **A broker-level timer heap** (:class:`TimerService`), so a queue with no consumers
  still expires its head on time, and so ``x-expires`` and delayed exchanges wake up.
  Each subscriber (a queue, a delayed exchange) keeps at most a few entries in the heap:
  it re-arms itself at its *next* deadline when it fires. One asyncio timer handle is
  armed for the earliest deadline of the whole heap.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from amqpd.protocol.errors import PreconditionFailed


def parse_expiration(value: Any) -> int:
    """The ``expiration`` property (a string of milliseconds), as RabbitMQ parses it
    (``rabbit_basic:parse_expiration``); a bad one fails the publish with 406."""
    if isinstance(value, bytes | bytearray):
        value = value.decode(errors="replace")
    text = str(value)
    digits = text.lstrip("+-")
    n = len(text) - len(digits)
    end = n
    while end < len(text) and text[end].isdigit():
        end += 1
    if end == n or n > 1:
        why = "no_integer"
    elif end < len(text):
        why = f'{{leftover_string,"{text[end:]}"}}'
    else:
        number = int(text[:end])
        if number >= 0:
            return number
        why = f"{{value_negative,{number}}}"
    raise PreconditionFailed(f"invalid expiration '{text}': {why}")


class TimerService:
    """A heap of (deadline, callback) served by one asyncio timer handle.

    Deadlines are ``time.monotonic()`` seconds. Callbacks must tolerate firing early or
    more than once (they check their own state), which keeps cancellation free: nothing
    is ever removed from the heap, stale entries simply fire and do nothing.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._arm()

    def __len__(self) -> int:
        return len(self._heap)

    def call_at(self, deadline: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (deadline, next(self._ids), callback))
        if self._armed_at is None or deadline < self._armed_at:
            self._arm()

    def _arm(self) -> None:
        loop = self._loop
        if loop is None:
            if not self._heap:
                return
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # armed by start() once the loop runs
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._armed_at = None
        if not self._heap:
            return
        deadline = self._heap[0][0]
        self._armed_at = deadline
        self._handle = loop.call_later(max(0.0, deadline - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = None
        heap = self._heap
        now = time.monotonic()
        due: list[Callable[[], None]] = []
        while heap and heap[0][0] <= now + 0.0005:
            due.append(heapq.heappop(heap)[2])
        for callback in due:
            try:
                callback()
            except Exception:  # a broken subscriber must not stop the others
                import logging

                logging.getLogger("amqpd.ttl").exception("timer callback failed")
        self._arm()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._heap.clear()


__all__ = ["TimerService", "parse_expiration"]
