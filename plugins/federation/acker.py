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
import contextlib
from typing import Any


class Acker:
    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._outstanding: collections.deque[int] = collections.deque()
        self._settled: dict[int, bool] = {}  # tag -> ok
        self._scheduled = False
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

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
        ops: list[tuple[bool, int]] = []
        last_ok: int | None = None
        outstanding, settled = self._outstanding, self._settled
        while outstanding and outstanding[0] in settled:
            tag = outstanding.popleft()
            if settled.pop(tag):
                last_ok = tag
                continue
            if last_ok is not None:
                ops.append((True, last_ok))
                last_ok = None
            ops.append((False, tag))
        if last_ok is not None:
            ops.append((True, last_ok))
        if ops:
            task = asyncio.ensure_future(self._send(ops))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, ops: list[tuple[bool, int]]) -> None:
        async with self._lock:  # FIFO: flushes reach the wire in order
            with contextlib.suppress(Exception):  # a dead channel: upstream requeues
                for ok, tag in ops:
                    if ok:
                        await self.channel.basic_ack(tag, multiple=True)
                    else:
                        await self.channel.basic_nack(tag, multiple=False, requeue=True)
