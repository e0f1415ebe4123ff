"""Delivery rate of a quorum queue with consumers (issue 28), three amqpd nodes on this
machine: what waiting for each checkout's commit before a delivery leaves costs.

A quorum queue declared on node-a (its leader, members a, b, c) gets ``--count``
confirmed persistent messages (``--body-size`` bytes); then consumers drain it: one on
node-a (the leader's own channel) and one on node-b (deliveries over the link), each
with prefetch ``--prefetch``, acking every 100 (tests/integration/cluster_support.py's
QueueConsumer, threads of this process). The rate is the messages consumed divided by
the time from the consumers' start until every message was consumed; the figure counts
only if every message was consumed (none missing), else the run says so. With
``--runs N`` a fresh queue per run and the median. Timings are reported, never
asserted.

Run it against a checkout (its amqpd is what the nodes run): ``cd CHECKOUT &&
PYTHONPATH=. python -m bench.quorum_consume [--count 20000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    QueueConsumer,
    declare_durable,
    running,
    three_nodes,
    wait_for,
)
from tests.support.etcdproc import EtcdProcess


def one_run(nodes: list[ClusterNode], name: str, count: int, body: int,
            prefetch: int) -> dict[str, Any]:
    """Fill a fresh quorum queue led by node-a, drain it from node-a and node-b."""
    a, b, _c = nodes
    declare_durable(a, name, {"x-queue-type": "quorum"})
    everyone = sorted(n.name for n in nodes)
    wait_for(lambda: sorted(a.api.get(f"/api/queues/%2F/{q(name)}").json()
                            .get("online", [])) == everyone, 30, "the group formed")
    pub = ConfirmPublisher(a.url, name, window=1000, batch=100, body_size=body)
    pub.publish_range(0, count)
    pub.conn.close()
    if len(pub.confirmed) != count:
        return {"invalid": f"{len(pub.nacked)} nacked while filling"}
    consumers = [QueueConsumer(a, name, prefetch=prefetch),
                 QueueConsumer(b, name, prefetch=prefetch)]
    t0 = time.monotonic()
    done = False
    with running(*consumers):
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(consumers[0].seen | consumers[1].seen) >= count, 300,
                     "every message consumed")
            done = True
        elapsed = time.monotonic() - t0
    a.api.delete(f"/api/queues/%2F/{q(name)}")
    if not done:
        missing = count - len(consumers[0].seen | consumers[1].seen)
        return {"invalid": f"{missing} not consumed in 300 s"}
    return {"rate": round(count / elapsed), "seconds": round(elapsed, 2),
            "on_leader": len(consumers[0].got), "on_other": len(consumers[1].got)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--prefetch", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdProcess(Path(tmp) / "etcd").start()
        try:
            with three_nodes(Path(tmp), etcd.url,
                             {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "5"}) as nodes:
                runs = [one_run(nodes, f"qq-bench-{i}", args.count, args.body_size,
                                args.prefetch) for i in range(args.runs)]
        finally:
            etcd.kill()
    rates = [r["rate"] for r in runs if "rate" in r]
    result = {"count": args.count, "body_size": args.body_size, "prefetch": args.prefetch,
              "runs": runs, "median_rate": statistics.median(rates) if rates else None}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
