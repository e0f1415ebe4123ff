"""A replicated stream's consumers as a client sees them on each node (issue 30): three
amqpd processes and etcd on loopback, pika.

* ``x-stream-offset: next`` on the leader's node and on a member's node (a consumer
  reading that node's copy): every record published after basic.consume-ok reaches it,
  published on the consumer's connection or another, through any node; repeated, since
  a consumer attached after its consume-ok would miss one only now and then.
* queue.declare-ok (and a passive declare) on a member's node counts the consumers
  reading that node's copy, as the management API there does.
* With the leader lost and no majority to elect another, the stream is declared on
  every node and a consume is refused, as RabbitMQ 3.10.8 answers.
"""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from tests.integration.cluster_support import ClusterNode, diagnose, wait_for
from tests.integration.test_cluster_stream_local import STREAM, channel, declare, queue_info
from tests.integration.test_cluster_streams import pika_connections  # noqa: F401 - a fixture
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

ROUNDS = 30  # consumes at next per node
WAIT = 15.0  # seconds one record may take to arrive at most


def test_next_gets_every_record_published_after_consume_ok(
        nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, b, c = nodes
    declare(nodes, opened)
    others = {n.name: channel(n, opened) for n in nodes}
    missed: list[tuple[str, int, str, list[bytes]]] = []
    for where in (a, c):  # the leader's node, a member's (reading its copy)
        ch = channel(where, opened)
        ch.basic_qos(prefetch_count=50)
        for i in range(ROUNDS):
            got: list[bytes] = []
            tag = ch.basic_consume(STREAM, lambda _c, m, _p, body, got=got: (
                got.append(body), _c.basic_ack(m.delivery_tag)),
                arguments={"x-stream-offset": "next"})
            # consume-ok is back: publish at once, on this channel or through any node
            body = f"{where.name}-{i}".encode()
            via = ch if i % 4 == 3 else others[(a, b, c)[i % 3].name]
            via.basic_publish("", STREAM, body)
            deadline = time.monotonic() + WAIT
            while body not in got and time.monotonic() < deadline:
                ch.connection.process_data_events(time_limit=0.05)
            if got[:1] != [body]:
                missed.append((where.name, i, "same" if via is ch else "other", got))
            ch.basic_cancel(tag)
    assert not missed, missed


def _declare_ok(ch: Any, passive: bool, **arguments: Any) -> int:
    ok = ch.queue_declare(STREAM, passive=passive, durable=True, arguments=None if passive
                          else {"x-queue-type": "stream", **arguments})
    return int(ok.method.consumer_count)


def test_declare_ok_counts_the_consumers_reading_a_members_copy(
        nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, _b, c = nodes
    declare(nodes, opened)
    for node in (a, c, c):  # one on the leader, two reading node-c's copy
        ch = channel(node, opened)
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(STREAM, lambda *_: None, arguments={"x-stream-offset": "first"})
    wait_for(lambda: len(queue_info(c).get("local_consumers", [])) == 2, 30,
             "node-c's two consumers read its copy", lambda: str(queue_info(c)))
    # node-c's API: the leader's consumer (reported about once a second) and its two
    wait_for(lambda: queue_info(c).get("consumers") == 3, 30, "node-c's API counts 3",
             lambda: str(queue_info(c)))
    asking = channel(c, opened)
    assert (_declare_ok(asking, False), _declare_ok(asking, True)) == (3, 3)
    assert queue_info(c)["consumers"] == 3
    # the leader's node counts what it serves (its API says the same)
    on_a = channel(a, opened)
    assert _declare_ok(on_a, False) == _declare_ok(on_a, True) == \
        queue_info(a)["consumers"] == 1


def test_a_stream_whose_leader_is_lost_is_declared_but_not_consumed(
        nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    """As RabbitMQ 3.10.8 answers on a member's node while the leader is lost:
    queue.declare and a passive declare succeed, basic.consume is refused (RabbitMQ:
    541, or 406 "does not have a replica on the local node"; amqpd: 404 home node
    down). Two members (node-a leading, node-b): with node-a killed no majority is
    left, so no leader is elected."""
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, b, c = nodes
    channel(a, opened).queue_declare(STREAM, durable=True, arguments={
        "x-queue-type": "stream", "x-initial-cluster-size": 2})
    wait_for(lambda: sorted(queue_info(a).get("member_offsets", {})) == [a.name, b.name],
             30, "node-a and node-b connected", lambda: str(queue_info(a)))
    a.kill()
    for node in (b, c):  # a member's node, and a node with none
        def down(node: ClusterNode = node) -> bool:
            return queue_info(node).get("state") == "down"

        wait_for(down, 30, f"{node.name} sees the leader lost", lambda: diagnose(nodes))
        ch = channel(node, opened)
        assert _declare_ok(ch, False, **{"x-initial-cluster-size": 2}) == 0
        assert _declare_ok(ch, True) == 0
        ch.basic_qos(prefetch_count=10)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_consume(STREAM, lambda *_: None)
        assert refused.value.reply_code == 404, refused.value
        assert "home node 'node-a'" in refused.value.reply_text
