"""Single active consumer groups (amqpd/streamproto/sac.py): RabbitMQ 3.11's rules,
pure state with no sockets."""

from __future__ import annotations

from amqpd.streamproto.sac import Coordinator, Notice

KEY = ("/", "s-1", "group")


def test_plain_stream_first_member_active_next_on_leave() -> None:
    co = Coordinator()
    a, b, c = object(), object(), object()
    assert co.register(("/", "s", "g"), -1, a, 0) == (True, [Notice(a, 0, True)])
    assert co.register(("/", "s", "g"), -1, b, 0) == (False, [])
    assert co.register(("/", "s", "g"), -1, c, 5) == (False, [])
    assert co.unregister(("/", "s", "g"), b, 0) == []  # not the active one
    assert co.unregister(("/", "s", "g"), a, 0) == [Notice(c, 5, True)]
    assert co.unregister(("/", "s", "g"), c, 5) == []
    assert co.groups == {}


def test_partition_rule_steps_down_before_activating() -> None:
    """Partition 1 of a super stream, two consumers: the second joiner (1 mod 2) reads,
    but only after the first, active until then, answered its step-down."""
    co = Coordinator()
    a, b = object(), object()
    assert co.register(KEY, 1, a, 0) == (True, [Notice(a, 0, True)])
    assert co.register(KEY, 1, b, 3) == (False, [Notice(a, 0, False, stepping_down=True)])
    assert co.groups[KEY].active() is None  # nobody reads while a steps down
    assert co.activate(KEY, b, 3) == []  # only the one stepping down may answer
    assert co.activate(KEY, a, 0) == [Notice(b, 3, True)]
    assert co.activate(KEY, a, 0) == []  # answered once
    # b leaves: a (alone) takes over at once
    assert co.unregister(KEY, b, 3) == [Notice(a, 0, True)]


def test_partition_rule_keeps_the_active_when_the_rule_points_at_it() -> None:
    co = Coordinator()
    a, b, c = object(), object(), object()
    co.register(KEY, 2, a, 0)
    assert co.register(KEY, 2, b, 0) == (False, [])  # 2 mod 2 = 0: a stays
    assert co.register(KEY, 2, c, 0) == (False, [Notice(a, 0, False, stepping_down=True)])
    assert co.activate(KEY, a, 0) == [Notice(c, 0, True)]  # 2 mod 3 = 2
    # b (inactive) leaves: 2 mod 2 = 0 is a, so c steps down for it
    assert co.unregister(KEY, b, 0) == [Notice(c, 0, False, stepping_down=True)]
    assert co.activate(KEY, c, 0) == [Notice(a, 0, True)]


def test_a_member_dying_while_stepping_down_hands_over() -> None:
    """RabbitMQ 3.11.0 would wait for an answer that never comes; amqpd activates the
    chosen member when the stepping-down one leaves."""
    co = Coordinator()
    a, b = object(), object()
    co.register(KEY, 1, a, 0)
    co.register(KEY, 1, b, 0)
    assert co.unregister(KEY, a, 0) == [Notice(b, 0, True)]
