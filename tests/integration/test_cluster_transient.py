"""Non-durable queues across the cluster (issue 15, RabbitMQ 3.10's classic non-durable
queues), three amqpd nodes and one etcd on loopback: a non-durable queue declared on
node A is listed by /api/queues on every node with ``node``, found by a passive and a
full declare on the others and usable from there, its bindings known there too (a
message published on another node reaches it); when A is killed (kill -9) it is
deleted on the others (a consumer there gets basic.cancel) and does not come back when
A restarts; nor after a full cluster restart. An exclusive queue of a connection on A
is listed everywhere, refused to other connections (405), reached by publishes on other
nodes and deleted with A.
"""

from __future__ import annotations

import base64
import functools
import json
import urllib.request
from typing import Any

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from bench.loadgen import Conn, ProtocolError
from tests.integration.cluster_support import (
    ClusterNode,
    wait_for,
    wait_formed,
)
from tests.integration.test_cluster_queues import declare_on, queue_info, usable
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]


def listed(node: ClusterNode, name: str) -> str | None:
    """The ``node`` /api/queues on ``node`` gives for ``name`` (None: not listed)."""
    r = node.api.get("/api/queues")
    assert r.status == 200, r.text
    for item in r.json():
        if item["name"] == name:
            return str(item["node"])
    return None


