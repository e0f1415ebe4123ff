"""Publish -> confirm latency of persistent messages at a fixed, modest rate (issue 34).

A rate measured with a fixed confirm window is window / latency, and on a shared 2-core
machine the rate moves with everybody else's load. The latency of each confirm at a
rate well below either configuration's ceiling is steadier: both configurations get the
same offered load, so the difference between a node alone and a synchronous pair is what
the standby adds to a confirm (its copy, its fsync, its ACK), not how much CPU the box
had left for a saturating publisher.

One connection, one channel in confirm mode, one thread that publishes at ``rate``
messages per second (send times taken just before each ``sendall``) and one that reads
the confirms (the time taken when ``recv`` returns; a multiple ack settles every tag up
to its own). The first ``warmup`` seconds of sends are left out of the figures.
Used by ``python -m bench.replication --latency-rate``; never asserted in tests.
"""

from __future__ import annotations

import math
import socket
import statistics
import threading
import time
from typing import Any

from pamqp import commands

from bench.loadgen import (
    RECV_SIZE,
    Conn,
    ProtocolError,
    Target,
    encode_publish,
    settle_frames,
)


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(round(q * len(sorted_values) / 100.0, 9)) - 1))
    return sorted_values[k]


class _ConfirmReader(threading.Thread):
    """Reads basic.ack / basic.nack and stamps every settled tag with the arrival time."""

    def __init__(self, sock: socket.socket, total: int) -> None:
        super().__init__(name="confirm-reader", daemon=True)
        self.sock = sock
        self.total = total
        self.settled_at = [0.0] * (total + 1)  # by delivery tag (1-based)
        self.nacked = 0
        self.low = 1  # lowest tag not settled yet
        self.error: str | None = None

    def _settle(self, tag: int, multiple: bool, nack: bool, now: float) -> None:
        tags = range(self.low, min(tag, self.total) + 1) if multiple else (tag,)
        for t in tags:
            if 0 < t <= self.total and not self.settled_at[t]:
                self.settled_at[t] = now
                self.nacked += nack
        while self.low <= self.total and self.settled_at[self.low]:
            self.low += 1

    def run(self) -> None:
        buf = bytearray()
        try:
            while self.low <= self.total:
                data = self.sock.recv(RECV_SIZE)
                now = time.monotonic()
                if not data:
                    raise ProtocolError("connection closed by broker")
                buf += data

                def settle(tag: int, multiple: bool, nack: bool, now: float = now) -> None:
                    self._settle(tag, multiple, nack, now)

                settle_frames(buf, settle)
        except (OSError, ProtocolError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def measure(url: str, queue: str, body: int, rate: float, duration: float,
            warmup: float = 1.0) -> dict[str, Any]:
    """Publish persistent messages to ``queue`` (default exchange) at ``rate`` msg/s for
    ``duration`` s; the publish -> confirm latency distribution in milliseconds."""
    conn = Conn(url)
    ch = conn.open_channel(1)
    conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
    msg, _body_offset = encode_publish(Target("", queue), body, True, conn.frame_max)
    total = int(rate * duration)
    sent_at = [0.0] * (total + 1)
    sock = conn.sock
    sock.settimeout(None)
    reader = _ConfirmReader(sock, total)
    reader.start()
    interval = 1.0 / rate
    start = time.monotonic()
    for tag in range(1, total + 1):
        delay = start + (tag - 1) * interval - time.monotonic()
        if delay > 0.0002:
            time.sleep(delay)
        sent_at[tag] = time.monotonic()
        sock.sendall(msg)
    sent_end = time.monotonic()
    reader.join(timeout=120.0)
    error = reader.error or ("confirms still missing after 120 s"
                             if reader.is_alive() else None)
    sock.settimeout(30.0)
    conn.close(timeout=30.0)
    if error:
        raise RuntimeError(f"latency publisher: {error}")
    skip_before = start + warmup
    lat = sorted((reader.settled_at[t] - sent_at[t]) * 1000.0
                 for t in range(1, total + 1) if sent_at[t] >= skip_before)
    return {"offered_rate": rate, "sent": total,
            "achieved_send_rate": round(total / max(sent_end - start, 1e-9)),
            "nacked": reader.nacked, "samples": len(lat),
            "p50_ms": round(_percentile(lat, 50), 3), "p90_ms": round(_percentile(lat, 90), 3),
            "p99_ms": round(_percentile(lat, 99), 3),
            "p999_ms": round(_percentile(lat, 99.9), 3),
            "max_ms": round(lat[-1], 3) if lat else float("nan"),
            "mean_ms": round(statistics.fmean(lat), 3) if lat else float("nan")}
