"""Stream protocol (port 5552) rates, amqpd beside RabbitMQ 3.10.8's rabbitmq_stream.

    python -m bench.stream_protocol --messages 200000 --body 100 --publishers 2 \\
        --consumers 2 --out bench/RESULTS-stream-protocol

The load generator speaks raw frames from several processes (no client library in the
way): each publisher process declares a publisher and sends publish frames of
``--batch`` messages, keeping at most ``--window`` unconfirmed; publish rate = messages
confirmed / wall time from the first frame to the last confirm. Each consumer process
then subscribes from ``first`` with credit 10 (one credit back per chunk) and counts
records from the chunk headers until it has seen every message; consume rate = the
slowest consumer's messages / its wall time. The broker's CPU time (utime + stime from
/proc) per message published and per message delivered is reported beside the rates:
on a machine shared with other work it moves far less than they do.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FRAME = struct.Struct(">I")


def _s(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


class Raw:
    """One connection from raw frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.held: list[bytes] = []  # frames read past an expected response
        self.corr = 0

    def send(self, key: int, body: bytes, corr: bool = True) -> None:
        self.corr += 1
        head = struct.pack(">HH", key, 1) + (struct.pack(">I", self.corr) if corr else b"")
        payload = head + body
        self.sock.sendall(FRAME.pack(len(payload)) + payload)

    def frames(self) -> list[bytes]:
        """The complete frames received so far (blocks for at least one)."""
        out, self.held = self.held, []
        while not out:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("server closed")
            self.buf += chunk
            at = 0
            while len(self.buf) - at >= 4:
                size = FRAME.unpack_from(self.buf, at)[0]
                if len(self.buf) - at - 4 < size:
                    break
                out.append(bytes(self.buf[at + 4:at + 4 + size]))
                at += 4 + size
            del self.buf[:at]
        return out

    def expect(self, key: int) -> bytes:
        """The first frame with ``key`` (a response: ``key | 0x8000``); frames after it
        stay for the next call."""
        while True:
            frames = self.frames()
            for i, f in enumerate(frames):
                if struct.unpack_from(">H", f)[0] == key:
                    self.held = frames[i + 1:] + self.held
                    return f

    def open(self) -> None:
        """Peer properties, SASL PLAIN, the server's tune agreed to (before open: the
        server refuses a tune after it), open of vhost ``/``."""
        self.send(0x11, struct.pack(">i", 0))
        self.expect(0x8011)
        self.send(0x12, b"")
        self.expect(0x8012)
        self.send(0x13, _s("PLAIN") + struct.pack(">i", 12) + b"\x00guest\x00guest")
        self.expect(0x8013)
        tune = self.expect(0x14)
        self.sock.sendall(FRAME.pack(len(tune)) + tune)
        self.send(0x15, _s("/"))
        self.expect(0x8015)


def _publisher(port: int, stream: str, count: int, body: int, batch: int, window: int,
               start: Any, result: Any) -> None:
    conn = Raw(port)
    conn.open()
    conn.send(0x01, struct.pack(">B", 0) + _s("") + _s(stream))  # no reference
    conn.expect(0x8001)
    message = b"\x00\x53\x75\xb0" + struct.pack(">I", body) + b"x" * body
    entry = struct.pack(">I", len(message)) + message
    result.put(("ready", 0, 0.0))
    start.wait()
    t0 = time.monotonic()
    sent = confirmed = 0
    next_id = 1
    while confirmed < count:
        while sent < count and sent - confirmed < window:
            n = min(batch, count - sent)
            parts = [struct.pack(">Bi", 0, n)]
            for i in range(n):
                parts.append(struct.pack(">Q", next_id + i) + entry)
            conn.send(0x02, b"".join(parts), corr=False)
            next_id += n
            sent += n
        for f in conn.frames():
            key = struct.unpack_from(">H", f)[0]
            if key == 0x03:
                confirmed += struct.unpack_from(">i", f, 5)[0]
            elif key == 0x04:
                raise RuntimeError("publish error")
    result.put(("publish", count, time.monotonic() - t0))


def _consumer(port: int, stream: str, total: int, start: Any, result: Any) -> None:
    conn = Raw(port)
    conn.open()
    result.put(("ready", 0, 0.0))
    start.wait()
    t0 = time.monotonic()
    conn.send(0x07, struct.pack(">B", 1) + _s(stream) + struct.pack(">HH", 1, 10)
              + struct.pack(">i", 0))
    seen = 0
    while seen < total:
        for f in conn.frames():
            if struct.unpack_from(">H", f)[0] == 0x08:
                # key, version, subscription, then the chunk: magic, type, entries u16,
                # records u32 ...
                seen += struct.unpack_from(">I", f, 5 + 4)[0]
                conn.send(0x09, struct.pack(">BH", 1, 1), corr=False)
    result.put(("consume", total, time.monotonic() - t0))


