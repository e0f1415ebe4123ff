"""ReplicationFollower: the standby's side of log shipping.

The follower makes its data directory a byte-for-byte copy of the active's (see
``source.py``): it writes every DATA frame into the segment file of the same name at
the same offset, checks each record's CRC and that sequence numbers only grow (bytes
from the network are distrusted like bytes from disk), and fsyncs in its own group
commit: a thread of its own (``syncer.py``) fsyncs whatever was written since its last
round, then acknowledges the highest sequence that is now durable. Reception goes on
while it syncs, so one fsync covers everything that arrived meanwhile.

CHECKPOINT frames are installed (atomically) only after the log up to them is
durable, DELETE frames after that, PROMISE frames go to the delivery journal
(``store/marks.py``): at every instant the directory is a valid data directory. No
broker runs over it while following; on promotion the node recovers from it exactly as
a restart does, messages delivered but unacknowledged on the old active included
(DELIVERED records and promises travel too, so they come back redelivered).

The follower reconnects on its own (0.2 s, doubling to 2 s) until stopped. TRUNCATE
cuts the log (``store/tail.py``) and reconnects; REFUSE (the active is older than us)
is logged and retried slowly, never obeyed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import ssl
import time
from pathlib import Path

from amqpd.config import ReplicationConfig, split_addr
from amqpd.replication import trace, wire
from amqpd.replication.conn import StreamConn
from amqpd.replication.epochs import EpochHistory
from amqpd.replication.syncer import SyncThread
from amqpd.store import checkpoint, marks
from amqpd.store import format as fmt
from amqpd.store.segment import fsync_directory, segment_name
from amqpd.store.tail import scan_tail, segments, truncate_after

log = logging.getLogger("amqpd.replication")

_CONNECT_TIMEOUT = 5.0


class ReplicationFollower:
    """Follows one active into ``directory`` (the node's log directory)."""

    def __init__(self, directory: Path, config: ReplicationConfig,
                 history: EpochHistory) -> None:
        self.directory = Path(directory)
        self.config = config
        self.history = history
        self.secret = config.shared_secret()
        self.name = config.node_name
        self.active_addr = ""
        self.active_name = ""
        self.connected = False
        self.epoch = history.last_epoch
        # acknowledged: durable here, or with standby_ack = "write" written here (the
        # page cache survives our process; durable_seq is what a power loss leaves)
        self.last_seq = 0
        self.durable_seq = 0
        self.ack_on_write = config.standby_ack == "write"
        self._conn: StreamConn | None = None  # the session's (ACKs on write)
        self.active_seq = 0  # the active's last sequence, as it told us or sent it
        self.refused = ""  # why the active refused us, if it did
        self.bytes_received = 0
        self.auth_failures = 0
        self._behind_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # writing state (one session at a time)
        self._fds: dict[int, int] = {}
        self._sync: SyncThread | None = None
        self._sync_error: OSError | None = None
        self._cur_base = -1
        self._cur_size = 0
        self._pbuf = bytearray()
        self._ppos = 0
        self._valid_seq = 0
        self._valid_pos = 0
        self._stale: list[int] = []
        self._journal = marks.DeliveryJournal(self.directory)

    # -- figures ---------------------------------------------------------------------

    @property
    def lag(self) -> float:
        """Seconds since this standby last held everything the active announced."""
        return 0.0 if self._behind_since is None else time.monotonic() - self._behind_since

    @property
    def lag_records(self) -> int:
        return max(0, self.active_seq - self.last_seq)

    # -- lifecycle -------------------------------------------------------------------

    def start(self, active_addr: str) -> None:
        self.active_addr = active_addr
        self.directory.mkdir(parents=True, exist_ok=True)
        self._journal.promised = marks.read(self.directory)
        self._journal.open()
        self._stopping = False
        self._task = asyncio.ensure_future(self._run())
        log.info("replication: following the active at %s", active_addr)

    async def stop(self) -> None:
        """Stop following; everything received is fsync'd and closed on return."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            # Python 3.11's asyncio.wait_for can swallow a cancellation that arrives as the
            # awaited connect completes (a refused connect to a dead active completes at
            # once): _run then goes round again. The flag ends the loop at its next turn;
            # the repeated cancel reaches a session that had already begun.
            for _ in range(50):
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
                if task.done():
                    break
            else:
                log.error("replication: the follower did not stop within 5 s")
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("replication: the follower ended with %r", task.exception())
        self._close_files()
        self._journal.close(remove=False)
        self.connected = False

    async def _run(self) -> None:
        delay = 0.2
        last_error, last_logged = "", 0.0
        while not self._stopping:
            try:
                again = await self._session()
                if again:
                    delay = 0.2
                    continue
            except asyncio.CancelledError:
                raise
            except wire.AuthError as exc:
                self.auth_failures += 1
                log.error("replication: the active at %s refused us or failed to prove the "
                          "shared secret: %s", self.active_addr, exc)
            except (TimeoutError, wire.ProtocolError, OSError, ConnectionError) as exc:
                text = str(exc) or type(exc).__name__
                now = time.monotonic()
                if self.connected or text != last_error or now - last_logged > 30:
                    # every new reason once, a repeated one every 30 s
                    log.warning("replication: %s the active at %s: %s",
                                "lost" if self.connected else "cannot follow",
                                self.active_addr, text)
                    last_error, last_logged = text, now
            except Exception:
                log.exception("replication: following %s failed", self.active_addr)
            finally:
                self.connected = False
                self._close_files()
            if self._stopping:
                return
            if self.refused:
                delay = 2.0
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- one session -----------------------------------------------------------------

    async def _session(self) -> bool:
        """Connect, catch up, follow. True: reconnect at once (after a TRUNCATE)."""
        host, port = split_addr(self.active_addr)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=self._tls_context()), _CONNECT_TIMEOUT)
        conn = StreamConn(reader, writer, self.active_addr)
        try:
            await asyncio.wait_for(self._handshake(conn), _CONNECT_TIMEOUT)
            tail = scan_tail(self.directory, repair=True)
            await conn.send(wire.follow(wire.Follow(self.history.last_epoch, tail.last_seq,
                                                    tail.base, tail.size)))
            ftype, payload = await asyncio.wait_for(conn.recv_frame(), _CONNECT_TIMEOUT)
            if ftype == wire.ERROR:
                raise wire.ProtocolError(f"the active says: {wire.parse_error(payload)}")
            if ftype != wire.WELCOME:
                raise wire.ProtocolError(f"expected WELCOME, got frame type {ftype}")
            w = wire.parse_welcome(payload)
            if w.decision == wire.REFUSE:
                self.refused = (f"our epoch {self.history.last_epoch} is newer than the "
                                f"active's {w.epoch}: not following a stale active")
                log.error("replication: %s at %s", self.refused, self.active_addr)
                return False
            self.refused = ""
            if w.decision == wire.TRUNCATE:
                truncate_after(self.directory, w.truncate_seq)
                self.history.replace([(e, s) for e, s in self.history.entries
                                      if s <= w.truncate_seq])
                return True
            self._begin(w, tail.last_seq)
            self.connected = True
            log.info("replication: following %s (%s) at epoch %d from seq %d (%s)",
                     self.active_name, self.active_addr, w.epoch, self._valid_seq,
                     "snapshot" if w.decision == wire.SNAPSHOT else "continue")
            # what we hold durably already: on a quiet active this is what puts a
            # standby that was only briefly away back in the in-sync set. Durably: a
            # killed process (ours, under standby_ack = "write" or mid-fsync) leaves
            # written bytes that no fsync covered, so make sure of them first
            await asyncio.to_thread(_fsync_segments, self.directory)
            await conn.send(wire.pair(wire.ACK, self._valid_seq, self._valid_pos))
            self.durable_seq = self._valid_seq
            self._sync_error = None
            sock = writer.get_extra_info("socket")
            # standby_ack = "write": the loop acknowledges each frame once it is written
            # and checked; the fsync thread then only makes it durable, never ACKs
            ack_fd = None if sock is None or self._tls_context() is not None \
                or self.ack_on_write else os.dup(sock.fileno())
            self._conn = conn
            self._sync = SyncThread(self.directory, asyncio.get_running_loop(),
                                    lambda seq, pos, acked: self._synced(conn, seq, pos,
                                                                         acked),
                                    lambda exc: self._sync_failed(conn, exc), ack_fd)
            self._sync.start()
            try:
                await self._receive(conn)
            except ConnectionError:
                if self._sync_error is not None:
                    raise self._sync_error from None
                raise
            return False
        finally:
            self._close_files()
            conn.close()

    def _tls_context(self) -> ssl.SSLContext | None:
        c = self.config
        if not (c.tls_cert and c.tls_key):
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=c.tls_ca or None)
        ctx.check_hostname = False  # peers are addressed by IP; the CA vouches for them
        ctx.load_cert_chain(c.tls_cert, c.tls_key)
        return ctx

    async def _handshake(self, conn: StreamConn) -> None:
        nonce = secrets.token_bytes(wire.NONCE_SIZE)
        await conn.send(wire.hello(nonce, self.name))
        ftype, payload = await conn.recv_frame()
        if ftype == wire.ERROR:
            raise wire.AuthError(wire.parse_error(payload))
        if ftype != wire.CHALLENGE:
            raise wire.ProtocolError(f"expected CHALLENGE, got frame type {ftype}")
        their_nonce, self.active_name = wire.parse_challenge(payload)
        await conn.send(wire.frame(wire.AUTH, wire.mac(self.secret, b"standby", their_nonce,
                                                        nonce, self.name)))
        ftype, payload = await conn.recv_frame()
        if ftype == wire.ERROR:
            raise wire.AuthError(wire.parse_error(payload))
        if ftype != wire.AUTH_OK:
            raise wire.ProtocolError(f"expected AUTH_OK, got frame type {ftype}")
        wire.check_mac(wire.mac(self.secret, b"active", nonce, their_nonce,
                                self.active_name), payload)

    def _begin(self, w: wire.Welcome, last_seq: int) -> None:
        """Set up writing at the WELCOME's place (wiping the log for a SNAPSHOT)."""
        own = list(segments(self.directory))
        if w.decision == wire.SNAPSHOT:
            for base in own:
                (self.directory / segment_name(base)).unlink(missing_ok=True)
            (self.directory / checkpoint.FILE_NAME).unlink(missing_ok=True)
            self._journal.close(remove=True)
            self._journal.promised = {}
            self._journal.open()
            fsync_directory(self.directory)
            last_seq = 0
            self._stale = []
        else:
            live = set(w.live)
            self._stale = [b for b in own if b not in live and b < w.base]
        self.history.replace(list(w.history))
        self.epoch = w.epoch
        self._valid_seq = self.last_seq = self.active_seq = last_seq
        self._cur_base, self._cur_size = w.base, w.offset
        self._valid_pos = w.base + w.offset
        self._pbuf = bytearray()
        self._ppos = w.offset
        if not w.offset:
            self._cur_base = -1  # the first DATA creates the segment file
        else:
            path = self.directory / segment_name(w.base)
            fd = os.open(path, os.O_WRONLY)
            if os.fstat(fd).st_size != w.offset:
                os.ftruncate(fd, w.offset)
            self._fds[w.base] = fd

    async def _receive(self, conn: StreamConn) -> None:
        while True:
            ftype, payload = await conn.recv_frame()
            self.bytes_received += len(payload) + wire.HEADER_SIZE
            if ftype == wire.DATA:
                if trace.ON:
                    trace.mark("x", self._valid_seq)
                self._data(*wire.parse_data(payload), payload)
                if trace.ON:
                    trace.mark("c", self._valid_seq)
                if self._valid_seq > self.active_seq:
                    # the active holds at least what it sent; a live active sends no
                    # TAIL after the bytes it pushed itself (source.py, the live lane)
                    self.active_seq = self._valid_seq
                    self._note_lag()
            elif ftype == wire.CHECKPOINT:
                await self._checkpoint(payload)
            elif ftype == wire.DELETE:
                await self._delete(wire.parse_u64(payload, "DELETE"))
            elif ftype == wire.PROMISE:
                queue, upto = wire.parse_promise(payload)
                self._journal.promise(queue, upto, upto)
            elif ftype == wire.TAIL:
                seq, _ = wire.parse_pair(payload, "TAIL")
                # never below what it sent us: a TAIL the sender wrote before the
                # writer's news reached its loop can trail the lane's DATA
                self.active_seq = max(seq, self._valid_seq)
                self._note_lag()
            elif ftype == wire.ERROR:
                raise wire.ProtocolError(f"the active says: {wire.parse_error(payload)}")
            else:
                raise wire.ProtocolError(f"unexpected frame type {ftype} from the active")

    def _note_lag(self) -> None:
        if self.last_seq >= self.active_seq:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = time.monotonic()

    # -- writing ---------------------------------------------------------------------

    def _data(self, base: int, offset: int, data: memoryview, frame: bytes) -> None:
        """Write ``data`` (the tail of the DATA ``frame``) at ``offset`` of segment
        ``base``, hand it to the fsync thread, check it."""
        if base != self._cur_base:
            if offset != 0 or base < self._cur_base:
                raise wire.ProtocolError(f"DATA for segment {base} at {offset}: expected "
                                         f"segment {self._cur_base} at {self._cur_size}")
            if self._pbuf:
                raise wire.ProtocolError(f"segment {self._cur_base} ends inside a record")
            fd = os.open(self.directory / segment_name(base),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            old = self._fds.pop(self._cur_base, None)
            if old is not None:
                if self._sync is not None:
                    self._sync.close_later(old)  # fsync'd first: it may hold new bytes
                else:
                    os.close(old)
            self._fds[base] = fd
            new_file = True
            self._cur_base, self._cur_size, self._ppos = base, 0, 0
        elif offset != self._cur_size:
            raise wire.ProtocolError(f"DATA for segment {base} at {offset}, expected "
                                     f"{self._cur_size}")
        else:
            new_file = False
        fd = self._fds[base]
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)
        self._cur_size += len(data)
        if trace.ON:
            trace.mark("p", self._valid_seq)
        # the fsync thread starts on these bytes now, while we check them (syncer.py)
        gen = self._sync.written(fd, new_file, not self.ack_on_write) \
            if self._sync is not None else 0
        self._check(data, frame)
        if self._sync is not None:
            if trace.ON:
                trace.mark("q", gen)
            self._sync.checked(gen, self._valid_seq, self._valid_pos)
        if self.ack_on_write and self._valid_seq > self.last_seq and self._conn is not None:
            self.last_seq = self._valid_seq
            self._note_lag()
            self._conn.send_nowait(wire.pair(wire.ACK, self._valid_seq, self._valid_pos))
            if trace.ON:
                trace.mark("k", self._valid_seq)

    def _check(self, data: memoryview, frame: bytes) -> None:
        """CRC-check the whole records received so far; remember the last one.

        A frame usually ends on a record boundary (the active writes whole records),
        so with nothing left over from the last one its records are checked in the
        frame's own bytes (``data`` is its tail): no copy into the carry-over buffer
        and out again."""
        buf = self._pbuf
        if not buf and self._ppos:
            start = len(frame) - len(data)
            try:
                seq, end = fmt.check_run(frame, start, self._valid_seq)
            except fmt.CorruptRecord as exc:
                raise wire.ProtocolError(f"segment {self._cur_base}: {exc}") from None
            if end < len(frame):
                buf += data[end - start:]  # a record the next frame completes
            if end > start:
                self._ppos += end - start
                self._valid_seq = seq
                self._valid_pos = self._cur_base + self._ppos
            return
        buf += data
        off = 0
        if self._ppos == 0:
            if len(buf) < fmt.FILE_HEADER_SIZE:
                return
            try:
                fmt.check_file_header(bytes(buf[: fmt.FILE_HEADER_SIZE]))
            except (fmt.FormatError, ValueError) as exc:
                raise wire.ProtocolError(f"segment {self._cur_base}: {exc}") from None
            off = fmt.FILE_HEADER_SIZE
        try:
            seq, off = fmt.check_run(bytes(buf), off, self._valid_seq)
        except fmt.CorruptRecord as exc:
            raise wire.ProtocolError(f"segment {self._cur_base}: {exc}") from None
        if off:
            del buf[:off]
            self._ppos += off
            self._valid_seq = seq
            self._valid_pos = self._cur_base + self._ppos

    def _synced(self, conn: StreamConn, seq: int, pos: int, acked: bool) -> None:
        """The sync thread made the log durable up to (seq, pos) and acknowledged it
        (``acked``), or leaves the ACK to us (TLS)."""
        if seq > self.durable_seq:
            self.durable_seq = seq
        if conn.writer.is_closing() or seq <= self.last_seq:
            return
        self.last_seq = seq
        self._note_lag()
        if not acked:
            conn.send_nowait(wire.pair(wire.ACK, seq, pos))

    def _sync_failed(self, conn: StreamConn, exc: OSError) -> None:
        """An fsync failed: end the session (``_session`` raises ``exc``); the next one
        re-scans the log's tail from disk."""
        self._sync_error = exc
        conn.close()

    async def _durable(self) -> None:
        """Everything received so far is fsync'd (before a checkpoint or a deletion)."""
        if self._sync is not None:
            await self._sync.barrier()

    async def _checkpoint(self, data: bytes) -> None:
        await self._durable()
        await asyncio.to_thread(checkpoint.write_atomic, self.directory, data)
        for base in self._stale:
            (self.directory / segment_name(base)).unlink(missing_ok=True)
        self._stale = []

    async def _delete(self, base: int) -> None:
        await self._durable()
        fd = self._fds.pop(base, None)
        if fd is not None:
            os.close(fd)  # nothing written to it since the barrier: no fsync owed
        (self.directory / segment_name(base)).unlink(missing_ok=True)
        await asyncio.to_thread(fsync_directory, self.directory)

    def _close_files(self) -> None:
        """End of a session: the sync thread fsyncs what it was handed, closes, and
        stops (a short wait on the loop, at most one fsync round); then every file is
        closed."""
        sync, self._sync = self._sync, None
        if sync is not None:
            for fd in self._fds.values():
                sync.close_later(fd)
            self._fds.clear()
            sync.stop_and_join()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._cur_base = -1
        self._pbuf = bytearray()
        self._conn = None


def _fsync_segments(directory: Path) -> None:
    """fdatasync every segment file (clean ones cost a system call each)."""
    for path in segments(directory).values():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
