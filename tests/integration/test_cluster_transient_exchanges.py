"""Non-durable exchanges and bindings across the cluster (issue 15, RabbitMQ 3.10 keeps
them in RAM tables replicated to every node), three amqpd nodes and one etcd on
loopback: an exchange declared ``durable=false`` on node A is known on B and C (passive
declare, /api/exchanges, bind to and from it, publish through it), in definitions
exports with "durable": false; the bindings from it, and from a durable exchange to it, are known
everywhere; it stays when A is killed with kill -9; an auto-delete one goes everywhere
with its last binding; after a restart of the whole cluster it is gone.
"""

from __future__ import annotations

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from bench.loadgen import Conn, ProtocolError
from tests.integration._http import q
from tests.integration.cluster_support import ClusterNode, wait_for, wait_formed
from tests.integration.test_cluster_queues import declare_on, queue_info, usable
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]


def exchange_on(node: ClusterNode, name: str) -> dict[str, object] | None:
    """``/api/exchanges/%2F/<name>`` on ``node`` (None: 404)."""
    r = node.api.get(f"/api/exchanges/%2F/{q(name)}")
    return r.json() if r.status == 200 else None


def passive_exchange(node: ClusterNode, name: str) -> str:
    """"ok", or the channel error of a passive exchange.declare on ``node``."""
    conn = Conn(node.url, timeout=5)
    try:
        conn.rpc(conn.open_channel(1), commands.Exchange.Declare(exchange=name, passive=True),
                 commands.Exchange.DeclareOk)
        return "ok"
    except ProtocolError as exc:
        return str(exc)
    finally:
        conn.close()


def bound(node: ClusterNode, source: str) -> set[tuple[str, str, str]]:
    """The bindings from ``source`` on ``node``: (destination_type, destination, key)."""
    r = node.api.get(f"/api/exchanges/%2F/{q(source)}/bindings/source")
    if r.status != 200:
        return set()
    return {(b["destination_type"], b["destination"], b["routing_key"]) for b in r.json()}


def publish(node: ClusterNode, exchange: str, key: str, body: bytes = b"m") -> None:
    conn = Conn(node.url)
    try:
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        conn.send(ch, commands.Basic.Publish(exchange=exchange, routing_key=key),
                  ContentHeader(0, len(body), commands.Basic.Properties()), ContentBody(body))
        conn.expect(ch, commands.Basic.Ack)
    finally:
        conn.close()


def messages(node: ClusterNode, name: str) -> int:
    return int((queue_info(node, name) or {}).get("messages") or 0)


