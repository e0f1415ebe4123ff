"""AckReader: a plain-TCP standby's ACKs, read on a thread of the active's own.

A confirm waits for two things: the active's fsync (the log writer thread) and the ACKs
of the standbys the gate counts. The writer hands its news to the event loop at once
(``call_soon_threadsafe``); an ACK read by the loop, though, waits for the loop's next
poll of the socket and then for one more turn to run the reading task, milliseconds
behind the publishers' work on a busy active. So on plain TCP this thread reads the
standby's frames itself, with a blocking ``poll`` on a ``dup`` of the connection:

* each ACK is checked (never backwards) and recorded at once in ``peer.acked_seq`` /
  ``peer.acked_pos`` and the source's ``acked_by_name``: a group commit whose local fsync
  completes later finds its standbys' ACKs already in, and is released with no wait;
* the loop is told with one ``call_soon_threadsafe`` (``arrived``), which reads the
  newest figures and releases the gate. While one such call is pending, further ACKs
  only update the figures: one loop wake-up per round of ACKs, not one per ACK;
* anything else (ERROR, an unknown or backwards frame, the end of the connection) ends
  the thread and is handed to the loop once (``ended``), which drops the standby.

The descriptor: a ``dup`` owned by this thread (the loop never reads the connection once
the session has begun). A closed descriptor does not end the connection while a ``dup``
of it is open, and closing a descriptor another thread polls wakes nobody, so
:meth:`stop` *shuts the connection down*: the thread's poll wakes, it reads the end,
closes its ``dup`` and returns. The lock makes sure ``stop`` never touches a descriptor
number the thread has already closed (the number may belong to another file by then).

TLS: the bytes must be decrypted by the loop's transport, so TLS standbys keep the loop's
reading task (``ReplicationSource._receiver``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from amqpd.replication import trace, wire

log = logging.getLogger("amqpd.replication")

_READ_SIZE = 4096


class AckTarget(Protocol):
    """What the reader updates (the source's ``_Peer``)."""

    name: str
    acked_seq: int
    acked_pos: int


class AckReader:
    """One standby connection's reading thread (see the module docstring)."""

    def __init__(self, sock: socket.socket, peer: AckTarget, acked_by_name: dict[str, int],
                 loop: asyncio.AbstractEventLoop, arrived: Callable[[], None],
                 ended: Callable[[BaseException], None]) -> None:
        self.peer = peer
        self.acked_by_name = acked_by_name
        self.loop = loop
        self.arrived = arrived  # on the loop: new ACKs are recorded, release the gate
        self.ended = ended  # on the loop, once: why the connection ended
        self.acks = 0  # ACK frames read
        self.wakeups = 0  # calls to ``arrived`` (at most one pending at a time)
        self._fd: int | None = os.dup(sock.fileno())
        self._lock = threading.Lock()
        self._pending = False  # an ``arrived`` call is queued on the loop
        self._thread = threading.Thread(target=self._run, name="amqpd-standby-acks",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- loop side --------------------------------------------------------------------

    def taken(self) -> None:
        """The loop is reading the figures now: the next ACK must wake it again. Called
        first thing in ``arrived``, so an ACK recorded after that read wakes it anew."""
        with self._lock:
            self._pending = False

    def stop(self) -> None:
        """End the session's reading: shut the connection down (the thread wakes, sees
        the end, closes its descriptor). Never blocks; safe to call more than once."""
        with self._lock:
            if self._fd is not None:
                try:
                    _shutdown(self._fd)
                except OSError:  # not connected any more: the thread's poll saw it
                    pass

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- thread ------------------------------------------------------------------------

    def _run(self) -> None:
        reason: BaseException
        try:
            self._read()
            reason = ConnectionError("peer closed the connection")
        except (wire.ProtocolError, OSError) as exc:
            reason = exc
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self._post(self.ended, reason)

    def _read(self) -> None:
        """Read frames until the connection ends (returns) or goes wrong (raises)."""
        fd = self._fd
        assert fd is not None
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        buf = bytearray()
        while True:
            poller.poll()
            try:
                data = os.read(fd, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                return
            buf += data
            self._frames(buf)

    def _frames(self, buf: bytearray) -> None:
        """Take every whole frame off the front of ``buf``."""
        peer = self.peer
        got = False
        while len(buf) >= wire.HEADER_SIZE:
            ftype, length = wire.parse_header(bytes(buf[:wire.HEADER_SIZE]))
            end = wire.HEADER_SIZE + length
            if len(buf) < end:
                break
            payload = bytes(buf[wire.HEADER_SIZE:end])
            del buf[:end]
            if ftype == wire.ACK:
                record(peer, self.acked_by_name, payload)
                self.acks += 1
                if trace.ON:
                    trace.mark("a", peer.acked_seq)
                got = True
            elif ftype == wire.ERROR:
                raise wire.ProtocolError(f"standby reports: {wire.parse_error(payload)}")
            else:
                raise wire.ProtocolError(f"unexpected frame type {ftype} from a standby")
        if got:
            with self._lock:
                if self._pending:
                    return
                self._pending = True
            self.wakeups += 1
            self._post(self.arrived)

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def record(peer: AckTarget, acked_by_name: dict[str, int], payload: bytes) -> None:
    """Check an ACK's payload and record it (this thread, or the loop over TLS)."""
    seq, pos = wire.parse_pair(payload, "ACK")
    if seq < peer.acked_seq:
        raise wire.ProtocolError(f"ACK went backwards ({seq} < {peer.acked_seq})")
    # position first: whoever sees the new seq finds its position with it
    peer.acked_pos = pos
    peer.acked_seq = seq
    acked_by_name[peer.name] = seq


def _shutdown(fd: int) -> None:
    """shutdown(2) on a raw descriptor, without taking ownership of it."""
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()
