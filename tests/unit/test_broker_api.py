"""The public broker API (amqpd.broker.api), table-driven, no sockets.

A Broker is built but never started (no listeners, the in-memory store, no event loop:
commits and dispatch run when asked). Each row of a table is one call through the API
and the AMQP reply code it must raise, the same code the AMQP layer sends for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from amqpd import hotpath
from amqpd.broker.api import AMQPError, BrokerAPI, Message, UnknownComponent, codec
from amqpd.config import Settings
from amqpd.server import Broker

OWNER_A = object()  # two connections, for exclusivity
OWNER_B = object()


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return Broker(Settings(data_dir=str(tmp_path), persistence=False))


@pytest.fixture
def api(broker: Broker) -> BrokerAPI:
    a = broker.api
    a.declare_exchange("/", "ex", "direct", durable=True)
    a.declare_queue("/", "q", durable=True)
    a.bind("/", "queue", "q", "ex", "k")
    a.declare_queue("/", "mine", exclusive_owner=OWNER_A, owner=OWNER_A)
    return a


def msg(body: bytes = b"m", rk: str = "k", exchange: str = "ex", **props: Any) -> Message:
    return Message(exchange, rk, codec.encode_properties(props), body)


def steps(*calls: Callable[[BrokerAPI], object]) -> Callable[[BrokerAPI], None]:
    """Several API calls made in order, as one case of a table below."""
    def run(a: BrokerAPI) -> None:
        for call in calls:
            call(a)
    return run


# (call, reply code); every call runs against the fixture's topology
ERRORS: list[tuple[str, Callable[[BrokerAPI], object], int]] = [
    ("declare the default exchange", lambda a: a.declare_exchange("/", "", "direct"), 403),
    ("declare amq.*", lambda a: a.declare_exchange("/", "amq.mine", "direct"), 403),
    ("unknown exchange type", lambda a: a.declare_exchange("/", "x", "nope"), 503),
    ("passive, missing exchange",
     lambda a: a.declare_exchange("/", "nope", "direct", passive=True), 404),
    ("inequivalent exchange type",
     lambda a: a.declare_exchange("/", "ex", "fanout", durable=True), 406),
    ("delete a built-in exchange", lambda a: a.delete_exchange("/", "amq.direct"), 403),
    ("delete an exchange in use", lambda a: a.delete_exchange("/", "ex", if_unused=True), 406),
    ("declare an amq.* queue", lambda a: a.declare_queue("/", "amq.q"), 403),
    ("passive, missing queue", lambda a: a.declare_queue("/", "nope", passive=True), 404),
    ("inequivalent durable", lambda a: a.declare_queue("/", "q", durable=False), 406),
    ("another connection's exclusive queue",
     lambda a: a.declare_queue("/", "mine", passive=True, owner=OWNER_B), 405),
    ("bad x-max-length",
     lambda a: a.declare_queue("/", "bad", arguments={"x-max-length": "ten"}), 406),
    ("unknown x-queue-type",
     lambda a: a.declare_queue("/", "t", arguments={"x-queue-type": "no-such-type"}), 406),
    ("quorum-only argument on classic",
     lambda a: a.declare_queue("/", "t", arguments={"x-delivery-limit": 3}), 406),
    ("purge a missing queue", lambda a: a.purge_queue("/", "nope"), 404),
    ("purge another's exclusive queue", lambda a: a.purge_queue("/", "mine", owner=OWNER_B),
     405),
    ("bind a missing queue", lambda a: a.bind("/", "queue", "nope", "ex", "k"), 404),
    ("bind from a missing exchange", lambda a: a.bind("/", "queue", "q", "nope", "k"), 404),
    ("bind to the default exchange", lambda a: a.bind("/", "queue", "q", "", "k"), 403),
    ("publish to a missing exchange", lambda a: a.publish("/", "nope", msg(), "guest"), 404),
    ("forged user-id", lambda a: a.publish("/", "ex", msg(user_id="mallory"), "guest"), 406),
    ("bad expiration", lambda a: a.publish("/", "ex", msg(expiration="soon"), "guest"), 406),
    ("get from a missing queue", lambda a: a.get("/", "nope"), 404),
    ("get another's exclusive queue", lambda a: a.get("/", "mine", owner=OWNER_B), 405),
    ("missing vhost", lambda a: a.declare_queue("nope", "q"), 404),
    ("unbind another's exclusive queue",
     lambda a: a.unbind("/", "queue", "mine", "amq.direct", "k", owner=OWNER_B), 405),
    ("unbind from the default exchange", lambda a: a.unbind("/", "queue", "q", "", "q"), 403),
    ("exchange.bind to a missing exchange",
     lambda a: a.bind("/", "exchange", "nope", "ex", "k"), 404),
    ("delete another's exclusive queue",
     lambda a: a.delete_queue("/", "mine", owner=OWNER_B), 405),
    ("consume a missing queue",
     lambda a: a.consume("/", "nope", RecordingChannel(), "t", no_ack=True, exclusive=False,
                         prefetch=0, arguments=None, owner=OWNER_A), 404),
    ("look up a missing queue", lambda a: a.queue("/", "nope"), 404),
    ("look up a missing exchange", lambda a: a.exchange("/", "nope"), 404),
    # vhosts, users, permissions
    ("delete a missing vhost", lambda a: a.delete_vhost("nope"), 404),
    ("look up a missing vhost", lambda a: a.vhost("nope"), 404),
    ("permissions of a missing user",
     lambda a: a.set_permissions("nobody", "/", ".*", ".*", ".*"), 404),
    ("permissions in a missing vhost",
     lambda a: a.set_permissions("guest", "nope", ".*", ".*", ".*"), 404),
    ("permission pattern not a regex",
     lambda a: a.set_permissions("guest", "/", "(", ".*", ".*"), 406),
    ("topic permission pattern not a regex",
     lambda a: a.put_topic_permission("guest", "/", "amq.topic", ".*", "("), 406),
    ("topic permission of a missing user",
     lambda a: a.put_topic_permission("nobody", "/", "amq.topic", ".*", ".*"), 404),
    ("no permissions in the vhost",
     steps(lambda a: a.put_user("bob", tags=[], password="pw"),
           lambda a: a.check_permission("bob", "/", "configure", "queue", "x")), 403),
    ("permission pattern does not match",
     steps(lambda a: a.put_user("bob", tags=[], password="pw"),
           lambda a: a.set_permissions("bob", "/", "^a", ".*", ".*"),
           lambda a: a.check_permission("bob", "/", "configure", "queue", "x")), 403),
    # policies (RabbitMQ's validation)
    ("policy pattern not a regex", lambda a: a.set_policy("/", "p", "(", {"max-length": 1}),
     406),
    ("unknown policy key", lambda a: a.set_policy("/", "p", ".*", {"nope": 1}), 406),
    ("bad policy value", lambda a: a.set_policy("/", "p", ".*", {"max-length": "x"}), 406),
    ("empty policy", lambda a: a.set_policy("/", "p", ".*", {}), 406),
    ("policy applies to nothing known",
     lambda a: a.set_policy("/", "p", ".*", {"max-length": 1}, apply_to="x"), 406),
    ("policy in a missing vhost",
     lambda a: a.set_policy("nope", "p", ".*", {"max-length": 1}), 406),
    # the vhost's max-queues limit (the fixture holds two queues): one check for AMQP
    # and HTTP alike
    ("new queue over max-queues",
     steps(lambda a: a.set_vhost_limit("/", "max-queues", 2),
           lambda a: a.declare_queue("/", "third")), 406),
    ("server-named queue over max-queues",
     steps(lambda a: a.set_vhost_limit("/", "max-queues", 0),
           lambda a: a.declare_queue("/", "amq.gen-x", server_named=True)), 406),
    # topic permissions: write on publish, read on bind/unbind, for the named user
    ("topic write refused",
     steps(lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^a"),
           lambda a: a.publish("/", "amq.topic", msg(rk="b", exchange="amq.topic"), "guest")),
     403),
    ("topic read refused on bind",
     steps(lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^a"),
           lambda a: a.bind("/", "queue", "q", "amq.topic", "b", username="guest")), 403),
    ("topic read refused on unbind",
     steps(lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^a"),
           lambda a: a.unbind("/", "queue", "q", "amq.topic", "b", username="guest")), 403),
]


@pytest.mark.parametrize(("call", "code"), [(c, code) for _n, c, code in ERRORS],
                         ids=[n for n, _c, _code in ERRORS])
def test_errors_carry_the_amqp_reply_code(api: BrokerAPI, call: Callable[[BrokerAPI], object],
                                          code: int) -> None:
    with pytest.raises(AMQPError) as info:
        call(api)
    assert info.value.reply_code == code


IDEMPOTENT: list[tuple[str, Callable[[BrokerAPI], object]]] = [
    ("redeclare an exchange", lambda a: a.declare_exchange("/", "ex", "direct", durable=True)),
    ("redeclare a queue", lambda a: a.declare_queue("/", "q", durable=True)),
    ("delete a missing exchange", lambda a: a.delete_exchange("/", "nope")),
    ("delete a missing queue", lambda a: a.delete_queue("/", "nope")),
    ("bind twice", lambda a: a.bind("/", "queue", "q", "ex", "k")),
    ("unbind what is not bound", lambda a: a.unbind("/", "queue", "q", "ex", "other")),
    ("explicit classic type", lambda a: a.declare_queue(
        "/", "c", arguments={"x-queue-type": "classic"})),
    # RabbitMQ 3.10.8 answered unbind-ok to all four (asked over AMQP with pika)
    ("unbind a missing queue", lambda a: a.unbind("/", "queue", "nope", "ex", "k")),
    ("unbind from a missing exchange", lambda a: a.unbind("/", "queue", "q", "nope", "k")),
    ("exchange.unbind, missing destination",
     lambda a: a.unbind("/", "exchange", "nope", "amq.direct", "k")),
    ("exchange.unbind, missing source",
     lambda a: a.unbind("/", "exchange", "amq.fanout", "nope", "k")),
    ("delete a missing user", lambda a: a.delete_user("nope")),
    ("clear permissions never set", lambda a: a.clear_permissions("guest", "nope")),
    ("redeclare at the queue limit", steps(
        lambda a: a.set_vhost_limit("/", "max-queues", 2),
        lambda a: a.declare_queue("/", "q", durable=True))),
    ("passive declare at the queue limit", steps(
        lambda a: a.set_vhost_limit("/", "max-queues", 0),
        lambda a: a.declare_queue("/", "q", passive=True))),
    ("topic key allowed", steps(
        lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^a"),
        lambda a: a.publish("/", "amq.topic", msg(rk="a.b", exchange="amq.topic"), "guest"),
        lambda a: a.bind("/", "queue", "q", "amq.topic", "a.b", username="guest"))),
    ("topic permissions bind only their exchange", steps(
        lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^a"),
        lambda a: a.publish("/", "ex", msg(rk="b"), "guest"),
        lambda a: a.bind("/", "queue", "q", "ex", "b", username="guest"))),
    ("no user named: no topic check", steps(
        lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^a"),
        lambda a: a.publish("/", "amq.topic", msg(rk="b", exchange="amq.topic"), None))),
]


@pytest.mark.parametrize("call", [c for _n, c in IDEMPOTENT], ids=[n for n, _c in IDEMPOTENT])
def test_idempotent_operations_succeed(api: BrokerAPI, call: Callable[[BrokerAPI], object]) -> None:
    call(api)


def test_publish_routes_and_reports_unroutable(api: BrokerAPI) -> None:
    returned: list[bool] = []
    assert [q.name for q in api.publish("/", "ex", msg(), None)] == ["q"]
    assert api.publish("/", "ex", msg(rk="nowhere"), None,
                       on_unroutable=lambda: returned.append(True)) == []
    assert returned == [True]
    assert api.queue("/", "q").message_count == 1


def test_publish_confirms_once(api: BrokerAPI) -> None:
    confirms: list[BaseException | None] = []
    api.publish("/", "ex", msg(delivery_mode=2), None, on_confirm=confirms.append)
    api.publish("/", "ex", msg(), None, on_confirm=confirms.append)
    assert confirms == [None, None]


# (what the client does with three fetched messages, ready after, unacked after)
SETTLEMENTS: list[tuple[str, Callable[[BrokerAPI, list[Any]], None], int, int]] = [
    ("ack", lambda a, f: a.ack(f), 0, 0),
    ("reject, requeue", lambda a, f: a.reject(f, requeue=True), 3, 0),
    ("reject, drop", lambda a, f: a.reject(f, requeue=False), 0, 0),
    ("leave unsettled", lambda a, f: None, 0, 3),
]


@pytest.mark.parametrize(("settle", "ready", "unacked"),
                         [(s, r, u) for _n, s, r, u in SETTLEMENTS],
                         ids=[n for n, *_ in SETTLEMENTS])
def test_get_then_settle(api: BrokerAPI, settle: Callable[[BrokerAPI, list[Any]], None],
                         ready: int, unacked: int) -> None:
    for body in (b"1", b"2", b"3"):
        api.publish("/", "ex", msg(body), None)
    fetched = [api.get("/", "q") for _ in range(3)]
    assert api.get("/", "q") is None
    assert [f.body for f in fetched if f is not None] == [b"1", b"2", b"3"]
    assert [f.message_count for f in fetched if f is not None] == [2, 1, 0]
    settle(api, [f for f in fetched if f is not None])
    q = api.queue("/", "q")
    assert (q.message_count, q.unacked_count) == (ready, unacked)


def test_requeued_messages_come_back_first_and_redelivered(api: BrokerAPI) -> None:
    for body in (b"1", b"2"):
        api.publish("/", "ex", msg(body), None)
    first = api.get("/", "q")
    assert first is not None and not first.redelivered
    api.reject([first], requeue=True)
    again = api.get("/", "q")
    assert again is not None and again.body == b"1" and again.redelivered


def test_rejected_without_requeue_is_dead_lettered(api: BrokerAPI) -> None:
    api.declare_queue("/", "dlq")
    api.declare_queue("/", "src", arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "dlq"})
    api.publish("/", "", msg(b"x", rk="src", exchange=""), None)
    got = api.get("/", "src")
    assert got is not None
    api.reject([got], requeue=False)
    dead = api.get("/", "dlq")
    assert dead is not None and dead.body == b"x"
    assert dead.message.headers["x-death"][0]["reason"] == "rejected"


def test_delete_and_purge_count_ready_messages(api: BrokerAPI) -> None:
    for _ in range(4):
        api.publish("/", "ex", msg(), None)
    with pytest.raises(AMQPError) as info:
        api.delete_queue("/", "q", if_empty=True)
    assert info.value.reply_code == 406
    assert api.purge_queue("/", "q") == 4
    api.publish("/", "ex", msg(), None)
    assert api.delete_queue("/", "q") == 1
    assert api.find_queue("/", "q") is None


class RecordingChannel:
    """A ConsumerChannel that takes every delivery (what the AMQP channel would send)."""

    def __init__(self) -> None:
        self.delivered: list[bytes] = []
        self.cancelled: list[str] = []

    def can_deliver(self, consumer: Any) -> bool:
        return True

    def deliver(self, consumer: Any, queue: Any, entry: Any) -> None:
        self.delivered.append(entry.message.body)
        queue.delivered(entry, acked=True)

    def consumer_cancelled_by_server(self, consumer: Any) -> None:
        self.cancelled.append(consumer.tag)


def test_consume_exclusivity_and_arguments(api: BrokerAPI) -> None:
    ch = RecordingChannel()
    excl = api.consume("/", "q", ch, "a", no_ack=True, exclusive=True, prefetch=0,
                       arguments=None, owner=OWNER_A)
    api.start_consumer(excl)
    with pytest.raises(AMQPError) as info:
        api.consume("/", "q", ch, "b", no_ack=True, exclusive=False, prefetch=0,
                    arguments=None, owner=OWNER_A)
    assert info.value.reply_code == 403
    with pytest.raises(AMQPError) as info:
        api.consume("/", "mine", ch, "c", no_ack=True, exclusive=False, prefetch=0,
                    arguments=None, owner=OWNER_B)
    assert info.value.reply_code == 405
    api.cancel(excl)
    with pytest.raises(AMQPError) as info:
        api.consume("/", "q", ch, "d", no_ack=True, exclusive=False, prefetch=0,
                    arguments={"x-priority": "high"}, owner=OWNER_A)
    assert info.value.reply_code == 406


def test_demand_follows_consumers_and_backlog(api: BrokerAPI) -> None:
    ch = RecordingChannel()
    assert not api.has_demand("/", "q")  # nobody consumes
    consumer = api.consume("/", "q", ch, "a", no_ack=True, exclusive=False, prefetch=0,
                           arguments=None, owner=None)
    api.start_consumer(consumer)
    assert api.has_demand("/", "q")
    api.publish("/", "ex", msg(), None)
    assert not api.has_demand("/", "q")  # a backlog: nothing more wanted
    api.queue("/", "q").dispatch()
    assert ch.delivered == [b"m"]
    assert api.has_demand("/", "q")


def test_delete_vhost_takes_everything_with_it(api: BrokerAPI) -> None:
    assert api.add_vhost("v2", description="second")
    assert not api.add_vhost("v2")
    api.put_user("bob", tags=[], password="pw")
    api.set_permissions("bob", "v2", ".*", ".*", ".*")
    api.declare_queue("v2", "q2")
    api.set_policy("v2", "p", ".*", {"max-length": 1})
    api.delete_vhost("v2")
    assert not api.has_vhost("v2")
    assert api.permission("bob", "v2") is None
    assert api.policies("v2") == []
    with pytest.raises(AMQPError):
        api.delete_vhost("v2")


# durable state saves itself: (change through the API, what the saved file then holds)
SAVED: list[tuple[str, Callable[[BrokerAPI], object], Callable[[dict[str, Any]], bool]]] = [
    ("durable exchange", lambda a: a.declare_exchange("/", "dx", "topic", durable=True),
     lambda d: any(x["name"] == "dx" for x in d["exchanges"])),
    ("durable queue", lambda a: a.declare_queue("/", "dq", durable=True),
     lambda d: any(q["name"] == "dq" for q in d["queues"])),
    ("binding", lambda a: a.bind("/", "queue", "q", "amq.topic", "a.#"),
     lambda d: any(b["source"] == "amq.topic" and b["destination"] == "q"
                   for b in d["bindings"])),
    ("user", lambda a: a.put_user("carol", tags=["management"], password="pw"),
     lambda d: any(u["name"] == "carol" for u in d["users"])),
    ("permission", lambda a: a.set_permissions("guest", "/", "^x$", ".*", ".*"),
     lambda d: any(p["configure"] == "^x$" for p in d["permissions"])),
    ("vhost", lambda a: a.add_vhost("saved"),
     lambda d: any(v["name"] == "saved" for v in d["vhosts"])),
    ("policy", lambda a: a.set_policy("/", "ttl", "^q$", {"message-ttl": 5}),
     lambda d: any(p["name"] == "ttl" for p in d["policies"])),
    ("queue deleted", lambda a: a.delete_queue("/", "q"),
     lambda d: not any(q["name"] == "q" for q in d["queues"])),
    ("user limit", lambda a: a.set_user_limit("guest", "max-channels", 5),
     lambda d: any(u["name"] == "guest" and u["limits"] == {"max-channels": 5}
                   for u in d["users"])),
    ("vhost limit", lambda a: a.set_vhost_limit("/", "max-queues", 10),
     lambda d: any(p["component"] == "vhost-limits" and p["value"] == {"max-queues": 10}
                   for p in d["parameters"])),
    ("topic permission",
     lambda a: a.put_topic_permission("guest", "/", "amq.topic", "^a", "^b"),
     lambda d: any(t["exchange"] == "amq.topic" and t["write"] == "^a"
                   for t in d["topic_permissions"])),
]


@pytest.mark.parametrize(("change", "holds"), [(c, h) for _n, c, h in SAVED],
                         ids=[n for n, *_ in SAVED])
def test_durable_state_saves_itself(api: BrokerAPI, broker: Broker, tmp_path: Path,
                                    change: Callable[[BrokerAPI], object],
                                    holds: Callable[[dict[str, Any]], bool]) -> None:
    """The change reaches the store as definition records (issue 22's journal) without
    the caller asking, and a broker rebuilt from those records has it."""
    journal = broker.definitions

    async def run() -> None:
        broker._loop = asyncio.get_running_loop()
        broker.store.loop = broker._loop  # type: ignore[attr-defined]
        journal.attach(broker.store)
        journal.record_all()  # the fixture's topology, as a booted broker has it
        change(api)  # nobody asks for a save
        await api.wait_durable()

    asyncio.run(run())
    assert journal.durable == journal.recorded
    fresh = Broker(Settings(data_dir=str(tmp_path / "fresh"), persistence=False))
    fresh.definitions.restore(broker.store.definitions())  # type: ignore[attr-defined]
    assert holds(fresh.api.export_definitions())


# parameters through the API: (call, the exception it raises)
PARAMETER_ERRORS: list[tuple[str, Callable[[BrokerAPI], object], type[Exception]]] = [
    ("unknown component", lambda a: a.parameters.set("nope", "/", "n", {}), UnknownComponent),
    ("value the component refuses",
     lambda a: a.parameters.set("vhost-limits", "/", "limits", {"max-bananas": 1}),
     ValueError),
    ("misnamed vhost limits",
     lambda a: a.parameters.set("vhost-limits", "/", "other", {"max-queues": 1}), ValueError),
]


@pytest.mark.parametrize(("call", "error"), [(c, e) for _n, c, e in PARAMETER_ERRORS],
                         ids=[n for n, *_ in PARAMETER_ERRORS])
def test_parameter_errors(api: BrokerAPI, call: Callable[[BrokerAPI], object],
                          error: type[Exception]) -> None:
    with pytest.raises(error):
        call(api)
    assert api.parameters.list(None, None) == []


def test_parameters_set_list_and_clear(api: BrokerAPI) -> None:
    seen: list[tuple[str, str, Any]] = []
    api.parameters.register("test-component",
                            lambda vh, name, value: seen.append((vh, name, value)))
    assert api.parameters.set("test-component", "/", "one", {"x": 1})
    assert not api.parameters.set("test-component", "/", "one", {"x": 2})  # replaced
    assert seen == [("/", "one", {"x": 1}), ("/", "one", {"x": 2})]
    assert api.parameters.get("test-component", "/", "one") == {"x": 2}
    assert [p["name"] for p in api.parameters.list("test-component", "/")] == ["one"]
    assert api.parameters.clear("test-component", "/", "one")
    assert not api.parameters.clear("test-component", "/", "one")
    assert api.parameters.get("test-component", "/", "one") is None


def test_lists_are_sorted_and_stats_count(api: BrokerAPI) -> None:
    """list and stats: what the management API and the plugins read."""
    api.declare_queue("/", "a")
    assert [q.name for q in api.queues("/")] == ["a", "mine", "q"]
    assert {"", "amq.direct", "ex"} <= {e.name for e in api.exchanges("/")}
    assert [(b.source.name, b.destination.name, b.routing_key) for b in api.bindings("/")
            if b.source.name == "ex"] == [("ex", "q", "k")]
    assert [v.name for v in api.vhosts()] == ["/"]
    for _ in range(3):
        api.publish("/", "ex", msg(), None)
    got = api.get("/", "q")
    assert got is not None
    q = api.queue("/", "q")
    assert (q.message_count, q.unacked_count) == (2, 1)
    info = q.info()
    assert (info["messages"], info["messages_ready"], info["messages_unacknowledged"]) == (
        3, 2, 1)
    api.reject([got], requeue=True)
    assert (q.message_count, q.unacked_count) == (3, 0)


def test_users_and_permissions(api: BrokerAPI) -> None:
    assert api.put_user("bob", tags=["management"], password="pw")
    assert not api.put_user("bob", tags=["monitoring"], password="pw2")  # replaced
    assert [u.name for u in api.users()] == ["bob", "guest"]
    assert api.authenticate("bob", "pw2", peer_is_loopback=False) is not None
    assert api.authenticate("bob", "pw", peer_is_loopback=False) is None
    assert not api.can_access_vhost("bob", "/")
    assert api.set_permissions("bob", "/", "^b", ".*", ".*")
    assert not api.set_permissions("bob", "/", "^b\\.", ".*", ".*")
    assert api.can_access_vhost("bob", "/")
    api.check_permission("bob", "/", "configure", "queue", "b.q")  # allowed: no raise
    assert api.clear_permissions("bob", "/")
    assert not api.can_access_vhost("bob", "/")
    assert api.delete_user("bob") and api.user("bob") is None


def test_several_fetched_messages_settle_at_once_as_nack_multiple(api: BrokerAPI) -> None:
    """basic.nack(multiple) is reject() of several: each back in its place, redelivered."""
    for body in (b"1", b"2", b"3"):
        api.publish("/", "ex", msg(body), None)
    fetched = [api.get("/", "q") for _ in range(3)]
    api.reject([f for f in fetched[:2] if f is not None], requeue=True)
    again = [api.get("/", "q") for _ in range(2)]
    assert [(f.body, f.redelivered) for f in again if f is not None] == [
        (b"1", True), (b"2", True)]


# limits through the API: (call, the exception it raises)
LIMIT_ERRORS: list[tuple[str, Callable[[BrokerAPI], object], type[Exception]]] = [
    ("unknown vhost limit", lambda a: a.set_vhost_limit("/", "max-bananas", 1), ValueError),
    ("vhost limit not a number", lambda a: a.set_vhost_limit("/", "max-queues", "ten"),
     ValueError),
    ("limit of a missing vhost", lambda a: a.set_vhost_limit("nope", "max-queues", 1),
     AMQPError),
    ("user-only limit on a vhost", lambda a: a.set_vhost_limit("/", "max-channels", 1),
     ValueError),
    ("unknown user limit", lambda a: a.set_user_limit("guest", "max-queues", 1), ValueError),
    ("limit of a missing user", lambda a: a.set_user_limit("nobody", "max-channels", 1),
     AMQPError),
]


@pytest.mark.parametrize(("call", "error"), [(c, e) for _n, c, e in LIMIT_ERRORS],
                         ids=[n for n, *_ in LIMIT_ERRORS])
def test_limit_errors(api: BrokerAPI, call: Callable[[BrokerAPI], object],
                      error: type[Exception]) -> None:
    with pytest.raises(error):
        call(api)
    assert api.vhost_limits("/") == {}
    assert api.user_limits() == {}


def test_limits_set_and_clear(api: BrokerAPI) -> None:
    api.set_vhost_limit("/", "max-queues", 10)
    api.set_vhost_limit("/", "max-connections", 3)
    assert api.vhost_limits("/") == {"max-queues": 10, "max-connections": 3}
    assert api.clear_vhost_limit("/", "max-queues")
    assert not api.clear_vhost_limit("/", "max-queues")
    assert api.vhost_limits("/") == {"max-connections": 3}
    assert api.clear_vhost_limit("/", "max-connections")
    assert api.vhost_limits("/") == {}
    api.set_user_limit("guest", "max-channels", 2)
    assert api.user_limits() == {"guest": {"max-channels": 2}}
    assert api.clear_user_limit("guest", "max-channels")
    assert not api.clear_user_limit("guest", "max-channels")
    assert api.user_limits() == {}


def test_topic_permissions_apply_at_once(api: BrokerAPI, broker: Broker) -> None:
    version = broker.auth.version
    assert not api.put_topic_permission("guest", "/", "amq.topic", "^a", "^b")
    assert api.put_topic_permission("guest", "/", "amq.topic", "^c", "^d")
    assert broker.auth.version > version  # sessions drop their cached checks
    assert api.topic_permissions("guest", "/") == [
        {"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": "^c", "read": "^d"}]
    assert api.topic_permissions(vhost="other") == []
    assert api.clear_topic_permissions("guest", "/", "amq.topic") == 1
    assert api.clear_topic_permissions("guest", "/") == 0
    assert api.topic_permissions() == []


def test_operator_policy_caps_the_effective_definition(api: BrokerAPI) -> None:
    api.set_policy("/", "p", "^q$", {"max-length": 100, "message-ttl": 5000})
    api.set_operator_policy("/", "cap", "^q", {"max-length": 10}, apply_to="queues")
    assert [p["name"] for p in api.operator_policies("/")] == ["cap"]
    assert api.effective_policy(api.queue("/", "q")) == (
        "cap", {"max-length": 10, "message-ttl": 5000})
    with pytest.raises(AMQPError):  # only the keys that cap limits
        api.set_operator_policy("/", "bad", ".*", {"alternate-exchange": "x"})
    api.clear_operator_policy("/", "cap")
    assert api.operator_policy("/", "cap") is None
    assert api.effective_policy(api.queue("/", "q")) == (
        None, {"max-length": 100, "message-ttl": 5000})


def test_single_node_has_no_warren(api: BrokerAPI) -> None:
    """Without [replication] the warren views are absent and promote is refused (406),
    which the HTTP API shows as 404 / 400 (tests/integration/test_warren_static.py has
    the pair)."""
    assert api.warren() is None
    assert api.replication_status() is None
    assert api.http_port() == 0 and not api.stopping()
    with pytest.raises(AMQPError) as info:
        asyncio.run(api.promote())
    assert info.value.reply_code == 406


def test_node_facts_the_http_layer_reads(broker: Broker, api: BrokerAPI) -> None:
    """Node name, cluster name, limits and plugins come through the API (http/ holds no
    Broker); the snapshot is a copy of what the node holds at that moment."""
    node = broker.settings.node_name
    assert api.node_name() == node and api.cluster_name() == node  # unnamed: the node's
    assert api.data_dir() == broker.settings.data_dir
    assert api.enabled_plugins() == [] and api.plugin_http_routes() == []
    status = api.node_status()
    assert (status.name, status.cluster_name, status.plugins) == (node, node, ())
    assert status.started_at == broker.started_at
    assert status.alarms == tuple(api.alarms())
    assert status.disk_free_limit == broker.settings.disk_free_limit
    assert status.hot_path == hotpath.MODE  # what /api/overview shows as amqpd_hot_path
    api.set_cluster_name("east")
    assert api.cluster_name() == "east" and api.node_status().cluster_name == "east"
    assert status.cluster_name == node  # the earlier snapshot did not change
    assert api.export_definitions()["global_parameters"][0] == {
        "name": "cluster_name", "value": "east"}


def test_memory_watermark_is_reevaluated_at_once(api: BrokerAPI) -> None:
    """One byte: this process is over it, the memory alarm is on and publishers are
    blocked; 0 (no limit) clears it again (rabbitmqctl set_vm_memory_high_watermark)."""
    assert api.set_memory_high_watermark(absolute=1) == 1
    assert "memory" in api.alarms() and api.alarms_active()
    assert api.node_status().memory_limit == 1
    assert api.set_memory_high_watermark(absolute=0) == 0
    assert "memory" not in api.alarms()
    assert api.set_memory_high_watermark(fraction=0.5) == api.node_status().memory_limit > 0
