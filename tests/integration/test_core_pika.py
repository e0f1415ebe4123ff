"""The broker core driven by pika, blocking and select adapters, against a real amqpd."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions as pex
import pytest

from tests.support.brokerproc import BrokerProcess


def uname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def params(broker: BrokerProcess, **kwargs: Any) -> pika.URLParameters:
    p = pika.URLParameters(broker.url)
    for key, value in kwargs.items():
        setattr(p, key, value)
    return p


@pytest.fixture
def conn(broker: BrokerProcess) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(params(broker))
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def ch(conn: pika.BlockingConnection) -> Any:
    return conn.channel()


def poll(fn: Callable[[], Any], conn: pika.BlockingConnection, timeout: float = 5.0) -> Any:
    """Process I/O until fn() is truthy (no sleeps for synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = fn()
        if result:
            return result
        conn.process_data_events(time_limit=0.05)
    raise AssertionError("condition not met before the deadline")


def declare_queue(ch: Any, **kwargs: Any) -> str:
    return ch.queue_declare(queue=kwargs.pop("queue", ""), exclusive=kwargs.pop(
        "exclusive", True), **kwargs).method.queue


def bodies(ch: Any, queue: str) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(1000):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)
    raise AssertionError("queue never emptied")


# ---------------------------------------------------------------- connection
def test_negotiation_and_server_properties(conn: pika.BlockingConnection) -> None:
    impl = conn._impl
    caps = impl.server_capabilities
    for cap in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "per_consumer_qos", "authentication_failure_close"):
        assert caps.get(cap) is True, cap
    assert impl.params.channel_max == 2047
    assert impl.params.frame_max == 131072
    assert impl.params.heartbeat == 60


def test_client_proposes_lower_limits(broker: BrokerProcess) -> None:
    c = pika.BlockingConnection(params(broker, channel_max=16, frame_max=8192, heartbeat=7))
    try:
        assert (c._impl.params.channel_max, c._impl.params.frame_max,
                c._impl.params.heartbeat) == (16, 8192, 7)
        ch = c.channel()
        q = declare_queue(ch)
        body = bytes(range(256)) * 100  # split over many 8 KiB frames both ways
        ch.basic_publish("", q, body)
        assert bodies(ch, q) == [body]
    finally:
        c.close()


def test_wrong_password_is_403(broker: BrokerProcess) -> None:
    p = params(broker)
    p.credentials = pika.PlainCredentials("guest", "wrong")
    with pytest.raises(pex.ProbableAuthenticationError):
        pika.BlockingConnection(p)


def test_unknown_vhost_is_530(broker: BrokerProcess) -> None:
    p = params(broker)
    p.virtual_host = uname("no-such-vhost")
    with pytest.raises(pex.ProbableAccessDeniedError):
        pika.BlockingConnection(p)


def test_channels_many_and_close(conn: pika.BlockingConnection) -> None:
    chans = [conn.channel() for _ in range(50)]
    assert len({c.channel_number for c in chans}) == 50
    for c in chans[::2]:
        c.close()
    q = declare_queue(chans[1])
    chans[3].basic_publish("", q, b"x")
    chans[3].queue_declare(q, passive=True)  # a round trip on the publishing channel
    assert bodies(chans[1], q) == [b"x"]


def test_channel_max_enforced(broker: BrokerProcess) -> None:
    c = pika.BlockingConnection(params(broker, channel_max=3))
    try:
        for _ in range(3):
            c.channel()
        with pytest.raises((pex.ConnectionClosed, pex.NoFreeChannels)):
            # pika itself refuses beyond channel_max; force it on the wire if it would not
            c._impl.params.channel_max = 10
            c.channel()
            c.channel()
        assert not c.is_open or c._impl.is_closing
    finally:
        if c.is_open:
            c.close()


