"""The broker core driven by aio-pika (aiormq underneath) against a real amqpd."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message

from tests.support.brokerproc import BrokerProcess

TIMEOUT = 5.0


def uname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def connection(broker: BrokerProcess) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    conn = await aio_pika.connect(broker.url, timeout=TIMEOUT)
    yield conn
    await conn.close()


async def drain(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(1000):
        msg = await queue.get(no_ack=True, fail=False, timeout=TIMEOUT)
        if msg is None:
            return out
        out.append(msg.body)
    raise AssertionError("queue never emptied")


async def test_server_properties_and_tune(connection) -> None:
    props = connection.transport.connection.server_properties
    assert props["capabilities"]["publisher_confirms"] is True
    assert props["product"] == "amqpd"
    assert connection.transport.connection.connection_tune.frame_max == 131072


async def test_publish_consume_ack_with_confirms(connection) -> None:
    channel = await connection.channel(publisher_confirms=True)
    queue = await channel.declare_queue(exclusive=True)
    for n in range(20):
        await channel.default_exchange.publish(Message(str(n).encode()), queue.name)
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.append(msg.body)
        await msg.ack()
        if len(got) == 20:
            done.set()

    tag = await queue.consume(on_message)
    await asyncio.wait_for(done.wait(), TIMEOUT)
    assert got == [str(n).encode() for n in range(20)]
    await queue.cancel(tag)


async def test_topic_headers_fanout(connection) -> None:
    channel = await connection.channel()
    topic = await channel.declare_exchange(uname("t"), ExchangeType.TOPIC, auto_delete=True)
    headers = await channel.declare_exchange(uname("h"), ExchangeType.HEADERS, auto_delete=True)
    fanout = await channel.declare_exchange(uname("f"), ExchangeType.FANOUT, auto_delete=True)
    q1 = await channel.declare_queue(exclusive=True)
    q2 = await channel.declare_queue(exclusive=True)
    await q1.bind(topic, "*.orange.#")
    await q2.bind(headers, arguments={"x-match": "any", "color": "red", "size": 3})
    await q1.bind(fanout)
    await q2.bind(fanout)
    await topic.publish(Message(b"t1"), "quick.orange.rabbit.x")
    await topic.publish(Message(b"t2"), "orange")
    await headers.publish(Message(b"h1", headers={"size": 3}), "")
    await headers.publish(Message(b"h2", headers={"size": 4}), "")
    await fanout.publish(Message(b"f"), "")
    assert await drain(q1) == [b"t1", b"f"]
    assert await drain(q2) == [b"h1", b"f"]


async def test_mandatory_return(connection) -> None:
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    with pytest.raises(aio_pika.exceptions.DeliveryError) as err:
        await channel.default_exchange.publish(Message(b"x"), uname("nobody"), mandatory=True)
    assert err.value.message is not None and err.value.message.body == b"x"


async def test_nack_requeue_redelivered_and_get_empty(connection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(exclusive=True)
    assert await queue.get(fail=False, timeout=TIMEOUT) is None
    await channel.default_exchange.publish(Message(b"again"), queue.name)
    msg = await queue.get(timeout=TIMEOUT)
    assert not msg.redelivered
    await msg.nack(requeue=True)
    msg = await queue.get(timeout=TIMEOUT)
    assert msg.redelivered and msg.body == b"again"
    await msg.reject(requeue=False)
    assert await queue.get(fail=False, timeout=TIMEOUT) is None


async def test_qos_limits_unacked(connection) -> None:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=3)
    queue = await channel.declare_queue(exclusive=True)
    for n in range(10):
        await channel.default_exchange.publish(Message(str(n).encode()), queue.name)
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    three = asyncio.Event()

    async def on_message(msg) -> None:
        got.append(msg)
        if len(got) >= 3:
            three.set()

    await queue.consume(on_message)
    await asyncio.wait_for(three.wait(), TIMEOUT)
    # a queue.declare round trip: anything the broker had in flight has arrived by now
    await channel.declare_queue(queue.name, passive=True)
    assert len(got) == 3
    await got[0].ack()
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while len(got) < 4 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert len(got) == 4


async def test_server_cancel_on_queue_delete(connection) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(uname("cancelme"), auto_delete=False)

    async def ignore(_msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        return None

    tag = await queue.consume(ignore)
    raw = await channel.get_underlay_channel()
    assert tag in raw.consumers
    other = await connection.channel()
    await other.queue_delete(queue.name)
    # aiormq forgets the consumer when the broker sends basic.cancel
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while tag in raw.consumers and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert tag not in raw.consumers
    await channel.declare_queue(exclusive=True)
    assert not channel.is_closed


async def test_channel_error_then_other_channel_works(connection) -> None:
    bad = await connection.channel()
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await bad.declare_queue(uname("missing"), passive=True)
    good = await connection.channel()
    q = await good.declare_queue(exclusive=True)
    await good.default_exchange.publish(Message(b"ok"), q.name)
    assert await drain(q) == [b"ok"]


async def test_transactions(connection) -> None:
    channel = await connection.channel(publisher_confirms=False)
    queue = await channel.declare_queue(exclusive=True)
    tx = channel.transaction()
    await tx.select()
    await channel.default_exchange.publish(Message(b"no"), queue.name)
    await tx.rollback()
    await channel.default_exchange.publish(Message(b"yes"), queue.name)
    await tx.commit()
    assert await drain(queue) == [b"yes"]


async def test_exchange_bind_and_delete_if_unused(connection) -> None:
    channel = await connection.channel()
    src = await channel.declare_exchange(uname("src"), ExchangeType.DIRECT)
    dst = await channel.declare_exchange(uname("dst"), ExchangeType.FANOUT)
    await dst.bind(src, "k")
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(dst)
    await src.publish(Message(b"e2e"), "k")
    assert await drain(queue) == [b"e2e"]
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await src.delete(if_unused=True)
    channel = await connection.channel()
    await channel.exchange_delete(src.name)
    await channel.exchange_delete(dst.name)