def test_non_durable_exchange_is_cluster_wide_outlives_its_node_not_the_cluster(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    conn = Conn(a.url)
    ch = conn.open_channel(1)
    conn.declare_exchange(ch, "tx", "direct", durable=False)
    # a durable exchange bound to it (a binding that is not durable: its destination is not)
    conn.declare_exchange(ch, "dx", "fanout", durable=True)
    conn.rpc(ch, commands.Exchange.Bind(destination="tx", source="dx", routing_key=""),
             commands.Exchange.BindOk)
    conn.close()
    for n in (b, c):
        def tx_known(n: ClusterNode = n) -> bool:
            return (passive_exchange(n, "tx") == "ok"
                    and (exchange_on(n, "tx") or {}).get("durable") is False
                    and ("exchange", "tx", "") in bound(n, "dx"))
        wait_for(tx_known, 30, f"tx and dx->tx known on {n.name}", n.tail)
    # used from B and C: a durable queue led by C bound to it on B, a message published
    # through it on C (and through dx on A) reaches the queue
    declare_on(c, "dq")
    wait_for(lambda: usable(b, "dq"), 30, "dq usable on node-b", b.tail)
    conn = Conn(b.url)
    conn.bind(conn.open_channel(1), "dq", "tx", "k")
    conn.close()
    for n in nodes:
        def binding_known(n: ClusterNode = n) -> bool:
            return ("queue", "dq", "k") in bound(n, "tx")
        wait_for(binding_known, 30, f"tx->dq known on {n.name}", n.tail)
    publish(c, "tx", "k")
    publish(a, "dx", "k")
    wait_for(lambda: messages(c, "dq") == 2, 15, "both messages in dq", c.tail)
    # a non-durable queue of B bound to it on B: a publish on A reaches it
    conn = Conn(b.url)
    ch = conn.open_channel(1)
    conn.declare_queue(ch, "tq", durable=False)
    conn.bind(ch, "tq", "tx", "t")
    conn.close()
    wait_for(lambda: ("queue", "tq", "t") in bound(a, "tx"), 30, "tx->tq known on node-a",
             a.tail)
    publish(a, "tx", "t")
    wait_for(lambda: messages(b, "tq") == 1, 15, "the message in tq on node-b", b.tail)
    # every node's definitions export has it with "durable": false, and its bindings, as
    # RabbitMQ 3.10.8's export has its transient exchanges (issue 33)
    for n in nodes:
        r = n.api.get("/api/definitions")
        assert r.status == 200, r.text
        defs = r.json()
        durable = {x["name"]: x["durable"] for x in defs["exchanges"]}
        assert durable["dx"] is True and durable["tx"] is False
        assert ("tx", "dq", "k") in {(x["source"], x["destination"], x["routing_key"])
                                     for x in defs["bindings"]}
    # an auto-delete one goes everywhere with its last binding, wherever that is removed
    conn = Conn(c.url)
    ch = conn.open_channel(1)
    conn.rpc(ch, commands.Exchange.Declare(exchange="ax", exchange_type="fanout",
                                           durable=False, auto_delete=True),
             commands.Exchange.DeclareOk)
    conn.bind(ch, "dq", "ax", "")
    conn.close()
    wait_for(lambda: ("queue", "dq", "") in bound(a, "ax"), 30, "ax->dq on node-a", a.tail)
    conn = Conn(a.url)
    conn.rpc(conn.open_channel(1), commands.Queue.Unbind(queue="dq", exchange="ax",
                                                         routing_key=""),
             commands.Queue.UnbindOk)
    conn.close()
    for n in nodes:
        def ax_gone(n: ClusterNode = n) -> bool:
            return exchange_on(n, "ax") is None
        wait_for(ax_gone, 30, f"ax gone on {n.name}", n.tail)
    # the declaring node killed: the exchange and its bindings stay on the others
    a.kill()
    for n in (b, c):
        def sees_a_down(n: ClusterNode = n) -> bool:
            return a.name not in n.status()["running_nodes"]
        wait_for(sees_a_down, 15, f"{n.name} sees node-a down", n.tail)
        assert passive_exchange(n, "tx") == "ok"
        assert ("queue", "dq", "k") in bound(n, "tx")
        assert ("exchange", "tx", "") in bound(n, "dx")
    publish(b, "tx", "k")
    wait_for(lambda: messages(c, "dq") == 3, 15, "the message through tx after the kill",
             c.tail)
    # node-b's non-durable queue is still bound; node-a returns and learns tx again
    a.start()
    wait_formed(nodes)
    wait_for(lambda: passive_exchange(a, "tx") == "ok" and ("queue", "dq", "k") in bound(a, "tx"),
             30, "tx known on the restarted node-a", a.tail)
    # the whole cluster restarted (kill -9 of every node: their leases outlive them a
    # while, which must not keep the old incarnation): the exchange is gone everywhere
    for n in nodes:
        n.kill()
    for n in nodes:
        n.start()
    wait_formed(nodes)
    for n in nodes:
        def dq_back(n: ClusterNode = n) -> bool:
            return usable(n, "dq")
        wait_for(dq_back, 30, f"dq back on {n.name}", n.tail)
        assert passive_exchange(n, "tx").startswith(
            "channel.close 404 NOT_FOUND - no exchange 'tx' in vhost '/'"), n.name
        assert exchange_on(n, "tx") is None
        assert ("exchange", "tx", "") not in bound(n, "dx")
    # and a new one of that name can be declared, non-durable again, and is cluster-wide
    conn = Conn(b.url)
    conn.declare_exchange(conn.open_channel(1), "tx", "topic", durable=False)
    conn.close()
    for n in (a, c):
        def new_tx(n: ClusterNode = n) -> bool:
            return (exchange_on(n, "tx") or {}).get("type") == "topic"
        wait_for(new_tx, 30, f"the new tx on {n.name}", n.tail)
