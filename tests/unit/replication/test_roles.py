"""RoleHooks, as the etcd election drives them: two brokers in one event loop trade the
active role back and forth (fence, promote, demote_and_follow) and nothing confirmed is
lost; a fenced node's clients are closed with 320 CONNECTION_FORCED."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from amqpd.config import ReplicationConfig, Settings
from amqpd.server import Broker

aio_pika = pytest.importorskip("aio_pika", reason="aio-pika is not installed")


async def until(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def _broker(d: Path, name: str) -> Broker:
    rc = ReplicationConfig(node_name=name, listen="127.0.0.1:0", peers=["127.0.0.1:1"],
                           secret="s", role="auto", etcd=["http://127.0.0.1:1"],
                           max_lag=2.0, insync_timeout=5.0)
    return Broker(Settings(bind="127.0.0.1", port=0, data_dir=str(d), management=False,
                           node_name=name, replication=rc))


def _addr(b: Broker) -> str:
    assert b.roles is not None and b.roles.source is not None
    return f"127.0.0.1:{b.roles.source.port}"


async def _publish(b: Broker, bodies: list[bytes]) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{b.port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("rq", durable=True)
        await asyncio.gather(*(ch.default_exchange.publish(
            aio_pika.Message(x, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "rq")
            for x in bodies))
    finally:
        await conn.close()


def _in_sync(active: Broker) -> bool:
    src = active.roles.source
    return src is not None and src.insync_count() == 1 and \
        src.standbys()[0].acked_seq >= src.last_seq


async def test_roles_change_back_and_forth(tmp_path: Path) -> None:
    a, b = _broker(tmp_path / "a", "a"), _broker(tmp_path / "b", "b")
    await a.start()
    await b.start()
    try:
        assert a.roles.role == "starting" and not a.listeners  # auto: the election decides
        await a.roles.start_as_active(1)
        await b.roles.start_as_standby(_addr(a), 1)
        await until(lambda: _in_sync(a))
        first = [b"one-%d" % i for i in range(200)]
        await _publish(a, first)

        # a client of the active is closed with 320 when the node is fenced
        client = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{a.port}/")
        closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

        def on_close(_client: object, exc: BaseException | None) -> None:
            if not closed.done():
                closed.set_result(exc)
        client.close_callbacks.add(on_close)
        await until(lambda: _in_sync(a))
        await a.roles.fence()
        exc = await asyncio.wait_for(closed, 10)
        assert "320" in repr(exc) or "CONNECTION_FORCED" in repr(exc)
        assert a.roles.role == "fenced" and not a.listeners

        await b.roles.promote(2)
        await a.roles.demote_and_follow(_addr(b), 2)
        # the log is closed; the in-memory store stands in (a standby writes nothing)
        assert not a.store.on_disk and a.roles.role == "standby"
        await until(lambda: _in_sync(b))
        second = [b"two-%d" % i for i in range(200)]
        await _publish(b, second)  # confirmed: a is b's in-sync standby now
        await until(lambda: _in_sync(b))

        await b.roles.fence()
        await a.roles.promote(3)
        assert a.roles.history.entries == [(1, 1), (2, a.roles.history.entries[1][1]),
                                           (3, a.roles.history.entries[2][1])]
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{a.port}/")
        try:
            ch = await conn.channel()
            q = await ch.declare_queue("rq", durable=True, passive=True)
            got = []
            for _ in range(401):
                m = await q.get(no_ack=True, fail=False)
                if m is None:
                    break
                got.append(m.body)
            assert got == first + second
        finally:
            await conn.close()
    finally:
        await b.stop()
        await a.stop()
