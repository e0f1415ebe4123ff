"""A closed connection is freed by reference counting, not left to the cyclic collector.

Under overloaded connection churn (bench/churn_memory.py) the broker's RSS grew round
after round: every closed connection (protocol, session, connection machine, timers) was
a reference cycle, and with the broker's collector thresholds (server.tune_gc) the dead
connections piled up by the tens of thousands between old-generation collections. The
transport now breaks the cycles when the socket goes (AMQPConnection.detach). Here, with
the collector off, a connection's objects must be gone as soon as its socket is.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from pamqp import commands as C

from amqpd.protocol.connection import AMQPConnection
from amqpd.session import Session
from amqpd.transport import AMQPProtocol
from tests.support import wire
from tests.unit.protocol.peer import real_broker


def _alive() -> dict[str, int]:
    counts = {"AMQPProtocol": 0, "Session": 0, "AMQPConnection": 0}
    for o in gc.get_objects():
        if isinstance(o, AMQPProtocol | Session | AMQPConnection):
            counts[type(o).__name__] += 1
    return counts


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _frames_until(reader: asyncio.StreamReader, class_method: tuple[int, int]) -> None:
    """Read frames until the method with these ids arrives (bounded by the caller)."""
    while True:
        ftype, _channel, size = wire_header(await reader.readexactly(7))
        payload = await reader.readexactly(size + 1)
        if ftype == 1 and (int.from_bytes(payload[0:2], "big"),
                           int.from_bytes(payload[2:4], "big")) == class_method:
            return


def wire_header(raw: bytes) -> tuple[int, int, int]:
    return raw[0], int.from_bytes(raw[1:3], "big"), int.from_bytes(raw[3:7], "big")


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_a_closed_connection_leaves_no_cycle(no_collector: None, how: str) -> None:
    broker = real_broker()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: AMQPProtocol(broker), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        before = _alive()
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(wire.handshake(channel_max=16) + wire.method(1, C.Channel.Open()))
            await asyncio.wait_for(_frames_until(reader, (20, 11)), 10)  # channel.open-ok
            assert len(broker.transports) == 1
            if how == "close":
                writer.write(wire.method(0, C.Connection.Close(
                    reply_code=200, reply_text="bye", class_id=0, method_id=0)))
                await asyncio.wait_for(_frames_until(reader, (10, 51)), 10)  # close-ok
                writer.close()
            else:
                writer.transport.abort()
            for _ in range(500):  # until the broker's side has seen the socket go
                if not broker.transports:
                    break
                await asyncio.sleep(0.01)
            assert not broker.transports
            writer.close()
        await asyncio.sleep(0)  # callbacks the close scheduled
        assert _alive() == before, "closed connections wait for the cyclic collector"
    finally:
        server.close()
        await server.wait_closed()
