"""Confirmed publish rate to replicated queues (issue 16), three nodes on this machine,
amqpd and RabbitMQ 3.10 side by side in one run.

Three queue kinds, each declared on (so led by) the first node, every publisher
connected to that node:

1. ``classic``: an unmirrored durable classic queue (the baseline);
2. ``mirrored``: a classic queue matched by a policy ``{"ha-mode": "all",
   "ha-sync-mode": "automatic"}``: mirrored on the other two nodes, a confirm waits for
   both mirrors (the run starts once both are synchronised);
3. ``quorum``: ``x-queue-type: quorum`` (RabbitMQ: a three-member Raft group).

``--publishers`` processes each publish ``--count`` persistent messages
(``--body-size`` bytes) with confirms (a window of ``--window`` unconfirmed). The rate
is the confirmed messages of all publishers divided by the time from the common start
to the last confirm. A figure counts only if every publish was confirmed (no nack, no
error) and the queue then holds exactly publishers x count messages (passive declare);
otherwise the row says ``invalid`` and why.

What was measured is said next to each figure: the queue's replicas as the broker's
``/api/queues/{vhost}/{name}`` lists them (``node`` plus ``synchronised_slave_nodes``
for a mirrored queue, ``members`` for a quorum queue); a queue that turns out to have
one replica is reported as "one node only", not as replicated.

amqpd: three amqpd processes and one etcd (tests/integration/cluster_support.py).
RabbitMQ: three nodes of Debian's rabbitmq-server on one private epmd, joined with
``rabbitmqctl join_cluster``, with the management plugin for the same HTTP calls
(devtools/rabbitmq_cluster.py). Fresh queues for every run, deleted afterwards; with
``--runs N`` the median of N runs. Timings are reported, never asserted.

Usage: ``python -m bench.mirrored [--publishers 4] [--count 10000] [--runs 1]
[--brokers amqpd,rabbitmq] [--out bench/RESULTS-mirrored.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue as queue_mod
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.loadgen import Conn, PublisherSpec, Target
from bench.runner import CTX, _pub_worker
from bench.side_by_side import add_broker_options, amqpd_cluster, num, run_side_by_side
from tests.integration._http import Api, q
from tests.integration.cluster_support import wait_for

KINDS = ("classic", "mirrored", "quorum")
POLICY = {"pattern": "^mirrored-", "apply-to": "queues",
          "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}}


def declare(url: str, name: str, kind: str) -> None:
    args = {"x-queue-type": "quorum"} if kind == "quorum" else {}
    conn = Conn(url)
    try:
        conn.declare_queue(conn.open_channel(1), name, durable=True, arguments=args)
    finally:
        conn.close()


def count_and_delete(url: str, name: str) -> int:
    conn = Conn(url)
    try:
        ch = conn.open_channel(1)
        n = conn.message_count(ch, name)
        conn.delete_queue(ch, name)
        return n
    finally:
        conn.close()


def replicas(api: Api, name: str, kind: str) -> list[str]:
    """The nodes holding the queue as the broker's /api/queues says."""
    r = api.get(f"/api/queues/%2F/{q(name)}")
    if r.status != 200:
        return []
    info = r.json()
    if kind == "quorum" and info.get("members"):
        return sorted(map(str, info["members"]))
    nodes = [str(info.get("node"))]
    if kind == "mirrored":
        nodes += sorted(map(str, info.get("synchronised_slave_nodes") or []))
    return nodes


