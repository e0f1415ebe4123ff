"""Helpers shared by the shovel tests (no tests here): publish, count, drain, poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
from pamqp import commands as spec

from tests.integration._http import Api, q


def wait_for(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    """Poll pred until it returns something truthy, or fail with what (bounded)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def await_for(pred: Callable[[], Any], timeout: float, what: str,
                    step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def publish(url: str, queue: str, n: int, *, start: int = 0, exchange: str = "",
                  routing_key: str | None = None, declare: bool = True,
                  properties: spec.Basic.Properties | None = None, window: int = 2000) -> None:
    """n persistent messages with bodies str(i), publisher-confirmed in windows."""
    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel()
        if declare and queue:
            await ch.queue_declare(queue, durable=True)
        rk = queue if routing_key is None else routing_key
        for base in range(start, start + n, window):
            top = min(base + window, start + n)
            await asyncio.gather(*(
                ch.basic_publish(str(i).encode(), exchange=exchange, routing_key=rk,
                                 properties=properties or spec.Basic.Properties(
                                     delivery_mode=2, message_id=f"m{i}"))
                for i in range(base, top)))
    finally:
        await conn.close()


async def publish_fast(url: str, queue: str, n: int, window: int = 5000,
                       properties: spec.Basic.Properties | None = None) -> None:
    """Like publish (bodies str(i), persistent, confirmed) but pipelined: for 100k."""
    from plugins.shovel.destination import AMQPDestination
    from plugins.shovel.params import parse
    from plugins.shovel.wire import encode_properties

    defn = parse("/", "publisher", {"src-uri": url, "src-queue": queue, "dest-uri": url,
                                    "dest-queue": queue})
    confirmed = 0
    nacked = 0
    progress = asyncio.Event()

    def on_confirm(seq: int, multiple: bool, ack: bool) -> None:
        nonlocal confirmed, nacked
        if not ack:
            nacked += 1
        confirmed = seq if multiple else confirmed + 1
        progress.set()

    dest = AMQPDestination(defn, url)
    await dest.open(on_confirm)
    try:
        sent = 0
        while sent < n:
            while sent - confirmed >= window:
                progress.clear()
                await asyncio.wait_for(progress.wait(), 30)
            top = min(sent + 500, n)
            await dest.publish_many([
                ("", queue, encode_properties(properties or spec.Basic.Properties(
                    delivery_mode=2, message_id=f"m{i}")), str(i).encode())
                for i in range(sent, top)])
            sent = top
        while confirmed < n:
            progress.clear()
            await asyncio.wait_for(progress.wait(), 30)
        assert not nacked
    finally:
        await dest.close()


async def count(url: str, queue: str) -> int:
    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel()
        try:
            ok = await ch.queue_declare(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0  # not declared (yet)
        return int(ok.message_count or 0)
    finally:
        await conn.close()


async def drain(url: str, queue: str, until: int, timeout: float = 60,
                cap: float = 900) -> list[bytes]:
    """Consume (auto-ack) until `until` distinct bodies arrived and the queue is empty.

    Fails once nothing new has arrived for `timeout` seconds (the flow stopped), or after
    `cap` seconds in all: a loaded machine only slows a big drain down, and a fixed total
    for 100,000 messages failed tests on a busy machine with the messages all there."""
    bodies: list[bytes] = []
    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel()
        await ch.basic_qos(prefetch_count=2000)

        def got(message: aiormq.abc.DeliveredMessage) -> None:
            bodies.append(message.body)

        start = time.monotonic()
        deadline = start + timeout
        while True:  # the queue may not be declared yet (by the shovel)
            try:
                await ch.basic_consume(queue, got, no_ack=True)  # type: ignore[arg-type]
                break
            except aiormq.exceptions.ChannelNotFoundEntity:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
                ch = await conn.channel()
                await ch.basic_qos(prefetch_count=2000)
        await _until_drained(bodies, until, timeout, cap, start, queue,
                             lambda: _aiormq_length(ch, queue))
        return bodies
    finally:
        await conn.close()


async def _aiormq_length(ch: Any, queue: str) -> int:
    ok = await ch.queue_declare(queue, passive=True)
    return int(ok.message_count or 0)


async def _until_drained(bodies: list[bytes], until: int, timeout: float, cap: float,
                         start: float, queue: str,
                         length: Callable[[], Awaitable[int]]) -> None:
    """Wait while bodies fills up: done at `until` distinct and an empty queue; fail after
    `timeout` seconds without a new one, or `cap` seconds from start."""
    seen = -1
    deadline = start + timeout
    while True:
        now = time.monotonic()
        if len(bodies) != seen:  # progress: the stall clock starts again
            seen, deadline = len(bodies), min(now + timeout, start + cap)
        if now >= deadline:
            break
        if len(set(bodies)) >= until and not await length():
            await asyncio.sleep(0.2)  # let anything in flight land (then we stop)
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"drained {len(set(bodies))} distinct of {until} from {queue} "
                         f"(nothing new for {timeout}s, or {cap}s in all)")


async def drain_fast(url: str, queue: str, until: int, timeout: float = 60,
                     cap: float = 900) -> list[bytes]:
    """drain() of a queue that exists, through the shovel plugin's pass-through client
    (plugins/shovel/wire.py) as publish_fast publishes: a fraction of aiormq's cost per
    message, so 100,000 are read in seconds where aiormq took minutes on a busy machine.
    (It can only lose or repeat bodies, never invent one: the tests' "nothing lost"
    checks stay as strict.)"""
    from plugins.shovel.wire import Connection

    bodies: list[bytes] = []
    conn = await Connection.open(url)
    try:
        start = time.monotonic()
        ch = await conn.channel()
        conn.on_delivery[ch] = lambda delivery: bodies.append(delivery.body)
        await conn.rpc(ch, spec.Basic.Consume(queue=queue, no_ack=True))
        probe = await conn.channel()

        async def length() -> int:
            ok = await conn.rpc(probe, spec.Queue.Declare(queue=queue, passive=True))
            return int(ok.message_count or 0)

        await _until_drained(bodies, until, timeout, cap, start, queue, length)
        return bodies
    finally:
        await conn.close()


async def await_progress(measure: Callable[[], Any], done: Callable[[int], bool],
                         stall: float, what: str, cap: float = 900,
                         step: float = 0.2) -> int:
    """Poll the number measure() returns until done(number); fail when it has not changed
    for `stall` seconds (stuck) or after `cap` seconds in all. For waits on a flow of
    messages, whose speed is the machine's, not the code's."""
    start = time.monotonic()
    deadline = start + stall
    last: int | None = None
    while True:
        value = measure()
        if asyncio.iscoroutine(value):
            value = await value
        if done(value):
            return int(value)
        now = time.monotonic()
        if value != last:
            last, deadline = value, min(now + stall, start + cap)
        if now >= deadline:
            raise AssertionError(f"timed out waiting for {what}: stuck at {last} for "
                                 f"{stall}s (or {cap}s in all)")
        await asyncio.sleep(step)


async def get_one(url: str, queue: str, timeout: float = 10) -> aiormq.abc.DeliveredMessage:
    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = await ch.basic_get(queue, no_ack=True)
            except aiormq.exceptions.ChannelNotFoundEntity:  # not declared yet
                ch = await conn.channel()
            else:
                if isinstance(msg.delivery, spec.Basic.GetOk):
                    return msg
            await asyncio.sleep(0.05)
        raise AssertionError(f"no message in {queue}")
    finally:
        await conn.close()


def shovels(api: Api, vhost: str | None = None) -> list[dict[str, Any]]:
    path = "/api/shovels" + ("" if vhost is None else "/" + q(vhost))
    r = api.get(path)
    assert r.status == 200, r.text
    return list(r.json())


def shovel_state(api: Api, name: str, vhost: str = "/") -> str | None:
    r = api.get(f"/api/shovels/vhost/{q(vhost)}/{q(name)}")
    return r.json()["state"] if r.status == 200 else None


def set_shovel(api: Api, name: str, value: dict[str, Any], vhost: str = "/") -> None:
    r = api.put(f"/api/parameters/shovel/{q(vhost)}/{q(name)}", {"value": value})
    assert r.status in (201, 204), r.text
