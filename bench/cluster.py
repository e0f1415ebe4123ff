"""Cluster figures (issue 15), two amqpd nodes and one etcd on this machine:

1. aggregate throughput, one node alone (no cluster): ``--queues`` queues, one publisher
   and one consumer process per queue, every client on that node;
2. the same load on a two-node cluster with queues led by both nodes (locator
   client-local: each queue declared on the node that leads it) and every client on its
   queue's leader: both nodes' cores at work;
3. the same two nodes with every client on the *other* node: each message crosses the
   inter-node link twice (publish to the leader, delivery back);
4. the cost of a remote hop for a publisher with confirms (persistent, durable queue led
   by node A): connected to A (local) against connected to B (every publish forwarded to
   A, confirmed after A's group commit).

Durable queues (the cluster knows durable queues only), transient messages, no
confirms, consumers acking with prefetch 1000 in 1-3; ``--count`` messages per
publisher. Generators are raw-frame (bench/loadgen.py), one process each. Timings are
reported, never asserted.

RabbitMQ side by side needs a local RabbitMQ cluster (several rabbit nodes on one host
under distinct names and ports, joined with ``rabbitmqctl join_cluster``); not run here
(see docs/benchmarks.md for why).

Usage: ``python -m bench.cluster [--queues 2] [--count 200000] [--hop-count 20000]
[--out bench/RESULTS-cluster.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue as queue_mod
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.loadgen import Conn, ConsumerSpec, PublisherSpec, Target, run_publisher
from bench.runner import CTX, _cons_worker, _pub_worker
from tests.integration.cluster_support import ClusterNode, new_prefix, wait_for, wait_formed
from tests.support.brokerproc import BrokerProcess
from tests.support.etcdproc import EtcdProcess


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=2)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--hop-count", type=int, default=20_000)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    out: dict[str, Any] = {"queues": args.queues, "count_per_publisher": args.count}
    with tempfile.TemporaryDirectory(prefix="amqpd-bench-cluster-") as tmp:
        root = Path(tmp)
        # 1. one node alone
        single = BrokerProcess(root / "single").start()
        try:
            names = [f"one-{i}" for i in range(args.queues)]
            for name in names:
                declare(single.url, name, durable=True)
            urls = dict.fromkeys(names, single.url)
            out["one_node"] = load(names, urls, urls, args.count)
            print("one node:", out["one_node"], flush=True)
        finally:
            single.stop()
        # 2-4. two nodes
        etcd = EtcdProcess(root / "etcd").start()
        nodes: list[ClusterNode] = []
        try:
            prefix = new_prefix()
            for name in ("a", "b"):
                nodes.append(ClusterNode(f"bench-{name}", root / name, etcd.url,
                                         prefix).start())
            wait_formed(nodes)
            a, b = nodes
            leader: dict[str, ClusterNode] = {}
            names = [f"two-{i}" for i in range(args.queues)]
            for i, name in enumerate(names):
                leader[name] = nodes[i % 2]
                declare(leader[name].url, name, durable=True)
            for name in names:
                for n in nodes:
                    wait_for(lambda n=n, name=name: usable(n.url, name), 30,
                             f"{name} usable on {n.name}")
            other = {name: (b if leader[name] is a else a) for name in names}
            local = {name: leader[name].url for name in names}
            remote = {name: other[name].url for name in names}
            out["two_nodes_clients_on_leaders"] = load(names, local, local, args.count)
            print("two nodes, clients on leaders:", out["two_nodes_clients_on_leaders"],
                  flush=True)
            out["two_nodes_clients_elsewhere"] = load(names, remote, remote, args.count)
            print("two nodes, clients elsewhere:", out["two_nodes_clients_elsewhere"],
                  flush=True)
            declare(a.url, "hop", durable=True)
            wait_for(lambda: usable(b.url, "hop"), 30, "hop usable on b")
            out["confirmed_publish_local"] = hop(a.url, "hop", args.hop_count)
            out["confirmed_publish_remote_hop"] = hop(b.url, "hop", args.hop_count)
            print("confirmed publish, local:", out["confirmed_publish_local"],
                  "remote hop:", out["confirmed_publish_remote_hop"], flush=True)
        finally:
            for n in nodes:
                with contextlib.suppress(Exception):
                    n.stop()
            etcd.kill()
    one = out["one_node"]["rate"]
    out["speedup_two_nodes_vs_one"] = round(out["two_nodes_clients_on_leaders"]["rate"]
                                            / one, 2) if one else None
    loc = out["confirmed_publish_local"]["rate"]
    out["remote_hop_vs_local"] = round(out["confirmed_publish_remote_hop"]["rate"] / loc,
                                       2) if loc else None
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    threading.current_thread().name = "bench-cluster"
    main()
