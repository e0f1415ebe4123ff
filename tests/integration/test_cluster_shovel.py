"""A dynamic shovel in a two-node cluster (issue 15): one node runs it, as RabbitMQ 3.10
runs each dynamic shovel on one node of a cluster, so each message is moved once; when
that node is killed, the other takes the shovel over.

The shovel takes from an exchange (``src-exchange``): each running copy would declare
its own queue bound to it, so two copies would deliver every message twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from bench.loadgen import PublisherSpec, Target, run_publisher
from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    cluster_of,
    private_etcd,
    publishing_thread,
    wait_for,
    wait_formed,
)
from tests.integration.fed_support import copies_and_lost
from tests.integration.test_cluster_queues import declare_on, queue_info, usable
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[list[ClusterNode]]:
    """Two nodes with the shovel plugin; ``ignore``: one of two must serve alone."""
    with private_etcd(tmp_path) as etcd, cluster_of(
            tmp_path, etcd.url, ("a", "b"), {"AMQPD_PLUGINS": "shovel"},
            partition_handling="ignore") as nodes:
        yield nodes


def shovels(node: ClusterNode) -> list[dict[str, Any]]:
    r = node.api.get("/api/shovels")
    assert r.status == 200, r.text
    items: list[dict[str, Any]] = r.json()
    return items


def runner_of(nodes: list[ClusterNode]) -> list[str]:
    """The nodes the shovel runs on, as ``nodes`` list it (each node lists the whole
    cluster's dynamic shovels with their ``node``, as RabbitMQ's do)."""
    return sorted({s["node"] for n in nodes for s in shovels(n)
                   if s["name"] == "mover" and s["state"] == "running"})


def drained_into(node: ClusterNode, dests: list[str], total: int) -> bool:
    """Every queue but ``dests`` is empty and settled (the shovel's own queue too), and
    each of ``dests`` holds at least ``total``."""
    r = node.api.get("/api/queues")
    assert r.status == 200
    for item in r.json():
        if item.get("state") == "down":
            continue  # led by a lost node: its counts are the last it reported
        if item["name"] in dests:
            if item.get("messages", 0) < total:
                return False
        elif item.get("messages", 0) or item.get("messages_unacknowledged", 0):
            return False
    return True


def count(node: ClusterNode, name: str) -> int:
    return int((queue_info(node, name) or {}).get("messages", -1))


def test_a_dynamic_shovel_runs_on_one_node_and_moves_each_message_once(
        pair: list[ClusterNode]) -> None:
    a, b = pair
    # srcx -> (shovel) -> dstx, a fanout to dst-a (led by a) and dst-b (led by b)
    for n in pair:
        declare_on(n, f"dst-{n.name[-1]}")
    for name in ("srcx", "dstx"):
        r = a.api.put(f"/api/exchanges/%2F/{name}", {"type": "fanout", "durable": True})
        assert r.status in (201, 204), r.text
    for dest in ("dst-a", "dst-b"):
        r = a.api.post(f"/api/bindings/%2F/e/dstx/q/{dest}", {"routing_key": ""})
        assert r.status in (201, 204), r.text
    for n in pair:
        def topology(n: ClusterNode = n) -> bool:
            return usable(n, "dst-a") and usable(n, "dst-b") and len(bound_on(n, "dstx")) == 2
        wait_for(topology, 30, f"topology on {n.name}", n.tail)
    r = b.api.put("/api/parameters/shovel/%2F/mover", {"value": {
        "src-uri": "amqp://", "src-exchange": "srcx", "dest-uri": "amqp://",
        "dest-exchange": "dstx"}})
    assert r.status in (201, 204), r.text
    # its queue (exclusive, on the node that runs it) bound to srcx: one, not one per
    # node
    wait_for(lambda: len(runner_of(pair)) == 1 and bindings(pair) == 1, 30,
             "the shovel running on one node, its queue bound to srcx",
             lambda: a.tail() + b.tail())
    runs = a if runner_of(pair) == [a.name] else b
    # any node answers for the cluster: both list it once, running on ``runs``
    for n in pair:
        def lists_mover(n: ClusterNode = n) -> bool:
            return [(s["node"], s["state"]) for s in shovels(n)
                    if s["name"] == "mover"] == [(runs.name, "running")]
        wait_for(lists_mover, 15, f"/api/shovels on {n.name} lists mover on {runs.name}",
                 n.tail)
        r = n.api.get("/api/shovels/vhost/%2F/mover")
        assert r.status == 200 and r.json()["node"] == runs.name, r.text
    pub = run_publisher(runs.url, PublisherSpec(1, [Target("srcx", "")], persistent=True,
                                             confirm_window=50, count=300))
    assert (pub.confirmed, pub.nacked) == (300, 0)
    wait_for(lambda: drained_into(a, ["dst-a", "dst-b"], 300), 60,
             "300 in dst-a and dst-b, nothing in flight", lambda: a.tail() + b.tail())
    assert (count(a, "dst-a"), count(a, "dst-b")) == (300, 300)  # each message once
    assert runner_of(pair) == [runs.name] and bindings(pair) == 1
    # the node running it is killed: the other takes the shovel over
    gone, other = runs, (b if runs is a else a)
    gone.kill()
    wait_for(lambda: runner_of([other]) == [other.name] and len(bound_on(other, "srcx"))
             == 1, 30, f"the shovel running on {other.name}", other.tail)
    mine = f"dst-{other.name[-1]}"
    pub = run_publisher(other.url, PublisherSpec(2, [Target("srcx", "")], persistent=True,
                                                 confirm_window=50, count=100))
    assert (pub.confirmed, pub.nacked) == (100, 0)
    wait_for(lambda: drained_into(other, [mine], 400), 60, f"100 more in {mine}",
             other.tail)
    assert count(other, mine) == 400


def bindings(nodes: list[ClusterNode]) -> int:
    """How many distinct queues are bound to srcx (each node lists them all)."""
    return len({d for n in nodes for d in bound_on(n, "srcx")})


def bound_on(node: ClusterNode, exchange: str) -> list[str]:
    r = node.api.get(f"/api/exchanges/%2F/{q(exchange)}/bindings/source")
    return [x["destination"] for x in r.json()] if r.status == 200 else []


def test_a_local_shovel_retries_only_the_queue_that_refused(
        pair: list[ClusterNode]) -> None:
    """Issue 29: a shovel into this cluster (``dest-uri`` ``amqp://``) whose destination
    exchange routes to a queue led by each node, one of them refusing (max-length 1 with
    reject-publish, while a policy says so): the shovel publishes per queue, so the
    healthy queue gets each message exactly once wherever the shovel runs, the refusing
    one gets every message once it takes them again, and nothing is lost."""
    a, b = pair
    n = 20
    declare_on(a, "rt-healthy")
    declare_on(b, "rt-orders")
    r = a.api.put("/api/exchanges/%2F/rtx", {"type": "fanout", "durable": True})
    assert r.status in (201, 204), r.text
    for dest in ("rt-healthy", "rt-orders"):
        r = a.api.post(f"/api/bindings/%2F/e/rtx/q/{dest}", {"routing_key": ""})
        assert r.status in (201, 204), r.text
    r = a.api.put("/api/policies/%2F/rt-full", {
        "pattern": "^rt-orders$", "apply-to": "queues",
        "definition": {"max-length": 1, "overflow": "reject-publish"}})
    assert r.status in (201, 204), r.text
    for node in pair:
        def ready(node: ClusterNode = node) -> bool:
            info = queue_info(node, "rt-orders") or {}
            return usable(node, "rt-healthy") and info.get("policy") == "rt-full" \
                and len(bound_on(node, "rtx")) == 2
        wait_for(ready, 30, f"topology and policy on {node.name}", node.tail)
    with pika.BlockingConnection(pika.URLParameters(b.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "rt-orders", b"filler")
        ch.queue_declare("rt-src", durable=True)
        for i in range(n):
            ch.basic_publish("", "rt-src", f"m{i}".encode(),
                             pika.BasicProperties(delivery_mode=2, message_id=f"id-{i}"))
    r = a.api.put("/api/parameters/shovel/%2F/retrier", {"value": {
        "src-uri": "amqp://", "src-queue": "rt-src", "dest-uri": "amqp://",
        "dest-exchange": "rtx"}})
    assert r.status in (201, 204), r.text
    # rt-orders' refusals come back from its node after the shovel published the whole
    # batch: rt-healthy takes every message once, rt-orders none; a few retry rounds
    # (of every message, into rt-orders alone) pass: rt-healthy must not grow with them
    wait_for(lambda: count(a, "rt-healthy") >= n, 30, "every message in rt-healthy",
             lambda: a.tail() + b.tail())
    def retry_rounds() -> int:
        """Retry rounds logged: per queue (this node's destination) or per message
        (an AMQP destination's, which goes through the exchange again)."""
        text = "".join(log_of(node) for node in pair)
        return text.count("local publish to 'rt-orders' failed") + \
            text.count("publishing them again")

    wait_for(lambda: retry_rounds() >= 3, 30, "three retry rounds",
             lambda: a.tail() + b.tail())
    assert count(a, "rt-healthy") == n and count(b, "rt-orders") == 1
    r = a.api.delete("/api/policies/%2F/rt-full")
    assert r.status == 204, r.text
    wait_for(lambda: count(b, "rt-orders") == n + 1 and count(a, "rt-healthy") == n
             and count(a, "rt-src") == 0, 60, "every message in both queues, once",
             lambda: a.tail() + b.tail())
    got: dict[str, list[str]] = {}
    for name, node in (("rt-healthy", a), ("rt-orders", b)):
        with pika.BlockingConnection(pika.URLParameters(node.url)) as conn:
            ch = conn.channel()
            ids = []
            for _ in range(3 * n):
                method, props, body = ch.basic_get(name, auto_ack=True)
                if method is None:
                    break
                if body != b"filler":
                    ids.append(props.message_id)
            got[name] = sorted(ids)
    expected = sorted(f"id-{i}" for i in range(n))
    assert got == {"rt-healthy": expected, "rt-orders": expected}


def log_of(node: ClusterNode) -> str:
    assert node.proc is not None
    return node.proc.log_path.read_text(errors="replace")


def _runs_on(nodes: list[ClusterNode], name: str) -> list[str]:
    """The nodes ``nodes`` say run shovel ``name`` (each lists the whole cluster's)."""
    found: set[str] = set()
    for n in nodes:
        r = n.api.get("/api/shovels")
        if r.status == 200:
            found.update(s["node"] for s in r.json()
                         if s["name"] == name and s["state"] == "running")
    return sorted(found)


def _settled_into(node: ClusterNode, total: int) -> bool:
    """mv-src empty and settled, mv-dest holding at least ``total``."""
    src, dest = queue_info(node, "mv-src") or {}, queue_info(node, "mv-dest") or {}
    return not src.get("messages", 1) and not src.get("messages_unacknowledged", 1) \
        and dest.get("messages", 0) >= total


def test_a_shovel_moving_between_running_nodes_hands_over_without_copies(
        pair: list[ClusterNode]) -> None:
    """Issue 29: the node running a shovel is stopped (a shutdown: a planned stop), the
    other takes the shovel over; started again, the node gets it back (the placement
    ranks it first). Both handovers drain (the source consumer cancelled, what is in
    hand confirmed and acked), so a steady stream of messages without ``message_id``
    reaches the destination queue once each. Before, each handover requeued what the
    stopped runner had published but not acked, and the next runner published it again.
    The queues are led by the node that stays up, so only the shovel moves."""
    a, b = pair
    for name in ("mv-src", "mv-dest"):
        declare_on(b, name)
    for n in pair:
        def ready(n: ClusterNode = n) -> bool:
            return usable(n, "mv-src") and usable(n, "mv-dest")
        wait_for(ready, 30, f"queues usable on {n.name}", n.tail)
    chosen = ""
    for i in range(12):  # a name the placement gives to a (even odds per name)
        name = f"mv-{i}"
        r = b.api.put(f"/api/parameters/shovel/%2F/{name}", {"value": {
            "src-uri": "amqp://", "src-queue": "mv-src", "dest-uri": "amqp://",
            "dest-queue": "mv-dest"}})
        assert r.status in (201, 204), r.text
        def running(name: str = name) -> bool:
            return bool(_runs_on(pair, name))

        wait_for(running, 30, f"{name} running", lambda: a.tail() + b.tail())
        if _runs_on(pair, name) == [a.name]:
            chosen = name
            break
        r = b.api.delete(f"/api/parameters/shovel/%2F/{name}")
        assert r.status == 204, r.text
        wait_for(lambda: not running(), 30, f"{name} gone")
    assert chosen, "no shovel name among 12 placed on node-a"
    pub = ConfirmPublisher(b.url, "mv-src", window=500, batch=50)
    stop = threading.Event()
    failure: list[BaseException] = []
    thread = publishing_thread(pub, 0, stop, failure)
    thread.start()
    try:
        def grown(by: int) -> Callable[[], bool]:
            target = count(b, "mv-dest") + by
            return lambda: count(b, "mv-dest") >= target

        wait_for(grown(1000), 60, "the shovel under way on node-a", a.tail)
        a.stop()  # the shovel's node shuts down: b takes it over
        wait_for(lambda: _runs_on([b], chosen) == [b.name], 30, "the shovel on node-b",
                 b.tail)
        wait_for(grown(1000), 60, "the shovel under way on node-b", b.tail)
        a.start()
        wait_formed(pair)
        wait_for(lambda: _runs_on(pair, chosen) == [a.name], 30, "the shovel back on a",
                 lambda: a.tail() + b.tail())
        wait_for(grown(1000), 60, "the shovel under way on node-a again", a.tail)
    finally:
        stop.set()
        thread.join(90)
    assert not failure, failure
    assert not pub.nacked, f"{len(pub.nacked)} publishes nacked"
    total = len(pub.confirmed)
    wait_for(lambda: _settled_into(b, total), 90, f"{total} in mv-dest, mv-src settled",
             lambda: a.tail() + b.tail())
    copies, lost = copies_and_lost(b.url, "mv-dest", pub.confirmed)
    assert not lost, f"{len(lost)} lost: {sorted(lost)[:10]}"
    assert copies == 0, f"{copies} second copies in mv-dest after two handovers"