def _create(port: int, stream: str) -> None:
    conn = Raw(port)
    conn.open()
    conn.send(0x0D, _s(stream) + struct.pack(">i", 0))
    conn.expect(0x800D)
    conn.sock.close()


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every process under it (RabbitMQ's pid is the
    rabbitmq-server script's; the work is done in its beam child)."""
    from bench.brokers import cpu_seconds

    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(cpu_seconds(p) for p in tree)


def run(port: int, args: argparse.Namespace, pid: int = 0) -> dict[str, float]:
    """Publish, then consume; rates, and with the broker's ``pid`` its CPU time per
    message published and per message delivered (less swayed by a machine shared with
    other work than the rates are)."""
    stream = f"bench-{time.time_ns()}"
    _create(port, stream)
    ctx = multiprocessing.get_context("fork")
    out: dict[str, float] = {}
    per = args.messages // args.publishers
    total = per * args.publishers
    start, result = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_publisher, args=(port, stream, per, args.body, args.batch,
                                                  args.window, start, result))
             for _ in range(args.publishers)]
    for p in procs:
        p.start()
    for _ in procs:  # every connection is open before the clock starts
        result.get(timeout=120)
    t0, cpu0 = time.monotonic(), _tree_cpu(pid) if pid else 0.0
    start.set()
    for _ in procs:
        result.get(timeout=1800)
    out["publish_msgs_per_s"] = total / (time.monotonic() - t0)
    if pid:
        out["broker_cpu_us_per_publish"] = (_tree_cpu(pid) - cpu0) * 1e6 / total
    for p in procs:
        p.join(60)
    start, result = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_consumer, args=(port, stream, total, start, result))
             for _ in range(args.consumers)]
    for p in procs:
        p.start()
    for _ in procs:
        result.get(timeout=120)
    cpu0 = _tree_cpu(pid) if pid else 0.0
    start.set()
    times = [result.get(timeout=1800)[2] for _ in procs]
    out["consume_msgs_per_s_each"] = total / max(times)
    out["consume_msgs_per_s_all"] = total * len(procs) / max(times)
    if pid:
        out["broker_cpu_us_per_delivery"] = ((_tree_cpu(pid) - cpu0) * 1e6
                                             / (total * len(procs)))
    for p in procs:
        p.join(60)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--window", type=int, default=5000)
    p.add_argument("--publishers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--brokers", default="amqpd,rabbitmq")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    from devtools import rabbitmq as rmq
    from devtools.rabbitmq import free_ports
    from tests.support.brokerproc import BrokerProcess

    results: dict[str, Any] = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.brokers.split(","):
            if name == "amqpd":
                (port,) = free_ports(1)
                proc = BrokerProcess(Path(tmp) / "amqpd", extra_args=["--stream-port",
                                                                        str(port)])
                proc.start(timeout=600)
                try:
                    assert proc.proc is not None
                    results[name] = run(port, args, proc.proc.pid)
                finally:
                    proc.stop()
            else:
                d = Path(tmp) / "rabbitmq"
                info = rmq.start(d, plugins=("rabbitmq_stream",))
                try:
                    results[name] = run(info.plugin_ports["rabbitmq_stream"], args,
                                        info.pid)
                finally:
                    rmq.stop(d)
            print(name, json.dumps(results[name]), flush=True)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(results, indent=2))
        rows = ["| measure | " + " | ".join(b for b in args.brokers.split(",")) + " |",
                "|---|" + "---|" * len(args.brokers.split(","))]
        for key in ("publish_msgs_per_s", "consume_msgs_per_s_each",
                    "consume_msgs_per_s_all", "broker_cpu_us_per_publish",
                    "broker_cpu_us_per_delivery"):
            rows.append(f"| {key} | " + " | ".join(
                f"{results[b].get(key, float('nan')):,.{2 if 'cpu' in key else 0}f}"
                for b in args.brokers.split(",")) + " |")
        Path(args.out + ".md").write_text(
            f"## Stream protocol (port 5552), {args.messages:,} messages of {args.body} B\n\n"
            f"Command: `python -m bench.stream_protocol {' '.join(sys.argv[1:])}`\n\n"
            + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
