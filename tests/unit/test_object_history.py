"""The per-object chart history (amqpd.http.object_history): its bounds and its windows."""

from __future__ import annotations

import pytest

from amqpd.http.object_history import MAX_POINTS, ObjectHistory, Ring, window


def test_object_history_is_bounded() -> None:
    h = ObjectHistory(interval=0.1, max_objects=3)
    for t in range(1000):
        for key in range(5):
            h.record(key, t * 100, (t,))
    assert len(h) == 3  # the first three objects; the others get no history
    block = h.samples(0, 0, age=3600, incr=0)
    assert len(block["samples"]) == MAX_POINTS
    assert block["samples"][0] == {"sample": 999, "timestamp": 99900}
    assert block["samples"][-1] == {"sample": 1000 - MAX_POINTS,
                                    "timestamp": (1000 - MAX_POINTS) * 100}
    h.retain({1})
    assert len(h) == 1 and h.samples(0, 0, 60, 0)["samples"] == []


def test_the_default_interval_keeps_the_last_minute() -> None:
    h = ObjectHistory(interval=5.0)
    for t in range(30):
        h.record(7, t * 5000, (t * 10, t))
    block = h.samples(7, 0, age=60, incr=5)
    stamps = [s["timestamp"] for s in block["samples"]]
    assert stamps == [t * 5000 for t in range(29, 16, -1)]  # 13 points, newest first
    assert block["avg_rate"] == 2.0  # 10 per 5 s
    assert h.samples(7, 1, age=10, incr=0)["samples"][-1] == {"sample": 27,
                                                             "timestamp": 27 * 5000}


def test_a_ring_refuses_a_point_of_the_wrong_shape() -> None:
    ring = Ring(3, 2)
    ring.append((1, 2))
    with pytest.raises(ValueError, match="3 fields in a ring of 2"):
        ring.append((1, 2, 3))
    assert list(ring.newest_first()) == [(1, 2)]


def test_window_thins_to_the_increment() -> None:
    points = [(t * 1000,) for t in range(20, -1, -1)]  # newest first, a second apart
    assert [p[0] for p in window(points, age=10, incr=3)] == [20000, 17000, 14000, 11000]
    assert window(points, age=0, incr=1) == []
