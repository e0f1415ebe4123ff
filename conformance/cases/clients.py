"""Other client libraries work unchanged: kombu (Celery's transport, over py-amqp) and
aio-pika (over aiormq). Skipped when the library is not installed."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from conformance.framework import Context, Skip, case, eq

A = "clients"


def _lib(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise Skip(f"{name} is not installed")


@case("kombu/simple-queue-round-trip", A)
def kombu_simple(ctx: Context) -> None:
    kombu = _lib("kombu")
    q = ctx.name()
    ctx.track_queue(q)
    with kombu.Connection(ctx.settings.url, connect_timeout=5) as conn:
        sq = conn.SimpleQueue(q)
        sq.put({"task": "add", "args": [1, 2]}, serializer="json")
        msg = sq.get(block=True, timeout=5)
        msg.ack()
        eq(msg.payload, {"task": "add", "args": [1, 2]}, "payload")
        sq.close()


@case("kombu/producer-consumer-with-topic-exchange", A)
def kombu_topic(ctx: Context) -> None:
    kombu = _lib("kombu")
    xname, qname = ctx.name("x"), ctx.name()
    ctx.track_exchange(xname)
    ctx.track_queue(qname)
    exchange = kombu.Exchange(xname, type="topic", durable=False)
    queue = kombu.Queue(qname, exchange, routing_key="celery.#", durable=False)
    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        message.ack()

    with kombu.Connection(ctx.settings.url, connect_timeout=5) as conn:
        with conn.Producer() as producer:
            producer.publish({"n": 1}, exchange=exchange, routing_key="celery.task",
                             declare=[queue], serializer="json")
        with conn.Consumer(queue, callbacks=[on_message]):
            conn.drain_events(timeout=5)
    eq(got, [{"n": 1}], "consumed bodies")


@case("kombu/publish-with-confirms-and-headers", A)
def kombu_confirm(ctx: Context) -> None:
    kombu = _lib("kombu")
    qname = ctx.name()
    ctx.track_queue(qname)
    with kombu.Connection(ctx.settings.url, connect_timeout=5,
                          transport_options={"confirm_publish": True}) as conn:
        queue = kombu.Queue(qname, durable=False)
        with conn.Producer() as producer:
            producer.publish("hello", routing_key=qname, declare=[queue],
                             headers={"x-app": "celery"}, serializer="raw")
        sq = conn.SimpleQueue(queue)
        msg = sq.get(block=True, timeout=5)
        body = msg.body.encode() if isinstance(msg.body, str) else msg.body
        eq((body, msg.headers.get("x-app")), (b"hello", "celery"), "body/header")
        msg.ack()
        sq.close()


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 15))


@case("aio-pika/publish-consume-with-confirms", A)
def aio_pika_basic(ctx: Context) -> None:
    aio_pika = _lib("aio_pika")
    qname = ctx.name()
    ctx.track_queue(qname)

    async def main() -> list[bytes]:
        conn = await aio_pika.connect(ctx.settings.url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(qname)
            for i in range(5):
                await ch.default_exchange.publish(aio_pika.Message(body=b"%d" % i), qname)
            out = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        out.append(message.body)
                    if len(out) == 5:
                        break
            return out

    eq(_run(main()), [b"%d" % i for i in range(5)], "bodies")


@case("aio-pika/topic-exchange-and-reject-to-dlx", A)
def aio_pika_dlx(ctx: Context) -> None:
    aio_pika = _lib("aio_pika")
    xname, qname, dlq = ctx.name("x"), ctx.name(), ctx.name()
    ctx.track_exchange(xname)
    ctx.track_queue(qname)
    ctx.track_queue(dlq)

    async def main() -> bytes:
        conn = await aio_pika.connect(ctx.settings.url)
        async with conn:
            ch = await conn.channel()
            x = await ch.declare_exchange(xname, aio_pika.ExchangeType.TOPIC)
            dead = await ch.declare_queue(dlq)
            q = await ch.declare_queue(qname, arguments={
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
            await q.bind(x, "a.*")
            await x.publish(aio_pika.Message(body=b"bad"), "a.b")
            msg = await q.get(timeout=5)
            await msg.reject(requeue=False)
            for _ in range(50):
                got = await dead.get(fail=False)
                if got is not None:
                    await got.ack()
                    return bytes(got.body)
                await asyncio.sleep(0.05)
            return b""

    eq(_run(main()), b"bad", "dead-lettered body")


@case("aio-pika/rpc-over-direct-reply-to", A)
def aio_pika_rpc(ctx: Context) -> None:
    aio_pika = _lib("aio_pika")
    qname = ctx.name()
    ctx.track_queue(qname)

    async def main() -> bytes:
        conn = await aio_pika.connect(ctx.settings.url)
        async with conn:
            ch = await conn.channel()
            server_q = await ch.declare_queue(qname)

            async def serve(message: Any) -> None:
                async with message.process():
                    await ch.default_exchange.publish(
                        aio_pika.Message(body=message.body.upper(),
                                         correlation_id=message.correlation_id),
                        message.reply_to)

            await server_q.consume(serve)
            reply_q = await ch.get_queue("amq.rabbitmq.reply-to", ensure=False)
            fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def on_reply(message: Any) -> None:
                if not fut.done():
                    fut.set_result(bytes(message.body))

            await reply_q.consume(on_reply, no_ack=True)
            await ch.default_exchange.publish(
                aio_pika.Message(body=b"ping", reply_to="amq.rabbitmq.reply-to",
                                 correlation_id="1"), qname)
            return await asyncio.wait_for(fut, 5)

    eq(_run(main()), b"PING", "reply")