def transient_keys(node: ClusterNode) -> list[str]:
    """The keys etcd holds under the cluster's ``transient/`` prefix."""
    prefix = f"{node.prefix}/{node.cluster}/transient/".encode()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    req = urllib.request.Request(
        f"{node.etcd_url}/v3/kv/range", method="POST",
        data=json.dumps({"key": base64.b64encode(prefix).decode(),
                         "range_end": base64.b64encode(end).decode(),
                         "keys_only": True}).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    return [base64.b64decode(kv["key"]).decode() for kv in kvs]


def passive_404(node: ClusterNode, name: str) -> str:
    """The channel error a passive declare of ``name`` on ``node`` gets."""
    conn = Conn(node.url)
    try:
        with pytest.raises(ProtocolError) as info:
            conn.rpc(conn.open_channel(1), commands.Queue.Declare(queue=name, passive=True),
                     commands.Queue.DeclareOk)
        return str(info.value)
    finally:
        conn.close()


def test_non_durable_queue_known_everywhere_and_gone_with_its_node(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    owner = Conn(a.url)  # the declaring connection stays: the queue is not exclusive
    ch = owner.open_channel(1)
    owner.declare_queue(ch, "tq", durable=False)
    for n in nodes:
        def tq_on_a(n: ClusterNode = n) -> bool:
            return listed(n, "tq") == "node-a" and usable(n, "tq")
        wait_for(tq_on_a, 30, f"tq listed with node-a and usable on {n.name}", n.tail)
    # a full declare on C finds it (same properties), a different one is refused
    conn = Conn(c.url)
    try:
        conn.declare_queue(conn.open_channel(1), "tq", durable=False)
        with pytest.raises(ProtocolError) as info:
            conn.declare_queue(conn.open_channel(2), "tq", durable=True)
        assert "inequivalent arg 'durable'" in str(info.value)
    finally:
        conn.close()
    # used from B: a message published on B is on A, got on C
    pub = Conn(b.url)
    pch = pub.open_channel(1)
    body = b"hello"
    pub.send(pch, commands.Basic.Publish(exchange="", routing_key="tq"),
             ContentHeader(0, len(body), commands.Basic.Properties()), ContentBody(body))
    wait_for(lambda: (queue_info(a, "tq") or {}).get("messages") == 1, 10,
             "the message on node-a", a.tail)
    pub.close()
    # bound on A to amq.topic: a message published to it on C reaches it too (routing
    # happens on C, which binds its stand-in as A has the queue bound)
    owner.bind(ch, "tq", "amq.topic", "t.#")
    wait_for(lambda: any(x["destination"] == "tq" for x in c.api.get(
        "/api/exchanges/%2F/amq.topic/bindings/source").json()), 15,
        "the binding known on node-c", c.tail)
    pub = Conn(c.url)
    pch = pub.open_channel(1)
    pub.send(pch, commands.Basic.Publish(exchange="amq.topic", routing_key="t.x"),
             ContentHeader(0, len(body), commands.Basic.Properties()), ContentBody(body))
    wait_for(lambda: (queue_info(a, "tq") or {}).get("messages") == 2, 10,
             "the topic message on node-a", a.tail)
    pub.close()
    # two bindings to one exchange with one key that differ only in their arguments
    # (the queue's record sorts its bindings: dicts do not compare) reach every node
    headers_args: list[dict[str, Any]] = [{"x-match": "all", "k": "1"},
                                          {"x-match": "any", "k": "2"}]
    for args in headers_args:
        owner.rpc(ch, commands.Queue.Bind(queue="tq", exchange="amq.headers",
                                          routing_key="", arguments=args),
                  commands.Queue.BindOk)
    wait_for(lambda: sum(x["destination"] == "tq" for x in c.api.get(
        "/api/exchanges/%2F/amq.headers/bindings/source").json()) == 2, 15,
        "both headers bindings known on node-c", c.tail)
    # an exclusive queue of that connection: listed everywhere, locked to everyone
    # else (405), reached by a publish on another node, gone with its node
    owner.rpc(ch, commands.Queue.Declare(queue="xq", exclusive=True),
              commands.Queue.DeclareOk)
    owner.bind(ch, "xq", "amq.topic", "t.#")
    for n in (b, c):
        def xq_bound(n: ClusterNode = n) -> bool:
            return listed(n, "xq") == "node-a" and any(
                x["destination"] == "xq" for x in n.api.get(
                    "/api/exchanges/%2F/amq.topic/bindings/source").json())
        wait_for(xq_bound, 15, f"xq and its binding on {n.name}", n.tail)
        assert passive_404(n, "xq").startswith(
            "channel.close 405 RESOURCE_LOCKED - cannot obtain exclusive access to locked "
            "queue 'xq'")
    pub = Conn(b.url)
    pch = pub.open_channel(1)
    pub.send(pch, commands.Basic.Publish(exchange="amq.topic", routing_key="t.y"),
             ContentHeader(0, len(body), commands.Basic.Properties()), ContentBody(body))
    wait_for(lambda: (queue_info(a, "xq") or {}).get("messages") == 1, 10,
             "the message in xq on node-a", a.tail)
    pub.close()
    # a consumer on B
    cons = Conn(b.url)
    cch = cons.open_channel(1)
    cons.rpc(cch, commands.Basic.Consume(queue="tq", consumer_tag="t"),
             commands.Basic.ConsumeOk)
    cons.expect(cch, commands.Basic.Deliver)
    a.kill()  # kill -9
    cons.sock.settimeout(15)
    assert cons.expect(cch, commands.Basic.Cancel).consumer_tag == "t"
    cons.close()
    owner.sock.close()
    for n in (b, c):
        def both_gone(n: ClusterNode = n) -> bool:
            return listed(n, "tq") is None and listed(n, "xq") is None
        wait_for(both_gone, 15, f"tq and xq deleted on {n.name}", n.tail)
        assert passive_404(n, "tq") == "channel.close 404 NOT_FOUND - no queue 'tq' in vhost '/'"
    # the name is free: declared on C now, it is C's
    conn = Conn(c.url)
    try:
        conn.declare_queue(conn.open_channel(1), "tq2", durable=False)
    finally:
        conn.close()
    a.start()
    wait_formed(nodes)
    declare_on(a, "marker")  # once B lists this, B has seen everything A did before
    wait_for(lambda: listed(b, "marker") == "node-a" and listed(b, "tq2") == "node-c",
             30, "marker and tq2 on node-b", b.tail)
    # the restarted node learns the others' non-durable queues
    wait_for(lambda: listed(a, "tq2") == "node-c" and usable(a, "tq2"), 30,
             "tq2 known on the restarted node-a", a.tail)
    for n in nodes:
        assert listed(n, "tq") is None, f"tq came back on {n.name}"


def test_non_durable_queues_do_not_survive_a_full_cluster_restart(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    for n, name in ((a, "ta"), (b, "tb")):
        conn = Conn(n.url)
        conn.declare_queue(conn.open_channel(1), name, durable=False)
        conn.close()
    declare_on(c, "durable-one")
    for n in nodes:
        def all_listed(n: ClusterNode = n) -> bool:
            return (listed(n, "ta") == "node-a" and listed(n, "tb") == "node-b"
                    and listed(n, "durable-one") == "node-c")
        wait_for(all_listed, 30, f"queues on {n.name}", n.tail)
    assert len(transient_keys(a)) == 2
    for n in nodes:
        n.kill()  # kill -9 all: their leases are still in etcd for a while
    for n in nodes:
        n.start()
    wait_formed(nodes)
    for n in nodes:
        def durable_back(n: ClusterNode = n) -> bool:
            return listed(n, "durable-one") == "node-c" and usable(n, "durable-one")
        wait_for(durable_back, 30, f"durable-one back on {n.name}", n.tail)
    # the old processes' keys go (each restarted node deletes its own at start):
    # nothing non-durable is listed anywhere once every node has had its first push
    wait_for(lambda: transient_keys(a) == [], 15, "the old processes' keys gone from etcd")
    for n in nodes:
        assert listed(n, "ta") is None and listed(n, "tb") is None, \
            f"a non-durable queue resurrected on {n.name}"


def test_binding_made_on_another_node_is_known_everywhere(nodes: list[ClusterNode]) -> None:
    """RabbitMQ's bindings are cluster-wide wherever they were made: a non-durable
    queue of node A bound by a client of node B is routed to by publishes on A (its
    node, which knows the binding once B's bind-ok came) and on C; unbound on B, it is
    gone on A at once and on C soon after. Before, the binding stayed on B."""
    a, b, c = nodes
    owner = Conn(a.url)
    och = owner.open_channel(1)
    owner.declare_queue(och, "bq", durable=False)
    wait_for(lambda: listed(b, "bq") == "node-a" and usable(b, "bq"), 30,
             "bq known on node-b", b.tail)

    def bound_on(n: ClusterNode) -> bool:
        return any(x["destination"] == "bq" and x["routing_key"] == "k" for x in n.api.get(
            "/api/exchanges/%2F/amq.direct/bindings/source").json())

    binder = Conn(b.url)
    bch = binder.open_channel(1)
    binder.bind(bch, "bq", "amq.direct", "k")
    assert bound_on(a), "node-a does not know node-b's binding after its bind-ok"
    body = b"m"
    for n, count in ((a, 1), (c, 2), (b, 3)):
        wait_for(functools.partial(bound_on, n), 15, f"the binding known on {n.name}",
                 n.tail)
        pub = Conn(n.url)
        pub.send(pub.open_channel(1),
                 commands.Basic.Publish(exchange="amq.direct", routing_key="k"),
                 ContentHeader(0, len(body), commands.Basic.Properties()),
                 ContentBody(body))
        def arrived(count: int = count) -> bool:
            return (queue_info(a, "bq") or {}).get("messages") == count
        wait_for(arrived, 10, f"the message published on {n.name} in bq", a.tail)
        pub.close()
    binder.rpc(bch, commands.Queue.Unbind(queue="bq", exchange="amq.direct",
                                          routing_key="k"), commands.Queue.UnbindOk)
    assert not bound_on(a), "node-a still has the binding after node-b's unbind-ok"
    for n in (b, c):
        def unbound(n: ClusterNode = n) -> bool:
            return not bound_on(n)
        wait_for(unbound, 15, f"the binding gone on {n.name}", n.tail)
    binder.close()
    owner.close()
