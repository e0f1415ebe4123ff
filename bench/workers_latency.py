"""Publish -> delivery latency at a fixed, modest rate, one worker against two (issue 35:
"latency at 1,000 msg/s p50 and p99 no worse than one worker's").

A saturating benchmark says how many messages a node moves; it says nothing of how long
each one waits on the way when the node is far from full, which is what most
applications see. Here one publisher sends 16-byte messages at ``--rate`` per second
(a thread sleeps to each message's slot, stamps it just before ``sendall``, and writes
the message's number into its body) to a durable queue, and one consumer (prefetch
1,000, acks every delivery) stamps each delivery when its body frame is read. The
latency of a message is the consumer's stamp minus the publisher's, one clock (one
machine). The first ``--warmup`` seconds are left out; every message must arrive once,
in order, or the run is reported invalid.

Scenarios, on a ``workers = 1`` node and a ``workers = 2`` node started side by side:

* ``one_worker``: both clients on the single node;
* ``two_workers_local``: both on the worker that owns the queue (declared through it);
* ``two_workers_crossing``: both on the *other* worker, so every message crosses twice
  (the publish to the owner, the delivery back);
* ``two_workers_node_port``: both through the node's one port, placed by the
  supervisor's round robin (the queue declared through the port too), as real clients.

Each run does every scenario once, one after the other, so they alternate over the runs;
the figures are the medians over the runs of each run's percentiles. Reported, never
asserted. The load generator (two Python threads) shares the box's two cores with the
brokers.

Usage: ``python -m bench.workers_latency [--rate 1000] [--duration 10] [--runs 5]
[--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import threading
import time
from typing import Any

from pamqp import commands
from pamqp.body import ContentBody

from bench.cluster import declare, wait_usable
from bench.confirm_latency import _percentile
from bench.loadgen import Conn, ProtocolError, Target, encode_publish
from bench.workers import one_and_two_workers, report, worker_urls
from tests.support.brokerproc import BrokerProcess

SEQ = struct.Struct(">Q")
BODY = 16


class _Consumer(threading.Thread):
    """Consumes ``total`` messages from ``queue``, stamping each body's arrival."""

    def __init__(self, url: str, queue: str, total: int) -> None:
        super().__init__(name="latency-consumer", daemon=True)
        self.conn = Conn(url)
        self.ch = self.conn.open_channel(1)
        self.conn.rpc(self.ch, commands.Basic.Qos(prefetch_count=1000),
                      commands.Basic.QosOk)
        self.conn.rpc(self.ch, commands.Basic.Consume(queue=queue), commands.Basic.ConsumeOk)
        self.total = total
        self.got_at = [0.0] * total
        self.order_ok = True
        self.received = 0
        self.error: str | None = None

    def run(self) -> None:
        conn, ch = self.conn, self.ch
        tag = 0
        try:
            while self.received < self.total:
                _c, fr = conn.read_frame()
                if isinstance(fr, commands.Basic.Deliver):
                    tag = int(fr.delivery_tag or 0)
                elif isinstance(fr, ContentBody):
                    now = time.monotonic()
                    seq = SEQ.unpack_from(fr.value, 0)[0]
                    if seq != self.received or seq >= self.total:
                        self.order_ok = False
                    if seq < self.total and not self.got_at[seq]:
                        self.got_at[seq] = now
                    self.received += 1
                    conn.send(ch, commands.Basic.Ack(delivery_tag=tag))
                elif isinstance(fr, commands.Connection.Close | commands.Channel.Close):
                    raise ProtocolError(f"closed by the broker: {fr.reply_text}")
        except (OSError, ProtocolError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def measure(pub_url: str, con_url: str, queue: str, rate: float, duration: float,
            warmup: float) -> dict[str, Any]:
    """One scenario: ``rate`` msg/s for ``duration`` s from ``pub_url`` to ``queue``,
    consumed at ``con_url``; the latency distribution in milliseconds."""
    total = int(rate * duration)
    consumer = _Consumer(con_url, queue, total)
    consumer.conn.sock.settimeout(None)
    consumer.start()
    pub = Conn(pub_url)
    pub.open_channel(1)
    template, body_at = encode_publish(Target("", queue), BODY, False, pub.frame_max)
    msg = bytearray(template)
    sent_at = [0.0] * total
    sock = pub.sock
    interval = 1.0 / rate
    start = time.monotonic()
    for seq in range(total):
        delay = start + seq * interval - time.monotonic()
        if delay > 0.0002:
            time.sleep(delay)
        SEQ.pack_into(msg, body_at, seq)
        sent_at[seq] = time.monotonic()
        sock.sendall(msg)
    sent_end = time.monotonic()
    consumer.join(timeout=60.0)
    error = consumer.error or ("deliveries still missing after 60 s"
                               if consumer.is_alive() else None)
    pub.close()
    consumer.conn.close()
    skip_before = start + warmup
    lat = sorted((consumer.got_at[i] - sent_at[i]) * 1000.0 for i in range(total)
                 if sent_at[i] >= skip_before and consumer.got_at[i])
    return {"sent": total, "received": consumer.received,
            "achieved_send_rate": round(total / max(sent_end - start, 1e-9)),
            "valid": error is None and consumer.order_ok and consumer.received == total,
            "error": error, "in_order": consumer.order_ok, "samples": len(lat),
            "p50_ms": round(_percentile(lat, 50), 3), "p90_ms": round(_percentile(lat, 90), 3),
            "p99_ms": round(_percentile(lat, 99), 3),
            "max_ms": round(lat[-1], 3) if lat else None}


SCENARIOS = ("one_worker", "two_workers_local", "two_workers_crossing",
             "two_workers_node_port")


def one_run(single: BrokerProcess, two: BrokerProcess, args: argparse.Namespace,
            tag: str) -> dict[str, Any]:
    w = worker_urls(two)
    where = {  # scenario -> (the node, declared through, clients on)
        "one_worker": (single, single.url, single.url),
        "two_workers_local": (two, w[0], w[0]),
        "two_workers_crossing": (two, w[0], w[1]),
        "two_workers_node_port": (two, two.url, two.url),
    }
    out: dict[str, Any] = {}
    for sc in SCENARIOS:
        _node, declare_at, client_at = where[sc]
        queue = f"{tag}-{sc}"
        declare(declare_at, queue, durable=True)
        wait_usable(sorted({declare_at, client_at}), queue)
        out[sc] = measure(client_at, client_at, queue, args.rate, args.duration, args.warmup)
        out[sc]["loadavg"] = os.getloadavg()[0]
        print(f"  {sc}: {out[sc]}", flush=True)
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for sc in SCENARIOS:
        valid = [r[sc] for r in runs if r[sc]["valid"]]
        out[sc] = {"valid_runs": len(valid), "runs": len(runs)}
        for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"):
            values = [r[key] for r in valid if r[key] is not None]
            out[sc][f"median_{key}"] = round(statistics.median(values), 3) if values else None
    one = out["one_worker"]
    for sc in SCENARIOS[1:]:
        out[f"{sc}_vs_one_worker"] = {
            key: round(out[sc][f"median_{key}"] / one[f"median_{key}"], 2)
            if out[sc][f"median_{key}"] and one[f"median_{key}"] else None
            for key in ("p50_ms", "p99_ms")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    meta: dict[str, Any] = {
        "rate": args.rate, "duration": args.duration, "warmup": args.warmup,
        "runs": args.runs, "body": BODY,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_start": os.getloadavg(),
        "hot_path": "pure Python" if os.environ.get("AMQPD_PURE_PYTHON") else "as installed"}
    runs = one_and_two_workers(args, "amqpd-bench-wlat-", one_run)
    report({**meta, **summarise(runs), "loadavg_end": os.getloadavg()}, args.out)


if __name__ == "__main__":
    main()
