"""The extensions through aio-pika and kombu, as applications use them."""

from __future__ import annotations

import asyncio

import aio_pika
import kombu

from tests.integration.ext_support import wait_for


async def test_aio_pika_direct_reply_to_rpc_and_dead_letter(broker) -> None:
    conn = await aio_pika.connect(broker.url)
    async with conn:
        server_ch = await conn.channel()
        queue = await server_ch.declare_queue("aio.rpc")

        async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                assert message.reply_to is not None  # the client below always sets it
                await server_ch.default_exchange.publish(
                    aio_pika.Message(message.body[::-1], correlation_id=message.correlation_id),
                    routing_key=message.reply_to)

        await queue.consume(serve)
        client_ch = await conn.channel()
        replies: asyncio.Queue[bytes] = asyncio.Queue()
        reply_queue = await client_ch.get_queue("amq.rabbitmq.reply-to", ensure=False)
        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            replies.put_nowait(message.body)

        await reply_queue.consume(on_reply, no_ack=True)
        await client_ch.default_exchange.publish(
            aio_pika.Message(b"olleh", reply_to="amq.rabbitmq.reply-to", correlation_id="1"),
            routing_key="aio.rpc")
        assert await asyncio.wait_for(replies.get(), 5) == b"hello"

        # dead-lettering: rejected by aio-pika, x-death read back through aio-pika
        ch = await conn.channel()
        dead = await ch.declare_queue("aio.dead")
        work = await ch.declare_queue("aio.work", arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "aio.dead"})
        await ch.default_exchange.publish(aio_pika.Message(b"bad"), routing_key="aio.work")
        msg = None
        for _ in range(200):
            msg = await work.get(fail=False)
            if msg is not None:
                break
            await asyncio.sleep(0.01)
        assert msg is not None
        await msg.reject(requeue=False)
        got = None
        for _ in range(200):
            got = await dead.get(no_ack=True, fail=False)
            if got is not None:
                break
            await asyncio.sleep(0.01)
        assert got is not None
        deaths = got.headers["x-death"]
        assert isinstance(deaths, list) and isinstance(deaths[0], dict)
        assert deaths[0]["reason"] == "rejected"


def test_kombu_priority_and_ttl(broker) -> None:
    with kombu.Connection(broker.url.replace("%2F", "/").replace("amqp://", "pyamqp://")) as conn:
        exchange = kombu.Exchange("kombu.x", type="direct")
        q = kombu.Queue("kombu.prio", exchange, routing_key="p", max_priority=10,
                        message_ttl=60.0)
        producer = conn.Producer()
        for body, prio in (("low", 1), ("high", 9), ("mid", 5)):
            producer.publish(body, exchange=exchange, routing_key="p", priority=prio,
                             declare=[q])
        producer.publish("gone", exchange=exchange, routing_key="p", expiration=0.05,
                         declare=[q], priority=10)
        bound = q(conn.default_channel)
        got: list[str] = []

        def take() -> bool:
            m = bound.get(no_ack=True)
            if m is not None:
                got.append(m.payload)
            return m is None and len(got) >= 3

        # the expired head goes on time. (RabbitMQ 3.10 keeps it, and even hands it to
        # basic.get, when a priority queue's oldest message has no TTL: a bug amqpd does
        # not copy, so this assertion is amqpd's, not RabbitMQ's.)
        wait_for(lambda: bound.queue_declare(passive=True).message_count == 3, 5)
        wait_for(take, 5)
        assert got == ["high", "mid", "low"]
