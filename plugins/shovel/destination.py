"""Where a shovel puts messages: an exchange (with a key), a queue, or the original route.

Two kinds: :class:`AMQPDestination` (any broker, over AMQP) here, and
:class:`~plugins.shovel.local.LocalDestination` (``amqp://`` without a host: this node,
through the broker API, one publish per destination queue).

:class:`AMQPDestination` publishes without awaiting each confirm: publishes get sequence
numbers (1, 2, ... on a channel in confirm mode, as the broker counts them) and the
broker's ``basic.ack``/``basic.nack`` (``multiple`` or not) are reported to the runner by
number. A burst of messages goes out in one socket write, and properties are written
back byte for byte as they were received (see :mod:`plugins.shovel.wire`). Towards an
amqpd that offers ``publish_retry_of`` it announces the capability (:attr:`retry_of`),
and the runner's retries name their first try, so that broker puts a retry only into
the queues of its route that did not take it (docs/shovel.md).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from typing import Any

from pamqp import commands as spec

from plugins.common.taken import Pass
from plugins.shovel.params import ShovelDef
from plugins.shovel.source import _either
from plugins.shovel.wire import Connection, NotFound

# (sequence number, multiple, ack?) for each confirm from the destination
OnConfirm = Callable[[int, bool, bool], None]
Message = tuple[str, str, bytes, bytes]  # exchange, routing key, raw properties, body


class Destination(abc.ABC):
    """Where the runner publishes. Sequence numbers count publishes from 1 per attempt;
    ``seq`` is the last one handed out (the runner maps the next ones to source
    deliveries before it calls :meth:`publish_many`, so no confirm can come first)."""

    seq: int
    # a retry may name its first try (RETRY_OF_HEADER): the destination broker then puts
    # it only into the queues that did not take that try (amqpd announced RETRY_OF)
    retry_of: bool = False

    @abc.abstractmethod
    async def open(self, on_confirm: OnConfirm | None) -> None:
        """Connect and declare; with on_confirm, in confirm mode."""

    @abc.abstractmethod
    async def publish_many(self, messages: list[Message],
                           records: list[Pass | None] | None = None) -> int:
        """Write messages; the first one's confirm sequence number. ``records``: for a
        destination that publishes per queue, each message's record of the queues that
        took it and whether the source redelivered it (:mod:`plugins.common.taken`);
        others ignore it."""

    @abc.abstractmethod
    def closed(self) -> asyncio.Future[Any]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


class AMQPDestination(Destination):
    def __init__(self, defn: ShovelDef, uri: str) -> None:
        self.defn = defn
        self.uri = uri
        self.conn: Connection | None = None
        self.channel = 0
        self.seq = 0

    async def open(self, on_confirm: OnConfirm | None) -> None:
        d = self.defn
        conn = self.conn = await Connection.open(self.uri, retry_of=True)
        self.retry_of = conn.retry_of
        ch = await conn.channel()
        if d.dest_queue is not None:
            try:
                await conn.queue_declare(ch, d.dest_queue, passive=True)
            except NotFound:
                ch = await conn.channel()
                await conn.queue_declare(ch, d.dest_queue, durable=True,
                                         arguments=d.dest_queue_args or None)
        elif d.dest_exchange:
            # never declared: a missing exchange fails the shovel (404), as in RabbitMQ
            await conn.exchange_declare(ch, d.dest_exchange, passive=True)
        if on_confirm is not None:
            await conn.rpc(ch, spec.Confirm.Select())
            conn.on_confirm[ch] = on_confirm
        self.channel = ch
        self.seq = 0

    async def publish_many(self, messages: list[Message],
                           records: list[Pass | None] | None = None) -> int:
        conn = self.conn
        assert conn is not None
        out = bytearray()
        for exchange, routing_key, properties, body in messages:
            conn.publish_frames(self.channel, exchange, routing_key, properties, body, out)
        first = self.seq + 1
        self.seq += len(messages)
        conn.write(out)
        await conn.drain()  # the peer reads slower than we write: wait (backpressure)
        return first

    def closed(self) -> asyncio.Future[Any]:
        assert self.conn is not None
        return _either(self.conn.closed, self.conn.channel_closed(self.channel))

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
