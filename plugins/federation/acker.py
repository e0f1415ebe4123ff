"""Acknowledging upstream deliveries in order, many at a time.

A link settles each delivery when the local broker confirms it, and confirms can come
back out of order (a persistent message waits for the group commit, a transient one does
not). Acking each one costs a frame and a round of work upstream; :class:`Acker` instead
keeps the delivery tags in order and, once per event-loop tick, acks the longest settled
prefix with one ``basic.ack(multiple=True)``. A failed delivery is nacked (requeued) on
its own, in sequence, so a multiple ack never covers a tag that is still in doubt.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable


class Acker:
    """Ordered settlement of one channel's deliveries (a new channel: a new Acker, since
    delivery tags restart). ``ack(tag, multiple)`` and ``nack(tag)`` write the frames
    (the link client's, which never block: the socket's buffer absorbs them)."""

    def __init__(self, ack: Callable[[int, bool], None], nack: Callable[[int], None]) -> None:
        self._ack = ack
        self._nack = nack
        self._outstanding: collections.deque[int] = collections.deque()
        self._settled: dict[int, bool] = {}  # tag -> ok
        self._scheduled = False

    @property
    def pending(self) -> int:
        """Deliveries tracked and not yet acked or nacked upstream."""
        return len(self._outstanding)

    def track(self, tag: int) -> None:
        """A delivery arrived (call in delivery order)."""
        self._outstanding.append(tag)

    def settle(self, tag: int, ok: bool) -> None:
        self._settled[tag] = ok
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        last_ok: int | None = None
        outstanding, settled = self._outstanding, self._settled
        while outstanding and outstanding[0] in settled:
            tag = outstanding.popleft()
            if settled.pop(tag):
                last_ok = tag
                continue
            if last_ok is not None:
                self._ack(last_ok, True)
                last_ok = None
            self._nack(tag)
        if last_ok is not None:
            self._ack(last_ok, True)
