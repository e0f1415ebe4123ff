"""pause_minority: a node cut off from etcd and from the other nodes stops serving clients
and serves again once the partition heals; nothing it confirmed is lost.

Each of the three nodes reaches etcd through a TCP proxy the test controls and receives
its heartbeats through a UDP relay the test controls (the nodes advertise the relay's
address in etcd). Cutting node c off means: its etcd proxy becomes a blackhole (bytes
stop, sockets stay open, as with a pulled cable), the heartbeats to it are dropped, and
the other two relays drop the heartbeats it sends. Then:

* c pauses: its open AMQP connection is closed with 320 CONNECTION_FORCED, a new one is
  refused at connection.open with 320, its HTTP API refuses changes (503) while its
  health checks still answer for the node;
* a and b see c stop running, keep their majority and keep serving;
* after the heal c serves again, and every message it confirmed before the partition
  is consumed from it, in order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    free_udp_port,
    new_prefix,
    wait_for,
    wait_formed,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess
from tests.support.tcpproxy import TcpProxy
from tests.support.udpproxy import UdpRelay

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(240),
]

QUEUE = "partition-q"
COUNT = 300


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    prefix = new_prefix()
    nodes: list[ClusterNode] = []
    try:
        for name in ("a", "b", "c"):
            hb_port = free_udp_port()
            relay = UdpRelay(("127.0.0.1", hb_port)).start()
            proxy = TcpProxy("127.0.0.1", etcd.client_port).start()
            nodes.append(ClusterNode(f"node-{name}", tmp_path / name, etcd.url, prefix,
                                     etcd_proxy=proxy, relay=relay, hb_port=hb_port))
        for n in nodes:
            n.start()
        wait_formed(nodes)
        yield nodes
    finally:
        for n in nodes:
            n.stop()
            if n.relay is not None:
                n.relay.stop()
            if n.etcd_proxy is not None:
                n.etcd_proxy.stop()


def amqp(node: ClusterNode) -> pika.BlockingConnection:
    assert node.proc is not None
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.proc.port, "/", pika.PlainCredentials("guest", "guest"),
        blocked_connection_timeout=10, socket_timeout=10))


def isolate(node: ClusterNode, others: list[ClusterNode]) -> None:
    assert node.etcd_proxy is not None and node.relay is not None
    node.etcd_proxy.cut("blackhole")
    node.relay.cut = True
    for o in others:
        assert o.relay is not None
        o.relay.drop_senders.add(node.name)


def heal(node: ClusterNode, others: list[ClusterNode]) -> None:
    assert node.etcd_proxy is not None and node.relay is not None
    node.etcd_proxy.restore()
    node.relay.cut = False
    for o in others:
        assert o.relay is not None
        o.relay.drop_senders.discard(node.name)


def test_minority_pauses_and_resumes_without_loss(cluster: list[ClusterNode]) -> None:
    a, b, c = cluster
    # c leads a durable queue holding confirmed persistent messages
    conn = amqp(c)
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.confirm_delivery()
    for i in range(COUNT):
        ch.basic_publish("", QUEUE, str(i).encode(),
                         pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()
    held = amqp(c)  # stays open across the partition
    held.channel()

    isolate(c, [a, b])
    wait_for(lambda: c.status()["paused"], 20, "node-c pauses", c.tail)
    assert "minority" in c.status()["pause_reason"] or "etcd" in c.status()["pause_reason"]

    # its open connection got connection.close 320
    deadline = time.monotonic() + 15
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        while time.monotonic() < deadline:
            held.process_data_events(time_limit=0.2)
    assert closed.value.reply_code == 320 and "paused" in closed.value.reply_text
    # and a new one is refused at connection.open with 320
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        amqp(c)
    assert "(320)" in str(refused.value)
    # the HTTP API takes no change there; the node's own health checks still answer
    assert c.api.put("/api/vhosts/during-partition", {}).status == 503
    assert c.api.get("/api/health/checks/alarms").status == 200

    # the majority goes on, and sees c gone (heartbeats: well before the lease ends)
    for n in (a, b):
        def sees_c_down(n: ClusterNode = n) -> bool:
            return n.status()["running_nodes"] == ["node-a", "node-b"] and not n.status()["paused"]
        wait_for(sees_c_down, 20, f"{n.name} sees node-c down", n.tail)
    conn = amqp(a)
    ch = conn.channel()
    ch.queue_declare("majority-q", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "majority-q", b"still here", pika.BasicProperties(delivery_mode=2),
                     mandatory=True)
    method, _props, body = ch.basic_get("majority-q", auto_ack=True)
    assert method is not None and body == b"still here"
    conn.close()

    heal(c, [a, b])
    wait_formed(cluster, timeout=40)
    conn = amqp(c)
    ch = conn.channel()
    got: list[bytes] = []
    for _ in range(COUNT + 1):
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        got.append(body)
    conn.close()
    assert got == [str(i).encode() for i in range(COUNT)]
    # the queue made on the majority during the partition is known to c now
    wait_for(lambda: any(q["name"] == "majority-q"
                         for q in c.api.get("/api/definitions").json()["queues"]),
             15, "majority-q in node-c's export")


def test_ignore_keeps_serving(tmp_path: Path, etcd: EtcdProcess) -> None:
    """partition_handling = ignore: the cut-off node goes on serving its clients."""
    prefix = new_prefix()
    proxy = TcpProxy("127.0.0.1", etcd.client_port).start()
    nodes = [ClusterNode("node-a", tmp_path / "a", etcd.url, prefix,
                         partition_handling="ignore"),
             ClusterNode("node-b", tmp_path / "b", etcd.url, prefix,
                         partition_handling="ignore", etcd_proxy=proxy)]
    try:
        for n in nodes:
            n.start()
        wait_formed(nodes)
        _a, b = nodes
        proxy.cut("blackhole")
        wait_for(lambda: not b.status()["etcd_reachable"], 20, "node-b loses etcd", b.tail)
        assert not b.status()["paused"]
        conn = amqp(b)
        ch = conn.channel()
        ch.queue_declare("", exclusive=True)
        conn.close()
        proxy.restore()
        wait_for(lambda: b.status()["etcd_reachable"], 20, "node-b reaches etcd again")
    finally:
        for n in nodes:
            n.stop()
        proxy.stop()
