"""hq -> branch over a federation link: end-to-end latency at a steady rate, and how fast
the link drains the backlog a WAN cut left behind (issue 29).

    python -m bench.multisite_bench [--rate 1000] [--seconds 30] [--cut 60] [--size 256]
                                    [--json]

Two amqpd processes on loopback: "hq" and "branch" (federation enabled), and between
them a TCP proxy (tests/support/tcpproxy.py) standing for the WAN. ``fb.orders`` at
branch is federated from hq (``ack-mode: on-confirm``, the default; link URI
``heartbeat=5``, ``reconnect-delay`` 2 s) and bound to a durable queue with one acking
consumer (prefetch 500). A publisher at hq sends persistent messages at a steady
``--rate`` (paced per message; each body carries its send time).

1. **Latency**: ``--seconds`` of steady publishing; p50/p99/max of (consumed at branch -
   published at hq), both on this machine's clock.
2. **Catch-up**: the WAN is cut (blackhole) for ``--cut`` seconds while the publisher goes
   on at ``--rate``; then the publisher stops and the WAN is restored. Reported: the
   backlog (messages sent and not yet consumed at the restore: the cut's, plus any lag
   the link had before it), the time from the restore to the first message through
   again and to the consumer having everything, and the drain rate (messages consumed
   per second from the first one through until the last).

Verified by counting: every message sent is consumed, none twice without a flag.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pika

EXCHANGE = "fb.orders"
QUEUE = "fb.orders.branch"


class Pacer(threading.Thread):
    """Publishes at a steady rate until stopped; the body starts with seq and send time."""

    def __init__(self, url: str, rate: float, size: int) -> None:
        super().__init__(daemon=True, name="pacer")
        self.url, self.rate, self.size = url, rate, size
        self.sent = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            props = pika.BasicProperties(delivery_mode=2)
            pad = b"x" * self.size
            start = time.monotonic()
            deadline = start + 24 * 3600
            while not self.stop.is_set() and time.monotonic() < deadline:
                due = start + self.sent / self.rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                body = b"%d %d " % (self.sent, time.time_ns()) + pad
                ch.basic_publish(EXCHANGE, "", body, props)
                self.sent += 1
                if self.sent % 200 == 0:
                    conn.process_data_events(0)
            conn.close()
        except BaseException as exc:  # reported by the run
            self.error = exc


class Sink(threading.Thread):
    """Consumes at branch, acking; records (seq, latency s, arrival monotonic)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="sink")
        self.url = url
        self.got: list[tuple[int, float, float]] = []
        self.distinct: set[int] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=500)
            for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.2):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                seq, sent_ns, _ = body.split(b" ", 2)
                now = time.time_ns()
                self.got.append((int(seq), (now - int(sent_ns)) / 1e9, time.monotonic()))
                self.distinct.add(int(seq))
                ch.basic_ack(method.delivery_tag)
            conn.close()
        except BaseException as exc:
            self.error = exc

    def has_all(self, n: int) -> bool:
        """Every message below ``n`` consumed."""
        return len(self.distinct) >= n and self.distinct.issuperset(range(n))


def _put(base: str, path: str, body: Any) -> None:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    urllib.request.urlopen(req, timeout=10).read()


