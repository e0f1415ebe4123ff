"""Python client libraries on the paths where amqpd once answered differently from
RabbitMQ 3.10.8; each test runs on amqpd and on a private RabbitMQ.

- py-amqp (kombu's transport): deleting the queue one consumes from returns (it waits for
  queue.delete-ok and raises ConsumerCancelled if basic.cancel comes first);
- aio-pika: unbinding from an exchange that is gone, and the RPC pattern's cleanup;
- reopening a channel after a channel error gets the same 404 again, with py-amqp and
  with AMQPStorm (which checks exactly this in its own tests).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tests.support.targets import both_brokers

__all__ = ["both_brokers"]  # the fixture, imported for pytest

amqp = pytest.importorskip("amqp", reason="py-amqp (kombu's transport) is not installed")
aio_pika = pytest.importorskip("aio_pika", reason="aio-pika is not installed")


def _name(kind: str) -> str:
    return f"compat-{kind}-{uuid.uuid4().hex[:8]}"


def test_py_amqp_deletes_the_queue_it_consumes_from(both_brokers: int) -> None:
    conn = amqp.Connection(host=f"127.0.0.1:{both_brokers}", userid="guest",
                           password="guest", connect_timeout=5)
    conn.connect()
    try:
        ch = conn.channel()
        q = _name("q")
        ch.queue_declare(q, exclusive=True)
        ch.basic_publish(amqp.Message(b"m"), routing_key=q)
        got: list[Any] = []
        ch.basic_consume(q, callback=got.append, no_ack=True)
        for _ in range(50):
            if got:
                break
            conn.drain_events(timeout=0.1)
        assert [m.body for m in got] == [b"m"]
        assert ch.queue_delete(q) == 0  # delete-ok arrives before the cancel
        with pytest.raises(amqp.exceptions.ConsumerCancelled):
            conn.drain_events(timeout=2)  # and the cancel follows
    finally:
        conn.collect()


def test_py_amqp_reopened_channel_gets_404_again(both_brokers: int) -> None:
    conn = amqp.Connection(host=f"127.0.0.1:{both_brokers}", userid="guest",
                           password="guest", connect_timeout=5)
    conn.connect()
    try:
        missing = _name("missing")
        for _ in range(3):
            ch = conn.channel(1)
            with pytest.raises(amqp.exceptions.NotFound):
                ch.queue_declare(missing, passive=True)
    finally:
        conn.close()


def test_aio_pika_unbind_of_what_is_gone_and_rpc_cleanup(both_brokers: int) -> None:
    from aio_pika.patterns import RPC

    url = f"amqp://guest:guest@127.0.0.1:{both_brokers}/"

    async def multiply(*, x: int, y: int) -> int:
        return x * y

    async def main() -> tuple[int, bool]:
        conn = await aio_pika.connect(url)
        async with conn:
            ch = await conn.channel()
            rpc = await RPC.create(ch)
            name = _name("rpc")
            await rpc.register(name, multiply, auto_delete=True)
            product = await rpc.call(name, kwargs={"x": 6, "y": 7})
            await rpc.close()
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            x = await ch.declare_exchange(_name("x"), auto_delete=True)
            await q.bind(x, "k")
            await x.delete()  # the binding goes with it
            await q.unbind(x, "k")  # RabbitMQ 3.10: unbind-ok for a gone exchange
            await q.unbind(_name("never"), "k")
            return product, not ch.is_closed

    product, open_after = asyncio.run(asyncio.wait_for(main(), 30))
    assert (product, open_after) == (42, True)


def test_amqpstorm_reopened_channel_gets_404_again(both_brokers: int) -> None:
    amqpstorm = pytest.importorskip("amqpstorm", reason="AMQPStorm is not installed")
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=both_brokers, timeout=5)
    try:
        ch = conn.channel()
        missing = _name("missing")
        codes = []
        for _ in range(3):
            with pytest.raises(amqpstorm.AMQPChannelError) as err:
                ch.queue.declare(missing, passive=True)
            codes.append(err.value.error_code)
            ch.open()  # the same channel number, at once
        assert codes == [404, 404, 404]
        assert ch.channel_id == 1
    finally:
        conn.close()
