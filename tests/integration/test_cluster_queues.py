"""Queues led by another node, with three amqpd processes and one etcd on loopback.

A queue led by node A is used by clients of nodes B and C over the inter-node links
(amqpd/cluster/link.py, remote_queue.py): a publisher on B and a consumer on C move
100,000 confirmed persistent messages in order with none lost (the raw-frame generator
of bench/loadgen.py counts every one and checks the order); A killed with kill -9:
C's consumer gets basic.cancel, A's durable queue answers 404 with RabbitMQ's text on
the other nodes until A restarts, then every confirmed message is back. Also a queue
placed on another node by the min-masters locator, and /api/queues' ``node``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pamqp import commands

from bench.loadgen import (
    Conn,
    ConsumerSpec,
    ProtocolError,
    PublisherSpec,
    Target,
    run_consumers,
    run_publisher,
)
from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    wait_counted_down,
    wait_for,
)
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(600),
]


def queue_info(node: ClusterNode, name: str) -> dict[str, Any] | None:
    r = node.api.get(f"/api/queues/%2F/{q(name)}")
    return r.json() if r.status == 200 else None


def usable(node: ClusterNode, name: str) -> bool:
    """A passive declare on ``node`` succeeds (the queue is known there and its leader
    reachable)."""
    conn = Conn(node.url, timeout=5)
    try:
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Queue.Declare(queue=name, passive=True),
                 commands.Queue.DeclareOk)
        return True
    except ProtocolError:
        return False
    finally:
        conn.close()


def declare_on(node: ClusterNode, name: str, **arguments: Any) -> None:
    conn = Conn(node.url)
    try:
        conn.declare_queue(conn.open_channel(1), name, durable=True, arguments=arguments)
    finally:
        conn.close()


def wait_known_everywhere(nodes: list[ClusterNode], name: str, leader: str) -> None:
    for n in nodes:
        def led_and_usable(n: ClusterNode = n) -> bool:
            return (queue_info(n, name) or {}).get("node") == leader and usable(n, name)
        wait_for(led_and_usable, 30, f"queue {name} led by {leader} usable on {n.name}", n.tail)


@pytest.mark.slow
def test_publisher_on_b_consumer_on_c_queue_led_by_a_100k_in_order(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    declare_on(a, "far")
    wait_known_everywhere(nodes, "far", a.name)
    total = 100_000
    stop = threading.Event()
    progress = [0]
    out: dict[str, Any] = {}
    consumer = threading.Thread(target=lambda: out.setdefault("c", run_consumers(
        c.url, [ConsumerSpec(["far"], prefetch=500)], stop, progress)))
    consumer.start()
    try:
        pub = run_publisher(b.url, PublisherSpec(1, [Target("", "far")], body_size=64,
                                                 persistent=True, confirm_window=2000,
                                                 count=total))
        deadline = time.monotonic() + 300
        while progress[0] < total and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        consumer.join(60)
    res = out["c"]
    assert pub.error is None, pub.error
    assert (pub.published, pub.confirmed, pub.nacked) == (total, total, 0)
    assert res.error is None, res.error
    assert res.received == total
    assert (res.gaps, res.disorder, res.redelivered) == (0, 0, 0)
    # everything acked on the leader
    wait_for(lambda: (queue_info(a, "far") or {}).get("messages") == 0, 30,
             "far empty on its leader", a.tail)


def test_kill_9_of_the_leader_cancels_404s_and_loses_nothing_confirmed(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    declare_on(a, "keep")
    wait_known_everywhere(nodes, "keep", a.name)
    total = 2000
    pub = run_publisher(b.url, PublisherSpec(1, [Target("", "keep")], body_size=32,
                                             persistent=True, confirm_window=500,
                                             count=total))
    assert (pub.confirmed, pub.nacked, pub.error) == (total, 0, None)
    # a consumer on C holding 10 unacknowledged deliveries
    cons = Conn(c.url)
    ch = cons.open_channel(1)
    cons.rpc(ch, commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
    cons.rpc(ch, commands.Basic.Consume(queue="keep", consumer_tag="holder"),
             commands.Basic.ConsumeOk)
    for _ in range(10):
        cons.expect(ch, commands.Basic.Deliver)
    a.kill()  # kill -9
    cons.sock.settimeout(15)
    cancel = cons.expect(ch, commands.Basic.Cancel)  # consumer_cancel_notify
    assert cancel.consumer_tag == "holder"
    cons.close()
    text = ("NOT_FOUND - home node 'node-a' of durable queue 'keep' in vhost '/' is down "
            "or inaccessible")
    for n in (b, c):
        conn = Conn(n.url)
        try:
            ch = conn.open_channel(1)
            with pytest.raises(ProtocolError) as info:
                conn.declare_queue(ch, "keep", durable=True)
            assert str(info.value) == f"channel.close 404 {text}"
            ch = conn.open_channel(2)
            with pytest.raises(ProtocolError) as info:
                conn.rpc(ch, commands.Basic.Get(queue="keep"), commands.Basic.GetOk)
            assert str(info.value) == f"channel.close 404 {text}"
        finally:
            conn.close()
    # as RabbitMQ 3.10: once node-a is counted down nothing is routed to the lost
    # queue, so a publisher with confirms gets acks (mandatory ones come back:
    # tests/integration/test_cluster_kill.py); before, they are nacked
    wait_counted_down([b], a.name)
    lost = run_publisher(b.url, PublisherSpec(2, [Target("", "keep")], persistent=True,
                                              confirm_window=10, count=5))
    assert (lost.confirmed, lost.nacked) == (5, 0)
    a.start()
    wait_for(lambda: usable(b, "keep") and usable(c, "keep"), 60,
             "keep usable on b and c after node-a restarted", a.tail)
    # every confirmed message is back: consumed on C, in order, none missing
    stop = threading.Event()
    progress = [0]
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("c", run_consumers(
        c.url, [ConsumerSpec(["keep"], prefetch=200)], stop, progress)))
    t.start()
    deadline = time.monotonic() + 60
    while progress[0] < total and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # nothing beyond the confirmed ones may come
    stop.set()
    t.join(30)
    res = out["c"]
    assert res.error is None, res.error
    assert (res.received, res.gaps, res.disorder) == (total, 0, 0)
    # the 10 the lost consumer held come back redelivered (after a kill -9 the store
    # flags every message within its delivery promise window: amqpd/store/marks.py)
    assert res.redelivered >= 10


def test_min_masters_places_the_queue_on_the_node_leading_fewest(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    declare_on(a, "on-a")
    declare_on(b, "on-b")
    wait_known_everywhere(nodes, "on-a", a.name)
    wait_known_everywhere(nodes, "on-b", b.name)
    declare_on(a, "placed", **{"x-queue-master-locator": "min-masters"})
    wait_known_everywhere(nodes, "placed", c.name)
    pub = run_publisher(a.url, PublisherSpec(1, [Target("", "placed")], persistent=True,
                                             confirm_window=50, count=100))
    assert (pub.confirmed, pub.nacked) == (100, 0)
    wait_for(lambda: (queue_info(c, "placed") or {}).get("messages") == 100, 10,
             "100 messages on the leader", c.tail)