def _wait(cond: Any, timeout: float, what: str, step: float = 0.01) -> float:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(step)
    return time.monotonic()


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.brokerproc import BrokerProcess
    from tests.support.tcpproxy import TcpProxy

    hq = BrokerProcess(work / "hq", env={"AMQPD_CLUSTER_NAME": "hq"}).start()
    branch = BrokerProcess(work / "branch", env={"AMQPD_PLUGINS": "federation",
                                                 "AMQPD_CLUSTER_NAME": "branch"}).start()
    wan = TcpProxy("127.0.0.1", hq.port).start()
    pacer = sink = None
    try:
        conn = pika.BlockingConnection(pika.URLParameters(hq.url))
        conn.channel().exchange_declare(EXCHANGE, "fanout", durable=True)
        conn.close()
        conn = pika.BlockingConnection(pika.URLParameters(branch.url))
        ch = conn.channel()
        ch.exchange_declare(EXCHANGE, "fanout", durable=True)
        ch.queue_declare(QUEUE, durable=True)
        ch.queue_bind(QUEUE, EXCHANGE)
        conn.close()
        _put(branch.http_url, "/api/parameters/federation-upstream/%2F/hq", {"value": {
            "uri": f"amqp://guest:guest@127.0.0.1:{wan.port}/%2F?heartbeat=5",
            "reconnect-delay": 2}})
        _put(branch.http_url, "/api/policies/%2F/fed", {
            "pattern": "^fb\\.orders$", "definition": {"federation-upstream": "hq"},
            "apply-to": "exchanges"})

        def link_queue_bound() -> bool:
            req = urllib.request.Request(
                f"{hq.http_url}/api/exchanges/%2F/{EXCHANGE}/bindings/source",
                headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
            try:
                return bool(json.loads(urllib.request.urlopen(req, timeout=5).read()))
            except OSError:
                return False
        _wait(link_queue_bound, 30, "the link bound at hq")
        sink = Sink(branch.url)
        sink.start()
        pacer = Pacer(hq.url, args.rate, args.size)
        pacer.start()
        # 1. latency at a steady rate (the first 2 s are warm-up)
        time.sleep(2)
        mark = len(sink.got)
        time.sleep(args.seconds)
        window = [lat for _s, lat, _t in sink.got[mark:]]
        latency = {"rate": args.rate, "seconds": args.seconds, "messages": len(window),
                   "p50_ms": round(_pct(window, 50) * 1000, 2),
                   "p99_ms": round(_pct(window, 99) * 1000, 2),
                   "max_ms": round(max(window) * 1000, 2),
                   "mean_ms": round(statistics.fmean(window) * 1000, 2)}
        print(json.dumps({"latency": latency}), flush=True)
        # 2. the cut, then the drain
        wan.cut("blackhole")
        time.sleep(args.cut)
        pacer.stop.set()  # the drain alone is measured: nothing new comes after the cut
        pacer.join(10)
        wan.restore()
        t_restore = time.monotonic()
        total = pacer.sent
        backlog = total - len(sink.distinct)
        n_before = len(sink.got)
        t_first = _wait(lambda: len(sink.got) > n_before, 120, "first message after the cut")
        t_caught = _wait(lambda: sink.has_all(total), 900, "caught up", 0.05)
        drained = sum(1 for _s, _l, t in sink.got if t_first <= t <= t_caught)
        catch_up = {"cut_s": args.cut, "backlog": backlog,
                    "first_after_restore_s": round(t_first - t_restore, 2),
                    "caught_up_after_restore_s": round(t_caught - t_restore, 2),
                    "drain_msgs_per_s": round(drained / max(t_caught - t_first, 1e-6))}
        print(json.dumps({"catch_up": catch_up}), flush=True)
        sink.stop.set()
        sink.join(10)
        seqs = [s for s, _l, _t in sink.got]
        verified = set(seqs) == set(range(total)) and pacer.error is None \
            and sink.error is None
        return {"latency": latency, "catch_up": catch_up, "sent": total,
                "consumed": len(seqs), "duplicates": len(seqs) - len(set(seqs)),
                "verified": verified}
    finally:
        for worker in (pacer, sink):
            if worker is not None:
                worker.stop.set()
        wan.stop()
        branch.stop()
        hq.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.multisite_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=1000, help="messages per second at hq")
    p.add_argument("--seconds", type=float, default=30, help="latency window")
    p.add_argument("--cut", type=float, default=60, help="seconds the WAN is cut")
    p.add_argument("--size", type=int, default=256, help="body bytes")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="multisite-bench-") as tmp:
        result = run(Path(tmp), args)
    print(json.dumps(result, indent=1 if args.json else None))
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
