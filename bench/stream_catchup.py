"""A stream's leader serving publishers while a member catches up a large backlog (issue
30): its confirm latency before and during the catch-up.

Per run: a private etcd and three fresh amqpd nodes (``tests/integration``'s cluster
helpers); a stream declared on node-a, members on every node. node-c is killed with
kill -9; ``--mb`` MB are published on node-a with confirms (``--body`` bytes each), so
node-c's copy lacks all of it. A probe on node-a then publishes one persistent message
at a time with confirms, waiting for each confirm, for ``--quiet`` seconds (the
baseline), then node-c is started again and the probe goes on until the leader shows
node-c holding every offset (or ``--limit`` seconds); beside it a second probe times
``basic.qos`` round trips on node-a, which only its event loop answers (a confirm also
waits for an fsync, which the catching-up node's disk writes slow on a shared disk).
Reported: both probes' latency (median, p99, max) in both phases and how long the
catch-up took.

    AMQPD_PURE_PYTHON=1 python -m bench.stream_catchup --mb 500 [--dir /dev/shm]

All three nodes share this machine's disk: node-c's catch-up writes slow the leader's
own writes and fsyncs (the kernel throttles writers of dirty pages), which a real
cluster does not see; ``--dir /dev/shm`` keeps that out of the figures.

This measures, it asserts nothing. Running it against an older checkout (its directory
first on ``PYTHONPATH`` and as the working directory) gives the "before" figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika

from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    private_etcd,
    three_nodes,
    wait_for,
)

STREAM = "catchup"


def member_offsets(node: ClusterNode) -> dict[str, int]:
    r = node.api.get(f"/api/queues/%2F/{STREAM}")
    return dict(r.json().get("member_offsets") or {}) if r.status == 200 else {}


class Probe(threading.Thread):
    """On ``url``: one confirmed publish at a time (``confirm``: it waits for the
    leader's fsync and a majority), or one ``basic.qos`` round trip at a time (``rtt``:
    only the leader's event loop answers it); each latency with its phase."""

    def __init__(self, url: str, kind: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.kind = kind
        self.phase = "quiet"
        self.stop = threading.Event()
        self.samples: dict[str, list[float]] = {"quiet": [], "catch-up": []}

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url + "?heartbeat=0"))
        ch = conn.channel()
        if self.kind == "confirm":
            ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        deadline = time.monotonic() + 900
        while not self.stop.is_set() and time.monotonic() < deadline:
            phase = self.phase
            t0 = time.perf_counter()
            if self.kind == "confirm":
                ch.basic_publish("", STREAM, b"probe", props)
            else:
                ch.basic_qos(prefetch_count=1)
            self.samples[phase].append(time.perf_counter() - t0)
        conn.close()


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
                            * 1000, 2),
            "max_ms": round(ordered[-1] * 1000, 2)}


def run(mb: int, body: int, quiet: float, limit: float, where: str | None
        ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=where) as tmp, private_etcd(Path(tmp)) as etcd, \
            three_nodes(Path(tmp), etcd.url) as nodes:
        a, _b, c = nodes
        conn = pika.BlockingConnection(pika.URLParameters(a.url))
        conn.channel().queue_declare(STREAM, durable=True,
                                     arguments={"x-queue-type": "stream"})
        conn.close()
        wait_for(lambda: len(member_offsets(a)) == 3, 60, "members connected")
        c.kill()
        count = mb * 1024 * 1024 // body
        pub = ConfirmPublisher(a.url, STREAM, window=200, batch=50, body_size=body)
        try:
            sent = 0
            while sent < count:
                n = min(pub.batch, count - sent)
                pub.publish(sent, n)
                sent += n
            pub.drain(300)
        finally:
            pub.conn.close()
        probes = [Probe(a.url, "confirm"), Probe(a.url, "rtt")]
        for probe in probes:
            probe.start()
        time.sleep(quiet)  # the baseline's length, not a synchronisation
        end = max(member_offsets(a).values())
        for probe in probes:
            probe.phase = "catch-up"
        started = time.monotonic()
        c.start()
        wait_for(lambda: member_offsets(a).get(c.name, 0) >= end, limit,
                 "node-c caught up")
        took = time.monotonic() - started
        for probe in probes:
            probe.stop.set()
            probe.join(30)
        out: dict[str, Any] = {"mb": mb, "body": body, "records": count,
                               "catch_up_s": round(took, 1)}
        for probe in probes:
            out[probe.kind] = {phase: summary(v) for phase, v in probe.samples.items()}
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--body", type=int, default=64 * 1024)
    parser.add_argument("--quiet", type=float, default=5.0)
    parser.add_argument("--limit", type=float, default=600.0)
    parser.add_argument("--dir", default=None,
                        help="where the nodes' data directories go (e.g. /dev/shm: no "
                             "disk shared by the three nodes)")
    args = parser.parse_args()
    print(json.dumps(run(args.mb, args.body, args.quiet, args.limit, args.dir), indent=2))


if __name__ == "__main__":
    main()
