"""x-delayed-message exchanges (rabbitmq-delayed-message-exchange semantics, any delay)."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from tests.integration.ext_support import channel, count, drain, get_msg, wait_for

DAY_MS = 24 * 3600 * 1000


def _delayed(ch, name: str, kind: str = "direct") -> None:
    ch.exchange_declare(name, "x-delayed-message", arguments={"x-delayed-type": kind})


def test_delivered_after_delay_with_negated_header(broker) -> None:
    with channel(broker.url) as ch:
        _delayed(ch, "dx1")
        ch.queue_declare("dx1.q")
        ch.queue_bind("dx1.q", "dx1", "k")
        start = time.monotonic()
        ch.basic_publish("dx1", "k", b"later", pika.BasicProperties(headers={"x-delay": 250}))
        assert count(ch, "dx1.q") == 0
        method, props, body = get_msg(ch, "dx1.q")
        assert time.monotonic() - start >= 0.24  # never early
        assert body == b"later" and method.exchange == "dx1" and method.routing_key == "k"
        assert props.headers["x-delay"] == -250  # as the plugin does


def test_due_order_not_publish_order(broker) -> None:
    with channel(broker.url) as ch:
        _delayed(ch, "dx2", "fanout")
        ch.queue_declare("dx2.q")
        ch.queue_bind("dx2.q", "dx2")
        for body, delay in ((b"c", 300), (b"a", 100), (b"now", 0), (b"b", 200),
                            (b"neg", -5)):
            ch.basic_publish("dx2", "", body, pika.BasicProperties(headers={"x-delay": delay}))
        ch.basic_publish("dx2", "", b"plain")
        wait_for(lambda: count(ch, "dx2.q") == 6, 5)
        assert drain(ch, "dx2.q") == [b"now", b"neg", b"plain", b"a", b"b", b"c"]


def test_topic_inner_type_and_very_long_delay(broker) -> None:
    with channel(broker.url) as ch:
        _delayed(ch, "dx3", "topic")
        ch.queue_declare("dx3.q")
        ch.queue_bind("dx3.q", "dx3", "a.*")
        ch.confirm_delivery()
        ch.basic_publish("dx3", "a.x", b"40d", pika.BasicProperties(
            headers={"x-delay": 40 * DAY_MS}, delivery_mode=2))  # confirmed, held
        ch.basic_publish("dx3", "a.y", b"soon", pika.BasicProperties(headers={"x-delay": 30}))
        ch.basic_publish("dx3", "b.y", b"nowhere", pika.BasicProperties(headers={"x-delay": 30}))
        assert get_msg(ch, "dx3.q")[2] == b"soon"
        assert count(ch, "dx3.q") == 0


def test_delayed_respects_cc(broker) -> None:
    with channel(broker.url) as ch:
        _delayed(ch, "dx4")
        ch.queue_declare("dx4.a")
        ch.queue_declare("dx4.b")
        ch.queue_bind("dx4.a", "dx4", "a")
        ch.queue_bind("dx4.b", "dx4", "b")
        ch.basic_publish("dx4", "a", b"m", pika.BasicProperties(
            headers={"x-delay": 20, "CC": ["b"]}))
        assert get_msg(ch, "dx4.a")[2] == b"m"
        assert get_msg(ch, "dx4.b")[2] == b"m"


@pytest.mark.parametrize("args,code", [
    ({}, 406),
    ({"x-delayed-type": "x-delayed-message"}, 406),
    ({"x-delayed-type": "no-such-type"}, 503),
])
def test_declare_validation(broker, args, code) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        with pytest.raises((pika.exceptions.ChannelClosedByBroker,
                            pika.exceptions.ConnectionClosedByBroker)) as e:
            ch.exchange_declare("dx.bad", "x-delayed-message", arguments=args)
        assert e.value.reply_code == code
    finally:
        if conn.is_open:
            conn.close()


def test_held_message_does_not_go_to_alternate_exchange(broker) -> None:
    with channel(broker.url) as ch:
        ch.exchange_declare("dx5.ae", "fanout")
        ch.queue_declare("dx5.unrouted")
        ch.queue_bind("dx5.unrouted", "dx5.ae")
        ch.exchange_declare("dx5", "x-delayed-message", arguments={
            "x-delayed-type": "direct", "alternate-exchange": "dx5.ae"})
        ch.queue_declare("dx5.q")
        ch.queue_bind("dx5.q", "dx5", "k")
        ch.basic_publish("dx5", "k", b"held", pika.BasicProperties(headers={"x-delay": 30}))
        ch.basic_publish("dx5", "other", b"lost", pika.BasicProperties(
            headers={"x-delay": 30}))
        assert get_msg(ch, "dx5.q")[2] == b"held"
        # due and unroutable: now it is the alternate exchange's
        assert get_msg(ch, "dx5.unrouted")[2] == b"lost"
        assert count(ch, "dx5.unrouted") == 0


def test_held_through_exchange_binding_is_not_returned(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        returned: list[bytes] = []
        ch.add_on_return_callback(lambda c, m, p, b: returned.append(b))
        _delayed(ch, "dx6")
        ch.exchange_declare("dx6.front", "fanout")
        ch.exchange_bind("dx6", "dx6.front")
        ch.queue_declare("dx6.q")
        ch.queue_bind("dx6.q", "dx6", "k")
        ch.confirm_delivery()
        ch.basic_publish("dx6.front", "k", b"via-e2e", pika.BasicProperties(
            headers={"x-delay": 30}), mandatory=True)
        assert get_msg(ch, "dx6.q")[2] == b"via-e2e"
        conn.process_data_events(0)
        assert returned == []
    finally:
        conn.close()
