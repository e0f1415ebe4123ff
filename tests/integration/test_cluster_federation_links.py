"""Issue 29: ``/api/federation-links`` on any node of a cluster lists every link of the
cluster with the node that runs it, as RabbitMQ's does (before, each node listed only
its own, so finding a link meant asking every node)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest

from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    wait_for,
    wait_formed,
)
from tests.integration.fed_support import amqp_uri, api, copies_and_lost
from tests.integration.test_cluster_queues import queue_info
from tests.support import etcdproc
from tests.support.brokerproc import BrokerProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]


def fed_links(node: ClusterNode) -> list[dict[str, Any]]:
    r = node.api.get("/api/federation-links")
    assert r.status == 200, r.text
    items: list[dict[str, Any]] = r.json()
    return items


def federate(node: ClusterNode, up: BrokerProcess, exchanges: list[str]) -> None:
    """Declare ``exchanges`` (fanout, durable; names starting ``fed.``) through
    ``node`` and federate them from ``up`` (upstream ``up``, policy ``fed``)."""
    for name in exchanges:
        r = node.api.put(f"/api/exchanges/%2F/{name}", {"type": "fanout", "durable": True})
        assert r.status in (201, 204), r.text
    r = node.api.put("/api/parameters/federation-upstream/%2F/up",
                     {"value": {"uri": amqp_uri(up.port), "reconnect-delay": 1}})
    assert r.status in (201, 204), r.text
    r = node.api.put("/api/policies/%2F/fed", {
        "pattern": "^fed\\.", "apply-to": "exchanges",
        "definition": {"federation-upstream-set": "all"}})
    assert r.status in (201, 204), r.text


def test_every_node_lists_every_link_with_its_node(
        upstream_and_pair: tuple[BrokerProcess, list[ClusterNode]]) -> None:
    up, nodes = upstream_and_pair
    a, b = nodes
    federate(a, up, ["fed.x1", "fed.x2", "fed.x3", "fed.x4"])

    def listed(n: ClusterNode) -> list[tuple[str, str, str]]:
        return sorted((i["exchange"], i["node"], i["status"]) for i in fed_links(n))

    def all_running() -> bool:
        items = listed(a)
        return len(items) == 4 and all(s == "running" for _x, _n, s in items)

    wait_for(all_running, 60, "four running links listed on node-a",
             lambda: a.tail() + b.tail())
    # each link once, on one node, and both nodes say the same
    wait_for(lambda: listed(b) == listed(a), 15, "node-b to list what node-a lists",
             b.tail)
    items = listed(a)
    assert len({x for x, _n, _s in items}) == 4
    # the exchanges' links are spread over both nodes (a fixed placement by name): so
    # each node lists links that the other runs
    assert {n for _x, n, _s in items} == {"node-a", "node-b"}, items
    # the per-vhost path is the whole cluster's too
    r = b.api.get("/api/federation-links/%2F")
    assert r.status == 200 and len(r.json()) == 4, r.text


class _Publisher(threading.Thread):
    """Confirmed persistent publishes of numbered bodies (no ``message_id``) into an
    upstream exchange until told to stop (bounded in count and time)."""

    def __init__(self, url: str, exchange: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.exchange = exchange
        self.confirmed: set[int] = set()
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            with pika.BlockingConnection(pika.URLParameters(self.url)) as conn:
                ch = conn.channel()
                ch.confirm_delivery()
                deadline = time.monotonic() + 240
                for number in range(200_000):
                    if self.halt.is_set() or time.monotonic() > deadline:
                        break
                    ch.basic_publish(self.exchange, "", str(number).encode(),
                                     pika.BasicProperties(delivery_mode=2))
                    self.confirmed.add(number)
        except BaseException as exc:  # reported by the test thread
            self.error = exc


def test_a_link_handed_over_at_shutdown_and_back_makes_no_copies(
        upstream_and_pair: tuple[BrokerProcess, list[ClusterNode]]) -> None:
    """Issue 29: the node running an exchange's link is shut down (SIGTERM), the other
    node takes the link over, and when the node is back the link returns to it. The
    queue on the exchange is led by the node that stays up, so the link's publishes
    into it cross the cluster. Both handovers drain (local confirms, acks upstream)
    while the cluster is still there, so every message reaches the queue once. Before,
    a shutdown left the cluster first: the node nacked the publishes in flight to the
    queue's leader, the drain ran out, and the upstream redelivered what the link held
    to the node that took over."""
    up, nodes = upstream_and_pair
    a, b = nodes
    candidates = [f"fed.h{i}" for i in range(8)]
    federate(a, up, candidates)

    def placed() -> dict[str, str]:
        return {i["exchange"]: i["node"] for i in fed_links(a) if i["status"] == "running"}

    wait_for(lambda: len(placed()) == len(candidates), 60, "every link running",
             lambda: a.tail() + b.tail())
    exchange = next((x for x, n in placed().items() if n == a.name), None)
    assert exchange is not None, placed()  # even odds per name: 1 in 256 to miss
    with pika.BlockingConnection(pika.URLParameters(b.url)) as conn:
        ch = conn.channel()
        ch.queue_declare("handed", durable=True)  # led by node-b
        ch.queue_bind("handed", exchange)
    upstream = api(up)

    def bound_upstream() -> bool:
        r = upstream.get(f"/api/exchanges/%2F/{q(exchange)}/bindings/source")
        return r.status == 200 and bool(r.json())

    wait_for(bound_upstream, 30, f"{exchange} bound upstream", a.tail)

    def depth() -> int:
        return int((queue_info(b, "handed") or {}).get("messages", 0))

    def grown(by: int) -> Callable[[], bool]:
        target = depth() + by
        return lambda: depth() >= target

    def runs_on(node: ClusterNode) -> Callable[[], bool]:
        return lambda: any(i["exchange"] == exchange and i["node"] == node.name
                           and i["status"] == "running" for i in fed_links(b))

    pub = _Publisher(up.url, exchange)
    pub.start()
    try:
        wait_for(grown(300), 60, "messages through the link on node-a", a.tail)
        a.stop()  # SIGTERM: the link hands over to node-b
        wait_for(runs_on(b), 30, "the link on node-b", b.tail)
        wait_for(grown(300), 60, "messages through the link on node-b", b.tail)
        a.start()
        wait_formed(nodes)
        wait_for(runs_on(a), 30, "the link back on node-a", lambda: a.tail() + b.tail())
        wait_for(grown(300), 60, "messages through the link on node-a again", a.tail)
    finally:
        pub.halt.set()
        pub.join(60)
    assert pub.error is None, pub.error
    total = len(pub.confirmed)
    deadline = time.monotonic() + 60  # bounded: a message lost never comes
    while depth() < total and time.monotonic() < deadline:
        time.sleep(0.2)
    copies, lost = copies_and_lost(b.url, "handed", pub.confirmed)
    assert not lost, f"{len(lost)} confirmed upstream, never in handed: {sorted(lost)[:10]}"
    assert copies == 0, f"{copies} second copies in handed after two handovers"
