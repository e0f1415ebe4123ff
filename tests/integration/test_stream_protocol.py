"""The RabbitMQ Stream protocol (port 5552) with real clients, on amqpd and on a private
RabbitMQ 3.10.8 with ``rabbitmq_stream`` enabled (skipped with the reason where
rabbitmq-server is missing): rstream and rbfly from PyPI, unchanged; aio-pika for the
same streams over AMQP 0-9-1; raw sockets for bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

rstream = pytest.importorskip("rstream", reason="rstream (test extra) is not installed")

from devtools.rabbitmq import (  # noqa: E402
    RabbitMQNotInstalled,
    find_server,
    free_ports,
    start,
    stop,
)
from tests.support.brokerproc import BrokerProcess  # noqa: E402

AMQPMessage = rstream.AMQPMessage
OffsetSpec = rstream.ConsumerOffsetSpecification
OffsetType = rstream.OffsetType
DEADLINE = 20.0


@dataclass
class Target:
    kind: str
    amqp_port: int
    stream_port: int
    restart: Any  # () -> None, keeps the data; the ports are read again after it
    http_url: str = ""  # amqpd's management API (amqpctl); empty for RabbitMQ
    log_path: Path | None = None  # amqpd's log


@pytest.fixture(scope="module", params=["amqpd", "rabbitmq"])
def target(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    if request.param == "amqpd":
        (stream_port,) = free_ports(1)
        proc = BrokerProcess(tmp_path_factory.mktemp("amqpd"),
                             extra_args=["--stream-port", str(stream_port)])
        proc.start()
        t = Target("amqpd", proc.port, stream_port, None, proc.http_url, proc.log_path)

        def restart_amqpd() -> None:
            proc.stop()
            proc.restart()
            t.amqp_port = proc.port
            t.http_url = proc.http_url

        t.restart = restart_amqpd
        try:
            yield t
        finally:
            proc.stop()
        return
    try:
        find_server()
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    d = tmp_path_factory.mktemp("rabbitmq")
    info = start(d, plugins=("rabbitmq_stream",))
    t = Target("rabbitmq", info.amqp_port, info.plugin_ports["rabbitmq_stream"], None)

    def restart_rabbitmq() -> None:
        stop(d)
        again = start(d, plugins=("rabbitmq_stream",), nodename=info.nodename)
        t.amqp_port = again.amqp_port
        t.stream_port = again.plugin_ports["rabbitmq_stream"]

    t.restart = restart_rabbitmq
    try:
        yield t
    finally:
        stop(d)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _producer(t: Target) -> Any:
    return rstream.Producer("127.0.0.1", port=t.stream_port, username="guest",
                            password="guest", load_balancer_mode=True)


def _consumer(t: Target) -> Any:
    return rstream.Consumer("127.0.0.1", port=t.stream_port, username="guest",
                            password="guest", load_balancer_mode=True)


async def _publish(t: Target, stream: str, bodies: list[bytes],
                   create: bool = False) -> None:
    async with _producer(t) as p:
        if create:
            await p.create_stream(stream, exists_ok=True)
        for body in bodies:
            await p.send_wait(stream, AMQPMessage(body=body))


async def _read(t: Target, stream: str, spec: Any, want: int) -> list[tuple[int, bytes]]:
    """The first ``want`` (offset, body) a subscription with ``spec`` gets, in order."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: Any) -> None:
        got.append((ctx.offset, bytes(msg.body)))
        if len(got) >= want:
            done.set()

    async with _consumer(t) as c:
        await c.start()
        await c.subscribe(stream, on_message, decoder=rstream.amqp_decoder,
                          offset_specification=spec)
        await asyncio.wait_for(done.wait(), DEADLINE)
    return got[:want]


async def test_publish_confirmed_and_consume_from_first(target: Target) -> None:
    stream = _name("first")
    bodies = [f"m{i}".encode() for i in range(50)]
    confirmed: list[Any] = []
    async with _producer(target) as p:
        await p.create_stream(stream)
        await p.send_batch(stream, [AMQPMessage(body=b) for b in bodies[:25]],
                           on_publish_confirm=confirmed.append)
        for body in bodies[25:]:
            await p.send_wait(stream, AMQPMessage(body=body))
        deadline = time.monotonic() + DEADLINE
        while len(confirmed) < 25 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    assert len(confirmed) == 25 and all(s.is_confirmed for s in confirmed)
    got = await _read(target, stream, OffsetSpec(OffsetType.FIRST, None), 50)
    assert got == list(enumerate(bodies))


async def test_consume_from_offset_next_and_timestamp(target: Target) -> None:
    stream = _name("offsets")
    await _publish(target, stream, [f"a{i}".encode() for i in range(10)], create=True)
    got = await _read(target, stream, OffsetSpec(OffsetType.OFFSET, 7), 3)
    assert got == [(7, b"a7"), (8, b"a8"), (9, b"a9")]
    # a timestamp after the first batch: only what was published after it
    mark = int(time.time() * 1000) + 5
    deadline = time.monotonic() + 2
    while int(time.time() * 1000) <= mark + 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await _publish(target, stream, [f"b{i}".encode() for i in range(3)])
    got = await _read(target, stream, OffsetSpec(OffsetType.TIMESTAMP, mark), 3)
    assert got == [(10, b"b0"), (11, b"b1"), (12, b"b2")]
    # next: nothing old, only what comes after the subscription
    seen: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: Any) -> None:
        seen.append(bytes(msg.body))
        done.set()

    async with _consumer(target) as c:
        await c.start()
        await c.subscribe(stream, on_message, decoder=rstream.amqp_decoder,
                          offset_specification=OffsetSpec(OffsetType.NEXT, None))
        await _publish(target, stream, [b"after"])
        await asyncio.wait_for(done.wait(), DEADLINE)
    assert seen == [b"after"]


async def test_store_and_query_offset(target: Target) -> None:
    stream = _name("track")
    await _publish(target, stream, [b"x"], create=True)
    async with _consumer(target) as c:
        await c.start()
        with pytest.raises(rstream.exceptions.OffsetNotFound):
            await c.query_offset(stream, "nobody")
        await c.store_offset(stream, "app-1", 42)
        deadline = time.monotonic() + DEADLINE
        stored = -1
        while time.monotonic() < deadline:
            try:
                stored = await c.query_offset(stream, "app-1")
            except rstream.exceptions.OffsetNotFound:
                await asyncio.sleep(0.02)
                continue
            break
        assert stored == 42
        with pytest.raises(rstream.exceptions.StreamDoesNotExist):
            await c.query_offset(_name("missing"), "app-1")


