"""Issue 29: restarting a shovel or a federation link from a node of the cluster that does
not run it. RabbitMQ's management API restarts either from any node (an RPC to the node
that runs it); amqpd's answered 404 for another node's federation link, and a shovel
restart asked of a node that did not run it started a second copy there. Now the asked
node passes the restart to the node that runs the link (a request through etcd,
amqpd/cluster/node_requests.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    wait_for,
)
from tests.integration.test_cluster_federation_links import federate
from tests.support import etcdproc
from tests.support.brokerproc import BrokerProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]


def listed(node: ClusterNode, path: str) -> list[dict[str, Any]]:
    r = node.api.get(path)
    assert r.status == 200, r.text
    items: list[dict[str, Any]] = r.json()
    return items


def log_size(node: ClusterNode) -> int:
    assert node.proc is not None
    return node.proc.log_path.stat().st_size


def log_since(node: ClusterNode, offset: int) -> str:
    assert node.proc is not None
    return node.proc.log_path.read_bytes()[offset:].decode(errors="replace")


def by_name(nodes: list[ClusterNode], name: str) -> ClusterNode:
    return next(n for n in nodes if n.name == name)


def test_shovel_restart_asked_of_the_other_node(
        upstream_and_pair: tuple[BrokerProcess, list[ClusterNode]]) -> None:
    _up, nodes = upstream_and_pair
    a, b = nodes
    r = a.api.put("/api/parameters/shovel/%2F/mover", {"value": {
        "src-uri": "amqp://", "src-queue": "restart.src",
        "dest-uri": "amqp://", "dest-queue": "restart.dst"}})
    assert r.status in (201, 204), r.text

    def running_on() -> str | None:
        found = [s["node"] for s in listed(a, "/api/shovels")
                 if s["name"] == "mover" and s["state"] == "running"]
        return found[0] if len(found) == 1 else None

    wait_for(lambda: running_on() is not None, 60, "the shovel running on one node",
             lambda: a.tail() + b.tail())
    runner = by_name(nodes, str(running_on()))
    other = b if runner is a else a
    # the other node lists it too (with the runner's node): what a restart there finds
    wait_for(lambda: any(s["name"] == "mover" and s["node"] == runner.name
                         for s in listed(other, "/api/shovels")), 15,
             "the other node to list the shovel", other.tail)
    at_runner, at_other = log_size(runner), log_size(other)
    r = other.api.delete("/api/shovels/vhost/%2F/mover/restart")
    assert r.status == 204, r.text
    # asked over the link between the two (logged by the asking node)
    assert f"to node {runner.name} over the link" in log_since(other, at_other), other.tail()
    assert "request 'shovel-restart'" in log_since(other, at_other), other.tail()
    wait_for(lambda: "restarted at another node's request" in log_since(runner, at_runner),
             15, "the runner to restart the shovel", runner.tail)
    wait_for(lambda: running_on() == runner.name, 30, "the shovel running again",
             runner.tail)
    # never started on the node that was asked (one copy moves each message once)
    assert "shovel //mover running" not in log_since(other, at_other), other.tail()
    # the shovel works after its restart: a message goes through it
    r = other.api.post("/api/exchanges/%2F/amq.default/publish", {
        "routing_key": "restart.src", "payload": "after", "payload_encoding": "string",
        "properties": {}})
    assert r.status == 200 and r.json()["routed"], r.text

    def moved() -> bool:
        r = a.api.get("/api/queues/%2F/restart.dst")
        return r.status == 200 and r.json().get("messages", 0) == 1

    wait_for(moved, 30, "the message in restart.dst", runner.tail)
    # an unknown shovel is 404 on either node
    r = other.api.delete("/api/shovels/vhost/%2F/nosuch/restart")
    assert r.status == 404, r.text


def test_federation_link_restart_asked_of_the_other_node(
        upstream_and_pair: tuple[BrokerProcess, list[ClusterNode]]) -> None:
    up, nodes = upstream_and_pair
    a, b = nodes
    federate(a, up, ["fed.r1"])

    def link_on(node: ClusterNode) -> dict[str, Any] | None:
        items = [i for i in listed(node, "/api/federation-links")
                 if i["exchange"] == "fed.r1" and i["status"] == "running"]
        return items[0] if len(items) == 1 else None

    wait_for(lambda: link_on(a) is not None, 60, "the link running",
             lambda: a.tail() + b.tail())
    item = link_on(a)
    assert item is not None
    runner = by_name(nodes, item["node"])
    other = b if runner is a else a
    wait_for(lambda: link_on(other) is not None, 15, "the other node to list the link",
             other.tail)
    at_runner, at_other = log_size(runner), log_size(other)
    path = f"/api/federation-links/vhost/%2F/{item['id']}/{runner.name}/restart"
    r = other.api.delete(path)
    assert r.status == 204, r.text
    asked = log_since(other, at_other)
    assert "request 'federation-link-restart'" in asked, other.tail()
    assert f"to node {runner.name} over the link" in asked, other.tail()
    wait_for(lambda: "federation link running" in log_since(runner, at_runner),
             15, "the runner to restart the link", runner.tail)
    wait_for(lambda: link_on(other) is not None, 30, "the link running again", runner.tail)
    # a link the named node does not run, and a node that is not in the cluster: 404
    r = other.api.delete(f"/api/federation-links/vhost/%2F/00000000/{runner.name}/restart")
    assert r.status == 404, r.text
    r = other.api.delete(f"/api/federation-links/vhost/%2F/{item['id']}/node-zz/restart")
    assert r.status == 404, r.text
