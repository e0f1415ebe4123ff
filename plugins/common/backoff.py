"""Delays between tries that never spin and never synchronise: exponential, capped, jittered.

Shovels and federation links retry two things: connecting (a peer down, or a load
balancer that accepts and closes at once while no backend is up) and a publish that the
destination refused (a quorum queue electing a leader). Retrying those at once is a hot
loop (issue 29 counted 42,505 failed republishes in 5 s), and retrying on a fixed
period makes every link of a site hit a recovering node together. A :class:`Backoff`
starts small (so a short blip costs little), doubles up to ``cap``, and draws each
delay from the upper half of its step, so it never exceeds ``cap`` and never waits less
than half of the step.
"""

from __future__ import annotations

import random


class Backoff:
    """The delays of one thing's consecutive failed tries; :meth:`reset` after a success."""

    def __init__(self, cap: float, first: float = 0.1, factor: float = 2.0) -> None:
        self.cap = max(cap, 0.0)
        self.first = min(first, self.cap) if self.cap > 0 else 0.0
        self.factor = factor
        self.tries = 0  # failed tries since the last success

    def next(self) -> float:
        """The delay before the next try (and one more failed try counted)."""
        step = min(self.cap, self.first * self.factor ** min(self.tries, 64))
        self.tries += 1
        return step * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.tries = 0