# ---------------------------------------------------------------- exchanges
def test_direct_and_default_exchange(ch: Any) -> None:
    q = declare_queue(ch)
    ch.queue_bind(q, "amq.direct", routing_key="rk1")
    ch.basic_publish("amq.direct", "rk1", b"a")
    ch.basic_publish("amq.direct", "other", b"b")
    ch.basic_publish("", q, b"c")
    assert bodies(ch, q) == [b"a", b"c"]


def test_fanout(ch: Any) -> None:
    x = uname("fan")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    qs = [declare_queue(ch) for _ in range(3)]
    for q in qs:
        ch.queue_bind(q, x, routing_key="ignored")
    ch.basic_publish(x, "anything", b"f")
    assert [bodies(ch, q) for q in qs] == [[b"f"]] * 3


@pytest.mark.parametrize("pattern,matches,misses", [
    ("a.*.c", ["a.b.c", "a.x.c"], ["a.c", "a.b.b.c", "a.b"]),
    ("a.#", ["a", "a.b", "a.b.c"], ["b.a", "ab"]),
    ("#.c", ["c", "a.c", "a.b.c"], ["c.a"]),
    ("#", ["", "x", "x.y.z"], []),
    ("*", ["x"], ["", "x.y"]),
    ("a.#.z", ["a.z", "a.b.z", "a.b.c.z"], ["a.b"]),
    ("*.#", ["a", "a.b"], [""]),
])
def test_topic(ch: Any, pattern: str, matches: list[str], misses: list[str]) -> None:
    x = uname("topic")
    ch.exchange_declare(x, "topic", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, x, routing_key=pattern)
    for key in matches + misses:
        ch.basic_publish(x, key, key.encode() or b"<empty>")
    assert bodies(ch, q) == [k.encode() or b"<empty>" for k in matches]


