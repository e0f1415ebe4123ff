"""Three amqpd nodes and one etcd on loopback: one set of definitions and one membership.

Definitions made on one node (over AMQP, the HTTP API and a definitions import) appear on
the other two, through etcd, and deletions too; a user created on one node logs in on
another; ``/api/nodes`` lists every member with ``running``; the cluster name set on one
node is every node's; a node that stops is seen as not running, and when it starts again
it takes what changed meanwhile (etcd wins over its own log).

Queues led by another node are known to every node's catalogue (exports list them); a
client on a non-leader node reaching them needs the inter-node links (c15b), so the
passive declares here are of exchanges, and of queues only on their leader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    new_prefix,
    wait_for,
    wait_formed,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(240),
]


def on_all(nodes: list[ClusterNode], path: str, status: int = 200,
           timeout: float = 15.0) -> list[Any]:
    """Wait until GET ``path`` answers ``status`` on every node; the bodies."""
    for n in nodes:
        def answers(n: ClusterNode = n) -> bool:
            return n.api.get(path).status == status
        wait_for(answers, timeout, f"GET {path} -> {status} on {n.name}", n.tail)
    return [n.api.get(path).json() if status == 200 else None for n in nodes]


def amqp(node: ClusterNode, user: str = "guest", password: str = "guest",
         vhost: str = "/") -> pika.BlockingConnection:
    assert node.proc is not None
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.proc.port, vhost, pika.PlainCredentials(user, password),
        blocked_connection_timeout=10, socket_timeout=10))


def test_definitions_made_on_one_node_are_everywhere(nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    # --- over AMQP on a: exchange, queue, binding
    conn = amqp(a)
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("orders.eu", durable=True, arguments={"x-max-length": 1000})
    ch.queue_bind("orders.eu", "orders", "eu.#")
    conn.close()
    # --- over HTTP on b: vhost, user, permissions, policy, parameter-backed limit
    api = b.api
    assert api.put("/api/vhosts/billing", {"description": "money"}).status == 201
    assert api.put("/api/users/alice", {"password": "wonder", "tags": "management"}
                   ).status == 201
    assert api.put(f"/api/permissions/{q('billing')}/alice",
                   {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    assert api.put(f"/api/policies/{q('/')}/lengths",
                   {"pattern": "^orders\\.", "definition": {"max-length": 500},
                    "apply-to": "queues"}).status == 201
    assert api.put(f"/api/vhost-limits/{q('billing')}/max-queues",
                   {"value": 10}).status == 204

    exchanges = on_all(nodes, f"/api/exchanges/{q('/')}/orders")
    assert all(x["type"] == "topic" and x["durable"] for x in exchanges)
    on_all(nodes, "/api/vhosts/billing")
    users = on_all(nodes, "/api/users/alice")
    assert all("management" in u["tags"] for u in users)
    on_all(nodes, f"/api/permissions/{q('billing')}/alice")
    policies = on_all(nodes, f"/api/policies/{q('/')}/lengths")
    assert all(p["definition"] == {"max-length": 500} for p in policies)
    wait_for(lambda: all(n.api.get(f"/api/vhost-limits/{q('billing')}").json()
                         and n.api.get(f"/api/vhost-limits/{q('billing')}").json()[0]
                         ["value"] == {"max-queues": 10} for n in nodes),
             15, "vhost limit everywhere")

    # the binding exists wherever its exchange and queue do; the export of every node
    # holds the whole cluster's topology, whichever node leads the queue
    for n in nodes:
        def exported(n: ClusterNode = n) -> bool:
            d = n.api.get("/api/definitions").json()
            return any(x["name"] == "orders.eu" and x["arguments"] == {"x-max-length": 1000}
                       for x in d["queues"]) and any(
                x["source"] == "orders" and x["destination"] == "orders.eu"
                and x["routing_key"] == "eu.#" for x in d["bindings"])
        wait_for(exported, 15, f"export of {n.name} lists orders.eu and its binding", n.tail)

    # a user made on b logs in on c over AMQP and sees the exchange made on a
    wait_for(lambda: amqp(c, "alice", "wonder", "billing").close() is None, 15,
             "alice logs in on c")
    conn = amqp(c)
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", passive=True)  # 404 would close the channel
    conn.close()
    # the queue's leader answers a passive declare with its arguments intact
    conn = amqp(a)
    ok = conn.channel().queue_declare("orders.eu", passive=True)
    assert ok.method.queue == "orders.eu"
    conn.close()

    # --- deletions travel as well: the exchange deleted on c goes everywhere
    assert c.api.delete(f"/api/exchanges/{q('/')}/orders").status == 204
    on_all(nodes, f"/api/exchanges/{q('/')}/orders", status=404)
    assert a.api.delete("/api/users/alice").status == 204
    on_all(nodes, "/api/users/alice", status=404)

    # --- a definitions import on c reaches a and b
    doc = {"exchanges": [{"name": "imported", "vhost": "/", "type": "fanout",
                          "durable": True, "auto_delete": False, "internal": False,
                          "arguments": {}}],
           "vhosts": [{"name": "from-import"}]}
    assert c.api.post("/api/definitions", doc).status in (200, 201, 204)
    on_all(nodes, f"/api/exchanges/{q('/')}/imported")
    on_all(nodes, "/api/vhosts/from-import")


def test_membership_nodes_name_and_a_returning_node(nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    names = ["node-a", "node-b", "node-c"]
    listed = a.api.get("/api/nodes").json()
    assert sorted(n["name"] for n in listed) == names
    assert all(n["running"] for n in listed)
    assert all(n["type"] == "disc" for n in listed)

    # amqpctl cluster_status, as rabbitmqctl's: members, running nodes, partitions
    status = b.ctl_json("cluster_status")
    assert status["disk_nodes"] == names and status["running_nodes"] == names
    assert status["partitions"] == {} and status["paused"] is False
    assert sorted(n["name"] for n in status["nodes"]) == names
    text = c.ctl("cluster_status").stdout
    assert "Running Nodes" in text and "node-b" in text and "(none)" in text

    # the cluster name set on b is every node's (and survives their restarts: in etcd)
    b.ctl("set_cluster_name", "prod-eu")
    wait_for(lambda: all(n.api.get("/api/overview").json()["cluster_name"] == "prod-eu"
                         for n in nodes), 15, "cluster name everywhere")
    conn = amqp(c)  # and clients see it in connection.start's server properties
    advertised = conn._impl.server_properties["cluster_name"]
    assert (advertised.decode() if isinstance(advertised, bytes) else advertised) == "prod-eu"
    conn.close()

    # c stops cleanly: the others list it as a member that does not run
    c.stop()
    def c_down() -> bool:
        listed = {n["name"]: n for n in a.api.get("/api/nodes").json()}
        return set(listed) == set(names) and listed["node-c"]["running"] is False
    wait_for(c_down, 15, "node-c listed as not running", a.tail)
    status = a.status()
    assert status["disk_nodes"] == names and status["running_nodes"] == ["node-a", "node-b"]
    assert status["paused"] is False  # two of three: a majority

    # while c is down: an exchange made and a vhost deleted elsewhere
    assert a.api.put(f"/api/exchanges/{q('/')}/while-away",
                     {"type": "direct", "durable": True}).status == 201
    assert b.api.put("/api/vhosts/doomed", {}).status == 201
    c.start()
    on_all(nodes, "/api/vhosts/doomed")
    c.stop()
    assert b.api.delete("/api/vhosts/doomed").status == 204
    c.start()
    wait_formed(nodes)
    on_all(nodes, f"/api/exchanges/{q('/')}/while-away")
    on_all(nodes, "/api/vhosts/doomed", status=404)  # etcd wins over c's own log
    assert c.api.get("/api/overview").json()["cluster_name"] == "prod-eu"


def test_killed_node_noticed_by_heartbeats(tmp_path: Path, etcd: EtcdProcess) -> None:
    """kill -9: the heartbeats stop at once, so the others see the node down while its
    lease (60 s here) is still in etcd; the restarted node is running again."""
    prefix = new_prefix()
    nodes = [ClusterNode(f"node-{x}", tmp_path / x, etcd.url, prefix, lease_ttl=60.0)
             for x in ("a", "b", "c")]
    try:
        for n in nodes:
            n.start()
        wait_formed(nodes)
        a, _b, c = nodes
        c.kill()
        wait_for(lambda: a.status()["running_nodes"] == ["node-a", "node-b"], 20,
                 "node-c seen down", a.tail)
        # still a member, its lease still there: the heartbeats alone told
        listed = {n["name"]: n for n in a.api.get("/api/nodes").json()}
        assert listed["node-c"]["running"] is False and listed["node-c"]["amqpd_member"]
        assert a.status()["partitions"] == {"node-a": ["node-c"]}
        c.start()
        wait_formed(nodes)
    finally:
        for n in nodes:
            n.stop()


def test_forget_and_join_cluster(nodes: list[ClusterNode]) -> None:
    a, _b, c = nodes
    # a running node cannot be forgotten
    out = a.ctl("forget_cluster_node", "node-c", check=False)
    assert out.returncode != 0 and "running" in out.stderr
    c.stop()
    wait_for(lambda: "node-c" not in a.status()["running_nodes"], 15, "node-c down")
    a.ctl("forget_cluster_node", "node-c")
    assert a.status()["disk_nodes"] == ["node-a", "node-b"]
    assert a.api.delete("/api/cluster/nodes/node-c").status == 404
    # a forgotten node that starts again serves no client until it joins again
    c.start()
    wait_for(lambda: c.status()["paused"], 15, "forgotten node-c paused")
    assert "join_cluster" in (c.status()["pause_reason"] or "")
    # refused at connection.open with 320 (pika reports it as a probable access denial)
    with pytest.raises(pika.exceptions.AMQPConnectionError) as info:
        amqp(c)
    assert "(320)" in str(info.value) and "paused" in str(info.value)
    assert c.api.post("/api/cluster/join", {"node": "nobody"}).status == 404
    c.ctl("join_cluster", "node-a")
    wait_formed(nodes)
    amqp(c).close()


def test_a_second_node_with_a_taken_name_is_refused(tmp_path: Path,
                                                     nodes: list[ClusterNode]) -> None:
    a = nodes[0]
    twin = ClusterNode("node-a", tmp_path / "twin", a.etcd_url, a.prefix)
    with pytest.raises(RuntimeError, match="in use"):
        twin.start()
    assert a.status()["running_nodes"] == ["node-a", "node-b", "node-c"]
