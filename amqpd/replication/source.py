"""ReplicationSource: the active's side of log shipping.

Theory of operation
-------------------
A standby's log is a byte-for-byte copy of the active's: same segment files (same
names, same bytes), same checkpoint file, same deletions. Positions, sequence numbers
and the checkpoint therefore mean the same on both, and a standby that is promoted
simply *recovers* from its own data directory exactly as a restarted active would.

The source serves the replication listener. For each authenticated standby it keeps
a cursor ``(segment base, offset)`` and a queue of file operations, and one sender
task walks the log::

    writer thread                 loop thread (this module)           standby
    pwrite chunk ---("w",base,size,seq)--> written[base] = size
      (live tail: DATA via sendfile, straight from here, before our fsync) ------>
    checkpoint  ---("c",covered,data)----> ops += CHECKPOINT   sender: DATA via sendfile
    unlink      ---("d",base)-----------> ops += DELETE                 up to written[]
                                                                       ops in order
    ACK reader thread: ACK(seq) recorded <------------------------------ after its fsync
                       -- one wake-up per round --> gate.release

Catch-up and the live tail are the same loop: the cursor reads whatever is already in
the files (``os.sendfile``, zero-copy), then waits for the writer's next event. The
events come as soon as the bytes are in the files, before our own fsync, so the
standby's fsync runs in parallel with ours. A CHECKPOINT is sent only once the
standby's cursor is past the record it covers, and DELETEs after it, so the standby's
directory is always a valid data directory: kill it at any point and it recovers.

The live lane: a busy active's loop picks up the writer's event only after the work
already queued on it (milliseconds under load), and until then the standby's fsync
cannot start. So while a plain-TCP standby's sender is parked at the end of the log
(nothing else to send), it *opens the lane* (``_Peer.lane``, a thread lock): the writer
thread then sends the new bytes itself, one non-blocking ``sendfile`` straight after its
``pwrite`` and before its own fsync, and moves the cursor. The socket's sending side has
one owner at a time: the writer only while the lane is open, the loop from the moment
it closes the lane (at every wake-up, before it sends anything). When the socket cannot
take a whole frame, the writer leaves the rest of it in ``partial`` and closes the lane;
the loop sends that remainder first. TLS standbys never use the lane (the bytes must be
encrypted by the loop's transport).

A commit the lane carried whole leaves the loop nothing urgent: the sender has nothing
to send, and the standby takes the active's sequence from the DATA itself. Then the
writer's news (``_apply``: the sizes, the lag marks) waits for the batch's fsync and
reaches the loop with its callbacks, in one wake-up (store/writer.py), and the sender
sleeps on: no TAIL frame per group commit. A TAIL goes out whenever the sender runs
(catch-up, a segment roll, checkpoints, promises, a frame the lane left unfinished).

The ACKs: on plain TCP a thread per standby (``acks.py``) reads them, records each at
once in ``_Peer.acked_seq`` (a group commit whose local fsync completes later finds it
there and is confirmed without waiting) and wakes the loop once per round of ACKs
(``_acked``: GC's ``retain``, joining the in-sync set, releasing the gate). A busy loop
would otherwise leave an ACK in the socket until its next poll. Over TLS the loop reads
them (``_receiver``).

In-sync set and confirms
------------------------
A standby is *in sync* once it has acknowledged everything written at some moment
and, from then on, the oldest record it has not acknowledged is at most ``max_lag``
seconds old. In mode "sync" the log's ``commit_gate`` holds each group commit's
callbacks (publisher confirms, tx.commit-ok) until ``min_insync_standbys`` in-sync
standbys acknowledged its last sequence (:class:`SyncGate`); when fewer are in sync
for ``insync_timeout`` seconds the callbacks get :class:`NotReplicated` (a nack).

GC: the log's ``retain`` keeps every segment from the one holding the lowest
acknowledged position of a connected standby (not what was merely sent: a standby that
reconnects resumes from what it holds durably). A standby that asks for a segment GC
already deleted gets a SNAPSHOT: it drops its log and receives the live segments (and
the current checkpoint) from the first.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpd.config import ReplicationConfig, host_port, split_addr
from amqpd.replication import acks, trace, wire
from amqpd.replication.acks import AckReader
from amqpd.replication.conn import Conn, SocketConn, StreamConn
from amqpd.replication.epochs import EpochHistory, decide
from amqpd.replication.gate import SyncGate
from amqpd.store import checkpoint
from amqpd.store import format as fmt

if TYPE_CHECKING:
    from amqpd.store.log import SharedLog

log = logging.getLogger("amqpd.replication")

Callback = Callable[[BaseException | None], None]
_CHECKPOINT_RECORD = fmt.HEADER_SIZE + 8
_HANDSHAKE_TIMEOUT = 10.0
_KEEP_ALL = 1 << 62


@dataclass(frozen=True)
class StandbyState:
    """One connected standby as the active sees it (API, metrics, election)."""

    name: str
    address: str
    acked_seq: int
    lag_records: int
    lag_bytes: int
    lag_seconds: float
    in_sync: bool


class _Peer:
    """A connected standby (internal)."""

    def __init__(self, conn: Conn, address: str) -> None:
        self.conn = conn
        self.address = address
        self.name = "?"
        self.base = 0  # cursor: segment base ...
        self.offset = 0  # ... and offset in it of the next byte to send
        self.retain = 0  # base of the segment holding its acked position (GC keeps it)
        self.ops: collections.deque[tuple[Any, ...]] = collections.deque()
        self.wake = asyncio.Event()
        self.acked_seq = 0
        self.acked_pos = 0
        self.caught_up = False  # acknowledged everything written at least once
        self.in_sync = False
        self.connected_at = time.monotonic()
        self.sent_promises: dict[str, int] = {}
        self.sent_tail = (-1, -1)
        self.tasks: list[asyncio.Task[None]] = []
        # the live lane (module docstring): guards lane_open, partial and, while the
        # lane is open, the cursor (base, offset) and the socket's sending side
        self.lane = threading.Lock()
        self.lane_open = False
        self.sock = conn.sock if isinstance(conn, SocketConn) else None
        # (base, header bytes left, file offset, bytes left) of a frame the writer began
        self.partial: tuple[int, bytes, int, int] | None = None
        self.ack_reader: AckReader | None = None  # plain TCP: the thread reading its ACKs

    @property
    def position(self) -> int:
        return self.base + self.offset


class ReplicationSource:
    """Serves the log to standbys (see the module docstring)."""

    def __init__(self, store: SharedLog, config: ReplicationConfig, history: EpochHistory,
                 epoch: int) -> None:
        self.store = store
        self.config = config
        self.history = history
        self.epoch = epoch
        self.secret = config.shared_secret()
        self.name = config.node_name
        self.peers: list[_Peer] = []
        self.acked_by_name: dict[str, int] = {}  # durable seq each standby last acknowledged
        # called when a standby joins or leaves the in-sync set (the election records it)
        self.insync_changed: Callable[[], None] | None = None
        self.written: dict[int, int] = {}  # segment base -> bytes of whole records
        self.last_seq = 0
        self.end = 0
        self.marks: collections.deque[tuple[int, int, float]] = collections.deque()
        self.checkpoint: tuple[int, bytes] | None = None
        self.gate: SyncGate | None = None
        self.port = 0
        self.left_insync = 0  # times a standby left the in-sync set (metric)
        self.auth_failures = 0
        self.lane_frames = 0  # DATA frames the writer thread sent itself (the live lane)
        self._fds: dict[int, int] = {}
        self._sock: socket.socket | None = None
        self._tls: ssl.SSLContext | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Hook into the (open) log and open the listener, if ``listen`` is set."""
        self._loop = asyncio.get_running_loop()
        store = self.store
        store.sync()  # written == appended, so the figures below are exact
        self.written = store.segment_sizes()
        self.last_seq = store.last_sequence
        self.end = store.end_position
        self.checkpoint = _read_checkpoint(store.directory)
        store.set_observer(self._observe)
        store.retain = self._retain
        if self.config.mode == "sync":
            c = self.config
            minimum = c.min_insync_standbys if c.peers else 0
            isr = bool(c.peers) and minimum == 0
            self.gate = SyncGate(self, minimum, c.insync_timeout, isr=isr,
                                 record=c.role == "auto")
            store.commit_gate = self.gate.wrap
            if isr:
                log.info("replication: synchronous confirms, waiting for every in-sync "
                         "standby; one that is gone or lags past max_lag %.1fs leaves the "
                         "set and the active confirms alone (min_insync_standbys = 0)",
                         c.max_lag)
            else:
                log.info("replication: synchronous confirms, waiting for %d in-sync "
                         "standbys (max_lag %.1fs, insync_timeout %.1fs)", minimum,
                         c.max_lag, c.insync_timeout)
        else:
            log.warning("replication: ASYNCHRONOUS mode: confirms follow the local fsync; "
                        "a failover loses what the standby had not received")
        self._spawn(self._watch_insync())
        if self.config.listen:
            await self._open_listener()

    async def _open_listener(self) -> None:
        host, port = split_addr(self.config.listen)
        ctx = self._tls_context()
        self._tls = ctx
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._spawn(self._accept_loop(sock))
        log.info("replication listener on %s (%s), epoch %d", host_port(host, self.port),
                 "TLS" if ctx else "HMAC", self.epoch)

    def _tls_context(self) -> ssl.SSLContext | None:
        c = self.config
        if not (c.tls_cert and c.tls_key):
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(c.tls_cert, c.tls_key)
        if c.tls_ca:
            ctx.load_verify_locations(c.tls_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    async def stop(self) -> None:
        """Stop serving (fence, demotion, shutdown): close the listener and standbys,
        detach from the log; waiting confirms are nacked."""
        self._stopped = True
        if self._sock is not None:
            self._sock.close()
        for peer in list(self.peers):
            self._drop(peer, "replication stopped")
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.gate is not None:
            self.gate.fail_all("replication stopped")
        store = self.store
        store.set_observer(None)
        store.commit_gate = None
        store.retain = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- figures ---------------------------------------------------------------------

    def standbys(self) -> list[StandbyState]:
        now = time.monotonic()
        return [StandbyState(p.name, p.address, p.acked_seq,
                             max(0, self.last_seq - p.acked_seq),
                             max(0, self.end - p.acked_pos) if p.acked_pos else self.end,
                             round(self._lag_seconds(p, now), 3), p.in_sync)
                for p in self.peers]

    def insync_count(self) -> int:
        return sum(1 for p in self.peers if p.in_sync)

    def _lag_seconds(self, peer: _Peer, now: float) -> float:
        if peer.acked_seq >= self.last_seq:
            return 0.0
        if not peer.caught_up:
            return now - peer.connected_at
        for seq, _pos, t in self.marks:
            if seq > peer.acked_seq:
                return now - t
        return 0.0

    async def _watch_insync(self) -> None:
        """Re-evaluate the in-sync set (and expire confirms) several times a second."""
        max_lag = self.config.max_lag
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for p in self.peers:
                lagging = self._lag_seconds(p, now) > max_lag
                if p.in_sync and lagging:
                    log.warning("replication: standby %s (%s) left the in-sync set: "
                                "%.1fs behind (max_lag %.1fs), acked seq %d of %d",
                                p.name, p.address, self._lag_seconds(p, now), max_lag,
                                p.acked_seq, self.last_seq)
                    self._left(p)
            self._trim_marks()
            if self.gate is not None:
                self.gate.release()

    def _left(self, peer: _Peer) -> None:
        """``peer`` is out of the in-sync set (lagging, or gone)."""
        peer.in_sync = False
        peer.caught_up = False
        self.left_insync += 1
        if self.gate is not None:
            self.gate.leave(peer.name)
        if self.insync_changed is not None:
            self.insync_changed()

    def _trim_marks(self) -> None:
        marks = self.marks
        low = min((p.acked_seq for p in self.peers), default=self.last_seq)
        while marks and (marks[0][0] <= low or len(marks) > 200_000):
            marks.popleft()

    # -- log events (writer thread -> loop) ------------------------------------------

    def _observe(self, events: list[tuple[Any, ...]]) -> Callable[[], None] | None:
        """Writer thread: push the new bytes through open lanes, then tell the loop.

        When every standby got the new bytes through its lane (and they are only
        writes), no sender has anything to do: the loop's bookkeeping (:meth:`_apply`)
        can wait for the batch's fsync, and the writer hands it over with that batch's
        callbacks, one wake-up of the loop per group commit instead of two
        (writer.py)."""
        sizes = {ev[1]: ev[2] for ev in events if ev[0] == "w"}
        quiet = len(sizes) == len(events)  # only writes
        if sizes:
            if trace.ON:
                trace.mark("w", max(ev[3] for ev in events if ev[0] == "w"))
            for peer in list(self.peers):
                size = sizes.get(peer.base)
                if size is None or len(sizes) > 1 or not self._push(peer, size):
                    quiet = False
            if trace.ON:
                trace.mark("l", max(ev[3] for ev in events if ev[0] == "w"))
        loop = self._loop
        if quiet and loop is not None:  # (no loop yet: nobody to tell, as below)
            return lambda: self._apply(events, wake=False)
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._apply, events)
            except RuntimeError:  # loop closed at shutdown
                pass
        return None

    def _apply(self, events: list[tuple[Any, ...]], wake: bool = True) -> None:
        """Loop: record the writer's events; wake the senders (``wake``: always; else
        only those with something to send: the lane carried the bytes)."""
        now = time.monotonic()
        for ev in events:
            kind = ev[0]
            if kind == "w":
                _, base, size, seq = ev
                if size > self.written.get(base, 0):
                    self.written[base] = size
                if seq > self.last_seq:
                    self.last_seq = seq
                    self.end = base + size
                    self.marks.append((seq, base + size, now))
            elif kind == "c":
                self.checkpoint = (ev[1], ev[2])
                for p in self.peers:
                    if p.ops and p.ops[-1][0] == "c":
                        p.ops[-1] = ("c", ev[1], ev[2])  # a newer one supersedes it
                    else:
                        p.ops.append(("c", ev[1], ev[2]))
            elif kind == "d":
                self.written.pop(ev[1], None)
                fd = self._fds.pop(ev[1], None)
                if fd is not None:
                    os.close(fd)
                for p in self.peers:
                    p.ops.append(("d", ev[1]))
        promised = self.store.promises() if not wake else None
        for p in self.peers:
            if wake or p.ops or not p.lane_open or p.sent_promises != promised \
                    or p.offset < self.written.get(p.base, 0):
                p.wake.set()

    def _push(self, peer: _Peer, size: int) -> bool:
        """Writer thread: send segment ``peer.base`` up to ``size`` through the lane,
        without ever blocking (a standby that does not read must not stall our fsync).
        True: all of it went, and the lane is still open."""
        with peer.lane:
            sock = peer.sock
            fd = self._fds.get(peer.base)
            if not peer.lane_open or sock is None or fd is None:
                return False
            base = peer.base
            while peer.offset < size:
                n = min(size - peer.offset, wire.MAX_DATA)
                head = wire.data_header(base, peer.offset, n)
                try:
                    sent = sock.send(head)
                except (BlockingIOError, InterruptedError):
                    return False  # nothing of this frame went out: the loop sends it
                except OSError:
                    peer.lane_open = False  # the loop's next send finds out why
                    return False
                offset, left = peer.offset, n
                peer.offset += n
                self.lane_frames += 1
                if sent == len(head):
                    head = b""
                    while left:
                        try:
                            k = os.sendfile(sock.fileno(), fd, offset, left)
                        except OSError:  # EAGAIN, or a broken connection: the loop
                            break
                        if k <= 0:
                            break
                        offset += k
                        left -= k
                else:
                    head = head[sent:]
                if head or left:
                    peer.partial = (base, head, offset, left)
                    peer.lane_open = False
                    return False
            return True

    def _open_lane(self, peer: _Peer) -> None:
        """Loop: the sender is parked at the end of the log; the writer may push."""
        if peer.sock is None:
            return
        try:
            self._fd(peer.base)  # opened here, on the loop: the writer only looks it up
        except OSError:
            return  # the segment is gone: the sender finds out on its next turn
        with peer.lane:
            peer.lane_open = True

    async def _close_lane(self, peer: _Peer) -> None:
        """Loop: take the socket back, and finish a frame the writer began."""
        if peer.sock is None:
            return
        with peer.lane:
            peer.lane_open = False
            partial, peer.partial = peer.partial, None
        if partial is not None:
            base, head, offset, left = partial
            if head:
                await peer.conn.send(head)
            if left:
                await peer.conn.send_file(self._fd(base), offset, left)

    def _retain(self) -> int:
        """The lowest log position a connected standby still needs (GC keeps it)."""
        return min((p.retain for p in self.peers), default=_KEEP_ALL)

    # -- connections -----------------------------------------------------------------

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, addr = await loop.sock_accept(sock)
            except OSError as exc:
                if self._stopped:
                    return
                log.warning("replication listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            address = f"{addr[0]}:{addr[1]}"
            if self._tls is None:
                self._spawn(self._serve(SocketConn(client, address)))
            else:
                self._spawn(self._serve_tls(client, address, self._tls))

    async def _serve_tls(self, client: socket.socket, address: str,
                         ctx: ssl.SSLContext) -> None:
        """TLS on an accepted socket: the handshake (client certificate included) fails
        here, where it is counted and logged, not silently inside asyncio."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, client, ssl=ctx, ssl_handshake_timeout=_HANDSHAKE_TIMEOUT)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            self.auth_failures += 1
            log.warning("replication: refused %s: TLS handshake failed: %s", address,
                        str(exc) or type(exc).__name__)
            client.close()
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        await self._serve(StreamConn(reader, writer, address))

    async def _serve(self, conn: Conn) -> None:
        peer = _Peer(conn, conn.peer)
        try:
            await asyncio.wait_for(self._handshake(peer), _HANDSHAKE_TIMEOUT)
        except wire.AuthError as exc:
            self.auth_failures += 1
            log.warning("replication: refused %s from %s: %s", peer.name, conn.peer, exc)
            await _send_error(conn, str(exc))
            conn.close()
            return
        except (TimeoutError, wire.ProtocolError, ConnectionError, OSError) as exc:
            log.warning("replication: handshake with %s failed: %s", conn.peer,
                        str(exc) or type(exc).__name__)
            await _send_error(conn, str(exc))
            conn.close()
            return
        if peer.retain < 0:
            conn.close()  # answered TRUNCATE or REFUSE: it reconnects when ready
            return
        self.peers.append(peer)
        sender = asyncio.ensure_future(self._sender(peer))
        receiver = asyncio.ensure_future(self._read_acks(peer, conn)
                                         if isinstance(conn, SocketConn)
                                         else self._receiver(peer))
        peer.tasks = [sender, receiver]
        try:
            done, _ = await asyncio.wait(peer.tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                failure = task.exception()
                if failure is not None:
                    raise failure
            reason = "closed"
        except asyncio.CancelledError:
            reason = "replication stopped"
        except (wire.ProtocolError, ConnectionError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
        self._drop(peer, reason)

    def _drop(self, peer: _Peer, reason: str) -> None:
        with peer.lane:
            peer.lane_open = False  # the writer must not send on a closed socket
        if peer.ack_reader is not None:
            peer.ack_reader.stop()  # its dup would keep the connection open (acks.py)
        for task in peer.tasks:
            task.cancel()
        if peer in self.peers:
            self.peers.remove(peer)
            log.warning("replication: standby %s (%s) disconnected: %s", peer.name,
                        peer.address, reason)
            if peer.in_sync and not self._stopped:
                self._left(peer)
        peer.conn.close()

    async def _handshake(self, peer: _Peer) -> None:
        conn = peer.conn
        ftype, payload = await conn.recv_frame()
        if ftype != wire.HELLO:
            raise wire.ProtocolError(f"expected HELLO, got frame type {ftype}")
        their_nonce, peer.name = wire.parse_hello(payload)
        nonce = secrets.token_bytes(wire.NONCE_SIZE)
        await conn.send(wire.challenge(nonce, self.name))
        ftype, payload = await conn.recv_frame()
        if ftype != wire.AUTH:
            raise wire.ProtocolError(f"expected AUTH, got frame type {ftype}")
        wire.check_mac(wire.mac(self.secret, b"standby", nonce, their_nonce, peer.name),
                       payload)
        await conn.send(wire.frame(wire.AUTH_OK, wire.mac(self.secret, b"active",
                                                           their_nonce, nonce, self.name)))
        ftype, payload = await conn.recv_frame()
        if ftype != wire.FOLLOW:
            raise wire.ProtocolError(f"expected FOLLOW, got frame type {ftype}")
        f = wire.parse_follow(payload)
        answer = self._place(f)
        await conn.send(wire.welcome(answer))
        if answer.decision in (wire.TRUNCATE, wire.REFUSE):
            what = (f"refused: its epoch {f.epoch} is newer than ours"
                    if answer.decision == wire.REFUSE else
                    f"told to cut its log after sequence {answer.truncate_seq} "
                    "(an unconfirmed tail)")
            log.warning("replication: standby %s (%s) at epoch %d seq %d %s", peer.name,
                        conn.peer, f.epoch, f.last_seq, what)
            peer.retain = -1
            return
        peer.base, peer.offset = answer.base, answer.offset
        peer.retain = peer.base
        if self.checkpoint is not None:
            peer.ops.append(("c", *self.checkpoint))
        peer.acked_seq = f.last_seq if answer.decision == wire.CONTINUE else 0
        self.acked_by_name[peer.name] = peer.acked_seq  # a snapshot starts from nothing
        log.info("replication: standby %s (%s) follows from seq %d (%s at %d:%d), epoch %d",
                 peer.name, conn.peer, f.last_seq,
                 "continue" if answer.decision == wire.CONTINUE else "snapshot",
                 answer.base, answer.offset, self.epoch)

    def _place(self, f: wire.Follow) -> wire.Welcome:
        """Where a follower starts: the (epoch, seq) rule, then its position."""
        live = tuple(self.written)
        history = tuple(self.history.entries)
        decision, tseq = decide(self.history, self.epoch, self.last_seq, f.epoch, f.last_seq)
        if decision in (wire.TRUNCATE, wire.REFUSE):
            return wire.Welcome(decision, self.epoch, truncate_seq=tseq, live=live,
                                history=history)
        if decision == wire.CONTINUE:
            where = self._continue_at(f)
            if where is not None:
                return wire.Welcome(wire.CONTINUE, self.epoch, where[0], where[1], 0, live,
                                    history)
        first = live[0] if live else 0
        return wire.Welcome(wire.SNAPSHOT, self.epoch, first, 0, 0, live, history)

    def _continue_at(self, f: wire.Follow) -> tuple[int, int] | None:
        """(base, offset) continuing the follower's log exactly, or None (snapshot)."""
        bases = list(self.written)
        if f.size == 0:
            return (0, 0) if bases and bases[0] == 0 and f.last_seq == 0 else None
        size = self.written.get(f.base)
        if size is None or f.size > size:
            return None
        if f.size < size:
            return (f.base, f.size) if self._seq_at(f.base, f.size) == f.last_seq + 1 \
                else None
        later = [b for b in bases if b > f.base]
        if not later:
            return (f.base, f.size) if f.last_seq == self.last_seq else None
        nxt = later[0]
        return (nxt, 0) if self._seq_at(nxt, fmt.FILE_HEADER_SIZE) == f.last_seq + 1 \
            else None

    def _seq_at(self, base: int, offset: int) -> int:
        """The sequence number of the record at ``offset`` of segment ``base``."""
        try:
            head = os.pread(self._fd(base), fmt.HEADER_SIZE, offset)
        except OSError:
            return -1
        if len(head) < fmt.HEADER_SIZE:
            return -1
        return int(fmt.RECORD_HEADER.unpack(head)[2])

    def _fd(self, base: int) -> int:
        fd = self._fds.get(base)
        if fd is None:
            fd = os.open(self.store.directory / f"{base:020d}.log", os.O_RDONLY)
            self._fds[base] = fd
        return fd

    # -- per standby -----------------------------------------------------------------

    async def _sender(self, peer: _Peer) -> None:
        conn = peer.conn
        while True:
            while peer.ops:
                op = peer.ops[0]
                if op[0] == "c":
                    if peer.position < op[1] + _CHECKPOINT_RECORD:
                        break
                    await conn.send(wire.frame(wire.CHECKPOINT, op[2]))
                else:
                    await conn.send(wire.delete(op[1]))
                peer.ops.popleft()
            size = self.written.get(peer.base)
            if size is None:
                raise ConnectionError(f"segment {peer.base} is gone (deleted while needed)")
            if peer.offset < size:
                n = min(size - peer.offset, wire.MAX_DATA)
                await conn.send(wire.data_header(peer.base, peer.offset, n))
                await conn.send_file(self._fd(peer.base), peer.offset, n)
                peer.offset += n
                continue
            nxt = next((b for b in self.written if b > peer.base), None)
            if nxt is not None:
                peer.base, peer.offset = nxt, 0
                continue
            if peer.ops and peer.ops[0][0] == "c":
                await peer.wake.wait()  # a checkpoint past what is written: wait for it
                peer.wake.clear()
                continue
            promised = self.store.promises()
            for queue, upto in list(promised.items()):
                if peer.sent_promises.get(queue) != upto:
                    peer.sent_promises[queue] = upto
                    await conn.send(wire.promise(queue, upto))
            tail = (self.last_seq, self.end)
            if tail != peer.sent_tail:
                peer.sent_tail = tail
                await conn.send(wire.pair(wire.TAIL, *tail))
            if peer.offset >= self.written.get(peer.base, 0) and not peer.ops:
                self._open_lane(peer)
                await peer.wake.wait()  # cancelled: _drop closes the lane
                await self._close_lane(peer)
                peer.wake.clear()

    async def _read_acks(self, peer: _Peer, conn: SocketConn) -> None:
        """Plain TCP: a thread reads the ACKs (acks.py) and calls :meth:`_acked` on the
        loop; this task only waits for it to end, and raises why."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[BaseException] = loop.create_future()

        def end(reason: BaseException) -> None:
            if not ended.done():
                ended.set_result(reason)

        def arrived() -> None:
            reader.taken()
            if peer in self.peers:
                self._acked(peer)

        reader = AckReader(conn.sock, peer, self.acked_by_name, loop, arrived, end)
        peer.ack_reader = reader
        reader.start()
        try:
            raise await ended
        finally:
            reader.stop()

    def _acked(self, peer: _Peer) -> None:
        """Loop: ``peer`` acknowledged up to ``peer.acked_seq`` (already recorded)."""
        seq, pos = peer.acked_seq, peer.acked_pos
        # GC may take what it holds durably: segments before the acked one
        peer.retain = max((b for b in self.written if b <= pos), default=peer.retain)
        if seq >= self.last_seq and not peer.in_sync:
            peer.caught_up = peer.in_sync = True
            log.info("replication: standby %s (%s) is in sync at seq %d",
                     peer.name, peer.address, seq)
            if self.gate is not None:
                self.gate.join(peer.name)
            if self.insync_changed is not None:
                self.insync_changed()
        if self.gate is not None:
            self.gate.release()

    async def _receiver(self, peer: _Peer) -> None:
        """TLS: the loop reads the ACKs (the transport decrypts them)."""
        conn = peer.conn
        while True:
            ftype, payload = await conn.recv_frame()
            if ftype == wire.ACK:
                acks.record(peer, self.acked_by_name, payload)
                self._acked(peer)
            elif ftype == wire.ERROR:
                raise wire.ProtocolError(f"standby reports: {wire.parse_error(payload)}")
            else:
                raise wire.ProtocolError(f"unexpected frame type {ftype} from a standby")


async def _send_error(conn: Conn, text: str) -> None:
    try:
        await asyncio.wait_for(conn.send(wire.error(text)), 1.0)
    except (TimeoutError, OSError, ConnectionError):
        pass


def _read_checkpoint(directory: Path) -> tuple[int, bytes] | None:
    """(covered, bytes) of the durable checkpoint file, or None."""
    try:
        data = (directory / checkpoint.FILE_NAME).read_bytes()
    except FileNotFoundError:
        return None
    head = struct.calcsize("<4sHIQ")
    if len(data) < head + 8:
        return None
    return int(struct.unpack_from("<q", data, head)[0]), data
