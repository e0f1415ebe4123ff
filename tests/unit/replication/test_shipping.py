"""Source and follower in one event loop over real loopback sockets: authentication,
byte-for-byte shipping, synchronous confirms, and a follower's recovered state."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from amqpd.config import ReplicationConfig
from amqpd.replication import wire
from amqpd.replication.epochs import EpochHistory
from amqpd.replication.follower import ReplicationFollower
from amqpd.replication.source import ReplicationSource
from amqpd.store import format as fmt
from amqpd.store.api import NotReplicated, StoredMessage
from amqpd.store.log import SharedLog


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def _cfg(name: str, secret: str = "s3cret", /, **kw: object) -> ReplicationConfig:
    c = ReplicationConfig(node_name=name, secret=secret, peers=["127.0.0.1:1"], **kw)  # type: ignore[arg-type]
    return c


async def _active(d: Path, **kw: object) -> tuple[SharedLog, ReplicationSource]:
    store = SharedLog(d, loop=asyncio.get_running_loop(), segment_size=64 * 1024)
    store.open()
    history = EpochHistory(d)
    history.begin(1, store.last_sequence + 1)
    src = ReplicationSource(store, _cfg("a", listen="127.0.0.1:0", role="active", **kw),
                            history, 1)
    await src.start()
    return store, src


def _follower(d: Path, secret: str = "s3cret") -> ReplicationFollower:
    return ReplicationFollower(d, _cfg("b", secret, role="standby"), EpochHistory(d))


def _msg(i: int) -> StoredMessage:
    return StoredMessage("", "q", b"", b"message-%d" % i * 20)


async def test_wrong_secret_is_refused_logged_and_closed(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    caplog.set_level(logging.WARNING, "amqpd.replication")
    store, src = await _active(tmp_path / "a")
    f = _follower(tmp_path / "b", secret="wrong")
    try:
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: src.auth_failures >= 1 and f.auth_failures >= 1)
        assert not f.connected and src.standbys() == []
        assert "refused b" in caplog.text and "authentication failed" in caplog.text
        # by hand: a wrong mac gets an ERROR frame, then the connection is closed
        loop = asyncio.get_running_loop()
        sock = socket.create_connection(("127.0.0.1", src.port))
        sock.setblocking(False)
        await loop.sock_sendall(sock, wire.hello(b"n" * 16, "intruder"))
        head = await loop.sock_recv(sock, 5)
        assert wire.parse_header(head)[0] == wire.CHALLENGE
        await loop.sock_recv(sock, wire.parse_header(head)[1])
        await loop.sock_sendall(sock, wire.frame(wire.AUTH, b"\0" * 32))
        rest = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
            if not chunk:
                break  # closed by the active
            rest += chunk
        else:
            raise AssertionError("connection not closed")
        assert wire.parse_header(rest[:5])[0] == wire.ERROR
        assert wire.parse_error(rest[5:]) == "authentication failed"
        sock.close()
    finally:
        await f.stop()
        await src.stop()
        store.close()


async def test_garbage_instead_of_hello_is_refused(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "amqpd.replication")
    store, src = await _active(tmp_path / "a")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", src.port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(), 5)  # until the active closes
        except ConnectionResetError:
            data = b""  # closed with our bytes unread: a reset
        if data:
            assert wire.parse_header(data[:5])[0] == wire.ERROR
        await until(lambda: "unknown frame type 71" in caplog.text)
        writer.close()
    finally:
        await src.stop()
        store.close()


async def test_catch_up_then_live_tail_byte_for_byte(tmp_path: Path) -> None:
    store, src = await _active(tmp_path / "a")
    f = _follower(tmp_path / "b")
    try:
        for i in range(300):  # several 64 KiB segments before the standby exists
            store.append_enqueue(["q"], _msg(i))
        store.append_definition(fmt.DEF_QUEUE, "/\0q", b'{"name":"q"}')
        store.sync()
        f.start(f"127.0.0.1:{src.port}")
        # durable there, then acknowledged here (the ACK is on its way a moment later)
        await until(lambda: f.last_seq == store.last_sequence and src.insync_count() == 1)
        assert src.standbys()[0].in_sync
        confirmed: list[BaseException | None] = []
        for i in range(300, 400):  # live tail, with a synchronous commit
            store.append_enqueue(["q"], _msg(i))
        store.commit(confirmed.append)
        await until(lambda: confirmed == [None])
        assert f.last_seq >= store.last_sequence  # the confirm waited for the standby
        store.sync()
        await until(lambda: f.last_seq == store.last_sequence)
        await f.stop()
        a = sorted(p.name for p in (tmp_path / "a").glob("*.log"))
        assert a == sorted(p.name for p in (tmp_path / "b").glob("*.log"))
        for name in a:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    finally:
        await f.stop()
        await src.stop()
        store.close()
    copy = SharedLog(tmp_path / "b")
    state = copy.open()
    try:
        bodies = [copy.read(p).body for p in state.queues["q"].positions]
        assert bodies == [_msg(i).body for i in range(400)]
        assert state.definitions[(fmt.DEF_QUEUE, "/\0q")] == b'{"name":"q"}'
    finally:
        copy.close()


async def test_confirms_nacked_without_an_in_sync_standby(tmp_path: Path) -> None:
    store, src = await _active(tmp_path / "a", insync_timeout=0.3, min_insync_standbys=1)
    try:
        got: list[BaseException | None] = []
        store.append_enqueue(["q"], _msg(1))
        store.commit(got.append)
        await until(lambda: bool(got), timeout=5)
        assert isinstance(got[0], NotReplicated)
        assert src.gate is not None and src.gate.nacked == 1
    finally:
        await src.stop()
        store.close()


async def _committed(store: SharedLog, i: int) -> list[BaseException | None]:
    """One group commit; its outcome list fills when the gate releases it."""
    got: list[BaseException | None] = []
    store.append_enqueue(["q"], _msg(i))
    store.commit(got.append)
    return got


async def test_degraded_mode_drops_a_gone_standby_and_confirms_alone(tmp_path: Path) -> None:
    """min_insync_standbys = 0, static roles (nothing to record in): a caught-up standby
    joins the members confirms wait for, leaves them when it disconnects, and the active
    then confirms alone; back and caught up, it joins again."""
    store, src = await _active(tmp_path / "a", insync_timeout=30.0)
    f = _follower(tmp_path / "b")
    try:
        assert src.gate is not None and src.gate.isr and not src.gate.record
        assert await _until_done(await _committed(store, 0)) is None  # alone: no member
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: src.gate is not None and src.gate.members == {"b"})
        got = await _committed(store, 1)
        assert await _until_done(got) is None
        assert src.acked_by_name["b"] >= store.last_sequence  # it waited for b's ack
        await f.stop()
        await until(lambda: src.gate is not None and not src.gate.members)
        assert await _until_done(await _committed(store, 2)) is None
        f = _follower(tmp_path / "b")
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: src.gate is not None and src.gate.members == {"b"})
    finally:
        await f.stop()
        await src.stop()
        store.close()


async def test_degraded_mode_under_an_election_waits_for_the_record(tmp_path: Path) -> None:
    """Under an election (role auto) a standby that disconnected stays a member until
    etcd records the set without it: until then confirms wait (never released on the
    active alone while etcd still names the standby eligible); then they are."""
    store, src = await _active(tmp_path / "a", insync_timeout=30.0)
    src.config.role = "auto"  # what the gate reads at start: restart it so
    await src.stop()
    src = ReplicationSource(store, src.config, src.history, 1)
    await src.start()
    changes: list[int] = []
    src.insync_changed = lambda: changes.append(src.insync_count())
    f = _follower(tmp_path / "b")
    try:
        assert src.gate is not None and src.gate.record
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: src.gate is not None and src.gate.members == {"b"})
        assert changes == [1]
        await f.stop()
        await until(lambda: changes == [1, 0])
        got = await _committed(store, 1)
        await asyncio.sleep(0.3)
        assert got == [], "released while etcd still lists the standby"
        src.gate.recorded(set())
        assert await _until_done(got) is None
        assert not src.gate.members
    finally:
        await f.stop()
        await src.stop()
        store.close()


async def _until_done(got: list[BaseException | None]) -> BaseException | None:
    await until(lambda: bool(got), timeout=5)
    return got[0]


async def test_standby_behind_the_live_segments_resyncs_from_a_snapshot(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "amqpd.replication")
    store, src = await _active(tmp_path / "a")
    f = _follower(tmp_path / "b")
    try:
        positions = [store.append_enqueue(["q"], _msg(i)) for i in range(50)]
        store.sync()
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: f.last_seq == store.last_sequence)
        await f.stop()  # the standby goes away holding the first segments
        positions += [store.append_enqueue(["q"], _msg(i)) for i in range(50, 400)]
        store.append_settle("q", positions[:-20])  # the old segments become garbage
        deadline = time.monotonic() + 10
        while 0 in store.segment_sizes():  # GC, once a checkpoint lies past them
            assert time.monotonic() < deadline, "GC did not delete the first segment"
            store.checkpoint()
            store.sync()
            store.maintain()
            await asyncio.sleep(0.01)
        store.sync()
        f = _follower(tmp_path / "b")
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: f.last_seq == store.last_sequence)
        await f.stop()
        assert "(snapshot at" in caplog.text
        live = sorted(p.name for p in (tmp_path / "a").glob("*.log"))
        assert live == sorted(p.name for p in (tmp_path / "b").glob("*.log"))
        for name in live:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    finally:
        await f.stop()
        await src.stop()
        store.close()
    copy = SharedLog(tmp_path / "b")
    state = copy.open()
    try:
        assert [copy.read(p).body for p in state.queues["q"].positions] == \
            [_msg(i).body for i in range(380, 400)]
    finally:
        copy.close()


async def test_tls_with_client_certificates_instead_of_a_secret(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("cryptography", reason="cryptography makes the test certificates")
    from tests.integration.test_tls import make_pki

    caplog.set_level(logging.INFO, "amqpd.replication")
    pki = make_pki(tmp_path)
    d = tmp_path / "a"
    store = SharedLog(d, loop=asyncio.get_running_loop())
    store.open()
    src = ReplicationSource(store, ReplicationConfig(
        node_name="a", listen="127.0.0.1:0", role="active", peers=["127.0.0.1:1"],
        tls_cert=str(pki["server_cert"]), tls_key=str(pki["server_key"]),
        tls_ca=str(pki["ca"])), EpochHistory(d), 1)
    await src.start()

    def follower(where: Path, with_cert: bool) -> ReplicationFollower:
        cert = pki["client_cert"] if with_cert else pki["server_cert"]
        key = pki["client_key"] if with_cert else pki["server_key"]
        cfg = ReplicationConfig(node_name="b", role="standby", peers=["x:1"],
                                tls_cert=str(cert), tls_key=str(key), tls_ca=str(pki["ca"]))
        return ReplicationFollower(where, cfg, EpochHistory(where))

    good = follower(tmp_path / "b", True)
    bad = follower(tmp_path / "c", False)  # a server-only certificate is no client's
    try:
        for i in range(20):
            store.append_enqueue(["q"], _msg(i))
        store.sync()
        good.start(f"127.0.0.1:{src.port}")
        await until(lambda: good.last_seq == store.last_sequence)
        # over TLS the standby's loop sends the ACK, and the writer never uses the lane
        await until(lambda: src.standbys()[0].acked_seq == store.last_sequence)
        store.append_enqueue(["q"], _msg(20))
        store.sync()
        await until(lambda: src.standbys()[0].acked_seq == store.last_sequence)
        assert src.lane_frames == 0
        assert "(TLS)" in caplog.text
        bad.start(f"127.0.0.1:{src.port}")
        await until(lambda: "TLS handshake failed" in caplog.text
                    and "cannot follow the active" in caplog.text)
        assert not bad.connected and bad.last_seq == 0 and src.auth_failures >= 1
        assert [s.name for s in src.standbys()] == ["b"]
    finally:
        await bad.stop()
        await good.stop()
        await src.stop()
        store.close()


async def test_gc_keeps_what_a_connected_standby_still_needs(tmp_path: Path) -> None:
    store, src = await _active(tmp_path / "a")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills up at once
    sock.setblocking(False)
    try:
        positions = [store.append_enqueue(["q"], StoredMessage("", "q", b"", b"x" * 8000))
                     for _ in range(1000)]  # 8 MB over many 64 KiB segments
        store.sync()
        await loop.sock_connect(sock, ("127.0.0.1", src.port))

        async def frame() -> tuple[int, bytes]:
            head = b""
            while len(head) < 5:
                head += await loop.sock_recv(sock, 5 - len(head))
            ftype, n = wire.parse_header(head)
            body = b""
            while len(body) < n:
                body += await loop.sock_recv(sock, n - len(body))
            return ftype, body

        nonce = b"m" * 16
        await loop.sock_sendall(sock, wire.hello(nonce, "slow"))
        _, payload = await frame()
        theirs, _name = wire.parse_challenge(payload)
        await loop.sock_sendall(sock, wire.frame(wire.AUTH, wire.mac(
            b"s3cret", b"standby", theirs, nonce, "slow")))
        assert (await frame())[0] == wire.AUTH_OK
        await loop.sock_sendall(sock, wire.follow(wire.Follow(0, 0, 0, 0)))
        assert (await frame())[0] == wire.WELCOME
        await until(lambda: len(src.standbys()) == 1)
        # a standby that reads nothing more: its cursor stays in the first segments
        store.append_settle("q", positions)
        for _ in range(5):
            store.checkpoint()
            store.sync()
            store.maintain()
            await asyncio.sleep(0.05)
        assert 0 in store.segment_sizes()  # still needed by the connected standby
        sock.close()
        await until(lambda: not src.standbys())
        deadline = time.monotonic() + 10
        while 0 in store.segment_sizes():  # gone once nobody needs it
            assert time.monotonic() < deadline, "GC did not resume"
            store.checkpoint()
            store.sync()
            store.maintain()
            await asyncio.sleep(0.02)
    finally:
        sock.close()
        await src.stop()
        store.close()


async def test_a_standby_back_on_a_quiet_active_is_in_sync_at_once(tmp_path: Path) -> None:
    store, src = await _active(tmp_path / "a")
    f = _follower(tmp_path / "b")
    try:
        for i in range(10):
            store.append_enqueue(["q"], _msg(i))
        store.sync()
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: src.insync_count() == 1 and f.last_seq == store.last_sequence)
        await f.stop()
        await until(lambda: src.insync_count() == 0)
        f = _follower(tmp_path / "b")
        f.start(f"127.0.0.1:{src.port}")  # nothing new to send: its first ACK says so
        await until(lambda: src.insync_count() == 1)
    finally:
        await f.stop()
        await src.stop()
        store.close()


async def test_stop_ends_a_follower_whose_cancellation_was_swallowed(tmp_path: Path) -> None:
    """Python 3.11's asyncio.wait_for returns the awaited result (here: raises the connect's
    OSError) when a cancellation arrives just as a refused connect completes, so the
    cancel is lost. Seen in CI as `amqpctl promote` hanging for 30 s on a standby whose
    active had been killed. stop() must end the follower all the same."""
    follower = _follower(tmp_path / "b")
    swallowed = 0

    async def session() -> bool:
        nonlocal swallowed
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if swallowed:  # the race happens once; later cancels go through
                raise
            swallowed += 1
            raise OSError("Connect call failed ('127.0.0.1', 1)") from None
        return False

    follower._session = session  # type: ignore[method-assign]
    follower.start("127.0.0.1:1")
    await asyncio.sleep(0.05)  # the follower is inside its session
    stopping = asyncio.ensure_future(follower.stop())
    done, _ = await asyncio.wait([stopping], timeout=5)
    assert stopping in done, "stop() did not return within 5 s"
    assert swallowed == 1
