"""What the two-broker cluster benchmarks share (bench/cluster.py, bench/mirrored.py): an
amqpd cluster on one private etcd, and the run of amqpd and RabbitMQ one after the other
with their figures put side by side.

Kept apart from the benchmarks so each of them says only what it measures; the shape of
a results file (``amqpd``, ``rabbitmq`` or ``rabbitmq_skipped``, ``amqpd_vs_rabbitmq``,
the load average at the start and the end) is the same for both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.integration.cluster_support import ClusterNode, new_prefix, wait_formed
from tests.support.etcdproc import EtcdProcess

Runner = Callable[[Path, argparse.Namespace], dict[str, Any]]


@contextlib.contextmanager
def amqpd_cluster(root: Path, names: Sequence[str],
                  heartbeat_timeout: float | None = None) -> Iterator[list[ClusterNode]]:
    """amqpd nodes ``bench-<name>`` under ``root`` joined through one private etcd,
    formed; on the way out every node started is stopped (a failing stop does not keep
    the others running) and etcd is killed. ``heartbeat_timeout``: the nodes' failure
    detection (None: the tests' 3 s, ClusterNode's default)."""
    etcd = EtcdProcess(root / "etcd").start()
    nodes: list[ClusterNode] = []
    try:
        prefix = new_prefix()
        for name in names:
            node = ClusterNode(f"bench-{name}", root / name, etcd.url, prefix)
            if heartbeat_timeout is not None:
                node.heartbeat_timeout = heartbeat_timeout
            nodes.append(node.start())
        wait_formed(nodes)
        yield nodes
    finally:
        for n in nodes:
            with contextlib.suppress(Exception):
                n.stop()
        etcd.kill()


def add_broker_options(ap: argparse.ArgumentParser) -> None:
    """``--brokers`` and ``--out``, as every side-by-side benchmark takes them."""
    ap.add_argument("--brokers", default="amqpd,rabbitmq",
                    help="comma-separated: amqpd, rabbitmq (skipped with a note if "
                         "rabbitmq-server is not installed)")
    ap.add_argument("--out", default="")


def run_side_by_side(out: dict[str, Any], args: argparse.Namespace, prefix: str,
                     run_amqpd: Runner, run_rabbitmq: Runner, keys: Sequence[str],
                     table: Callable[[dict[str, Any]], str]) -> None:
    """Runs each broker ``args.brokers`` names in a temporary directory (``prefix``),
    RabbitMQ only where it is installed (else a note in ``rabbitmq_skipped``), and adds
    to ``out`` what each returned and the amqpd / RabbitMQ ratio of the median rate of
    every one of ``keys``. Prints ``out`` without the raw results, then ``table(out)``,
    and writes ``out`` to ``args.out`` when one is given."""
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        if "amqpd" in brokers:
            out["amqpd"] = run_amqpd(root / "amqpd", args)
        if "rabbitmq" in brokers:
            from devtools.rabbitmq import RabbitMQNotInstalled, find_server

            try:
                find_server()
            except RabbitMQNotInstalled as exc:
                out["rabbitmq_skipped"] = str(exc)
            else:
                out["rabbitmq"] = run_rabbitmq(root / "rabbitmq", args)
    out["loadavg_end"] = os.getloadavg()
    am, rb = out.get("amqpd"), out.get("rabbitmq")
    if am and rb:
        out["amqpd_vs_rabbitmq"] = {
            k: round(am[k]["median_rate"] / rb[k]["median_rate"], 2)
            if am[k]["median_rate"] and rb[k]["median_rate"] else None for k in keys}
    print(json.dumps({k: v for k, v in out.items() if k not in ("amqpd", "rabbitmq")},
                     indent=2))
    print(table(out))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


def num(x: int | None) -> str:
    """A rate for a results table: thousands separated, "-" where there is none."""
    return "-" if x is None else f"{x:,}"
