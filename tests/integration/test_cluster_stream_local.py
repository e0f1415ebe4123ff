"""A stream consumer on a node holding a member reads that member's copy (issue 30, as
RabbitMQ's stream consumers read their local replica): three amqpd processes and etcd
on loopback, pika.

A stream declared on node-a has members on every node. A consumer on node-c is served
there: the leader lists no consumer of its own for it, node-c lists it with its position
among the consumers reading its copy, and it gets every record in order with the
``x-stream-offset`` header. Every ``x-stream-offset`` form starts where it starts on the
leader.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration._http import q
from tests.integration.cluster_support import ClusterNode, diagnose, wait_for
from tests.integration.test_cluster_streams import (  # noqa: F401 - a fixture
    connect,
    pika_connections,
    read,
)
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(240),
]

STREAM = "local-reads"


def queue_info(node: ClusterNode) -> dict[str, Any]:
    r = node.api.get(f"/api/queues/%2F/{q(STREAM)}")
    return r.json() if r.status == 200 else {}


@pytest.fixture
def opened(request: pytest.FixtureRequest) -> list[pika.BlockingConnection]:
    """The pika connections a test opened, closed after it (test_cluster_streams')."""
    conns: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    return conns


def channel(node: ClusterNode, conns: list[pika.BlockingConnection]) -> Any:
    return connect(node, conns).channel()


def publish(ch: Any, first: int, count: int) -> None:
    for i in range(first, first + count):
        ch.basic_publish("", STREAM, str(i).encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)


def confirming(node: ClusterNode, conns: list[pika.BlockingConnection], count: int
               ) -> Any:
    """A channel on ``node`` in confirm mode, ``count`` messages published on it."""
    ch = channel(node, conns)
    ch.confirm_delivery()
    publish(ch, 0, count)
    return ch


def declare(nodes: list[ClusterNode], conns: list[pika.BlockingConnection]) -> None:
    """The stream declared on node-a, its members on every node connected."""
    names = sorted(n.name for n in nodes)
    channel(nodes[0], conns).queue_declare(STREAM, durable=True,
                                           arguments={"x-queue-type": "stream"})
    wait_for(lambda: sorted(queue_info(nodes[0]).get("member_offsets", {})) == names, 30,
             "the stream's members connected", lambda: diagnose(nodes))


def test_a_consumer_on_a_member_reads_the_copy_on_its_own_node(
        nodes: list[ClusterNode], opened: list[pika.BlockingConnection]) -> None:
    a, b, c = nodes
    declare(nodes, opened)
    pub = confirming(b, opened, 200)
    ch, gen = first_delivery(c, opened, "first")
    assert read(ch, gen, 200, 60) == [(i, i) for i in range(200)]

    # node-c serves it: the leader has no consumer of its own for it
    wait_for(lambda: [x["offset"] for x in queue_info(c).get("local_consumers", [])]
             == [200], 30, "node-c lists its consumer at offset 200",
             lambda: str(queue_info(c)))
    assert queue_info(a)["stream"]["consumers"] == [], queue_info(a)
    assert queue_info(c)["consumers"] == 1

    # what is published later reaches it too
    publish(pub, 200, 50)
    assert read(ch, gen, 50, 60) == [(i, i) for i in range(200, 250)]


def first_delivery(node: ClusterNode, conns: list[pika.BlockingConnection], spec: Any
                   ) -> tuple[Any, Iterator[Any]]:
    """A consumer of the stream on ``node`` from ``x-stream-offset: spec`` (prefetch 10)."""
    ch = channel(node, conns)
    ch.basic_qos(prefetch_count=10)
    return ch, ch.consume(STREAM, arguments={"x-stream-offset": spec}, inactivity_timeout=0.5)


def test_every_offset_form_starts_where_it_starts_on_the_leader(
        nodes: list[ClusterNode], opened: list[pika.BlockingConnection]) -> None:
    a, _b, c = nodes
    declare(nodes, opened)
    pub = confirming(a, opened, 0)
    for chunk in range(5):  # a few chunks: "last" is the start of the last one
        publish(pub, chunk * 40, 40)
    wait_for(lambda: set(queue_info(a)["member_offsets"].values()) == {200}, 30,
             "every member holds 200 records", lambda: str(queue_info(a)))
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    specs: list[Any] = ["first", "last", 57, 0, now - datetime.timedelta(hours=1), "1h"]
    for spec in specs:
        (ch_a, gen_a), (ch_c, gen_c) = first_delivery(a, opened, spec), \
            first_delivery(c, opened, spec)
        on_leader = read(ch_a, gen_a, 3, 10)
        on_member = read(ch_c, gen_c, 3, 10)
        assert on_leader and on_member == on_leader, (spec, on_leader, on_member)
    assert on_leader[0][0] == 0  # "1h": everything is younger
    assert len(queue_info(c).get("local_consumers", [])) == len(specs), queue_info(c)

    # "next" and an offset beyond the end: the copy's end when the consumer is
    # registered, before its consume-ok, so the first record published after it is
    # the first delivery (pika's consume() sends basic.consume, and waits for its
    # consume-ok, at the generator's first step: nothing to deliver yet)
    end = 200
    for spec in ("next", 10_000):
        ch_c, gen_c = first_delivery(c, opened, spec)
        assert next(gen_c) == (None, None, None), spec
        publish(pub, end, 5)
        assert read(ch_c, gen_c, 5, 20) == [(i, i) for i in range(end, end + 5)], spec
        end += 5


def test_consumers_get_only_what_a_majority_of_members_holds(
        nodes: list[ClusterNode], opened: list[pika.BlockingConnection]) -> None:
    """A stream of two members (node-a leading, node-b): with node-b killed nothing new
    is committed, so a consumer on the leader gets none of what is written meanwhile
    (a failover to node-b would not have it); node-b back, it gets all of it."""
    a, b, _c = nodes
    channel(a, opened).queue_declare(STREAM, durable=True, arguments={
        "x-queue-type": "stream", "x-initial-cluster-size": 2})
    wait_for(lambda: sorted(queue_info(a).get("member_offsets", {})) == [a.name, b.name],
             30, "node-a and node-b connected", lambda: diagnose(nodes))
    confirming(a, opened, 100)
    ch, gen = first_delivery(a, opened, "first")
    assert read(ch, gen, 100, 60) == [(i, i) for i in range(100)]

    b.kill()
    loose = channel(a, opened)  # no confirms: they would wait for node-b
    publish(loose, 100, 20)
    wait_for(lambda: queue_info(a).get("stream", {}).get("last_offset") == 119, 30,
             "offsets 100..119 written on the leader", lambda: str(queue_info(a)))
    assert read(ch, gen, 1, 3) == [], "a record no majority holds was delivered"

    b.start()
    assert read(ch, gen, 20, 90) == [(i, i) for i in range(100, 120)], diagnose(nodes)
