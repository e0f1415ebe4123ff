"""The active's ACK reader thread (acks.py): ACKs recorded as they arrive with one loop
wake-up per round, a standby that drops mid-ACK or says something wrong ends the
session once, stop() really closes the connection, and confirms stay exact while
standby sessions come and go."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from pathlib import Path

from amqpd.replication import wire
from amqpd.replication.acks import AckReader
from amqpd.replication.conn import SocketConn
from amqpd.replication.source import ReplicationSource
from tests.unit.replication.test_lane import _commit, _pair, held
from tests.unit.replication.test_shipping import until


class _Peer:
    def __init__(self) -> None:
        self.name = "sb"
        self.acked_seq = 0
        self.acked_pos = 0


class _Harness:
    """An AckReader on one end of a loopback connection; the test is the standby."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            self.standby = socket.create_connection(listener.getsockname())
            self.ours, _ = listener.accept()
        self.ours.setblocking(False)  # as the loop's socket is (the dup shares it)
        self.peer = _Peer()
        self.by_name: dict[str, int] = {}
        self.arrivals: list[int] = []  # acked_seq each time the loop was woken
        self.endings: list[BaseException] = []
        self.hold = False  # leave the wake-up pending (the loop is busy elsewhere)
        self.reader = AckReader(self.ours, self.peer, self.by_name, loop, self._arrived,
                                self.endings.append)

    def _arrived(self) -> None:
        if self.hold:
            return
        self.reader.taken()
        self.arrivals.append(self.peer.acked_seq)

    def ack(self, seq: int, pos: int) -> bytes:
        return wire.pair(wire.ACK, seq, pos)

    async def ended(self) -> BaseException:
        await until(lambda: bool(self.endings))
        await asyncio.to_thread(self.reader.join, 5)
        assert not self.reader._thread.is_alive()
        assert self.reader._fd is None  # its dup is closed
        return self.endings[0]

    def close(self) -> None:
        self.reader.stop()
        self.reader.join(5)
        self.ours.close()
        self.standby.close()


async def test_acks_are_recorded_at_once_with_one_wakeup_per_round() -> None:
    h = _Harness(asyncio.get_running_loop())
    try:
        h.reader.start()
        # the loop busy (its wake-up left pending) while three ACKs come: however the
        # kernel hands them to the thread (one read or several, under load), each is
        # recorded at once where the gate reads it, and one wake-up is queued
        h.hold = True
        h.standby.sendall(h.ack(3, 300) + h.ack(5, 500) + h.ack(9, 900))
        await until(lambda: h.reader.acks == 3)
        assert h.reader.wakeups == 1
        assert (h.peer.acked_seq, h.peer.acked_pos, h.by_name) == (9, 900, {"sb": 9})
        h.hold = False
        h.reader.taken()  # what the pending call does
        # while a wake-up is pending, ACKs are recorded (the gate sees them) but do not
        # queue more wake-ups; the pending one reads the newest figures
        h.hold = True
        h.standby.sendall(h.ack(10, 1000))
        await until(lambda: h.reader.acks == 4)
        assert h.peer.acked_seq == 10
        h.standby.sendall(h.ack(11, 1100))
        await until(lambda: h.reader.acks == 5)
        assert h.reader.wakeups == 2 and h.peer.acked_seq == 11
        h.hold = False
        h.reader.taken()  # what the pending call would have done
        h.standby.sendall(h.ack(12, 1200)[:7])  # an ACK in two pieces
        await asyncio.sleep(0.05)
        assert h.peer.acked_seq == 11
        h.standby.sendall(h.ack(12, 1200)[7:])
        # (a wake-up queued while held may still run once it is released: it reads
        # whatever was recorded then, so only the last arrival is certain)
        await until(lambda: h.arrivals[-1:] == [12])
        assert h.endings == []
    finally:
        h.close()


async def test_a_standby_dropping_mid_ack_ends_the_session_once() -> None:
    h = _Harness(asyncio.get_running_loop())
    try:
        h.reader.start()
        h.standby.sendall(h.ack(4, 400) + h.ack(6, 600)[:10])
        await until(lambda: h.peer.acked_seq == 4)
        h.standby.close()
        reason = await h.ended()
        assert isinstance(reason, ConnectionError)
        assert h.peer.acked_seq == 4  # half an ACK counts for nothing
        await asyncio.sleep(0.05)
        assert len(h.endings) == 1
    finally:
        h.close()


async def test_a_backwards_ack_or_an_error_frame_ends_the_session() -> None:
    for data, words in ((wire.pair(wire.ACK, 7, 1) + wire.pair(wire.ACK, 6, 1),
                         "went backwards (6 < 7)"),
                        (wire.error("disk full"), "standby reports: disk full"),
                        (wire.pair(wire.TAIL, 1, 1), "unexpected frame type"),
                        (b"\xff\x00\x00\x00\x00", "unknown frame type 255")):
        h = _Harness(asyncio.get_running_loop())
        try:
            h.reader.start()
            h.standby.sendall(data)
            reason = await h.ended()
            assert isinstance(reason, wire.ProtocolError) and words in str(reason), reason
        finally:
            h.close()


async def test_stop_closes_the_connection_despite_the_readers_dup() -> None:
    h = _Harness(asyncio.get_running_loop())
    try:
        h.reader.start()
        h.standby.sendall(h.ack(1, 100))
        await until(lambda: h.arrivals == [1])
        h.ours.close()  # the loop's descriptor alone: the dup keeps the connection
        h.standby.settimeout(0.1)
        try:
            assert h.standby.recv(1) != b""
        except TimeoutError:
            pass
        h.reader.stop()
        h.reader.stop()  # twice is harmless
        assert isinstance(await h.ended(), ConnectionError)
        h.standby.settimeout(5)
        assert h.standby.recv(1) == b""  # the standby sees the end
    finally:
        h.close()


async def test_confirms_stay_exact_while_standby_sessions_come_and_go(
        tmp_path: Path) -> None:
    """ACKs read on the reader thread while sessions are cut under it: every commit is
    confirmed only once the standby holds it, and no reader thread outlives its
    session."""

    def _replaced(src: ReplicationSource, old: object) -> bool:
        return bool(src.peers) and src.peers[0] is not old and src.insync_count() == 1

    def readers() -> int:
        return sum(t.name == "amqpd-standby-acks" for t in threading.enumerate())

    async with _pair(tmp_path) as (store, src, f):
        n = 0
        for _round in range(5):
            for _ in range(10):
                assert await _commit(store, range(n, n + 3)) is None
                assert held(f) >= store.last_sequence  # confirmed => on the standby
                n += 3
            old = src.peers[0]
            assert old.ack_reader is not None and old.ack_reader.acks > 0
            # cut the session under the reader (as a network failure would): a commit
            # made meanwhile waits for the next session's ACK
            assert isinstance(old.conn, SocketConn)
            old.conn.sock.shutdown(socket.SHUT_RDWR)
            pending = asyncio.ensure_future(_commit(store, range(n, n + 3)))
            n += 3
            await until(functools.partial(_replaced, src, old), 20)
            assert await pending is None
            assert held(f) >= store.last_sequence
            await until(lambda: readers() == 1)
    await until(lambda: readers() == 0)
