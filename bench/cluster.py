"""Cluster figures (issue 15), two nodes on this machine, amqpd and RabbitMQ 3.10 side by
side:

1. aggregate throughput, one node alone (no cluster): ``--queues`` queues, one publisher
   and one consumer process per queue, every client on that node;
2. the same load on a two-node cluster with queues led by both nodes (locator
   client-local, both brokers' default: each queue declared on the node that leads it)
   and every client on its queue's leader: both nodes' cores at work;
3. the same two nodes with every client on the *other* node: each message crosses
   between the nodes twice (publish to the leader, delivery back);
4. the cost of a remote hop for a publisher with confirms (persistent, durable queue led
   by node A): connected to A (local) against connected to B (every publish forwarded to
   A, confirmed after A has it on disk).

amqpd: two amqpd processes and one etcd (tests/integration/cluster_support.py).
RabbitMQ: two nodes of Debian's rabbitmq-server on one private epmd, joined with
``rabbitmqctl join_cluster`` (devtools/rabbitmq_cluster.py); classic queues, whose
leaders are checked with ``rabbitmqctl list_queues name pid``. Scenario 1 runs on a
single node of each that is in no cluster.

Durable queues (amqpd's cluster knows durable queues only), transient messages, no
confirms, consumers acking with prefetch 1000 in 1-3; ``--count`` messages per
publisher; fresh queues for every scenario and run. Generators are raw-frame
(bench/loadgen.py), one process each; every delivery is counted and checked in order.
With ``--runs N`` every scenario runs N times on the same brokers and the median rate is
reported. Timings are reported, never asserted.

Usage: ``python -m bench.cluster [--queues 2] [--count 200000] [--hop-count 20000]
[--runs 1] [--brokers amqpd,rabbitmq] [--out bench/RESULTS-cluster.json]``.
"""

from __future__ import annotations

import argparse
import os
import queue as queue_mod
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.loadgen import Conn, ConsumerSpec, PublisherSpec, Target, run_publisher
from bench.runner import CTX, _cons_worker, _pub_worker
from bench.side_by_side import add_broker_options, amqpd_cluster, num, run_side_by_side
from tests.integration.cluster_support import wait_for
from tests.support.brokerproc import BrokerProcess


def declare(url: str, name: str, durable: bool = False) -> None:
    conn = Conn(url)
    try:
        conn.declare_queue(conn.open_channel(1), name, durable=durable)
    finally:
        conn.close()


def usable(url: str, name: str) -> bool:
    conn = Conn(url, timeout=5)
    try:
        conn.message_count(conn.open_channel(1), name)
        return True
    except Exception:
        return False
    finally:
        conn.close()


def flow(pubs: list[tuple[str, PublisherSpec]], cons: list[tuple[str, ConsumerSpec]],
         expected: int, timeout: float = 600.0) -> dict[str, Any]:
    """Consumers, then publishers, each a process at its own URL; the aggregate
    delivery rate from go to the last delivery."""
    ready = CTX.Barrier(len(pubs) + len(cons) + 1)
    go = CTX.Event()
    stop = CTX.Event()
    progress = CTX.RawArray("q", len(cons))
    out: Any = CTX.Queue()
    procs = [CTX.Process(target=_pub_worker, args=(url, spec, ready, go, out), daemon=True)
             for url, spec in pubs]
    procs += [CTX.Process(target=_cons_worker, args=(url, [spec], i, ready, stop, progress,
                                                     out), daemon=True)
              for i, (url, spec) in enumerate(cons)]
    for p in procs:
        p.start()
    results: dict[str, list[Any]] = {"pub": [], "cons": []}
    try:
        ready.wait(timeout=120)
        t_go = time.monotonic()
        go.set()
        deadline = t_go + timeout
        while sum(progress) < expected and time.monotonic() < deadline:
            time.sleep(0.005)
        t_done = time.monotonic()
        got = sum(progress)
        stop.set()
        while len(results["pub"]) + len(results["cons"]) < len(procs):
            try:
                kind, _idx, res = out.get(timeout=60)
            except queue_mod.Empty:
                break
            results[kind].append(res)
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [r.error for rs in results.values() for r in rs if r.error]
    disorder = sum(r.disorder + r.gaps for r in results["cons"])
    return {"delivered": got, "expected": expected, "seconds": round(t_done - t_go, 3),
            "rate": round(got / (t_done - t_go)), "errors": errors,
            "gaps_or_disorder": disorder, "valid": got == expected and not errors
            and not disorder}