def _with_id(body: bytes, publishing_id: int) -> Any:
    """A message with the publishing id the test picks (rstream's attribute)."""
    message = AMQPMessage(body=body)
    message.publishing_id = publishing_id
    return message


async def test_deduplication_across_restart(target: Target) -> None:
    stream = _name("dedup")
    async with _producer(target) as p:
        await p.create_stream(stream)
        for i in range(1, 6):
            await p.send_wait(stream, _with_id(f"d{i}".encode(), i),
                              publisher_name="writer")
    await asyncio.to_thread(target.restart)
    await _wait_available(target, stream)
    async with _producer(target) as p:
        for i in range(3, 9):  # 3..5 again: confirmed, not stored twice
            await p.send_wait(stream, _with_id(f"d{i}".encode(), i),
                              publisher_name="writer")
    got = await _read(target, stream, OffsetSpec(OffsetType.FIRST, None), 8)
    assert [b for _, b in got] == [f"d{i}".encode() for i in range(1, 9)]
    # nothing beyond the eight
    extra = await _read_all(target, stream)
    assert len(extra) == 8


async def _wait_available(t: Target, stream: str) -> None:
    """Poll until the stream answers after a restart (RabbitMQ answers
    STREAM_NOT_AVAILABLE while its stream's member starts)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            async with _consumer(t) as c:
                await c.query_offset(stream, "probe")
        except rstream.exceptions.OffsetNotFound:
            return
        except (rstream.exceptions.StreamNotAvailable, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _read_all(t: Target, stream: str) -> list[bytes]:
    """Everything in the stream: read until the offset of the last message published
    (a marker) arrives."""
    marker = uuid.uuid4().hex.encode()
    await _publish(t, stream, [marker])
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: Any) -> None:
        if bytes(msg.body) == marker:
            done.set()
        else:
            got.append(bytes(msg.body))

    async with _consumer(t) as c:
        await c.start()
        await c.subscribe(stream, on_message, decoder=rstream.amqp_decoder,
                          offset_specification=OffsetSpec(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), DEADLINE)
    return got


async def test_refusals(target: Target) -> None:
    stream = _name("refuse")
    async with _producer(target) as p:
        await p.create_stream(stream)
        with pytest.raises(rstream.exceptions.StreamAlreadyExists):
            await p.create_stream(stream)
        if target.kind == "amqpd":
            # RabbitMQ 3.10.8 never answers this create (rstream's request times out);
            # amqpd answers PRECONDITION_FAILED, as for x-max-age over AMQP 0-9-1
            with pytest.raises(rstream.exceptions.PreconditionFailed):
                await p.create_stream(_name("bad"), arguments={"max-age": "forever"})
        with pytest.raises(rstream.exceptions.StreamDoesNotExist):
            await p.send_wait(_name("missing"), AMQPMessage(body=b"x"))
        await p.delete_stream(stream)
        with pytest.raises(rstream.exceptions.StreamDoesNotExist):
            await p.delete_stream(stream)


async def test_same_stream_over_amqp_091(target: Target) -> None:
    aio_pika = pytest.importorskip("aio_pika")
    stream = _name("both")
    await _publish(target, stream, [b"from-stream"], create=True)
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{target.amqp_port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.default_exchange.publish(aio_pika.Message(b"from-amqp"), routing_key=stream)
        await ch.set_qos(prefetch_count=10)
        q = await ch.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
        bodies: list[bytes] = []
        async with q.iterator(arguments={"x-stream-offset": "first"}) as it:
            async for message in it:
                bodies.append(message.body)
                await message.ack()
                if len(bodies) == 2:
                    break
        assert bodies == [b"from-stream", b"from-amqp"]
    finally:
        await conn.close()
    got = await _read(target, stream, OffsetSpec(OffsetType.FIRST, None), 2)
    assert got == [(0, b"from-stream"), (1, b"from-amqp")]


def _frame(key: int, body: bytes, version: int = 1) -> bytes:
    payload = struct.pack(">HH", key, version) + body
    return struct.pack(">I", len(payload)) + payload


def _closed_within(sock: socket.socket, deadline: float) -> bytes:
    """What the server sent until it closed the socket (bounded by ``deadline``)."""
    data = b""
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the server did not close the connection; it sent {data!r}")


@pytest.mark.parametrize("frame", [
    _frame(0x0007, struct.pack(">I", 1)),  # subscribe before authentication
    _frame(0x7777, struct.pack(">I", 1)),  # unknown command key
    struct.pack(">I", 64 * 1024 * 1024) + b"\x00\x11\x00\x01",  # larger than frame max
], ids=["before-auth", "unknown-key", "oversize"])
def test_bad_frames_close_the_connection(target: Target, frame: bytes) -> None:
    with socket.create_connection(("127.0.0.1", target.stream_port), timeout=5) as sock:
        sock.sendall(frame)
        _closed_within(sock, time.monotonic() + DEADLINE)
    # the listener serves others still
    asyncio.run(_publish(target, _name("after-bad"), [b"ok"], create=True))


@pytest.fixture(scope="module")
def rbfly_module() -> Any:
    return pytest.importorskip("rbfly.streams", reason="rbfly (test extra) is not installed")


async def test_rbfly_publish_and_consume(target: Target, rbfly_module: Any) -> None:
    rbs = rbfly_module
    stream = _name("rbfly")
    client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:"
                                f"{target.stream_port}/")
    await client.create_stream(stream)
    async with client.publisher(stream) as publisher:  # send waits for the confirm
        for i in range(5):
            await publisher.send(f"r{i}".encode())
    got: list[Any] = []

    async def read() -> None:
        async for msg in client.subscribe(stream, offset=rbs.Offset.FIRST):
            got.append(msg)
            if len(got) == 5:
                return

    await asyncio.wait_for(read(), DEADLINE)
    assert got == [f"r{i}".encode() for i in range(5)]


def test_stream_listener_off_by_default(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path)
    proc.start()
    try:
        assert not [entry for entry in proc.info["listeners"] if entry[0] == "stream"]
        assert proc.info.get("stream_port") is None
    finally:
        proc.stop()


@pytest.mark.parametrize("compression", ["No", "Gzip"])
async def test_sub_entry_batches(target: Target, compression: str) -> None:
    stream = _name("subentry")
    kind = getattr(rstream.CompressionType, compression)
    confirmed: list[Any] = []
    async with _producer(target) as p:
        await p.create_stream(stream)
        await p.send_sub_entry(stream, [AMQPMessage(body=f"s{i}".encode())
                                        for i in range(10)],
                               compression_type=kind, on_publish_confirm=confirmed.append)
        deadline = time.monotonic() + DEADLINE
        while not confirmed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    assert confirmed and confirmed[0].is_confirmed
    got = await _read(target, stream, OffsetSpec(OffsetType.FIRST, None), 10)
    assert [b for _, b in got] == [f"s{i}".encode() for i in range(10)]


async def refused_with(producer: Any, expected: type[BaseException]) -> None:
    """``producer.start()`` fails with ``expected``: the broker's refusal. rstream
    closes its client on the way out; when the broker has already dropped the socket
    (RabbitMQ does, right after a refused open) that close raises ConnectionResetError
    with the refusal as its context, so the refusal is looked for along that chain."""
    with pytest.raises(Exception) as info:  # which one: the chain, just below
        await producer.start()
    chain: list[BaseException] = []
    exc: BaseException | None = info.value
    while exc is not None and len(chain) < 10:
        chain.append(exc)
        exc = exc.__context__
    assert any(isinstance(e, expected) for e in chain), chain
    with contextlib.suppress(OSError):
        await producer.close()


async def test_authentication_and_vhost_refusals(target: Target) -> None:
    bad = rstream.Producer("127.0.0.1", port=target.stream_port, username="guest",
                           password="wrong", load_balancer_mode=True)
    await refused_with(bad, rstream.exceptions.AuthenticationFailure)
    nohost = rstream.Producer("127.0.0.1", port=target.stream_port, username="guest",
                              password="guest", vhost="no-such-vhost",
                              load_balancer_mode=True)
    await refused_with(nohost, rstream.exceptions.VirtualHostAccessFailure)


class RawClient:
    """A stream-protocol client from raw frames, for answers the libraries hide."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        self.buffer = b""
        self.corr = 0

    def send(self, key: int, body: bytes, with_corr: bool = True) -> int:
        self.corr += 1
        corr = struct.pack(">I", self.corr) if with_corr else b""
        self.sock.sendall(_frame(key, corr + body))
        return self.corr

    def frame(self) -> tuple[int, bytes]:
        """The next frame the server sends, skipping heartbeats: (key, rest)."""
        while True:
            while len(self.buffer) < 4 or len(self.buffer) < 4 + struct.unpack_from(
                    ">I", self.buffer)[0]:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("the server closed the connection")
                self.buffer += chunk
            size = struct.unpack_from(">I", self.buffer)[0]
            frame, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
            key = struct.unpack_from(">H", frame)[0]
            if key != 0x17:
                return key, frame[4:]

    def response(self, key: int) -> tuple[int, bytes]:
        """The next response to ``key``: (response code, what follows the code)."""
        while True:
            got, rest = self.frame()
            if got == key | 0x8000:
                return struct.unpack_from(">H", rest, 4)[0], rest[6:]

    def open(self, vhost: str = "/", heartbeat: int | None = None) -> None:
        """Handshake; answer tune with the server's values (or ``heartbeat``)."""
        self.send(0x11, struct.pack(">i", 0))
        assert self.response(0x11)[0] == 1
        self.send(0x12, b"")
        assert self.response(0x12)[0] == 1
        self.send(0x13, _s("PLAIN") + struct.pack(">i", 12) + b"\x00guest\x00guest")
        assert self.response(0x13)[0] == 1
        key, rest = self.frame()
        assert key == 0x14  # tune
        if heartbeat is not None:
            rest = rest[:4] + struct.pack(">I", heartbeat)
        self.sock.sendall(_frame(0x14, rest))
        self.send(0x15, _s(vhost))
        assert self.response(0x15)[0] == 1

    def close(self) -> None:
        self.sock.close()


