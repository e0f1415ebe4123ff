"""ClusterView: running = lease record present and heartbeats fresh; majority counting;
subscribers told of every flip. A fake clock, no sockets."""

from __future__ import annotations

from amqpd.cluster.view import ClusterView


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view() -> tuple[ClusterView, Clock]:
    clock = Clock()
    return ClusterView("a", heartbeat_timeout=1.0, clock=clock), clock


REC = {"name": "x", "link": "127.0.0.1:7000", "amqp_port": 5672, "http_port": 15672,
       "started": 1.0}


def test_running_needs_record_and_fresh_heartbeats() -> None:
    v, clock = view()
    v.update({"a", "b", "c"}, {"a": REC, "b": REC})
    assert v.is_running("a") and v.is_running("b")  # b: grace since its record appeared
    assert not v.is_running("c")  # a member without a record (lease) does not run
    clock.now += 1.5
    assert not v.is_running("b")  # silent longer than the timeout
    v.heartbeat("b")
    assert v.is_running("b")
    v.update({"a", "b", "c"}, {"a": REC})  # b's lease went
    assert not v.is_running("b")
    info = v.nodes()
    assert sorted(info) == ["a", "b", "c"] and info["a"].link == ("127.0.0.1", 7000)
    assert info["a"].running and not info["c"].running


def test_majority_and_partitions() -> None:
    v, clock = view()
    v.update({"a", "b", "c"}, {"a": REC, "b": REC, "c": REC})
    assert v.sees_majority() and v.partitioned_from() == []
    clock.now += 2
    v.heartbeat("b")
    assert v.sees_majority()  # a and b of three
    assert v.partitioned_from() == ["c"]  # its lease is there, its heartbeats are not
    clock.now += 2
    assert not v.sees_majority()  # a alone of three
    v2, _ = view()
    v2.update({"a", "b"}, {"a": REC, "b": REC})
    assert v2.sees_majority()


def test_exactly_half_is_a_minority_as_in_rabbitmq() -> None:
    v, clock = view()
    v.update({"a", "b"}, {"a": REC, "b": REC})
    clock.now += 2
    assert not v.sees_majority()


def test_subscribers_hear_each_flip_once() -> None:
    v, clock = view()
    seen: list[tuple[str, bool]] = []
    v.subscribe(lambda node, running: seen.append((node, running)))
    v.update({"a", "b"}, {"a": REC, "b": REC})
    v.check_changes()
    clock.now += 2
    v.check_changes()
    v.check_changes()
    v.heartbeat("b")
    v.check_changes()
    assert seen == [("b", True), ("b", False), ("b", True)]


def test_restarted_node_gets_a_new_grace_period() -> None:
    v, clock = view()
    v.update({"a", "b"}, {"a": REC, "b": REC})
    clock.now += 5
    assert not v.is_running("b")
    v.update({"a", "b"}, {"a": REC, "b": {**REC, "started": 2.0}})
    assert v.is_running("b")
