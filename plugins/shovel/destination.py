"""Where a shovel puts messages: an exchange (with a key), a queue, or the original route.

:class:`AMQPDestination` publishes over aiormq without awaiting each confirm: publishes
get sequence numbers (1, 2, ... on a channel in confirm mode, as the broker counts them)
and the broker's ``basic.ack``/``basic.nack`` (``multiple`` or not) are reported to the
runner by number. aiormq's own ``basic_publish`` is not used: it awaits every confirm
and adds a ``message_id`` to messages without one, and a shovel must forward properties
exactly as it received them.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from plugins.shovel.params import ShovelDef
from plugins.shovel.source import CONNECT_TIMEOUT, _either

# (sequence number, multiple, ack?) for each confirm from the destination
OnConfirm = Callable[[int, bool, bool], None]
Message = tuple[str, str, spec.Basic.Properties, bytes]  # exchange, routing key, props, body


class Destination(abc.ABC):
    @abc.abstractmethod
    async def open(self, on_confirm: OnConfirm | None) -> None:
        """Connect and declare; with on_confirm, in confirm mode."""

    @abc.abstractmethod
    async def publish(self, exchange: str, routing_key: str,
                      properties: spec.Basic.Properties, body: bytes) -> int:
        """Write one message; its confirm sequence number."""

    @abc.abstractmethod
    def closed(self) -> asyncio.Future[Any]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


class AMQPDestination(Destination):
    def __init__(self, defn: ShovelDef, uri: str) -> None:
        self.defn = defn
        self.uri = uri
        self.conn: aiormq.abc.AbstractConnection | None = None
        self.channel: Any = None  # aiormq.Channel (its writer queue and confirm hook)
        self.seq = 0
        self.max_body = 131072 - 8

    async def open(self, on_confirm: OnConfirm | None) -> None:
        d = self.defn
        self.conn = await asyncio.wait_for(aiormq.connect(self.uri), CONNECT_TIMEOUT)
        ch: Any = await self.conn.channel(publisher_confirms=False)
        if d.dest_queue is not None:
            try:
                await ch.queue_declare(d.dest_queue, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                ch = await self.conn.channel(publisher_confirms=False)
                await ch.queue_declare(d.dest_queue, durable=True,
                                       arguments=d.dest_queue_args or None)
        elif d.dest_exchange:
            # never declared: a missing exchange fails the shovel (404), as in RabbitMQ
            await ch.exchange_declare(d.dest_exchange, passive=True)
        if on_confirm is not None:
            await ch.rpc(spec.Confirm.Select())

            async def confirm_frame(frame: spec.Basic.Ack | spec.Basic.Nack) -> None:
                on_confirm(frame.delivery_tag, bool(frame.multiple),
                           isinstance(frame, spec.Basic.Ack))

            # the channel's reader dispatches confirms through this attribute
            ch._on_confirm_frame = confirm_frame
        self.channel = ch
        self.seq = 0
        tune = getattr(self.conn, "connection_tune", None)
        if tune is not None and tune.frame_max:
            self.max_body = int(tune.frame_max) - 8

    async def publish(self, exchange: str, routing_key: str,
                      properties: spec.Basic.Properties, body: bytes) -> int:
        return await self.publish_many([(exchange, routing_key, properties, body)])

    async def publish_many(self, messages: list[Message]) -> int:
        """Write messages in one go (one socket write); the first one's sequence number."""
        ch = self.channel
        assert ch is not None
        frames: list[Any] = []
        step = self.max_body
        for exchange, routing_key, properties, body in messages:
            frames.append(spec.Basic.Publish(exchange=exchange, routing_key=routing_key))
            frames.append(ContentHeader(properties=properties, body_size=len(body)))
            frames.extend(ContentBody(body[i:i + step]) for i in range(0, len(body), step))
        first = self.seq + 1
        self.seq += len(messages)
        await ch.write_queue.put(ChannelFrame.marshall(channel_number=ch.number, frames=frames))
        return first

    def closed(self) -> asyncio.Future[Any]:
        assert self.conn is not None and self.channel is not None
        return _either(self.conn.closing, self.channel.closing)

    async def close(self) -> None:
        if self.conn is not None and not self.conn.is_closed:
            try:
                await asyncio.wait_for(self.conn.close(), 5)
            except Exception:  # already gone is fine
                pass