def _s(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def test_a_connection_deleting_its_publishers_stream(target: Target) -> None:
    """The deleting connection gets the delete's answer, then a metadata-update for its
    own publisher's stream; another connection's publisher gets the update too; a later
    publish is refused 0x12 (publisher does not exist). RabbitMQ 3.10.8 did exactly this
    (asked 2026-12-07); amqpd sent the update before the answer."""
    stream = _name("selfdel")
    a, b = RawClient(target.stream_port), RawClient(target.stream_port)
    try:
        a.open()
        b.open()
        a.send(0x0D, _s(stream) + struct.pack(">i", 0))
        assert a.response(0x0D)[0] == 0x01
        for client in (a, b):
            client.send(0x01, struct.pack(">B", 1) + _s("") + _s(stream))
            assert client.response(0x01)[0] == 0x01
        corr = a.send(0x0E, _s(stream))
        update = struct.pack(">H", 0x06) + _s(stream)
        key, rest = a.frame()
        assert (key, rest[:4], rest[4:]) == (0x800E, struct.pack(">I", corr),
                                            struct.pack(">H", 0x01))
        assert a.frame() == (0x10, update)
        assert b.frame() == (0x10, update)
        a.sock.sendall(_frame(0x02, struct.pack(">BiQi", 1, 1, 1, 3) + b"abc"))
        key, rest = a.frame()
        assert key == 0x04 and rest == struct.pack(">BiQH", 1, 1, 1, 0x12)
    finally:
        a.close()
        b.close()


def test_raw_refusals_and_metadata_update(target: Target) -> None:
    stream = _name("raw")
    client = RawClient(target.stream_port)
    try:
        client.open()
        client.send(0x0D, _s(stream) + struct.pack(">i", 0))
        assert client.response(0x0D)[0] == 0x01
        # publish for a publisher never declared: publish-error 0x12 per id
        client.send(0x02, struct.pack(">Bi", 9, 1) + struct.pack(">QI", 77, 1) + b"x",
                    with_corr=False)
        key, rest = client.frame()
        assert key == 0x04
        assert struct.unpack_from(">BiQH", rest) == (9, 1, 77, 0x12)
        # subscribe: an unknown stream, then ok, then the same id again
        sub = struct.pack(">B", 1)
        client.send(0x07, sub + _s(_name("nope")) + struct.pack(">HH", 1, 10)
                    + struct.pack(">i", 0))
        assert client.response(0x07)[0] == 0x02
        client.send(0x07, sub + _s(stream) + struct.pack(">HH", 1, 10) + struct.pack(">i", 0))
        assert client.response(0x07)[0] == 0x01
        client.send(0x07, sub + _s(stream) + struct.pack(">HH", 1, 10) + struct.pack(">i", 0))
        assert client.response(0x07)[0] == 0x03
        # credit for an unknown subscription: a credit response with 0x04
        client.send(0x09, struct.pack(">BH", 5, 1), with_corr=False)
        key, rest = client.frame()
        assert (key, struct.unpack_from(">HB", rest)) == (0x8009, (0x04, 5))
        # unsubscribe of an unknown id
        client.send(0x0C, struct.pack(">B", 6))
        assert client.response(0x0C)[0] == 0x04
        # the stream goes: the subscriber hears metadata-update "stream not available"
        other = RawClient(target.stream_port)
        try:
            other.open()
            other.send(0x0E, _s(stream))
            assert other.response(0x0E)[0] == 0x01
        finally:
            other.close()
        key, rest = client.frame()
        assert key == 0x10
        assert struct.unpack_from(">H", rest)[0] == 0x06
        assert rest[2:] == _s(stream)
    finally:
        client.close()


def test_command_before_open_closes(target: Target) -> None:
    client = RawClient(target.stream_port)
    try:
        client.send(0x11, struct.pack(">i", 0))
        assert client.response(0x11)[0] == 1
        client.send(0x0D, _s(_name("early")) + struct.pack(">i", 0))  # create before auth
        with pytest.raises((EOFError, ConnectionResetError)):
            for _ in range(10):
                client.frame()
    finally:
        client.close()


def test_silent_client_is_closed_after_missed_heartbeats(target: Target) -> None:
    client = RawClient(target.stream_port)
    try:
        client.open(heartbeat=1)  # then read, never send
        started = time.monotonic()
        beats = 0
        client.sock.settimeout(0.5)
        while time.monotonic() - started < DEADLINE:  # read, never send
            try:
                data = client.sock.recv(4096)
            except TimeoutError:
                continue
            if not data:
                break
            beats += data.count(struct.pack(">IHH", 4, 0x17, 1))
        else:
            raise AssertionError("a silent client was never closed")
        assert beats >= 1
    finally:
        client.close()


async def _declare_super_stream(t: Target, name: str, partitions: int) -> list[str]:
    """The layout RabbitMQ's super streams have: a direct exchange bound to one stream
    per partition by routing key, with ``x-stream-partition-order`` (made over AMQP
    0-9-1 here, as on a 3.10 node without rabbitmq-streams add_super_stream)."""
    aio_pika = pytest.importorskip("aio_pika")
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{t.amqp_port}/")
    names = [f"{name}-{i}" for i in range(partitions)]
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange(name, aio_pika.ExchangeType.DIRECT, durable=True)
        for i, stream in reversed(list(enumerate(names))):  # bound out of order
            q = await ch.declare_queue(stream, durable=True,
                                       arguments={"x-queue-type": "stream"})
            await q.bind(ex, routing_key=str(i),
                         arguments={"x-stream-partition-order": i})
    finally:
        await conn.close()
    return names


async def _super_stream_send(t: Target, name: str, n: int) -> None:
    """``n`` messages p0.. through rstream's super stream producer, hash routing over the
    partitions command (its key routing, RouteType.Key, caches the first key's route for
    every key in 1.1.1)."""

    async def routing_key(message: Any) -> str:
        return str(message.application_properties["k"])

    producer = rstream.SuperStreamProducer(
        "127.0.0.1", port=t.stream_port, username="guest", password="guest",
        super_stream=name, routing=rstream.RouteType.Hash, load_balancer_mode=True,
        routing_extractor=routing_key)
    async with producer:
        for i in range(n):
            await producer.send(AMQPMessage(body=f"p{i}".encode(),
                                            application_properties={"k": f"key{i}"}))


async def test_super_stream_route_and_partitions(target: Target) -> None:
    if target.kind == "rabbitmq":
        pytest.skip("super streams are RabbitMQ 3.11+: 3.10.8's plugin left a partitions "
                    "request on this layout unanswered (20 s) when tried")
    name = _name("super")
    names = await _declare_super_stream(target, name, 3)
    client = RawClient(target.stream_port)
    try:
        client.open()
        client.send(0x19, _s(name))
        code, rest = client.response(0x19)
        assert code == 0x01
        assert rest == struct.pack(">i", 3) + b"".join(_s(n) for n in names)
        client.send(0x18, _s("1") + _s(name))
        code, rest = client.response(0x18)
        assert (code, rest) == (0x01, struct.pack(">i", 1) + _s(names[1]))
        client.send(0x19, _s(_name("nosuper")))
        assert client.response(0x19)[0] == 0x02
    finally:
        client.close()
    await _super_stream_send(target, name, 6)
    seen: list[bytes] = []
    for stream in names:
        seen += await _read_all(target, stream)
    assert sorted(seen) == [f"p{i}".encode() for i in range(6)]


async def test_stream_over_tls(tmp_path: Path) -> None:
    from tests.integration.test_tls import client_context, make_pki

    pki = make_pki(tmp_path)
    (port,) = free_ports(1)
    proc = BrokerProcess(tmp_path / "data", extra_args=["--stream-port", str(port)],
                         env={"AMQPD_STREAM_TLS_PORT": "0", "AMQPD_TLS_PORT": "0",
                              "AMQPD_TLS_CERT": str(pki["server_cert"]),
                              "AMQPD_TLS_KEY": str(pki["server_key"]),
                              "AMQPD_TLS_CA": str(pki["ca"])})
    proc.start()
    try:
        tls_port = int(proc.info["stream_tls_port"])
        assert ["stream/ssl", "127.0.0.1", tls_port] in proc.info["listeners"]
        stream = _name("tls")
        async with rstream.Producer("127.0.0.1", port=tls_port, username="guest",
                                    password="guest", ssl_context=client_context(pki),
                                    load_balancer_mode=True) as p:
            await p.create_stream(stream)
            await p.send_wait(stream, AMQPMessage(body=b"secret"))
        plain = Target("amqpd", proc.port, port, None)
        assert await _read(plain, stream, OffsetSpec(OffsetType.FIRST, None), 1) == [
            (0, b"secret")]
    finally:
        proc.stop()


async def test_management_api_lists_stream_clients(tmp_path: Path) -> None:
    import base64
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    (port,) = free_ports(1)
    proc = BrokerProcess(tmp_path, extra_args=["--stream-port", str(port)])
    proc.start()
    t = Target("amqpd", proc.port, port, None)

    def get(path: str) -> Any:
        req = urllib.request.Request(proc.http_url + path, headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    try:
        stream = _name("mgmt")
        got = asyncio.Event()

        async def on_message(msg: Any, ctx: Any) -> None:
            got.set()

        async with _producer(t) as p, _producer(t) as p2, _consumer(t) as c:
            await p.create_stream(stream)
            await p.send_wait(stream, AMQPMessage(body=b"one"))
            for i in (7, 9):  # a named publisher's publishing ids (rstream: one publisher
                # per stream and producer, so another producer)
                await p2.send_wait(stream, _with_id(f"n{i}".encode(), i),
                                   publisher_name="namer")
            await c.start()
            await c.subscribe(stream, on_message, decoder=rstream.amqp_decoder,
                              offset_specification=OffsetSpec(OffsetType.FIRST, None))
            await asyncio.wait_for(got.wait(), DEADLINE)
            conns = await asyncio.to_thread(get, "/api/stream/connections")
            # rstream opens a locator connection besides each client's own
            assert len(conns) >= 3 and {c["user"] for c in conns} == {"guest"}
            pubs = await asyncio.to_thread(get, "/api/stream/publishers/%2F")
            mine = {x["reference"]: x for x in pubs if x["queue"]["name"] == stream}
            assert mine[""]["published"] == 1 and mine[""]["confirmed"] == 1
            named = mine["namer"]
            assert (named["published"], named["confirmed"], named["last_publishing_id"],
                    named["confirmed_publishing_id"]) == (2, 2, 9, 9)
            subs = await asyncio.to_thread(get, "/api/stream/consumers")
            mine_subs = [x for x in subs if x["queue"]["name"] == stream]
            deadline = time.monotonic() + DEADLINE
            while mine_subs[0]["offset"] < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                subs = await asyncio.to_thread(get, "/api/stream/consumers")
                mine_subs = [x for x in subs if x["queue"]["name"] == stream]
            sub = mine_subs[0]
            assert (sub["offset"], sub["offset_lag"], sub["consumed"], sub["active"],
                    sub["activity_status"]) == (3, 0, 3, True, "up")
            # one connection, as RabbitMQ's stream management has it
            conn_name = sub["connection_details"]["name"]
            path = f"/api/stream/connections/%2F/{urllib.parse.quote(conn_name, safe='')}"
            one = await asyncio.to_thread(get, path)
            assert one["name"] == conn_name and one["consumers"] == 1
            theirs = await asyncio.to_thread(get, path + "/consumers")
            assert [x["subscription_id"] for x in theirs] == [sub["subscription_id"]]
            with pytest.raises(urllib.error.HTTPError) as missing:
                await asyncio.to_thread(get, "/api/stream/connections/%2F/nobody")
            assert missing.value.code == 404
            # Prometheus: the totals and the per-publisher / per-consumer series
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(proc.http_url + "/metrics",
                                               timeout=10).read().decode())
            totals = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                      if line.startswith("amqpd_stream_protocol_") and "{" not in line}
            assert totals["amqpd_stream_protocol_connections"] >= 3, totals
            assert (totals["amqpd_stream_protocol_publishers"],
                    totals["amqpd_stream_protocol_consumers"],
                    totals["amqpd_stream_protocol_consumers_active"]) == (2, 1, 1), totals
            series = [line for line in text.splitlines() if f'stream="{stream}"' in line]
            assert any(line.startswith("amqpd_stream_protocol_publisher_last_publishing_id{")
                       and 'reference="namer"' in line and line.endswith(" 9")
                       for line in series), series
            assert any(line.startswith("amqpd_stream_protocol_consumer_offset{")
                       and line.endswith(" 3") for line in series), series
            assert any(line.startswith("amqpd_stream_protocol_consumer_active{")
                       and line.endswith(" 1") for line in series), series
    finally:
        proc.stop()


