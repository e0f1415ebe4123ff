"""Workers (issue 35), first cut: what crossing between two workers costs, amqpd alone.

Scenarios, each on fresh durable queues (``--queues`` publish+consume pairs, transient
16 B... 64 B bodies as bench/cluster.py's ``load``, consumers acking with prefetch
1000, every delivery counted and checked in order):

1. ``one_worker``: ``workers = 1`` (today's broker), every client on it;
2. ``two_workers_local``: ``workers = 2``, queue i declared through worker i % 2 (so
   owned by it) and its publisher and consumer on that worker;
3. ``two_workers_crossing``: the same, with each queue's publisher and consumer on the
   *other* worker: every message crosses twice (publish to the owner, delivery back);
4. ``two_workers_node_port``: every client and declare through the node's one port
   (the supervisor's round robin): where each lands is not chosen, as for real clients;
5. ``confirmed_local`` / ``confirmed_crossing``: one publisher with confirms
   (persistent, window 500) to a queue owned by worker 0, on worker 0 / on worker 1.

Clients are placed on a chosen worker through its private loopback port (the ready
file's ``workers``), the same broker code a handed-over connection reaches. Broker CPU
is the sum of user+system time of the supervisor and every worker (``/proc``) over
the scenario, divided by the messages delivered (or confirmed). The load generator
shares the two cores. RabbitMQ is not run here (this first cut measures the cost of
crossing, not the ratios against RabbitMQ). Reported, never asserted.

Usage: ``python -m bench.workers [--queues 4] [--count 100000] [--hop-count 20000]
[--runs 3] [--out bench/RESULTS-workers.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cluster import declare, hop, load, wait_usable
from tests.support.brokerproc import BrokerProcess

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def pids_of(node: BrokerProcess) -> list[int]:
    info = json.loads((node.data_dir / "ready.json").read_text())
    return [int(info["pid"])] + [int(w["pid"]) for w in info.get("workers", [])]


def worker_urls(node: BrokerProcess) -> list[str]:
    info = json.loads((node.data_dir / "ready.json").read_text())
    return [f"amqp://guest:guest@127.0.0.1:{w['amqp_port']}/%2F"
            for w in sorted(info["workers"], key=lambda w: w["index"])]


def measured(node: BrokerProcess, run: Any) -> dict[str, Any]:
    pids = pids_of(node)
    before = cpu_seconds(pids)
    res: dict[str, Any] = run()
    spent = cpu_seconds(pids) - before
    done = res.get("delivered", res.get("confirmed", 0))
    res["broker_cpu_s"] = round(spent, 3)
    res["broker_cpu_us_per_msg"] = round(spent * 1e6 / done, 2) if done else None
    return res


def pairs(node: BrokerProcess, names: list[str], declare_at: list[str],
          client_at: list[str], count: int) -> dict[str, Any]:
    for name, url in zip(names, declare_at, strict=True):
        declare(url, name, durable=True)
    for name in names:
        wait_usable(sorted(set(client_at)), name)
    urls = dict(zip(names, client_at, strict=True))
    return measured(node, lambda: load(names, urls, urls, count))


def one_run(single: BrokerProcess, two: BrokerProcess, args: argparse.Namespace,
            tag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    q = args.queues
    names = [f"{tag}-one-{i}" for i in range(q)]
    out["one_worker"] = pairs(single, names, [single.url] * q, [single.url] * q, args.count)
    w = worker_urls(two)
    names = [f"{tag}-local-{i}" for i in range(q)]
    owners = [w[i % 2] for i in range(q)]
    out["two_workers_local"] = pairs(two, names, owners, owners, args.count)
    names = [f"{tag}-cross-{i}" for i in range(q)]
    others = [w[(i + 1) % 2] for i in range(q)]
    out["two_workers_crossing"] = pairs(two, names, owners, others, args.count)
    names = [f"{tag}-port-{i}" for i in range(q)]
    out["two_workers_node_port"] = pairs(two, names, [two.url] * q, [two.url] * q,
                                         args.count)
    hop_q = f"{tag}-hop"
    declare(w[0], hop_q, durable=True)
    wait_usable(w, hop_q)
    out["confirmed_local"] = measured(two, lambda: hop(w[0], hop_q, args.hop_count))
    out["confirmed_crossing"] = measured(two, lambda: hop(w[1], hop_q, args.hop_count))
    for key, res in out.items():
        print(f"  {key}: {res}", flush=True)
    return out


SCENARIOS = ("one_worker", "two_workers_local", "two_workers_crossing",
             "two_workers_node_port", "confirmed_local", "confirmed_crossing")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for sc in SCENARIOS:
        rates = [r[sc]["rate"] for r in runs]
        cpus = [r[sc]["broker_cpu_us_per_msg"] for r in runs
                if r[sc]["broker_cpu_us_per_msg"] is not None]
        out[sc] = {"median_rate": round(statistics.median(rates)), "rates": rates,
                   "median_cpu_us_per_msg": round(statistics.median(cpus), 2) if cpus
                   else None,
                   "valid": all(r[sc].get("valid", not r[sc].get("error")) for r in runs)}
    one = out["one_worker"]
    for sc in ("two_workers_local", "two_workers_crossing", "two_workers_node_port"):
        out[f"{sc}_vs_one_worker"] = {
            "throughput": round(out[sc]["median_rate"] / one["median_rate"], 2),
            "cpu_per_msg": round(out[sc]["median_cpu_us_per_msg"]
                                 / one["median_cpu_us_per_msg"], 2)
            if out[sc]["median_cpu_us_per_msg"] and one["median_cpu_us_per_msg"] else None}
    out["confirmed_crossing_vs_local"] = round(
        out["confirmed_crossing"]["median_rate"] / out["confirmed_local"]["median_rate"], 2)
    return out


def one_and_two_workers(args: argparse.Namespace, prefix: str,
                        one_run: Callable[[BrokerProcess, BrokerProcess,
                                           argparse.Namespace, str], dict[str, Any]],
                        ) -> list[dict[str, Any]]:
    """A ``workers = 1`` node and a ``workers = 2`` node side by side (fresh data
    directories under a temporary ``prefix``), ``one_run(single, two, args, tag)``
    ``args.runs`` times (the scenarios alternate within each run); both nodes stopped
    on the way out, a failing run included."""
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        single = BrokerProcess(Path(root) / "one").start()
        two = BrokerProcess(Path(root) / "two", extra_args=["--workers", "2"]).start(60)
        try:
            runs = []
            for i in range(args.runs):
                print(f"run {i + 1}:", flush=True)
                runs.append(one_run(single, two, args, f"r{i}"))
        finally:
            single.stop()
            two.stop()
    return runs


def report(result: dict[str, Any], out: str) -> None:
    """Print ``result`` without its raw runs; write all of it to ``out`` if given."""
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--hop-count", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    meta: dict[str, Any] = {
        "queues": args.queues, "count_per_publisher": args.count,
        "hop_count": args.hop_count, "runs": args.runs,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_start": os.getloadavg(),
        "hot_path": "pure Python" if os.environ.get("AMQPD_PURE_PYTHON") else "as installed"}
    runs = one_and_two_workers(args, "amqpd-bench-workers-", one_run)
    report({**meta, **summarise(runs), "loadavg_end": os.getloadavg()}, args.out)


if __name__ == "__main__":
    main()
