"""Inter-node links over loopback (amqpd.cluster.link): handshake, multiplexing, reconnect."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from amqpd.cluster import link_wire as W
from amqpd.cluster.link import Link, LinkManager


class Recorder:
    def __init__(self) -> None:
        self.ups: list[str] = []
        self.downs: list[str] = []
        self.frames: list[tuple[str, int, int, list[Any]]] = []

    def link_up(self, link: Link) -> None:
        self.ups.append(link.peer)

    def link_down(self, link: Link) -> None:
        self.downs.append(link.peer)

    def frame(self, link: Link, kind: int, stream: int, fields: list[Any]) -> None:
        self.frames.append((link.peer, kind, stream, fields))


async def until(cond: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def pair(cookie_a: bytes = b"c", cookie_b: bytes = b"c") -> tuple[
        LinkManager, Recorder, LinkManager, Recorder]:
    ra, rb = Recorder(), Recorder()
    addrs: dict[str, tuple[str, int]] = {}
    a = LinkManager("a@x", cookie_a, ra, addrs.get)
    b = LinkManager("b@x", cookie_b, rb, addrs.get)
    addrs["a@x"] = await a.listen("127.0.0.1", 0)
    addrs["b@x"] = await b.listen("127.0.0.1", 0)
    return a, ra, b, rb


async def test_handshake_then_frames_both_ways_on_many_streams() -> None:
    a, ra, b, rb = await pair()
    try:
        a.want("b@x")
        b.want("a@x")  # sorts second: does not dial, waits
        await until(lambda: a.link("b@x") and b.link("a@x"))
        assert ra.ups == ["b@x"] and rb.ups == ["a@x"]
        la, lb = a.link("b@x"), b.link("a@x")
        assert la is not None and lb is not None
        for stream in range(1, 4):
            la.send(W.encode(W.PUBLISH, stream, stream, 1, "ex", "rk", b"", b"x" * stream))
        lb.send(W.encode(W.CONFIRM, 2, 2, 1))
        await until(lambda: len(rb.frames) == 3 and len(ra.frames) == 1)
        assert [f[2] for f in rb.frames] == [1, 2, 3]
        assert rb.frames[2] == ("a@x", W.PUBLISH, 3, [3, 1, "ex", "rk", b"", b"xxx"])
        assert ra.frames == [("b@x", W.CONFIRM, 2, [2, 1])]
    finally:
        await a.close()
        await b.close()


async def test_wrong_cookie_is_refused_and_never_up() -> None:
    a, ra, b, rb = await pair(b"one", b"two")
    try:
        a.want("b@x")
        await asyncio.sleep(0.5)  # several dial attempts (backoff from 0.1 s)
        assert ra.ups == [] and rb.ups == []
        assert a.link("b@x") is None and b.link("a@x") is None
    finally:
        await a.close()
        await b.close()


async def test_a_stranger_without_the_preamble_is_dropped() -> None:
    a, _ra, b, rb = await pair()
    try:
        assert b.address is not None
        reader, writer = await asyncio.open_connection(*b.address)
        writer.write(b"AMQP\x00\x00\x09\x01")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no reply
        writer.close()
        assert rb.ups == []
    finally:
        await a.close()
        await b.close()


async def test_a_node_of_another_link_version_is_refused_and_told_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """A dialler speaking link protocol version 4 (before ASK and ANSWER) gets REFUSED
    with both versions and never a frame of this version: no link comes up between
    the two."""
    a, _ra, b, rb = await pair()
    try:
        assert b.address is not None and W.VERSION == 5
        reader, writer = await asyncio.open_connection(*b.address)
        writer.write(W.PREAMBLE + b"\x04" + W.encode(W.HELLO, 0, "old@x", b"n" * 32))
        with caplog.at_level(logging.WARNING, logger="amqpd.cluster"):
            got = await asyncio.wait_for(reader.read(), 5)  # then closed
        assert W.FrameReader().feed(got) == [
            (W.REFUSED, 0, ["link protocol version 4 there, 5 here: no link between "
                            "the two"])]
        writer.close()
        assert rb.ups == [] and rb.frames == []
        assert "link protocol version 4 there, 5 here" in caplog.text
    finally:
        await a.close()
        await b.close()


async def test_reconnects_after_the_link_drops() -> None:
    a, ra, b, rb = await pair()
    try:
        a.want("b@x")
        await until(lambda: b.link("a@x") is not None)
        first = b.link("a@x")
        assert first is not None and first.transport is not None
        first.transport.abort()  # the TCP connection dies under both
        await until(lambda: ra.downs == ["b@x"] and rb.downs == ["a@x"])
        await until(lambda: a.link("b@x") is not None and b.link("a@x") is not None)
        assert b.link("a@x") is not first
        assert ra.ups == ["b@x", "b@x"]
    finally:
        await a.close()
        await b.close()


async def test_a_refusal_on_a_live_link_closes_it_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """Both nodes dialled at once: the dialler that had the listener's welcome may
    refuse the link after all (it adopted the other one). The listener's link is up by
    then; the refusal closes it with a warning, not a traceback for a 'handshake frame
    on a live link'."""
    a, _ra, b, rb = await pair()
    try:
        a.want("b@x")
        await until(lambda: a.link("b@x") is not None and b.link("a@x") is not None)
        la = a.link("b@x")
        assert la is not None
        caplog.set_level(logging.WARNING, logger="amqpd.cluster")
        la.send(W.encode(W.REFUSED, 0, "a link is up already"))
        await until(lambda: rb.downs == ["a@x"])
        assert rb.frames == []
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("refused by peer: a link is up already" in r.getMessage()
                   for r in caplog.records)
    finally:
        await a.close()
        await b.close()


def test_replication_frames_decode_before_the_mirrors_module_is_loaded() -> None:
    """issue 28's link race: a restarted node's link comes up (remote_queue starts it)
    before the server loads amqpd.cluster.mirror, and a peer that leads mirrored
    queues sends MSTART (80) at once; main closed the link ("malformed frame: unknown
    frame type 80"). A fresh interpreter with only the link module loaded decodes
    MSTART and the quorum groups' QTERM (100)."""
    import subprocess
    import sys

    code = (
        "import struct, sys\n"
        "import amqpd.cluster.link\n"
        "from amqpd.cluster import link_wire as W\n"
        "assert 'amqpd.cluster.mirror' not in sys.modules\n"
        "def frame(kind, stream, body):\n"
        "    return struct.pack('>IBI', len(body) + 5, kind, stream) + body\n"
        "name = lambda s: struct.pack('>H', len(s)) + s\n"
        "data = frame(80, 7, name(b'/') + name(b'q') + struct.pack('>Q', 3))\n"
        "data += frame(100, 8, struct.pack('>Q', 2))\n"
        "print(W.FrameReader().feed(data))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(80, 7, ['/', 'q', 3]), (100, 8, [2])]"


async def test_one_try_at_a_time_while_a_peer_accepts_and_never_answers() -> None:
    """A stopped (SIGSTOP) peer's kernel accepts connections that nothing answers: the
    dialler waits for its try's handshake to end before the next, instead of piling a
    new half-open link into the peer's accept queue every 0.1 s (issue 28: a 9.8 s stop
    gave ~100 "handshake timed out" lines and a flood of links when the peer woke)."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    a = LinkManager("a@x", b"c", Recorder(), {"b@x": (host, port)}.get)
    try:
        a.want("b@x")
        await until(lambda: len(accepted) == 1)
        await asyncio.sleep(1.0)  # ten of the old 0.1 s redials
        assert len(accepted) == 1
    finally:
        await a.close()
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()
