"""A lean connection-churn generator: non-blocking sockets on one epoll, no asyncio.

Each connection is a few lines of state over raw AMQP frames: protocol header ->
connection.start -> start-ok (PLAIN) -> tune -> tune-ok + connection.open -> open-ok ->
channel.open -> open-ok -> connection.close -> close-ok -> the socket is closed. The
generator shares the two cores of the development VM with the broker it measures, so
its own cost counts: ~370 µs of CPU per connection this way, where an asyncio protocol
with futures and ``wait_for`` per connection spent ~600 µs (two runs on the shared VM,
not side by side).

Used by ``bench.connections`` (``--churn-worker``), several processes at once.
"""

from __future__ import annotations

import errno
import selectors
import socket
import struct
import time
from typing import Any

_FRAME = struct.Struct(">BHI")
_IDS = struct.Struct(">HH")
HEADER = b"AMQP\x00\x00\x09\x01"
START, TUNE, OPEN_OK, CLOSE, CLOSE_OK = (10, 10), (10, 30), (10, 41), (10, 50), (10, 51)
CH_OPEN_OK = (20, 11)


class _Conn:
    __slots__ = ("buf", "deadline", "sock", "step")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.buf = b""
        self.deadline = deadline
        self.step = "connecting"


class Generator:
    """Start connections at ``rate`` a second for ``seconds`` (at most ``max_inflight``
    at once), connection ``k`` from 127.0.0.(2 + k % 250); wait up to ``timeout`` for
    each. ``frames`` are bench.connections' pre-encoded client frames."""

    def __init__(self, host: str, port: int, frames: dict[str, bytes],
                 timeout: float = 30.0) -> None:
        self.target = (host, port)
        self.timeout = timeout
        self.sel = selectors.EpollSelector()
        self.live: dict[int, _Conn] = {}
        self.ok = self.failed = self.started = self.behind = 0
        self.errors: list[str] = []
        self.close = frames["close"]
        self.reply = {START: frames["start_ok"], TUNE: frames["tune_ok_open"],
                      OPEN_OK: frames["channel_open"], CH_OPEN_OK: frames["close"]}

    def fail(self, c: _Conn, why: str) -> None:
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(f"{c.step}: {why}")
        self.finish(c, abort=True)

    def finish(self, c: _Conn, abort: bool = False) -> None:
        self.live.pop(c.sock.fileno(), None)
        self.sel.unregister(c.sock)
        if abort:  # RST, as a client that gives up would (and no TIME_WAIT here)
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.sock.close()

    def start(self, k: int) -> None:
        self.started += 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((f"127.0.0.{2 + k % 250}", 0))
        code = s.connect_ex(self.target)
        if code not in (0, errno.EINPROGRESS):
            s.close()
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"connect: errno {code}")
            return
        c = _Conn(s, time.monotonic() + self.timeout)
        self.live[s.fileno()] = c
        self.sel.register(s, selectors.EVENT_WRITE, c)

    def writable(self, c: _Conn) -> None:
        code = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self.fail(c, f"connect: errno {code}")
            return
        c.step = "header"
        c.sock.send(HEADER)
        self.sel.modify(c.sock, selectors.EVENT_READ, c)

    def readable(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except OSError as exc:
            self.fail(c, str(exc))
            return
        if not data:
            self.fail(c, "closed by the broker")
            return
        buf = c.buf + data
        pos = 0
        while len(buf) - pos >= 8:
            ftype, _ch, size = _FRAME.unpack_from(buf, pos)
            end = pos + 7 + size
            if len(buf) < end + 1:
                break
            if ftype == 1:
                ids = _IDS.unpack_from(buf, pos + 7)
                if ids == CLOSE_OK:
                    self.ok += 1
                    self.finish(c)
                    return
                if ids == CLOSE:
                    self.fail(c, "connection.close from the broker")
                    return
                out = self.reply.get(ids)
                if out is not None:
                    c.step = f"after {ids}"
                    c.sock.send(out)
            pos = end + 1
        c.buf = buf[pos:]

    def sweep(self, now: float) -> None:
        for c in [c for c in self.live.values() if c.deadline < now]:
            self.fail(c, f"timeout ({self.timeout:.0f} s)")

    def run(self, rate: float, seconds: float, max_inflight: int, first: int = 0,
            stride: int = 1) -> dict[str, Any]:
        t0 = time.monotonic()
        cpu0 = time.process_time()
        period = 1.0 / rate
        nxt = t0
        k = 0
        next_sweep = t0 + 1
        end_by = t0 + seconds + self.timeout + 5
        while True:
            now = time.monotonic()
            starting = now - t0 < seconds
            if not starting and (not self.live or now > end_by):
                break
            if starting:
                while nxt <= now and len(self.live) < max_inflight:
                    self.start(first + k * stride)
                    k += 1
                    nxt += period
                if nxt < now - 1:
                    self.behind += 1
                    nxt = now  # fell behind by a second: that rate is not reachable
            if not starting:
                wait = 0.05
            elif len(self.live) >= max_inflight:
                wait = 0.005  # nothing may start before one finishes: no busy wait
            else:
                wait = max(0.0, min(nxt - time.monotonic(), 0.005))
            for key, events in self.sel.select(wait):
                if key.data.step == "connecting":
                    self.writable(key.data)
                elif events & selectors.EVENT_READ:
                    self.readable(key.data)
            if now >= next_sweep:
                next_sweep = now + 1
                self.sweep(now)
        for c in list(self.live.values()):
            self.fail(c, "still open at the end")
        self.sel.close()
        return {"ok": self.ok, "failed": self.failed, "errors": self.errors,
                "started": self.started,
                "start_window_s": round(min(seconds, time.monotonic() - t0), 2),
                "wall_s": round(time.monotonic() - t0, 2),
                "cpu_s": round(time.process_time() - cpu0, 2), "fell_behind": self.behind}
