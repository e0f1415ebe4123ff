"""Issue 29: ``/api/federation-links`` on any node of a cluster lists every link of the
cluster with the node that runs it, as RabbitMQ's does (before, each node listed only
its own, so finding a link meant asking every node)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    wait_for,
)
from tests.integration.fed_support import amqp_uri
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
