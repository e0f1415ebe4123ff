"""Priority queues, consumer priorities and single active consumer."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.ext_support import channel, drain, wait_for


def _pub(ch, queue: str, body: bytes, priority: int | None = None) -> None:
    ch.basic_publish("", queue, body, pika.BasicProperties(priority=priority))


def test_priority_order_and_cap(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("pri.q1", arguments={"x-max-priority": 5})
        for body, prio in ((b"p1", 1), (b"none", None), (b"p9", 9), (b"p5", 5), (b"p1b", 1)):
            _pub(ch, "pri.q1", body, prio)
        # 9 is capped at 5 and stays FIFO with the other 5; no priority means 0
        assert drain(ch, "pri.q1") == [b"p9", b"p5", b"p1", b"p1b", b"none"]


def test_requeue_returns_to_place_in_its_priority(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("pri.q2", arguments={"x-max-priority": 3})
        for body, prio in ((b"a2", 2), (b"b2", 2), (b"c1", 1)):
            _pub(ch, "pri.q2", body, prio)
        m, _p, body = ch.basic_get("pri.q2", auto_ack=False)
        assert body == b"a2"
        ch.basic_nack(m.delivery_tag, requeue=True)
        m, _p, body = ch.basic_get("pri.q2", auto_ack=True)
        assert body == b"a2" and m.redelivered
        assert drain(ch, "pri.q2") == [b"b2", b"c1"]


def test_invalid_max_priority_is_406(broker) -> None:
    with channel(broker.url) as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("pri.bad", arguments={"x-max-priority": 256})
    assert e.value.reply_code == 406 and "{max_value_exceeded,256}" in e.value.reply_text


def test_consumer_priority_high_gets_all_while_it_has_credit(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("pri.cq")
        got: dict[str, list[bytes]] = {"low": [], "high": []}
        ch.basic_consume("pri.cq", lambda c, m, p, b: got["low"].append(b), auto_ack=True)
        ch.basic_consume("pri.cq", lambda c, m, p, b: got["high"].append(b), auto_ack=True,
                         arguments={"x-priority": 10})
        for i in range(20):
            _pub(ch, "pri.cq", str(i).encode())
        wait_for(lambda: (ch.connection.process_data_events(0.01),
                          len(got["high"]) + len(got["low"]) == 20)[1], 5)
        assert len(got["high"]) == 20 and got["low"] == []


def test_single_active_consumer_and_failover(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch_a, ch_b = conn.channel(), conn.channel()
        ch_a.basic_qos(prefetch_count=1)
        ch_a.queue_declare("pri.sac", arguments={"x-single-active-consumer": True})
        got: dict[str, list[bytes]] = {"a": [], "b": []}
        ch_a.basic_consume("pri.sac", lambda c, m, p, b: got["a"].append(b))  # never acks
        def take_and_ack(c: BlockingChannel, m: pika.spec.Basic.Deliver,
                         _p: pika.BasicProperties, b: bytes) -> None:
            got["b"].append(b)
            c.basic_ack(m.delivery_tag)
        ch_b.basic_consume("pri.sac", take_and_ack)
        for i in range(3):
            _pub(ch_b, "pri.sac", str(i).encode())
        wait_for(lambda: (conn.process_data_events(0.01), got["a"])[1], 3)
        conn.process_data_events(0.1)
        assert got == {"a": [b"0"], "b": []}  # only the active consumer, prefetch 1
        ch_a.close()  # failover: b takes over, starting with a's requeued message
        wait_for(lambda: (conn.process_data_events(0.01), len(got["b"]) == 3)[1], 3)
        assert got["b"] == [b"0", b"1", b"2"]
    finally:
        conn.close()


def test_single_active_consumer_argument_type(broker) -> None:
    with channel(broker.url) as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("pri.sacbad", arguments={"x-single-active-consumer": 1})
    assert "{unacceptable_type,signedint}" in e.value.reply_text


def test_expired_message_behind_higher_priority_is_never_delivered(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("pri.ttl", arguments={"x-max-priority": 5})
        ch.queue_declare("pri.clock", arguments={"x-message-ttl": 150})
        ch.basic_publish("", "pri.ttl", b"high", pika.BasicProperties(priority=5))
        ch.basic_publish("", "pri.ttl", b"low", pika.BasicProperties(priority=1,
                                                                     expiration="50"))
        ch.basic_publish("", "pri.clock", b"tick")
        wait_for(lambda: ch.queue_declare("pri.ttl", passive=True).method.message_count == 2,
                 3)
        # (like RabbitMQ 3.10, "low" waits behind the unexpired head until it is the head)
        wait_for(lambda: ch.queue_declare("pri.clock", passive=True).method.message_count == 0,
                 3)  # > 50 ms later
        assert drain(ch, "pri.ttl") == [b"high"]