def publish(url: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """``args.publishers`` processes publish at once; the confirmed rate, verified."""
    n = args.publishers
    ready = CTX.Barrier(n + 1)
    go = CTX.Event()
    out: Any = CTX.Queue()
    specs = [PublisherSpec(i + 1, [Target("", name)], body_size=args.body_size,
                           persistent=True, confirm_window=args.window, count=args.count)
             for i in range(n)]
    procs = [CTX.Process(target=_pub_worker, args=(url, s, ready, go, out), daemon=True)
             for s in specs]
    for p in procs:
        p.start()
    results: list[Any] = []
    try:
        ready.wait(timeout=120)
        t_go = time.monotonic()
        go.set()
        while len(results) < n:
            try:
                results.append(out.get(timeout=600)[2])
            except queue_mod.Empty:
                break
    finally:
        go.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    confirmed = sum(r.confirmed for r in results)
    nacked = sum(r.nacked for r in results)
    errors = [r.error for r in results if r.error]
    t_end = max((r.t_end for r in results), default=t_go)
    took = t_end - t_go
    return {"confirmed": confirmed, "nacked": nacked, "errors": errors,
            "seconds": round(took, 3), "rate": round(confirmed / took) if took > 0 else 0}


def one_kind(url: str, api: Api, kind: str, tag: str, args: argparse.Namespace,
             want_replicas: int) -> dict[str, Any]:
    name = f"{kind}-{tag}"
    declare(url, name, kind)
    got: list[str] = []

    def placed() -> bool:
        nonlocal got
        got = replicas(api, name, kind)
        return kind == "classic" or len(got) >= want_replicas

    # a mirrored queue starts once every mirror is synchronised; a quorum queue of a
    # broker that keeps it on one node is measured as it is (and said so)
    with contextlib.suppress(AssertionError):
        wait_for(placed, 60 if kind == "mirrored" else 10, f"{name} on {want_replicas} nodes")
    res = publish(url, name, args)
    res["replicas"] = got
    res["in_queue"] = count_and_delete(url, name)
    expected = args.publishers * args.count
    problems = []
    if res["confirmed"] != expected:
        problems.append(f"{res['confirmed']} of {expected} confirmed")
    if res["nacked"] or res["errors"]:
        problems.append(f"{res['nacked']} nacked, errors {res['errors']}")
    if res["in_queue"] != expected:
        problems.append(f"the queue held {res['in_queue']}")
    if kind == "mirrored" and len(got) < want_replicas:
        problems.append(f"mirrors not synchronised at the start: {got}")
    res["valid"] = not problems
    res["problems"] = problems
    print(f"  {kind}: {res}", flush=True)
    return res


def runs_on(url: str, api: Api, args: argparse.Namespace, label: str) -> dict[str, Any]:
    r = api.put("/api/policies/%2F/bench-ha", POLICY)
    if r.status not in (201, 204):
        raise RuntimeError(f"{label}: policy refused: {r.status} {r.text}")
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        print(f"{label} run {i + 1}:", flush=True)
        runs.append({kind: one_kind(url, api, kind, f"r{i}", args, 3) for kind in KINDS})
    return summarise(runs)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for kind in KINDS:
        rates = [r[kind]["rate"] for r in runs if r[kind]["valid"]]
        out[kind] = {"median_rate": round(statistics.median(rates)) if rates else None,
                     "rates": [r[kind]["rate"] for r in runs],
                     "valid_runs": len(rates),
                     "replicas": runs[-1][kind]["replicas"]}
    base = out["classic"]["median_rate"]
    for kind in ("mirrored", "quorum"):
        x = out[kind]["median_rate"]
        out[f"{kind}_vs_classic"] = round(x / base, 2) if x and base else None
    return out


def run_amqpd(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    with amqpd_cluster(root, ("a", "b", "c")) as nodes:
        a = nodes[0]
        return runs_on(a.url, a.api, args, "amqpd")


def run_rabbitmq(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from devtools import rabbitmq as rmq
    from devtools import rabbitmq_cluster as rmqc

    cluster = rmqc.start_cluster(root / "rmq", nodes=3, plugins=["rabbitmq_management"])
    try:
        a = cluster.nodes[0]
        if a.http_url is None:
            raise RuntimeError("RabbitMQ started without its management listener")
        api = Api(a.http_url.rstrip("/"))
        wait_for(lambda: api.get("/api/overview").status == 200, 120, "management API")
        out = runs_on(a.amqp_url, api, args, "rabbitmq")
        out["version"] = "RabbitMQ " + rmq.ctl(a, "version").strip()
        return out
    finally:
        rmqc.stop_cluster(root / "rmq")


def _where(nodes: list[str]) -> str:
    return f"{len(nodes)} ({'replicated' if len(nodes) > 1 else 'one node only'})"


def table(res: dict[str, Any]) -> str:
    """The markdown rows of bench/RESULTS-mirrored.md."""
    am, rb = res.get("amqpd"), res.get("rabbitmq")
    lines = ["| queue | amqpd msgs/s | amqpd replicas | RabbitMQ msgs/s | RabbitMQ replicas "
             "| amqpd / RabbitMQ |", "|---|---|---|---|---|---|"]
    for kind in KINDS:
        x = am[kind]["median_rate"] if am else None
        y = rb[kind]["median_rate"] if rb else None
        ratio = f"{x / y:.2f}" if x and y else "-"
        xr = _where(am[kind]["replicas"]) if am else "-"
        yr = _where(rb[kind]["replicas"]) if rb else "-"
        lines.append(f"| {kind} | {num(x)} | {xr} | {num(y)} | {yr} | {ratio} |")
    for kind in ("mirrored", "quorum"):
        x = am[f"{kind}_vs_classic"] if am else None
        y = rb[f"{kind}_vs_classic"] if rb else None
        lines.append(f"| {kind} / classic | {x} | | {y} | | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--count", type=int, default=10_000, help="messages per publisher")
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--window", type=int, default=500, help="unconfirmed per publisher")
    ap.add_argument("--runs", type=int, default=1)
    add_broker_options(ap)
    args = ap.parse_args()
    out: dict[str, Any] = {"publishers": args.publishers, "count_per_publisher": args.count,
                           "body_size": args.body_size, "window": args.window,
                           "runs": args.runs,
                           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "loadavg_start": os.getloadavg()}
    run_side_by_side(out, args, "amqpd-bench-mirrored-", run_amqpd, run_rabbitmq, KINDS, table)


if __name__ == "__main__":
    threading.current_thread().name = "bench-mirrored"
    main()
