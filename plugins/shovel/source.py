"""Where a shovel takes messages from: a queue (or an exchange, through a queue it declares).

:class:`Source` is the contract the runner uses (like LavinMQ's ``Shovel::Source`` and
RabbitMQ's ``rabbit_shovel_behaviour``); :class:`AMQPSource` implements it over the
pass-through client in :mod:`plugins.shovel.wire`, so the far end may be amqpd or
RabbitMQ. Deliveries reach the callback in the order the broker sent them; settlement is
by delivery tag, ``multiple`` when the runner can.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any

from plugins.shovel.params import ShovelDef
from plugins.shovel.wire import Connection, Delivery, NotFound

OnMessage = Callable[[Delivery], None]


class Source(abc.ABC):
    @abc.abstractmethod
    async def open(self, on_message: OnMessage) -> None:
        """Connect, declare, and start consuming; on_message gets each delivery."""

    @abc.abstractmethod
    async def stop_consuming(self) -> None:
        """No more deliveries (a planned stop: those in hand are settled first)."""

    @abc.abstractmethod
    def ack(self, delivery_tag: int, multiple: bool) -> None: ...

    @abc.abstractmethod
    def nack(self, delivery_tag: int, requeue: bool = True) -> None: ...

    @abc.abstractmethod
    def closed(self) -> asyncio.Future[Any]:
        """Done when the link is gone (connection or channel closed, consumer cancelled)."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class AMQPSource(Source):
    def __init__(self, defn: ShovelDef, uri: str) -> None:
        self.defn = defn
        self.uri = uri
        self.conn: Connection | None = None
        self.channel = 0
        self.queue = ""
        self.initial_length = 0  # the queue's length when the shovel started consuming
        self.consumer_tag = ""
        self._cancelled: asyncio.Future[Any] | None = None

    async def open(self, on_message: OnMessage) -> None:
        d = self.defn
        conn = self.conn = await Connection.open(self.uri)
        ch = self.channel = await conn.channel()
        if d.src_exchange is not None:
            ok = await conn.queue_declare(ch, "", exclusive=True, auto_delete=True)
            self.queue = ok.queue
            await conn.queue_bind(ch, self.queue, d.src_exchange, d.src_exchange_key)
        else:
            assert d.src_queue is not None
            self.queue = d.src_queue
            try:
                ok = await conn.queue_declare(ch, self.queue, passive=True)
            except NotFound:
                # missing: declared durable (with src-queue-args when given), as RabbitMQ
                ch = self.channel = await conn.channel()
                ok = await conn.queue_declare(ch, self.queue, durable=True,
                                              arguments=d.src_queue_args or None)
            self.initial_length = ok.message_count or 0
        if d.ack_mode != "no-ack":
            await conn.basic_qos(ch, d.prefetch_count)
        cancelled = self._cancelled = asyncio.get_running_loop().create_future()

        def on_cancel(consumer_tag: str) -> None:
            # the broker cancelled the consumer (queue deleted...): this attempt is over
            if not cancelled.done():
                cancelled.set_result(f"consumer cancelled by the broker (queue '{self.queue}')")

        conn.on_delivery[ch] = on_message
        conn.on_cancel[ch] = on_cancel
        self.consumer_tag = await conn.basic_consume(
            ch, self.queue, no_ack=d.ack_mode == "no-ack",
            arguments=d.src_consumer_args or None)

    async def stop_consuming(self) -> None:
        if self.conn is not None and self.consumer_tag:
            tag, self.consumer_tag = self.consumer_tag, ""
            await self.conn.basic_cancel(self.channel, tag)

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        assert self.conn is not None
        self.conn.ack(self.channel, delivery_tag, multiple)

    def nack(self, delivery_tag: int, requeue: bool = True) -> None:
        assert self.conn is not None
        self.conn.nack(self.channel, delivery_tag, requeue)

    def closed(self) -> asyncio.Future[Any]:
        assert self.conn is not None and self._cancelled is not None
        return _either(self.conn.closed, self.conn.channel_closed(self.channel),
                       self._cancelled)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


def _either(*futures: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """A future done when any of futures is (never raising: we only want to know *that*)."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Any] = loop.create_future()

    def done(f: asyncio.Future[Any]) -> None:
        if not out.done():
            exc = None if f.cancelled() else f.exception()
            out.set_result(exc or (None if f.cancelled() else f.result()) or "closed")

    for f in futures:
        f.add_done_callback(done)
    return out
