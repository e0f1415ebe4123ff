"""A priority queue's ready messages: one FIFO per priority level, highest served first.

It stands in for the plain ``deque`` of :class:`~amqpd.broker.queue.Queue` (len, bool,
iteration, ``append``, ``popleft``, ``clear``, ``[0]``), so the queue code is the same for
both; only requeue needs :meth:`put_back`, which returns an entry to its original place
*within its own level*. As in RabbitMQ, a message's priority is capped at the queue's
``x-max-priority`` and a message without one has priority 0.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from typing import Any


class PriorityReady:
    __slots__ = ("_len", "levels")

    def __init__(self, max_priority: int) -> None:
        self.levels: list[deque[Any]] = [deque() for _ in range(max_priority + 1)]
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Any]:
        for level in reversed(self.levels):
            yield from level

    def __getitem__(self, index: int) -> Any:
        if not self._len:
            raise IndexError("empty")
        if index == 0:
            for level in reversed(self.levels):
                if level:
                    return level[0]
        if index == -1:
            for level in self.levels:
                if level:
                    return level[-1]
        raise IndexError("only [0] and [-1] are supported")

    def append(self, entry: Any) -> None:
        self.levels[entry.priority].append(entry)
        self._len += 1

    def appendleft(self, entry: Any) -> None:
        self.levels[entry.priority].appendleft(entry)
        self._len += 1

    def popleft(self) -> Any:
        for level in reversed(self.levels):
            if level:
                self._len -= 1
                return level.popleft()
        raise IndexError("pop from an empty priority queue")

    def put_back(self, entry: Any) -> None:
        """Return a requeued entry to its original place (by sequence) in its level."""
        level = self.levels[entry.priority]
        if not level or entry.seq < level[0].seq:
            level.appendleft(entry)
        elif entry.seq > level[-1].seq:
            level.append(entry)
        else:
            level.insert(bisect.bisect_left([e.seq for e in level], entry.seq), entry)
        self._len += 1

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self._len = 0


__all__ = ["PriorityReady"]
