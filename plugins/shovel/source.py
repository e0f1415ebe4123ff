"""Where a shovel takes messages from: a queue (or an exchange, through a queue it declares).

:class:`Source` is the contract the runner uses (like LavinMQ's ``Shovel::Source`` and
RabbitMQ's ``rabbit_shovel_behaviour``); :class:`AMQPSource` implements it over aiormq, so
the far end may be amqpd or RabbitMQ. Deliveries are handed to a callback in the order
the broker sent them; settlement is by delivery tag, ``multiple`` when the runner can.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from plugins.shovel.params import ShovelDef

CONNECT_TIMEOUT = 10.0
FRAME_BUFFER = 4096

OnMessage = Callable[[DeliveredMessage], None]


class Source(abc.ABC):
    @abc.abstractmethod
    async def open(self, on_message: OnMessage) -> None:
        """Connect, declare, and start consuming; on_message gets each delivery."""

    @abc.abstractmethod
    async def ack(self, delivery_tag: int, multiple: bool) -> None: ...

    @abc.abstractmethod
    async def nack(self, delivery_tag: int, requeue: bool = True) -> None: ...

    @abc.abstractmethod
    def closed(self) -> asyncio.Future[Any]:
        """Done when the link is gone (connection or channel closed)."""

    @abc.abstractmethod
    async def close(self) -> None: ...


class AMQPSource(Source):
    def __init__(self, defn: ShovelDef, uri: str) -> None:
        self.defn = defn
        self.uri = uri
        self.conn: aiormq.abc.AbstractConnection | None = None
        self.channel: Any = None  # aiormq.Channel
        self.queue = ""
        self.initial_length = 0  # the queue's length when the shovel started consuming
        self._cancelled: asyncio.Future[Any] | None = None

    async def open(self, on_message: OnMessage) -> None:
        d = self.defn
        self.conn = await asyncio.wait_for(aiormq.connect(self.uri), CONNECT_TIMEOUT)
        ch = await self._channel()
        if d.src_exchange is not None:
            ok = await ch.queue_declare("", exclusive=True, auto_delete=True)
            self.queue = ok.queue or ""
            await ch.queue_bind(self.queue, d.src_exchange, routing_key=d.src_exchange_key)
        else:
            assert d.src_queue is not None
            self.queue = d.src_queue
            try:
                ok = await ch.queue_declare(self.queue, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                # missing: declared durable (with src-queue-args when given), as RabbitMQ
                ch = await self._channel()
                ok = await ch.queue_declare(self.queue, durable=True,
                                            arguments=d.src_queue_args or None)
            self.initial_length = ok.message_count or 0
        if d.ack_mode != "no-ack":
            await ch.basic_qos(prefetch_count=d.prefetch_count)

        def deliver(message: DeliveredMessage) -> Any:
            on_message(message)
            return None

        if hasattr(ch, "_get_frame") and hasattr(ch, "_read_content"):
            # hand deliveries over in the channel's reader, in order, without aiormq's
            # task per message (the consumer callback above stays as the fallback)
            async def on_deliver(frame: spec.Basic.Deliver) -> None:
                header = await ch._get_frame()
                on_message(await ch._read_content(frame, header))

            ch._on_deliver_frame = on_deliver

        cancelled = self._cancelled = asyncio.get_running_loop().create_future()
        original = ch._on_cancel_frame

        async def on_cancel(frame: Any) -> None:
            # the broker cancelled the consumer (queue deleted...): this attempt is over
            if isinstance(frame, spec.Basic.Cancel) and not cancelled.done():
                cancelled.set_result(f"consumer cancelled by the broker "
                                           f"(queue '{self.queue}')")
            await original(frame)

        ch._on_cancel_frame = on_cancel
        await ch.basic_consume(self.queue, deliver, no_ack=d.ack_mode == "no-ack",
                               arguments=d.src_consumer_args or None)

    async def _channel(self) -> Any:
        assert self.conn is not None
        # room for a prefetch window of frames between the socket reader and the channel
        self.channel = await self.conn.channel(publisher_confirms=False,
                                               frame_buffer_size=FRAME_BUFFER)
        return self.channel

    async def ack(self, delivery_tag: int, multiple: bool) -> None:
        assert self.channel is not None
        await self.channel.basic_ack(delivery_tag, multiple=multiple, wait=False)

    async def nack(self, delivery_tag: int, requeue: bool = True) -> None:
        assert self.channel is not None
        await self.channel.basic_nack(delivery_tag, requeue=requeue, wait=False)

    def closed(self) -> asyncio.Future[Any]:
        assert self.conn is not None and self.channel is not None
        assert self._cancelled is not None
        return _either(self.conn.closing, self.channel.closing, self._cancelled)

    async def close(self) -> None:
        if self.conn is not None and not self.conn.is_closed:
            try:
                await asyncio.wait_for(self.conn.close(), 5)
            except Exception:  # already gone is fine
                pass


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