def load(queues: list[str], pub_url: dict[str, str], cons_url: dict[str, str],
         count: int) -> dict[str, Any]:
    pubs = [(pub_url[name], PublisherSpec(i + 1, [Target("", name)], body_size=64,
                                          count=count)) for i, name in enumerate(queues)]
    cons = [(cons_url[name], ConsumerSpec([name], prefetch=1000)) for name in queues]
    return flow(pubs, cons, count * len(queues))


def hop(url: str, queue: str, count: int) -> dict[str, Any]:
    res = run_publisher(url, PublisherSpec(1, [Target("", queue)], body_size=64,
                                           persistent=True, confirm_window=500,
                                           count=count))
    took = res.t_end - res.t_start if res.t_start else 0.0
    return {"confirmed": res.confirmed, "nacked": res.nacked, "error": res.error,
            "seconds": round(took, 3), "rate": round(res.confirmed / took) if took else 0}


def wait_usable(urls: list[str], name: str) -> None:
    for url in urls:
        def ready(url: str = url) -> bool:
            return usable(url, name)
        wait_for(ready, 30, f"{name} usable at {url}")


def one_node(url: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    """Scenario 1 on fresh queues."""
    names = [f"one-{tag}-{i}" for i in range(args.queues)]
    for name in names:
        declare(url, name, durable=True)
    urls = dict.fromkeys(names, url)
    return load(names, urls, urls, args.count)


def two_nodes(a_url: str, b_url: str, args: argparse.Namespace, tag: str,
              leaders_of: Any = None) -> dict[str, Any]:
    """Scenarios 2-4 on fresh queues: queue i declared on (so led by) node i % 2.
    *leaders_of*, if given, answers queue name -> leader node (0 or 1) to check that."""
    out: dict[str, Any] = {}
    both = [a_url, b_url]
    for key, swap in (("two_nodes_clients_on_leaders", False),
                      ("two_nodes_clients_elsewhere", True)):
        names = [f"two-{tag}-{key[-7:]}-{i}" for i in range(args.queues)]
        leader: dict[str, int] = {}
        for i, name in enumerate(names):
            leader[name] = i % 2
            declare(both[i % 2], name, durable=True)
        for name in names:
            wait_usable(both, name)
        if leaders_of is not None:
            got = leaders_of()
            wrong = {n: got.get(n) for n in names if got.get(n) != leader[n]}
            if wrong:
                raise RuntimeError(f"queues not led where declared: {wrong}")
        urls = {n: both[(leader[n] + 1) % 2 if swap else leader[n]] for n in names}
        out[key] = load(names, urls, urls, args.count)
        print(f"  {key}:", out[key], flush=True)
    hop_q = f"hop-{tag}"
    declare(a_url, hop_q, durable=True)
    wait_usable(both, hop_q)
    out["confirmed_publish_local"] = hop(a_url, hop_q, args.hop_count)
    out["confirmed_publish_remote_hop"] = hop(b_url, hop_q, args.hop_count)
    print("  confirmed publish, local:", out["confirmed_publish_local"],
          "remote hop:", out["confirmed_publish_remote_hop"], flush=True)
    return out


SCENARIOS = ("one_node", "two_nodes_clients_on_leaders", "two_nodes_clients_elsewhere",
             "confirmed_publish_local", "confirmed_publish_remote_hop")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate of every scenario over the runs (all runs kept), and the ratios."""
    out: dict[str, Any] = {"runs": runs}
    for sc in SCENARIOS:
        rates = [r[sc]["rate"] for r in runs if sc in r]
        valid = all(r[sc].get("valid", not r[sc].get("error")) for r in runs if sc in r)
        out[sc] = {"median_rate": round(statistics.median(rates)) if rates else None,
                   "rates": rates, "valid": valid}
    one = out["one_node"]["median_rate"]
    two = out["two_nodes_clients_on_leaders"]["median_rate"]
    out["speedup_two_nodes_vs_one"] = round(two / one, 2) if one and two else None
    loc = out["confirmed_publish_local"]["median_rate"]
    rem = out["confirmed_publish_remote_hop"]["median_rate"]
    out["remote_hop_vs_local"] = round(rem / loc, 2) if loc and rem else None
    return out


def run_amqpd(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = [{} for _ in range(args.runs)]
    single = BrokerProcess(root / "single").start()
    try:
        for i in range(args.runs):
            runs[i]["one_node"] = one_node(single.url, args, f"r{i}")
            print(f"amqpd run {i + 1}, one node:", runs[i]["one_node"], flush=True)
    finally:
        single.stop()
    with amqpd_cluster(root, ("a", "b")) as (a, b):
        for i in range(args.runs):
            print(f"amqpd run {i + 1}, two nodes:", flush=True)
            runs[i].update(two_nodes(a.url, b.url, args, f"r{i}"))
    return summarise(runs)


def run_rabbitmq(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from devtools import rabbitmq as rmq
    from devtools import rabbitmq_cluster as rmqc

    runs: list[dict[str, Any]] = [{} for _ in range(args.runs)]
    info = rmq.start(root / "rmq-single")
    try:
        for i in range(args.runs):
            runs[i]["one_node"] = one_node(info.amqp_url, args, f"r{i}")
            print(f"rabbitmq run {i + 1}, one node:", runs[i]["one_node"], flush=True)
    finally:
        rmq.stop(root / "rmq-single")
    cluster = rmqc.start_cluster(root / "rmq-cluster", nodes=2)
    try:
        a, b = cluster.nodes
        version = "RabbitMQ " + rmq.ctl(a, "version").strip()
        index = {a.nodename: 0, b.nodename: 1}

        def leaders_of() -> dict[str, int]:
            return {q: index.get(n, -1) for q, n in rmqc.queue_leaders(a).items()}

        for i in range(args.runs):
            print(f"rabbitmq run {i + 1}, two nodes:", flush=True)
            runs[i].update(two_nodes(a.amqp_url, b.amqp_url, args, f"r{i}", leaders_of))
    finally:
        rmqc.stop_cluster(root / "rmq-cluster")
    out = summarise(runs)
    out["version"] = version
    return out


def table(res: dict[str, Any]) -> str:
    """The markdown rows of bench/RESULTS-cluster.md."""
    names = {
        "one_node": "1. one node alone, queues' clients on it",
        "two_nodes_clients_on_leaders": "2. two nodes, a queue led by each, clients on "
                                        "their queue's leader",
        "two_nodes_clients_elsewhere": "3. two nodes, clients on the *other* node",
        "confirmed_publish_local": "4a. confirmed persistent publish, on the leader",
        "confirmed_publish_remote_hop": "4b. confirmed persistent publish, on the other "
                                        "node (remote hop)",
    }
    am, rb = res.get("amqpd"), res.get("rabbitmq")
    lines = ["| scenario | amqpd msgs/s | RabbitMQ msgs/s | amqpd / RabbitMQ |",
             "|---|---|---|---|"]
    for sc, label in names.items():
        x = am[sc]["median_rate"] if am else None
        y = rb[sc]["median_rate"] if rb else None
        ratio = f"{x / y:.2f}" if x and y else "-"
        lines.append(f"| {label} | {num(x)} | {num(y)} | {ratio} |")
    for key, label in (("speedup_two_nodes_vs_one", "two nodes / one node (2 / 1)"),
                       ("remote_hop_vs_local", "remote hop / local (4b / 4a)")):
        x = am[key] if am else None
        y = rb[key] if rb else None
        lines.append(f"| {label} | {x} | {y} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=2)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--hop-count", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1)
    add_broker_options(ap)
    args = ap.parse_args()
    out: dict[str, Any] = {"queues": args.queues, "count_per_publisher": args.count,
                           "hop_count": args.hop_count, "runs": args.runs,
                           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "loadavg_start": os.getloadavg()}
    run_side_by_side(out, args, "amqpd-bench-cluster-", run_amqpd, run_rabbitmq, SCENARIOS, table)


if __name__ == "__main__":
    threading.current_thread().name = "bench-cluster"
    main()
