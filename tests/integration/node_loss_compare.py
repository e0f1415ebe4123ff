"""Node loss, amqpd against RabbitMQ 3.10: the scenario of
test_rabbitmq_cluster_reference.py (``observe``) run on two amqpd nodes and one etcd,
and on a private two-node RabbitMQ cluster, answer by answer::

    python -m tests.integration.node_loss_compare [--partition-handling ignore]
        [--out FILE.json] [--no-rabbitmq]

Prints every recorded answer of both, node names replaced by ``N1``/``N2``, marked
``same`` or ``DIFFERS``. A tool for matching amqpd to RabbitMQ, not a test: where amqpd
chooses to differ (docs/clustering.md, "RabbitMQ 3.10 as measured") it says so without
failing. ``--partition-handling`` defaults to ``ignore``, RabbitMQ's default: under
amqpd's ``pause_minority`` the surviving node of two pauses and answers nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from devtools.rabbitmq_cluster import start_cluster, stop_cluster
from tests.integration.cluster_support import ClusterNode, new_prefix, wait_for, wait_formed
from tests.integration.test_rabbitmq_cluster_reference import (
    Endpoint,
    RabbitPair,
    attempt,
    observe,
)
from tests.support.etcdproc import EtcdProcess


class Port:
    def __init__(self, node: ClusterNode) -> None:
        self.amqp_port = int(urlparse(node.url).port or 5672)


class AmqpdPair:
    """Two amqpd cluster nodes as a ``Pair`` of the reference scenario."""

    def __init__(self, a: ClusterNode, b: ClusterNode) -> None:
        self.a, self.b = a, b
        # typed as the Protocol's mutable attributes are (invariant): Pair.n1 is an Endpoint
        self.n1: Endpoint = Port(a)
        self.n2: Endpoint = Port(b)
        self.name1, self.name2 = a.name, b.name

    def leaders(self) -> dict[str, str]:
        return {q["name"]: q.get("node") for q in self.b.api.get("/api/queues").json()}

    def wait_known(self, queue: str) -> None:
        from pamqp import commands

        wait_for(lambda: attempt(self.n2, commands.Queue.Declare(queue=queue, passive=True),
                                 commands.Queue.DeclareOk).startswith("Queue.DeclareOk"),
                 60, f"{queue} usable on {self.name2}", self.b.tail)

    def kill1(self) -> None:
        self.a.kill()

    def wait_down(self) -> None:
        wait_for(lambda: self.name1 not in self.b.status()["running_nodes"], 60,
                 f"{self.name2} sees {self.name1} down")

    def states_on_2(self) -> dict[str, str]:
        return {q["name"]: q.get("state") for q in self.b.api.get("/api/queues").json()}

    def restart1(self) -> None:
        self.a.start()
        wait_formed([self.a, self.b], 60)
        self.n1 = Port(self.a)


def normalise(value: Any, names: dict[str, str]) -> str:
    text = json.dumps(value, sort_keys=True)
    for name, alias in names.items():
        text = text.replace(name, alias)
    return text


def run_amqpd(root: Path, partition_handling: str) -> dict[str, Any]:
    etcd = EtcdProcess(root / "etcd").start()
    nodes: list[ClusterNode] = []
    try:
        prefix = new_prefix()
        for name in ("node-1", "node-2"):
            nodes.append(ClusterNode(name, root / name, etcd.url, prefix,
                                     partition_handling=partition_handling).start())
        wait_formed(nodes)
        return observe(AmqpdPair(*nodes))
    finally:
        for n in nodes:
            with contextlib.suppress(Exception):
                n.stop()
        etcd.kill()


def run_rabbitmq(root: Path) -> dict[str, Any]:
    cluster = start_cluster(root / "rabbitmq", nodes=2)
    try:
        return observe(RabbitPair(cluster))
    finally:
        stop_cluster(root / "rabbitmq")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partition-handling", default="ignore")
    ap.add_argument("--out", default="")
    ap.add_argument("--no-rabbitmq", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="amqpd-node-loss-") as tmp:
        root = Path(tmp)
        results = {"amqpd": run_amqpd(root / "amqpd", args.partition_handling)}
        if not args.no_rabbitmq:
            results["rabbitmq"] = run_rabbitmq(root)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    am = results["amqpd"]
    rb = results.get("rabbitmq", {})
    differs = 0
    for key in am:
        if key in ("node1", "node2", "unacked_delivery_tag"):
            continue
        x = normalise(am[key], {am["node1"]: "N1", am["node2"]: "N2"})
        if not rb:
            print(f"{key}: {x}")
            continue
        y = normalise(rb.get(key), {rb["node1"]: "N1", rb["node2"]: "N2"})
        same = x == y
        differs += not same
        print(f"{'same   ' if same else 'DIFFERS'} {key}\n  amqpd:    {x}"
              + ("" if same else f"\n  rabbitmq: {y}"))
    if rb:
        print(f"{differs} answers differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