def _ctl(t: Target, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", t.http_url, *args],
                          capture_output=True, text=True, timeout=60)


def _api(t: Target, method: str, path: str, body: Any = None,
         user: str = "guest:guest") -> tuple[int, Any]:
    """(status, JSON body or None) of a management API call."""
    import base64
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(t.http_url + path, data=data, method=method, headers={
        "Authorization": "Basic " + base64.b64encode(user.encode()).decode(),
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    return status, json.loads(raw) if raw else None


def _api_get(t: Target, path: str) -> Any:
    status, body = _api(t, "GET", path)
    assert status == 200, (path, status, body)
    return body


def test_super_stream_http_api(target: Target) -> None:
    """PUT / GET / DELETE /api/stream/super-streams/{vhost}/{name}: RabbitMQ's body
    (partitions or binding-keys), its refusals, and the permissions it needs."""
    if target.kind == "rabbitmq":
        pytest.skip("the super-stream management endpoint is RabbitMQ 4.2+: 3.10.8's "
                    "management has no such path")
    name = _name("http")
    path = f"/api/stream/super-streams/%2F/{name}"
    for body, reason in (({}, "Must specify partitions or binding keys"),
                         ({"partitions": 2, "binding-keys": "a"}, "not both"),
                         ({"partitions": "two"}, "The partitions must be a number"),
                         ({"binding-keys": "a,a"}, "The binding keys must be distinct"),
                         ({"partitions": 1, "arguments": {"max-length-bytes": "lots"}},
                          "is not an integer")):
        status, answer = _api(target, "PUT", path, body)
        assert (status, reason in answer["reason"]) == (400, True), (body, answer)
    assert _api(target, "PUT", path, {"binding-keys": "eu, us"})[0] == 201
    got = _api_get(target, path)
    assert got["partitions"] == [
        {"name": f"{name}-eu", "routing_key": "eu", "partition_order": 0},
        {"name": f"{name}-us", "routing_key": "us", "partition_order": 1}]
    exchange = _api_get(target, f"/api/exchanges/%2F/{name}")
    assert (exchange["type"], exchange["durable"], exchange["arguments"]) == (
        "direct", True, {"x-super-stream": True})
    queue = _api_get(target, f"/api/queues/%2F/{name}-eu")
    assert queue["arguments"]["x-queue-type"] == "stream"
    # a user who may configure nothing in the vhost is refused, and nothing is made
    assert _api(target, "PUT", "/api/users/ss-user", {"password": "pw",
                                                       "tags": "management"})[0] in (
        201, 204)
    assert _api(target, "PUT", "/api/permissions/%2F/ss-user",
                {"configure": "^$", "write": ".*", "read": ".*"})[0] in (201, 204)
    other = _name("denied")
    status, answer = _api(target, "PUT", f"/api/stream/super-streams/%2F/{other}",
                          {"partitions": 1}, user="ss-user:pw")
    assert status == 403, answer
    assert _api(target, "GET", f"/api/exchanges/%2F/{other}")[0] == 404
    assert target.log_path is not None
    logged = target.log_path.read_text()
    assert f"creating super stream '{name}' in vhost '/' refused: Specify partitions or " \
           "binding keys, not both" in logged
    assert _api(target, "DELETE", path)[0] == 204
    assert _api(target, "GET", path)[0] == 404
    assert _api(target, "GET", f"/api/queues/%2F/{name}-us")[0] == 404


async def _exchange_publish(t: Target, exchange: str, messages: list[tuple[str, bytes]]) -> None:
    """AMQP 0-9-1 publishes through ``exchange`` (confirmed), as a 0-9-1 client would
    write into a super stream."""
    aio_pika = pytest.importorskip("aio_pika")
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{t.amqp_port}/")
    try:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(exchange)
        for key, body in messages:
            await ex.publish(aio_pika.Message(body), routing_key=key, mandatory=True)
    finally:
        await conn.close()


async def test_super_stream_created_by_amqpctl(target: Target) -> None:
    if target.kind == "rabbitmq":
        pytest.skip("rabbitmq-streams add_super_stream is RabbitMQ 3.11+: 3.10.8 has no "
                    "such command")
    name = _name("made")
    out = await asyncio.to_thread(_ctl, target, "add_super_stream", name, "--partitions", "3",
                                  "--max-length-bytes", "10000000")
    assert out.returncode == 0 and f"Super stream {name} has been created" in out.stdout, out
    names = [f"{name}-{i}" for i in range(3)]
    # the layout: a direct exchange marked x-super-stream, streams bound by "0".."2"
    client = RawClient(target.stream_port)
    try:
        client.open()
        client.send(0x19, _s(name))
        code, rest = client.response(0x19)
        assert (code, rest) == (0x01, struct.pack(">i", 3) + b"".join(_s(n) for n in names))
        client.send(0x18, _s("2") + _s(name))
        assert client.response(0x18) == (0x01, struct.pack(">i", 1) + _s(names[2]))
    finally:
        client.close()
    # refusals: the name taken (exchange), a partition taken (queue), bad counts, a bad
    # stream argument (the first partition's declare refuses it: the exchange goes again)
    await _publish(target, f"{name}-x-0", [b"squatter"], create=True)
    bad_age = _name("age")
    for args, text in (
            ((name,), f"there is already an exchange named {name}"),
            ((f"{name}-x", "--partitions", "1"), f"there is already a queue named {name}-x-0"),
            ((_name("zero"), "--partitions", "0"), "The partition number must be greater "
                                                  "than 0"),
            ((_name("many"), "--partitions", "100000"), "must not exceed"),
            ((_name("nokeys"), "--routing-keys", " , "), "The number of binding keys must "
                                                        "be greater than 0"),
            ((bad_age, "--max-age", "forever"), "invalid_max_age")):
        got = await asyncio.to_thread(_ctl, target, "add_super_stream", *args)
        assert got.returncode == 65 and text in got.stderr, (args, got)
    usage = await asyncio.to_thread(_ctl, target, "add_super_stream", _name("int"),
                                    "--max-length-bytes", "x")
    assert usage.returncode == 64 and "invalid int value" in usage.stderr
    probe = RawClient(target.stream_port)
    try:
        probe.open()
        probe.send(0x19, _s(bad_age))  # rolled back: no exchange, no partition
        assert probe.response(0x19)[0] == 0x02
        probe.send(0x0F, struct.pack(">i", 1) + _s(f"{bad_age}-0"))
        assert _s(f"{bad_age}-0") + struct.pack(">H", 0x02) in probe.frame()[1]
    finally:
        probe.close()
    both = await asyncio.to_thread(_ctl, target, "add_super_stream", _name("both"),
                                   "--partitions", "2", "--routing-keys", "a,b")
    assert both.returncode == 64 and "not both" in both.stderr
    # rstream's super stream producer and an AMQP 0-9-1 publisher through the exchange
    await _super_stream_send(target, name, 6)
    await _exchange_publish(target, name, [("1", b"amqp-1"), ("2", b"amqp-2")])
    per_partition = {stream: await _read_all(target, stream) for stream in names}
    assert b"amqp-1" in per_partition[names[1]] and b"amqp-2" in per_partition[names[2]]
    everything = sorted(b for bodies in per_partition.values() for b in bodies)
    assert everything == sorted([f"p{i}".encode() for i in range(6)] + [b"amqp-1",
                                                                        b"amqp-2"])
    # rstream's super stream consumer reads every partition
    seen: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: Any) -> None:
        seen.append(bytes(msg.body))
        if len(seen) >= len(everything):
            done.set()

    consumer = rstream.SuperStreamConsumer(
        "127.0.0.1", port=target.stream_port, username="guest", password="guest",
        super_stream=name, load_balancer_mode=True)
    async with consumer:
        await consumer.subscribe(on_message, decoder=rstream.amqp_decoder,
                                 offset_specification=OffsetSpec(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), DEADLINE)
    # the markers _read_all published are in there too; the messages are all there once
    assert sorted(b for b in seen if len(b) < 32) == everything
    # delete: the exchange and every partition go
    gone = await asyncio.to_thread(_ctl, target, "delete_super_stream", name)
    assert gone.returncode == 0 and f"Super stream {name} has been deleted" in gone.stdout
    again = await asyncio.to_thread(_ctl, target, "delete_super_stream", name)
    assert again.returncode == 1 and "super_stream_not_found" in again.stderr
    client = RawClient(target.stream_port)
    try:
        client.open()
        client.send(0x19, _s(name))
        assert client.response(0x19)[0] == 0x02
        client.send(0x0F, struct.pack(">i", 1) + _s(names[0]))
        key, rest = client.frame()
        assert key == 0x800F and _s(names[0]) + struct.pack(">H", 0x02) in rest
    finally:
        client.close()


async def _wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_single_active_consumer_group_on_a_super_stream(target: Target) -> None:
    """Two consumers of one group on a 3-partition super stream (rstream's SAC: the
    consumer-update listener resumes from the stored offset): partition i is read by
    member i mod 2 in joining order, every message once; when one member goes, the
    other takes its partition from the offset stored there."""
    if target.kind == "rabbitmq":
        pytest.skip("single active consumer (consumer update, 0x1a) and super streams are "
                    "RabbitMQ 3.11+: 3.10.8's plugin has neither")
    name = _name("sac")
    out = await asyncio.to_thread(_ctl, target, "add_super_stream", name, "--partitions", "3")
    assert out.returncode == 0, out
    parts = [f"{name}-{i}" for i in range(3)]
    group = "billing"
    got: dict[str, list[tuple[str, int, bytes]]] = {"a": [], "b": []}
    active: dict[str, str] = {}  # partition -> who the last consumer update made active
    props = {"single-active-consumer": "true", "name": group, "super-stream": name}

    def handlers(who: str) -> tuple[Any, Any]:
        async def on_message(msg: Any, ctx: Any) -> None:
            await ctx.consumer.store_offset(ctx.stream, group, ctx.offset)
            got[who].append((ctx.stream, ctx.offset, bytes(msg.body)))

        async def on_update(is_active: bool, ectx: Any) -> Any:
            if not is_active:
                if active.get(ectx.stream) == who:
                    del active[ectx.stream]
                return rstream.OffsetSpecification(OffsetType.NEXT, 0)
            active[ectx.stream] = who
            try:
                stored = await ectx.consumer.query_offset(ectx.stream, group)
            except rstream.exceptions.OffsetNotFound:
                return rstream.OffsetSpecification(OffsetType.FIRST, 0)
            return rstream.OffsetSpecification(OffsetType.OFFSET, stored + 1)

        return on_message, on_update

    def member() -> Any:
        return rstream.SuperStreamConsumer(
            "127.0.0.1", port=target.stream_port, username="guest", password="guest",
            super_stream=name, load_balancer_mode=True)

    a, b = member(), member()
    await a.start()
    try:
        on_message, on_update = handlers("a")
        await a.subscribe(on_message, decoder=rstream.amqp_decoder, properties=dict(props),
                          subscriber_name=group, consumer_update_listener=on_update)
        await _wait_for(lambda: len(active) == 3, "the first member active everywhere")
        await b.start()
        on_message, on_update = handlers("b")
        await b.subscribe(on_message, decoder=rstream.amqp_decoder, properties=dict(props),
                          subscriber_name=group, consumer_update_listener=on_update)
        want = {parts[0]: "a", parts[1]: "b", parts[2]: "a"}  # index mod 2
        await _wait_for(lambda: active == want, f"the partitions shared as {want}")
        # the management API shows the group: per partition one active, one waiting
        listed = await asyncio.to_thread(_api_get, target, "/api/stream/consumers/%2F")
        members = sorted((x["queue"]["name"], x["activity_status"]) for x in listed
                         if x["group"] == group)
        assert members == sorted((p, st) for p in parts for st in ("single_active",
                                                                   "waiting")), members
        first = [(str(i % 3), f"m{i}".encode()) for i in range(30)]
        await _exchange_publish(target, name, first)
        await _wait_for(lambda: len(got["a"]) + len(got["b"]) >= 30, "30 messages")
        assert sorted(body for who in got for _, _, body in got[who]) == sorted(
            body for _, body in first)  # each once
        assert {stream for stream, _, _ in got["a"]} == {parts[0], parts[2]}
        assert {stream for stream, _, _ in got["b"]} == {parts[1]}
        # b goes: a takes partition 1 from the offset b stored there
        await b.close()
        await _wait_for(lambda: active.get(parts[1]) == "a", "a active on partition 1")
        before = len(got["a"])
        second = [(str(i % 3), f"n{i}".encode()) for i in range(9)]
        await _exchange_publish(target, name, second)
        await _wait_for(lambda: len(got["a"]) >= before + 9, "9 more messages")
        later = got["a"][before:]
        assert sorted(body for _, _, body in later) == sorted(body for _, body in second)
        assert [o for s, o, _ in later if s == parts[1]] == [10, 11, 12]
    finally:
        await b.close()
        await a.close()


@contextlib.contextmanager
def _told_on_timeout(target: Target, *words: str) -> Iterator[None]:
    """A raw read that times out fails with the broker's log lines containing
    ``words`` (what it did about the connections), not a bare TimeoutError."""
    try:
        yield
    except TimeoutError as exc:
        path = target.log_path
        text = path.read_text(errors="replace") if path is not None and path.exists() \
            else ""
        lines = [line for line in text.splitlines() if any(w in line for w in words)]
        raise AssertionError("the broker sent no frame in time; its log about it:\n"
                             + "\n".join(lines[-40:])) from exc


def test_single_active_consumer_raw_frames(target: Target) -> None:
    """The wire side on a plain stream: a nameless single active consumer is refused
    (0x11); the first member gets a consumer update (0x1a, active) and reads from the
    offset its answer gives; the second waits until the first unsubscribes, the third
    until the second's connection dies."""
    if target.kind == "rabbitmq":
        pytest.skip("single active consumer (consumer update, 0x1a) is RabbitMQ 3.11+: "
                    "3.10.8's plugin does not have it")
    # a digit suffix, as super stream partitions have: still a plain stream's group
    stream = _name("sacraw") + "-3"
    asyncio.run(_publish(target, stream, [b"a", b"b", b"c"], create=True))
    sac = {"single-active-consumer": "true", "name": "g1"}

    def subscribe(client: RawClient, sid: int, props: dict[str, str]) -> int:
        body = struct.pack(">B", sid) + _s(stream) + struct.pack(">HH", 3, 10)
        body += struct.pack(">i", len(props)) + b"".join(_s(k) + _s(v)
                                                         for k, v in props.items())
        client.send(0x07, body)
        return client.response(0x07)[0]

    first, second, third = (RawClient(target.stream_port) for _ in range(3))
    try:
        with _told_on_timeout(target, "stream connection"):
            first.open()
            second.open()
            third.open()
            assert subscribe(first, 1, {"single-active-consumer": "true"}) == 0x11
            assert subscribe(first, 1, sac) == 0x01
            key, rest = first.frame()
            assert key == 0x1A
            corr, sid, is_active = struct.unpack(">IBB", rest)
            assert (sid, is_active) == (1, 1)
            # answer: start at offset 1
            first.sock.sendall(_frame(0x801A, struct.pack(">IHHQ", corr, 1, 4, 1)))
            key, rest = first.frame()
            assert key == 0x08 and rest[0] == 1  # deliver for subscription 1
            assert struct.unpack_from(">Q", rest, 1 + 24)[0] == 1  # the chunk's first offset
            assert subscribe(second, 7, sac) == 0x01  # joins, inactive: no update
            assert subscribe(third, 2, sac) == 0x01
            first.send(0x0C, struct.pack(">B", 1))
            assert first.response(0x0C)[0] == 0x01
            key, rest = second.frame()
            assert key == 0x1A and struct.unpack(">IBB", rest)[1:] == (7, 1)
            second.sock.close()  # killed without a word: the next member takes over
            key, rest = third.frame()
            assert key == 0x1A and struct.unpack(">IBB", rest)[1:] == (2, 1)
    finally:
        first.close()
        second.close()
        third.close()


def _list(items: list[str]) -> bytes:
    return struct.pack(">i", len(items)) + b"".join(_s(i) for i in items)


def _create_super(client: RawClient, name: str, partitions: list[str], keys: list[str],
                  args: dict[str, str] | None = None) -> int:
    """A raw create-super-stream (0x1d, RabbitMQ 3.13+): its response code."""
    pairs = list((args or {}).items())
    client.send(0x1D, _s(name) + _list(partitions) + _list(keys) + struct.pack(
        ">i", len(pairs)) + b"".join(_s(k) + _s(v) for k, v in pairs))
    return client.response(0x1D)[0]


def test_super_stream_protocol_commands(target: Target) -> None:
    """create-super-stream (0x1d) and delete-super-stream (0x1e) in raw frames: the
    layout amqpctl add_super_stream makes (seen through partitions, route and the HTTP
    API), RabbitMQ 3.13's refusals, and nothing left of a refused one."""
    if target.kind == "rabbitmq":
        pytest.skip("create/delete super stream (0x1d, 0x1e) are RabbitMQ 3.13+: 3.10.8's "
                    "plugin does not know the commands")
    name = _name("cmdsuper")
    parts = [f"{name}-eu", f"{name}-us", f"{name}-ap"]
    client = RawClient(target.stream_port)
    try:
        client.open()
        client.send(0x1B, struct.pack(">i", 0))  # exchange-command-versions names both
        code, rest = client.response(0x1B)
        (n,) = struct.unpack_from(">i", rest)
        keys = {struct.unpack_from(">H", rest, 4 + 6 * i)[0] for i in range(n)}
        assert code == 0x01 and {0x1D, 0x1E} <= keys
        # refused: nothing is made
        assert _create_super(client, name, parts, ["eu", "us"]) == 0x11
        assert _create_super(client, "amq.super", parts[:1], ["eu"]) == 0x11
        assert _create_super(client, name, [], []) == 0x11
        assert _create_super(client, name, [parts[0], parts[0]], ["a", "b"]) == 0x11
        assert _create_super(client, name, parts, ["eu", "us", "ap"],
                             {"max-age": "bad"}) == 0x11
        client.send(0x19, _s(name))
        assert client.response(0x19)[0] == 0x02
        assert _api(target, "GET", f"/api/queues/%2F/{parts[0]}")[0] == 404
        # made: the exchange, the streams, the bindings in order
        assert _create_super(client, name, parts, ["eu", "us", "ap"],
                             {"max-length-bytes": "1000000"}) == 0x01
        client.send(0x19, _s(name))
        assert client.response(0x19) == (0x01, _list(parts))
        client.send(0x18, _s("us") + _s(name))
        assert client.response(0x18) == (0x01, _list([parts[1]]))
        layout = _api_get(target, f"/api/stream/super-streams/%2F/{name}")
        assert [(p["name"], p["routing_key"], p["partition_order"])
                for p in layout["partitions"]] == [(parts[0], "eu", 0), (parts[1], "us", 1),
                                                   (parts[2], "ap", 2)]
        queue = _api_get(target, f"/api/queues/%2F/{parts[2]}")
        assert queue["arguments"] == {"x-queue-type": "stream",
                                      "x-max-length-bytes": 1000000}
        exchange = _api_get(target, f"/api/exchanges/%2F/{name}")
        assert (exchange["type"], exchange["durable"], exchange["arguments"]) == (
            "direct", True, {"x-super-stream": True})
        # a name taken: 0x05
        assert _create_super(client, name, [f"{name}-x"], ["x"]) == 0x05
        assert _create_super(client, _name("other"), [parts[0]], ["x"]) == 0x05
        # delete: everything goes; again: 0x02
        client.send(0x1E, _s(name))
        assert client.response(0x1E)[0] == 0x01
        for stream in parts:
            assert _api(target, "GET", f"/api/queues/%2F/{stream}")[0] == 404
        assert _api(target, "GET", f"/api/exchanges/%2F/{name}")[0] == 404
        client.send(0x1E, _s(name))
        assert client.response(0x1E)[0] == 0x02
    finally:
        client.close()