def test_headers_all_and_any(ch: Any) -> None:
    x = uname("hdr")
    ch.exchange_declare(x, "headers", auto_delete=True)
    q_all, q_any = declare_queue(ch), declare_queue(ch)
    ch.queue_bind(q_all, x, arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_bind(q_any, x, arguments={"x-match": "any", "a": 1, "b": "two"})
    for n, headers in enumerate([{"a": 1, "b": "two"}, {"a": 1}, {"b": "x"}, {}, None]):
        ch.basic_publish(x, "", str(n).encode(), pika.BasicProperties(headers=headers))
    assert bodies(ch, q_all) == [b"0"]
    assert bodies(ch, q_any) == [b"0", b"1"]


def test_headers_values_compare_as_rabbitmq_does(ch: Any) -> None:
    """A boolean is not a number; a long string and a byte array with the same bytes match."""
    x = uname("hdrtypes")
    ch.exchange_declare(x, "headers", auto_delete=True)
    q_int, q_bool, q_str = declare_queue(ch), declare_queue(ch), declare_queue(ch)
    ch.queue_bind(q_int, x, arguments={"a": 1})
    ch.queue_bind(q_bool, x, arguments={"x-match": "any", "a": True})
    ch.queue_bind(q_str, x, arguments={"a": "1"})
    for body, headers in ((b"int", {"a": 1}), (b"bool", {"a": True}), (b"bytes", {"a": b"1"}),
                          (b"long", {"a": 2**40}), (b"void", {"a": None})):
        ch.basic_publish(x, "", body, pika.BasicProperties(headers=headers))
    assert bodies(ch, q_int) == [b"int"]
    assert bodies(ch, q_bool) == [b"bool"]
    assert bodies(ch, q_str) == [b"bytes"]


def test_builtin_exchanges_exist(ch: Any) -> None:
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        ch.exchange_declare(name, passive=True)


def test_exchange_declare_flags(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = uname("flags")
    ch.exchange_declare(x, "direct", durable=True, arguments={"alternate-exchange": "amq.fanout"})
    ch.exchange_declare(x, passive=True)
    ch.exchange_declare(x, "direct", durable=True, arguments={"alternate-exchange": "amq.fanout"})
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.exchange_declare(x, "fanout", durable=True)
    assert err.value.reply_code == 406
    ch = conn.channel()
    ch.exchange_delete(x)
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.exchange_declare(x, passive=True)
    assert err.value.reply_code == 404


def test_alternate_exchange(ch: Any) -> None:
    x = uname("ae")
    q = declare_queue(ch)
    ae = uname("ae-target")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.queue_bind(q, ae)
    ch.exchange_declare(x, "direct", auto_delete=False, arguments={"alternate-exchange": ae})
    ch.basic_publish(x, "unrouted", b"to-ae")
    assert bodies(ch, q) == [b"to-ae"]
    ch.exchange_delete(x)


def test_internal_exchange_refuses_publish(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = uname("internal")
    ch.exchange_declare(x, "fanout", internal=True)
    ch.basic_publish(x, "", b"x")
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.basic_get(uname("whatever"))
    assert err.value.reply_code == 403
    conn.channel().exchange_delete(x)


def test_auto_delete_exchange_goes_with_its_last_binding(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = uname("autodel")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, x)
    ch.exchange_declare(x, passive=True)
    ch.queue_unbind(q, x)
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.exchange_declare(x, passive=True)
    assert err.value.reply_code == 404


def test_exchange_delete_if_unused(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    x = uname("ifunused")
    ch.exchange_declare(x, "direct")
    q = declare_queue(ch)
    ch.queue_bind(q, x, "k")
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.exchange_delete(x, if_unused=True)
    assert err.value.reply_code == 406
    ch = conn.channel()
    ch.queue_unbind(q, x, "k")
    ch.exchange_delete(x, if_unused=True)


def test_exchange_to_exchange_bindings(ch: Any) -> None:
    src, dst = uname("e2e-src"), uname("e2e-dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct", auto_delete=True)
    ch.exchange_bind(destination=dst, source=src, routing_key="k.*")
    q = declare_queue(ch)
    ch.queue_bind(q, dst, "k.1")
    ch.basic_publish(src, "k.1", b"via-e2e")
    ch.basic_publish(src, "k.2", b"not-bound-at-dst")
    assert bodies(ch, q) == [b"via-e2e"]
    ch.exchange_unbind(destination=dst, source=src, routing_key="k.*")
    ch.basic_publish(src, "k.1", b"after-unbind")
    assert bodies(ch, q) == []
    ch.exchange_delete(src)


def test_reserved_and_default_exchange_errors(conn: pika.BlockingConnection) -> None:
    for action in (
        lambda c: c.exchange_declare(uname("amq.mine"), "direct"),
        lambda c: c.exchange_delete("amq.direct"),
        lambda c: c.queue_bind(declare_queue(c), ""),
    ):
        ch = conn.channel()
        with pytest.raises(pex.ChannelClosedByBroker) as err:
            action(ch)
        assert err.value.reply_code == 403
    assert conn.is_open


# ---------------------------------------------------------------- queues
def test_queue_declare_server_named_and_counts(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ok = ch.queue_declare("", exclusive=True).method
    assert ok.queue.startswith("amq.gen-") and len(ok.queue) > len("amq.gen-") + 10
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    for n in range(3):
        ch.basic_publish("", ok.queue, str(n).encode())
    ch.basic_consume(ok.queue, lambda *a: None, consumer_tag="counting")
    ch2 = conn.channel()
    ok2 = ch2.queue_declare(ok.queue, passive=True).method
    assert ok2.consumer_count == 1
    # the consumer has taken the messages (no qos), so 0 ready
    assert ok2.message_count in (0, 3)


def test_queue_declare_passive_missing_and_equivalence(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.queue_declare(uname("missing"), passive=True)
    assert err.value.reply_code == 404
    ch = conn.channel()
    q = uname("equiv")
    ch.queue_declare(q, auto_delete=True)
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.queue_declare(q, durable=True)
    assert err.value.reply_code == 406
    conn.channel().queue_delete(q)


def test_durable_queue(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uname("durable")
    ch.queue_declare(q, durable=True)
    ch.queue_declare(q, durable=True, passive=True)
    assert ch.queue_delete(q).method.message_count == 0


def test_exclusive_queue_is_locked_to_its_connection(broker: BrokerProcess,
                                                      conn: pika.BlockingConnection) -> None:
    q = declare_queue(conn.channel(), queue=uname("excl"))
    other = pika.BlockingConnection(params(broker))
    try:
        with pytest.raises(pex.ChannelClosedByBroker) as err:
            other.channel().basic_consume(q, lambda *a: None)
        assert err.value.reply_code == 405
    finally:
        other.close()
    conn.close()
    check = pika.BlockingConnection(params(broker))
    try:  # gone with its owner
        with pytest.raises(pex.ChannelClosedByBroker) as err:
            check.channel().queue_declare(q, passive=True)
        assert err.value.reply_code == 404
    finally:
        check.close()


def test_auto_delete_queue_goes_with_its_last_consumer(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uname("autodelq")
    ch.queue_declare(q, auto_delete=True)
    tag = ch.basic_consume(q, lambda *a: None)
    ch.queue_declare(q, passive=True)
    ch.basic_cancel(tag)
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.queue_declare(q, passive=True)
    assert err.value.reply_code == 404


def test_bind_unbind_purge(ch: Any) -> None:
    q = declare_queue(ch)
    ch.queue_bind(q, "amq.topic", "p.#")
    for _ in range(4):
        ch.basic_publish("amq.topic", "p.x", b"m")
    assert ch.queue_purge(q).method.message_count == 4
    ch.queue_unbind(q, "amq.topic", "p.#")
    ch.basic_publish("amq.topic", "p.x", b"m")
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_queue_delete_if_unused_if_empty(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    ch.basic_publish("", q, b"x")
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.queue_delete(q, if_empty=True)
    assert err.value.reply_code == 406
    ch = conn.channel()
    tag = ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch2.queue_delete(q, if_unused=True)
    assert err.value.reply_code == 406
    ch.basic_cancel(tag)
    ch.queue_purge(q)
    assert ch.queue_delete(q, if_unused=True, if_empty=True).method.message_count == 0


def test_queue_delete_reports_message_count(ch: Any) -> None:
    q = declare_queue(ch)
    for _ in range(5):
        ch.basic_publish("", q, b"x")
    assert ch.queue_delete(q).method.message_count == 5


# ---------------------------------------------------------------- basic
def test_mandatory_unroutable_is_returned(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returned.append((method, body)))
    ch.basic_publish("amq.direct", uname("nowhere"), b"back", mandatory=True)
    ch.basic_publish("amq.direct", uname("nowhere"), b"dropped", mandatory=False)
    poll(lambda: returned, conn)
    conn.process_data_events(time_limit=0.1)
    assert [(m.reply_code, m.reply_text, b) for m, b in returned] == [(312, "NO_ROUTE", b"back")]


def test_consume_server_generated_tag_and_no_ack(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)  # pika names tags
    for n in range(10):
        ch.basic_publish("", q, str(n).encode())
    poll(lambda: len(got) == 10, conn)
    assert got == [str(n).encode() for n in range(10)]
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_exclusive_consumer(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch2 = conn.channel()
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch2.basic_consume(q, lambda *a: None)
    assert err.value.reply_code == 403


def test_server_cancel_when_queue_deleted(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    cancelled: list[Any] = []
    ch.basic_consume(q, lambda *a: None, consumer_tag="to-cancel")
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    conn.channel().queue_delete(q)
    poll(lambda: cancelled, conn)
    assert cancelled == ["to-cancel"]


def test_get_and_get_empty(ch: Any) -> None:
    q = declare_queue(ch)
    assert ch.basic_get(q) == (None, None, None)
    ch.basic_publish("", q, b"one", pika.BasicProperties(content_type="text/plain",
                                                         headers={"h": 1}))
    ch.basic_publish("", q, b"two")
    method, props, body = ch.basic_get(q)
    assert (body, method.message_count, method.redelivered) == (b"one", 1, False)
    assert props.content_type == "text/plain" and props.headers == {"h": 1}
    ch.basic_ack(method.delivery_tag)


def test_nack_requeue_marks_redelivered(ch: Any) -> None:
    q = declare_queue(ch)
    for n in range(3):
        ch.basic_publish("", q, str(n).encode())
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[-1], multiple=True, requeue=True)
    again = [ch.basic_get(q) for _ in range(3)]
    assert [(m.redelivered, b) for m, _p, b in again] == [(True, b"0"), (True, b"1"),
                                                          (True, b"2")]
    ch.basic_reject(again[0][0].delivery_tag, requeue=False)
    ch.basic_ack(again[2][0].delivery_tag, multiple=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_reject_requeue_keeps_order(ch: Any) -> None:
    q = declare_queue(ch)
    for n in range(3):
        ch.basic_publish("", q, str(n).encode())
    m0 = ch.basic_get(q)[0]
    ch.basic_get(q, auto_ack=True)
    ch.basic_reject(m0.delivery_tag, requeue=True)
    assert bodies(ch, q) == [b"0", b"2"]


def test_unknown_delivery_tag_is_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.basic_ack(12345)
    with pytest.raises(pex.ChannelClosedByBroker) as err:
        ch.queue_declare("", exclusive=True)
    assert err.value.reply_code == 406
    assert conn.is_open


def test_qos_per_consumer(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    for n in range(10):
        ch.basic_publish("", q, str(n).encode())
    ch.basic_qos(prefetch_count=2)
    a: list[Any] = []
    b: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, body: a.append(m))
    ch.basic_consume(q, lambda c, m, p, body: b.append(m))
    poll(lambda: len(a) == 2 and len(b) == 2, conn)
    conn.process_data_events(time_limit=0.2)
    assert (len(a), len(b)) == (2, 2)  # each consumer has its own limit of 2
    ch.basic_ack(a[0].delivery_tag)
    poll(lambda: len(a) + len(b) == 5, conn)


def test_qos_global_is_per_channel(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    for n in range(10):
        ch.basic_publish("", q, str(n).encode())
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(m))
    ch.basic_consume(q, lambda c, m, p, body: got.append(m))
    poll(lambda: len(got) == 3, conn)
    conn.process_data_events(time_limit=0.2)
    assert len(got) == 3  # shared by both consumers of the channel
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    poll(lambda: len(got) == 6, conn)


def test_recover_redelivers_unacked(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    ch.basic_publish("", q, b"r")
    got: list[Any] = []
    ch.basic_consume(q, lambda c, m, p, body: got.append(m))
    poll(lambda: got, conn)
    ch.basic_recover(requeue=True)
    poll(lambda: len(got) == 2, conn)
    assert got[1].redelivered is True


def test_channel_close_requeues_unacked(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    ch.basic_publish("", q, b"back")
    assert ch.basic_get(q)[2] == b"back"
    ch.close()
    ch = conn.channel()
    method, _p, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"back", True)


def test_publisher_confirms(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = declare_queue(ch)
    for _ in range(20):
        ch.basic_publish("", q, b"c")  # raises if nacked
    with pytest.raises(pex.UnroutableError):
        ch.basic_publish("amq.direct", uname("nowhere"), b"x", mandatory=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 20


def test_publisher_nack_when_queue_refuses(conn: pika.BlockingConnection) -> None:
    """basic.nack: a full queue with x-overflow=reject-publish refuses the message."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = declare_queue(ch, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pex.NackError):
        ch.basic_publish("", q, b"refused")
    assert bodies(ch, q) == [b"fits"]


def test_confirms_for_persistent_messages_in_durable_queues(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = uname("confirm-durable")
    ch.queue_declare(q, durable=True)
    for _ in range(5):
        ch.basic_publish("", q, b"p", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_delete(q).method.message_count == 5


def test_tx_commit_and_rollback(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = declare_queue(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled-back")
    ch.tx_rollback()
    ch.basic_publish("", q, b"committed")
    other = conn.channel()
    assert other.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert other.queue_declare(q, passive=True).method.message_count == 1
    method = ch.basic_get(q)[0]
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()  # the ack is undone: message stays unacked, not settled
    ch.tx_commit()
    assert other.queue_declare(q, passive=True).method.message_count == 0
    ch.close()  # closing requeues the still-unacked message
    assert other.queue_declare(q, passive=True).method.message_count == 1


def test_channel_errors_leave_connection_and_other_channels(conn: pika.BlockingConnection) -> None:
    good = conn.channel()
    q = declare_queue(good)
    for code, action in (
        (404, lambda c: c.queue_declare(uname("nope"), passive=True)),
        (404, lambda c: c.basic_publish(uname("no-exchange"), "", b"x") or c.basic_get(q)),
        (403, lambda c: c.queue_declare(uname("amq.reserved"))),
        (406, lambda c: c.basic_reject(999) or c.basic_get(q)),
    ):
        ch = conn.channel()
        with pytest.raises(pex.ChannelClosedByBroker) as err:
            action(ch)
        assert err.value.reply_code == code
        assert err.value.reply_text.startswith(("NOT_FOUND - ", "ACCESS_REFUSED - ",
                                                "PRECONDITION_FAILED - "))
    good.basic_publish("", q, b"still fine")
    assert bodies(good, q) == [b"still fine"]


def test_connection_error_closes_connection(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(pex.ConnectionClosedByBroker) as err:
        ch.exchange_declare(uname("badtype"), "no-such-type")
    assert err.value.reply_code == 503
    assert "no-such-type" in err.value.reply_text
    assert not conn.is_open


# ---------------------------------------------------------------- select adapter
def test_select_connection_publish_consume_confirm(broker: BrokerProcess) -> None:
    q = uname("select")
    state: dict[str, Any] = {"acks": 0, "got": []}
    n = 25

    def on_open(connection: Any) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        state["ch"] = ch
        ch.confirm_delivery(lambda frame: on_confirm(frame))
        ch.queue_declare(q, exclusive=True, callback=on_declared)

    def on_confirm(frame: Any) -> None:
        assert isinstance(frame.method, pika.spec.Basic.Ack)
        state["acks"] += 1 if not frame.method.multiple else 0
        state["last_ack"] = frame.method.delivery_tag
        check_done()

    def on_declared(_frame: Any) -> None:
        ch = state["ch"]
        ch.basic_qos(prefetch_count=5, callback=lambda _f: start_consuming(ch))

    def start_consuming(ch: Any) -> None:
        ch.basic_consume(q, on_message)
        for i in range(n):
            ch.basic_publish("", q, str(i).encode())

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        state["got"].append(body)
        ch.basic_ack(method.delivery_tag)
        check_done()

    def check_done() -> None:
        if len(state["got"]) == n and state.get("last_ack") == n:
            state["connection"].close()

    connection = pika.SelectConnection(params(broker), on_open_callback=on_open,
                                       on_open_error_callback=lambda c, e: c.ioloop.stop(),
                                       on_close_callback=lambda c, r: c.ioloop.stop())
    state["connection"] = connection
    timer = connection.ioloop.call_later(10, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert state["got"] == [str(i).encode() for i in range(n)]
    assert state.get("last_ack") == n


def test_select_connection_channel_error(broker: BrokerProcess) -> None:
    result: dict[str, Any] = {}

    def on_open(connection: Any) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        ch.add_on_close_callback(on_channel_closed)
        ch.queue_declare(uname("missing"), passive=True)

    def on_channel_closed(ch: Any, reason: Any) -> None:
        result["code"] = reason.reply_code
        ch.connection.close()

    connection = pika.SelectConnection(params(broker), on_open_callback=on_open,
                                       on_close_callback=lambda c, r: c.ioloop.stop())
    timer = connection.ioloop.call_later(10, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert result == {"code": 404}
