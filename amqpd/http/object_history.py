"""The last minute of samples per queue, channel and connection, for charts that open full.

RabbitMQ's management UI shows an object's charts with the last minute already drawn: its
agent keeps samples per object, and a request such as
``GET /api/queues/%2F/q?lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5``
gets them back as ``*_details.samples`` (newest first); a connection's bytes come with
``data_rates_age``/``data_rates_incr`` (checked against RabbitMQ 3.10.8). Here the rate sampler
(:mod:`amqpd.http.stats`) records one point per object on each of its timer ticks (every
``AMQPD_STATS_INTERVAL`` seconds, default 5): no cost on the message path, and nothing for
objects that never did anything.

Memory is bounded twice: at most :data:`MAX_POINTS` points per object (the last minute at
the default 5 s interval; a shorter interval keeps a shorter span), and at most
:data:`MAX_OBJECTS` objects at a time, first come first served; an object beyond that cap
has rates but no history (its charts fill while its page is open). An object's points are
one flat ``array('q')`` ring, about 1 KB, so the cap is about 5 MB (measured in
bench/object_history.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

HISTORY_SECONDS = 60.0  # the range of RabbitMQ's object charts by default: the last minute
MAX_POINTS = 13  # 60 s at the default 5 s interval, both ends included
MAX_OBJECTS = 5000


class Ring:
    """The last ``size`` points of one object, flat in one array: (unix ms, values...)."""

    __slots__ = ("count", "data", "size", "start", "width")

    def __init__(self, size: int, width: int) -> None:
        self.size, self.width = size, width
        self.data = array("q", bytes(8 * size * width))
        self.start = self.count = 0

    def append(self, point: Sequence[int]) -> None:
        if len(point) != self.width:
            raise ValueError(f"a point of {len(point)} fields in a ring of {self.width}")
        if self.count < self.size:
            slot = (self.start + self.count) % self.size
            self.count += 1
        else:
            slot = self.start
            self.start = (self.start + 1) % self.size
        self.data[slot * self.width:(slot + 1) * self.width] = array("q", point)

    def newest_first(self) -> Iterator[tuple[int, ...]]:
        w = self.width
        for i in range(self.count - 1, -1, -1):
            slot = (self.start + i) % self.size
            yield tuple(self.data[slot * w:(slot + 1) * w])


class ObjectHistory:
    """Points per object key (``id()`` of a queue, channel or session)."""

    def __init__(self, interval: float, max_objects: int = MAX_OBJECTS) -> None:
        self.maxlen = max(min(int(HISTORY_SECONDS / max(interval, 0.1)) + 1, MAX_POINTS), 2)
        self.max_objects = max_objects
        self._rings: dict[int, Ring] = {}

    def __len__(self) -> int:
        return len(self._rings)

    def record(self, key: int, timestamp_ms: int, values: Sequence[int]) -> None:
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= self.max_objects:
                return
            ring = self._rings[key] = Ring(self.maxlen, len(values) + 1)
        ring.append((timestamp_ms, *values))

    def retain(self, keys: set[int]) -> None:
        """Forget every object not in ``keys`` (deleted queues, closed channels)."""
        for key in [k for k in self._rings if k not in keys]:
            del self._rings[key]

    def forget(self, key: int) -> None:
        self._rings.pop(key, None)

    def samples(self, key: int, field: int, age: float, incr: float) -> dict[str, Any]:
        """RabbitMQ's ``{"samples", "avg", "avg_rate"}`` for one field (0-based, after
        the timestamp) over the last ``age`` seconds, a point per ``incr`` at most."""
        ring = self._rings.get(key)
        chosen = window(ring.newest_first() if ring else (), age, incr)
        return sample_block([(p[0], p[field + 1]) for p in chosen])


def window(newest_first: Iterable[Any], age: float, incr: float,
           timestamp: Any = lambda p: p[0]) -> list[Any]:
    """The points of the last ``age`` seconds (counted back from the newest), at least
    ``incr`` seconds apart, newest first as RabbitMQ lists samples."""
    if age <= 0:
        return []
    chosen: list[Any] = []
    step = int(max(incr, 0.0) * 1000)
    cutoff = None
    for p in newest_first:
        t = timestamp(p)
        if cutoff is None:
            cutoff = t - int(age * 1000)
        if t < cutoff:
            break
        if step and chosen and timestamp(chosen[-1]) - t < step:
            continue
        chosen.append(p)
    return chosen


def sample_block(points: list[tuple[int, int]]) -> dict[str, Any]:
    """RabbitMQ's sample block: the points, their mean, and the mean rate across them."""
    samples = [{"sample": v, "timestamp": t} for t, v in points]
    if len(points) < 2:
        return {"samples": samples, "avg": float(points[0][1]) if points else 0.0,
                "avg_rate": 0.0}
    (t_new, v_new), (t_old, v_old) = points[0], points[-1]
    span = (t_new - t_old) / 1000
    return {"samples": samples, "avg": sum(v for _, v in points) / len(points),
            "avg_rate": round((v_new - v_old) / span, 1) if span > 0 else 0.0}
