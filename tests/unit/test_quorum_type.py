"""The quorum queue type (amqpd.broker.quorum) driven through the queue-type seam only.

``x-queue-type: quorum`` picks :class:`QuorumQueue`; everything here goes through the
calls the channel and the API make on any queue type (declare, enqueue/take/fetch,
delivered, settle/requeue, check_consume, check_delete, type_info) and the public
broker API. No sockets; the broker is built but never started. The same behaviour
against a real RabbitMQ 3.10 is in conformance/cases/quorum.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpd.broker.api import (
    QUEUE_TYPES,
    AMQPError,
    BrokerAPI,
    Message,
    QueueType,
    codec,
)
from amqpd.config import Settings
from amqpd.server import Broker
from amqpd.store.memory import MemoryStore

Q = {"x-queue-type": "quorum"}


@pytest.fixture
def api(tmp_path: Path) -> BrokerAPI:
    return Broker(Settings(data_dir=str(tmp_path), persistence=False)).api


def message(body: bytes, rk: str = "qq") -> Message:
    return Message("", rk, codec.encode_properties({}), body)


def quorum(api: BrokerAPI, name: str = "qq", /, **args: Any) -> QueueType:
    q = api.declare_queue("/", name, durable=True, arguments={**Q, **args})
    assert q.type_name == "quorum"
    return q


def count_of(entry: Any) -> Any:
    return entry.message.headers.get("x-delivery-count")


def test_quorum_is_registered_and_picked_by_x_queue_type(api: BrokerAPI) -> None:
    assert QUEUE_TYPES["quorum"].type_name == "quorum"
    q = quorum(api)
    assert type(q) is QUEUE_TYPES["quorum"]
    assert q.info()["type"] == "quorum"
    node = api.settings.node_name
    assert q.type_info(node) == {"type": "quorum", "leader": node, "members": [node],
                                 "online": [node]}
    assert api.queue_type_info(q) == q.type_info(node)
    assert api.queue_type_info(api.declare_queue("/", "c")) == {}  # classic: nothing more


# (id, declare keyword arguments, extra arguments, reply code, text in the error)
DECLARE_REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], int, str]] = [
    ("non-durable", {"durable": False}, {}, 406, "invalid property 'non-durable'"),
    ("exclusive", {"exclusive_owner": object()}, {}, 406, "invalid property 'exclusive-owner'"),
    ("auto-delete", {"auto_delete": True}, {}, 406, "invalid property 'auto-delete'"),
    ("server-named", {"server_named": True}, {}, 406,
     "Cannot declare a server-named queue for type rabbit_quorum_queue"),
    ("max-priority", {}, {"x-max-priority": 5}, 406,
     "invalid arg 'x-max-priority' for queue 'qq' in vhost '/' of queue type "
     "rabbit_quorum_queue"),
    ("queue-mode", {}, {"x-queue-mode": "lazy"}, 406, "of queue type rabbit_quorum_queue"),
    ("group size zero", {}, {"x-quorum-initial-group-size": 0}, 406, "{value_zero,0}"),
    ("in-memory not int", {}, {"x-max-in-memory-length": "a"}, 406,
     "expected integer, got longstr"),
    ("in-memory negative", {}, {"x-max-in-memory-bytes": -1}, 406, "{value_negative,-1}"),
    ("bad dlx strategy", {}, {"x-dead-letter-strategy": "sometimes"}, 406,
     "invalid_dlx_strategy"),
    ("common rule: bad overflow", {}, {"x-overflow": "nope"}, 406, "invalid_overflow"),
    # arguments are checked before the properties, as RabbitMQ does
    ("args before props", {"durable": False}, {"x-max-priority": 5}, 406, "x-max-priority"),
]


@pytest.mark.parametrize(("kw", "args", "code", "text"), [r[1:] for r in DECLARE_REFUSED],
                         ids=[r[0] for r in DECLARE_REFUSED])
def test_declaration_refusals(api: BrokerAPI, kw: dict[str, Any], args: dict[str, Any],
                              code: int, text: str) -> None:
    options = {"durable": True, **kw}
    with pytest.raises(AMQPError) as info:
        api.declare_queue("/", "qq", arguments={**Q, **args}, **options)
    assert info.value.reply_code == code
    assert text in info.value.text
    assert api.find_queue("/", "qq") is None


# arguments a quorum queue takes (and a classic one refuses)
ACCEPTED: list[dict[str, Any]] = [
    {"x-delivery-limit": 3}, {"x-dead-letter-strategy": "at-least-once"},
    {"x-max-in-memory-length": 10}, {"x-quorum-initial-group-size": 3},
    {"x-some-unknown": "kept"}]


@pytest.mark.parametrize("args", ACCEPTED, ids=[next(iter(a)) for a in ACCEPTED])
def test_quorum_arguments_are_taken(api: BrokerAPI, args: dict[str, Any]) -> None:
    q = quorum(api, **args)
    assert all(q.arguments[k] == v for k, v in args.items())
    if not next(iter(args)).startswith("x-some"):
        with pytest.raises(AMQPError) as info:  # the classic type refuses them
            api.declare_queue("/", "classic", arguments=args)
        assert "of queue type rabbit_classic_queue" in info.value.text


# (id, first arguments, redeclared arguments, refused?)
REDECLARE: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [
    ("same", {"x-delivery-limit": 3}, {"x-delivery-limit": 3}, False),
    ("delivery limit differs", {"x-delivery-limit": 3}, {"x-delivery-limit": 4}, True),
    ("delivery limit added", {}, {"x-delivery-limit": 4}, True),
    ("unknown argument not compared", {"x-a": 1}, {"x-a": 2}, False),
]


@pytest.mark.parametrize(("first", "again", "refused"), [r[1:] for r in REDECLARE],
                         ids=[r[0] for r in REDECLARE])
def test_redeclare_compares_the_quorum_arguments(api: BrokerAPI, first: dict[str, Any],
                                                 again: dict[str, Any], refused: bool) -> None:
    quorum(api, **first)
    if refused:
        with pytest.raises(AMQPError) as info:
            quorum(api, **again)
        assert info.value.reply_code == 406 and "inequivalent arg" in info.value.text
    else:
        quorum(api, **again)


@pytest.mark.parametrize(("flags", "text"), [({"if_unused": True}, "if-unused"),
                                             ({"if_empty": True}, "if-empty")])
def test_conditional_delete_is_not_implemented(api: BrokerAPI, flags: dict[str, bool],
                                               text: str) -> None:
    quorum(api)
    with pytest.raises(AMQPError) as info:
        api.delete_queue("/", "qq", **flags)
    assert info.value.reply_code == 540 and f"with {text} flag set" in info.value.text
    assert api.delete_queue("/", "qq") == 0 and api.find_queue("/", "qq") is None


# (id, consume arguments, channel global prefetch, reply code or None)
CONSUME: list[tuple[str, dict[str, Any], int, int | None]] = [
    ("plain", {}, 0, None),
    ("global qos", {}, 10, 540),
    ("stream offset", {"x-stream-offset": "first"}, 0, 406),
    ("bad priority (classic rule too)", {"x-priority": "high"}, 0, 406),
]


@pytest.mark.parametrize(("args", "global_prefetch", "code"), [r[1:] for r in CONSUME],
                         ids=[r[0] for r in CONSUME])
def test_check_consume(api: BrokerAPI, args: dict[str, Any], global_prefetch: int,
                       code: int | None) -> None:
    q = quorum(api)
    if code is None:
        q.check_consume(args, global_prefetch)
        return
    with pytest.raises(AMQPError) as info:
        q.check_consume(args, global_prefetch)
    assert info.value.reply_code == code


def test_a_returned_delivery_goes_to_the_back_counted(api: BrokerAPI) -> None:
    q = quorum(api)
    for body in (b"a", b"b"):
        q.enqueue(message(body))
    a = q.take()
    assert a is not None and count_of(a) is None  # basic.deliver: no header at first
    q.delivered(a, acked=False)
    q.requeue([a])
    out = []
    while (e := q.take()) is not None:
        out.append((e.message.body, e.redelivered, count_of(e)))
        q.delivered(e, acked=False)
        q.settle([e])
    assert out == [(b"b", False, None), (b"a", True, 1)]
    assert (q.message_count, q.unacked_count) == (0, 0)


def test_checkouts_returned_after_an_election_go_to_the_front_counted(
        api: BrokerAPI) -> None:
    """What a lost leader's consumers held comes back ahead of every message never
    delivered, in its order, counted once more (amqpd.cluster.quorum_group calls
    ``return_checked_out`` on the new leader; RabbitMQ 3.10.8 as measured)."""
    q = quorum(api)
    for i in range(6):
        q.enqueue(message(b"m%d" % i))
    held = [q.take() for _ in range(3)]
    for e in held:
        assert e is not None
        q.delivered(e, acked=False)
    q.return_checked_out([held[1], held[0]])  # type: ignore[attr-defined]
    assert q.unacked_count == 1  # m2 is still held
    out = []
    while (e := q.take()) is not None:
        out.append((e.message.body, e.redelivered, count_of(e)))
    assert out == [(b"m0", True, 1), (b"m1", True, 1), (b"m3", False, None),
                   (b"m4", False, None), (b"m5", False, None)]
    # past the delivery limit a returned checkout is dead-lettered instead
    limited = quorum(api, "limited", **{"x-delivery-limit": 0})
    limited.enqueue(message(b"x", "limited"))
    x = limited.take()
    assert x is not None
    limited.delivered(x, acked=False)
    limited.return_checked_out([x])  # type: ignore[attr-defined]
    assert (limited.message_count, limited.unacked_count) == (0, 0)


def test_fetch_shows_the_count_even_the_first_time(api: BrokerAPI) -> None:
    q = quorum(api)
    q.enqueue(message(b"x"))
    entry = q.fetch()
    assert entry is not None and count_of(entry) == 0
    q.delivered(entry, acked=False)
    q.requeue([entry])
    again = q.fetch()
    assert again is not None and count_of(again) == 1 and again.message.body == b"x"
    classic = api.declare_queue("/", "c")
    classic.enqueue(message(b"y", "c"))
    plain = classic.fetch()
    assert plain is not None and count_of(plain) is None


# (id, x-delivery-limit argument, delivery-limit policy, returns, then: dead-lettered?)
DELIVERY_LIMIT: list[tuple[str, Any, int | None, int, bool]] = [
    ("no limit", None, None, 5, False),
    ("within the limit", 2, None, 2, False),
    ("past the limit", 2, None, 3, True),
    ("limit zero", 0, None, 1, True),
    ("non-integer argument: none", "2", None, 5, False),
    ("policy alone", None, 1, 2, True),
    ("the lower wins (policy)", 5, 1, 2, True),
    ("the lower wins (argument)", 1, 5, 2, True),
]


@pytest.mark.parametrize(("arg", "policy", "returns", "dead"),
                         [r[1:] for r in DELIVERY_LIMIT], ids=[r[0] for r in DELIVERY_LIMIT])
def test_delivery_limit_dead_letters(api: BrokerAPI, arg: Any, policy: int | None,
                                     returns: int, dead: bool) -> None:
    api.declare_exchange("/", "dlx", "fanout")
    api.declare_queue("/", "dead")
    api.bind("/", "queue", "dead", "dlx", "")
    if policy is not None:
        api.set_policy("/", "limit", "^qq$", {"delivery-limit": policy},
                       apply_to="quorum_queues")
    extra = {} if arg is None else {"x-delivery-limit": arg}
    q = quorum(api, **extra, **{"x-dead-letter-exchange": "dlx"})
    q.enqueue(message(b"m"))
    for _ in range(returns):
        entry = q.take()
        assert entry is not None
        q.delivered(entry, acked=False)
        q.requeue([entry])
    dead_q = api.queue("/", "dead")
    assert (q.message_count, dead_q.message_count) == ((0, 1) if dead else (1, 0))
    assert q.unacked_count == 0
    if dead:
        got = dead_q.take()
        assert got is not None and got.message.body == b"m"
        headers = got.message.headers
        assert "x-delivery-count" not in headers  # republished as published
        assert headers["x-death"][0]["reason"] in ("delivery_limit", b"delivery_limit")
    else:
        left = q.take()
        assert left is not None and count_of(left) == returns


def test_a_rejected_return_dead_letters_as_published(api: BrokerAPI) -> None:
    api.declare_exchange("/", "dlx", "fanout")
    api.declare_queue("/", "dead")
    api.bind("/", "queue", "dead", "dlx", "")
    quorum(api, **{"x-dead-letter-exchange": "dlx"})
    api.publish("/", "", message(b"m"), None)
    first = api.get("/", "qq")
    assert first is not None and count_of(first.entry) == 0
    api.reject([first], requeue=True)
    second = api.get("/", "qq")
    assert second is not None and count_of(second.entry) == 1
    api.reject([second], requeue=False)
    got = api.queue("/", "dead").take()
    assert got is not None and "x-delivery-count" not in got.message.headers


# (id, x-overflow, publishes, then (take+settle, publish) steps, ready after each step)
OVERFLOW: list[tuple[str, str, int, list[tuple[int, int]], list[int]]] = [
    # max-length 5: admitted while not over it (6), then refused until back at 80 % (4)
    ("reject-publish soft limit", "reject-publish", 10, [(1, 1), (1, 1), (0, 3)],
     [6, 5, 5, 6]),
    ("drop-head", "drop-head", 10, [(2, 3)], [5, 5]),
    ("reject-publish-dlx acts as drop-head", "reject-publish-dlx", 10, [(2, 3)], [5, 5]),
]


@pytest.mark.parametrize(("overflow", "first", "steps", "ready"),
                         [r[1:] for r in OVERFLOW], ids=[r[0] for r in OVERFLOW])
def test_overflow(api: BrokerAPI, overflow: str, first: int, steps: list[tuple[int, int]],
                  ready: list[int]) -> None:
    q = quorum(api, **{"x-max-length": 5, "x-overflow": overflow})
    seen = []
    for i in range(first):
        api.publish("/", "", message(b"%d" % i), None)
    seen.append(q.message_count)
    for taken, published in steps:
        for _ in range(taken):
            entry = q.take()
            assert entry is not None
            q.delivered(entry, acked=False)
            q.settle([entry])
        for i in range(published):
            api.publish("/", "", message(b"n%d" % i), None)
        seen.append(q.message_count)
    assert seen == ready


# (id, queues a transient message reaches, written to the store?)
KEEPS: list[tuple[str, list[str], bool]] = [
    ("quorum", ["qq"], True),
    ("classic durable", ["cd"], False),
    ("both", ["qq", "cd"], True),
]


@pytest.mark.parametrize(("targets", "persistent"), [r[1:] for r in KEEPS],
                         ids=[r[0] for r in KEEPS])
def test_a_quorum_queue_keeps_every_message(api: BrokerAPI, targets: list[str],
                                            persistent: bool) -> None:
    quorum(api)
    api.declare_queue("/", "cd", durable=True)
    api.declare_exchange("/", "fan", "fanout")
    for name in targets:
        api.bind("/", "queue", name, "fan", "")
    m = Message("fan", "", codec.encode_properties({}), b"t")
    assert not m.persistent
    api.publish("/", "fan", m, None)
    assert m.persistent is persistent
    assert QUEUE_TYPES["quorum"].keeps_every_message
    assert not QUEUE_TYPES["classic"].keeps_every_message


def test_deleting_the_last_quorum_queue_stops_keeping_transients(api: BrokerAPI) -> None:
    quorum(api)
    api.delete_queue("/", "qq")
    api.declare_queue("/", "cd", durable=True)
    m = message(b"t", "cd")
    api.publish("/", "", m, None)
    assert not m.persistent


def test_policies_apply_to_quorum_queues_by_type(api: BrokerAPI) -> None:
    api.set_policy("/", "ql", ".*", {"max-length": 1}, apply_to="quorum_queues")
    q = quorum(api)
    c = api.declare_queue("/", "c")
    assert q.policy_name == "ql" and c.policy_name is None


def test_a_returned_message_is_written_again_with_its_first_stamps(api: BrokerAPI) -> None:
    """The record written for a return (with x-delivery-count) keeps the publish time
    and expiry the publish pipeline stamped on the first, so a restart neither restarts
    its TTL clock nor forgets it was delivered (tests/integration/test_quorum_restart.py
    has the restart)."""
    store = api._broker.store  # the in-memory store: what the log would be handed
    assert isinstance(store, MemoryStore)
    quorum(api, **{"x-message-ttl": 60000})
    api.publish("/", "", Message("", "qq", codec.encode_properties({"expiration": "30000"}),
                                 b"m"), None)
    got = api.get("/", "qq")
    assert got is not None
    first = store.read(got.message.position)
    assert first.published > 0 and first.expires == first.published + 30000
    api.reject([got], requeue=True)
    again = api.get("/", "qq")
    assert again is not None and again.message.headers["x-delivery-count"] == 1
    position = again.message.position
    assert position != got.message.position
    record = store.read(position)
    assert (record.published, record.expires, record.transient) == (
        first.published, first.expires, False)
    assert codec.decode_properties(record.properties)["headers"]["x-delivery-count"] == 1
    assert position in store._delivered.get(api.queue("/", "qq").store_key, set())
