"""The memory of nacked publishes behind ``publish_retry_of`` (amqpd.broker.retry_routes):
bounded by count and by age, oldest first out, and only a retry of the same body is
kept out of the queues that took its first try."""

from __future__ import annotations

from amqpd.broker.retry_routes import Memory, body_sum


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_take_returns_the_queues_once_and_checks_the_body() -> None:
    mem = Memory(count=10, age=60.0, clock=Clock())
    mem.keep(3, frozenset({"a", "b"}), body_sum(b"one"))
    assert mem.take(3, body_sum(b"other")) is None  # another body: no retry of it
    assert mem.take(3, body_sum(b"one")) == frozenset({"a", "b"})
    assert mem.take(3, body_sum(b"one")) == frozenset()  # taken: a nacked retry keeps anew
    assert mem.take(99, body_sum(b"one")) == frozenset()  # never kept


def test_eviction_by_count_drops_the_oldest() -> None:
    mem = Memory(count=3, age=60.0, clock=Clock())
    for seq in range(1, 6):
        mem.keep(seq, frozenset({"a"}), body_sum(b"x"))
    assert len(mem) == 3
    assert mem.take(1, body_sum(b"x")) == frozenset()
    assert mem.take(2, body_sum(b"x")) == frozenset()
    assert [mem.take(s, body_sum(b"x")) for s in (3, 4, 5)] == [frozenset({"a"})] * 3


def test_keeping_again_makes_a_record_the_newest() -> None:
    mem = Memory(count=2, age=60.0, clock=Clock())
    mem.keep(1, frozenset({"a"}), body_sum(b"x"))
    mem.keep(2, frozenset({"a"}), body_sum(b"x"))
    mem.keep(1, frozenset({"a", "b"}), body_sum(b"x"))  # its retry nacked again
    mem.keep(3, frozenset({"a"}), body_sum(b"x"))  # evicts 2, not 1
    assert mem.take(2, body_sum(b"x")) == frozenset()
    assert mem.take(1, body_sum(b"x")) == frozenset({"a", "b"})


def test_eviction_by_age() -> None:
    clock = Clock()
    mem = Memory(count=100, age=10.0, clock=clock)
    mem.keep(1, frozenset({"a"}), body_sum(b"x"))
    clock.now += 6
    mem.keep(2, frozenset({"a"}), body_sum(b"x"))
    clock.now += 5  # 1 is 11 s old, 2 is 5 s old
    assert mem.take(1, body_sum(b"x")) == frozenset()
    assert len(mem) == 1
    clock.now += 6  # 2 is 11 s old: gone on the next keep as well as on a take
    mem.keep(3, frozenset({"b"}), body_sum(b"y"))
    assert len(mem) == 1
    assert mem.take(2, body_sum(b"x")) == frozenset()
    assert mem.take(3, body_sum(b"y")) == frozenset({"b"})


def test_records_share_equal_queue_sets() -> None:
    mem = Memory(count=10, age=60.0, clock=Clock())
    mem.keep(1, frozenset({"a", "b"}), body_sum(b"x"))
    mem.keep(2, frozenset({"b", "a"}), body_sum(b"y"))
    assert mem.records[1].queues is mem.records[2].queues
