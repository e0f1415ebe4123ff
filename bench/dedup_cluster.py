"""What a dedup exchange's cluster-wide cache costs a publisher that waits for each confirm.

    python -m bench.dedup_cluster [--count 2000]

One amqpd node alone, then a three-node cluster (one private etcd, bench/side_by_side.py's
``amqpd_cluster``). On each: a durable queue (led by the node the publisher uses) bound to
a ``fanout`` exchange and to an ``x-message-deduplication`` exchange (1,000,000-entry
cache); one pika publisher with confirms sends ``--count`` persistent 64-byte messages,
each with a distinct ``x-deduplication-header``, waiting for every confirm before the
next (so the rate is 1 / the latency of one confirmed publish): through the fanout
exchange, through the dedup exchange (new values), and the same values once more through
the dedup exchange (duplicates, dropped). Between runs the queue is purged.

On one node the cache is in process; in the cluster every new value costs two etcd
transactions (taken, then settled after the queue's confirm) and a duplicate one (unless
this node already knows the value is done: then none), docs/dedup.md "In a cluster".
Timings are reported, never asserted; this machine is shared, so read ratios, not rates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pika

from bench.side_by_side import amqpd_cluster
from tests.support.brokerproc import BrokerProcess

BODY = b"x" * 64


def _setup(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.exchange_declare("bench.fx", "fanout", durable=True)
        ch.exchange_declare("bench.dx", "x-message-deduplication", durable=True,
                            arguments={"x-cache-size": 1_000_000})
        ch.queue_declare("bench.q", durable=True)
        ch.queue_bind("bench.q", "bench.fx")
        ch.queue_bind("bench.q", "bench.dx")
    finally:
        conn.close()


def _publish(url: str, exchange: str, values: list[str]) -> dict[str, float]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        took: list[float] = []
        start = time.perf_counter()
        for value in values:
            t = time.perf_counter()
            ch.basic_publish(exchange, "", BODY, pika.BasicProperties(
                delivery_mode=2, headers={"x-deduplication-header": value}))
            took.append(time.perf_counter() - t)
        total = time.perf_counter() - start
        ch.queue_purge("bench.q")
    finally:
        conn.close()
    took.sort()
    return {"rate": round(len(values) / total), "mean_ms": round(statistics.mean(took) * 1e3, 3),
            "p99_ms": round(took[int(len(took) * 0.99) - 1] * 1e3, 3)}


def _measure(url: str, count: int, tag: str) -> dict[str, Any]:
    _setup(url)
    values = [f"{tag}-{i:09d}" for i in range(count)]
    fanout = _publish(url, "bench.fx", values)
    new = _publish(url, "bench.dx", values)
    dups = _publish(url, "bench.dx", values)
    return {"fanout": fanout, "dedup_new": new, "dedup_duplicate": dups,
            "new_over_fanout": round(new["rate"] / fanout["rate"], 3)}


def _row(where: str, res: dict[str, Any]) -> str:
    f, n, d = res["fanout"], res["dedup_new"], res["dedup_duplicate"]
    return (f"| {where} | {f['rate']:,} ({f['mean_ms']} ms) | {n['rate']:,} ({n['mean_ms']} ms) "
            f"| {d['rate']:,} ({d['mean_ms']} ms) | {res['new_over_fanout']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.dedup_cluster",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dedup-cluster-bench-") as tmp:
        root = Path(tmp)
        single = BrokerProcess(root / "single").start()
        try:
            alone = _measure(single.url, args.count, "alone")
        finally:
            single.stop()
        with amqpd_cluster(root, ("a", "b", "c")) as nodes:
            clustered = _measure(nodes[0].url, args.count, "cluster")
    print(f"{args.count:,} confirmed persistent publishes each, one at a time: "
          "msgs/s (mean latency)")
    print("| where | fanout | dedup, new values | dedup, duplicates | new / fanout |")
    print("|---|---|---|---|---|")
    print(_row("one node", alone))
    print(_row("three-node cluster", clustered))
    print({"one_node": alone, "cluster": clustered})


if __name__ == "__main__":
    main()
