"""The broker core driven by kombu (py-amqp transport) against a real amqpd."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import amqp
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

from tests.support.brokerproc import BrokerProcess


def uname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def conn(broker: BrokerProcess) -> Iterator[Connection]:
    c = Connection(f"pyamqp://guest:guest@127.0.0.1:{broker.port}//", connect_timeout=5)
    c.connect()
    yield c
    c.release()


def test_connect_with_amqplain(broker: BrokerProcess) -> None:
    c = amqp.Connection(f"127.0.0.1:{broker.port}", userid="guest", password="guest",
                        login_method="AMQPLAIN", connect_timeout=5)
    c.connect()
    try:
        assert c.server_capabilities["publisher_confirms"] is True
        assert c.channel_max == 2047 or c.channel_max > 0
    finally:
        c.close()


def test_wrong_password_is_refused(broker: BrokerProcess) -> None:
    c = amqp.Connection(f"127.0.0.1:{broker.port}", userid="guest", password="nope",
                        connect_timeout=5)
    with pytest.raises(amqp.exceptions.AccessRefused):
        c.connect()


def test_publish_consume_ack(conn: Connection) -> None:
    exchange = Exchange(uname("kx"), type="direct", auto_delete=True)
    queue = Queue(uname("kq"), exchange, routing_key="rk", exclusive=True)
    channel = conn.channel()
    queue(channel).declare()
    producer = Producer(channel, exchange)
    for n in range(10):
        producer.publish({"n": n}, routing_key="rk", serializer="json")
    got: list[int] = []

    def on_message(body: dict, message) -> None:
        got.append(body["n"])
        message.ack()

    with Consumer(channel, [queue], callbacks=[on_message], prefetch_count=3):
        for _ in range(100):
            if len(got) == 10:
                break
            conn.drain_events(timeout=5)
    assert got == list(range(10))


def test_topic_routing_and_get(conn: Connection) -> None:
    channel = conn.channel()
    exchange = Exchange(uname("ktopic"), type="topic", auto_delete=True)
    queue = Queue(uname("ktq"), exchange, routing_key="logs.*.error", exclusive=True)
    bound = queue(channel)
    bound.declare()
    producer = Producer(channel, exchange)
    for key in ("logs.web.error", "logs.web.info", "logs.db.error", "logs.error"):
        producer.publish(key, routing_key=key, serializer="json")
    got = []
    for _ in range(10):
        msg = bound.get(no_ack=True)
        if msg is None:
            break
        got.append(msg.payload)
    assert got == ["logs.web.error", "logs.db.error"]


def test_reject_requeue_and_purge(conn: Connection) -> None:
    channel = conn.channel()
    queue = Queue(uname("kpurge"), exclusive=True)
    bound = queue(channel)
    bound.declare()
    Producer(channel).publish("x", routing_key=queue.name, serializer="json")
    msg = bound.get()
    assert not msg.delivery_info["redelivered"]
    msg.requeue()
    msg = bound.get()
    assert msg.delivery_info["redelivered"]
    msg.ack()
    Producer(channel).publish("y", routing_key=queue.name, serializer="json")
    assert bound.purge() == 1
    assert bound.get() is None


def test_confirm_publish(broker: BrokerProcess) -> None:
    with Connection(f"pyamqp://guest:guest@127.0.0.1:{broker.port}//",
                    transport_options={"confirm_publish": True}) as c:
        channel = c.channel()
        queue = Queue(uname("kconfirm"), exclusive=True)
        queue(channel).declare()
        producer = Producer(channel)
        for _ in range(5):
            producer.publish("c", routing_key=queue.name, serializer="json")
        assert queue(channel).queue_declare(passive=True).message_count == 5


def test_channel_error_is_404_and_connection_survives(conn: Connection) -> None:
    channel = conn.channel()
    with pytest.raises(amqp.exceptions.NotFound):
        channel.queue_declare(uname("missing"), passive=True)
    channel = conn.channel()
    channel.queue_declare(uname("fine"), exclusive=True)
