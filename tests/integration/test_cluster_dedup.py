"""Queue-level deduplication on a quorum queue follows the queue to its new leader.

Three real nodes (etcd membership). A quorum queue declared with
``x-message-deduplication`` on node-a (its leader) takes 50 confirmed messages; node-a is
killed with kill -9; once a new leader is elected, a publisher on node-b re-sends the same
50 (same ``x-deduplication-header``) and 10 new ones. The new leader rebuilt the cache
from the messages its copy holds, and refuses the 50 whether the publish reached it
directly or was forwarded by node-b: the queue holds 60 messages, each once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.cluster_support import ClusterNode, diagnose, three_nodes, wait_for
from tests.integration.ext_support import drain
from tests.integration.test_cluster_quorum import group_formed, queue_info
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

QUEUE = "qq"  # the name test_cluster_quorum's helpers look at


@pytest.fixture
def tolerant_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """As test_cluster_quorum's kill test: failure detectors a loaded machine's stalls
    do not trip (heartbeat timeout 5 s, etcd lease 10 s)."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "5"},
                     lease_ttl=10.0) as started:
        yield started


def _publish(url: str, bodies: list[tuple[str, bytes]]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for value, body in bodies:
            ch.basic_publish("", QUEUE, body, pika.BasicProperties(
                delivery_mode=2, headers={"x-deduplication-header": value}))
    finally:
        conn.close()


def test_new_leader_rebuilds_the_cache_from_its_copy(tolerant_nodes: list[ClusterNode]) -> None:
    a, b, c = tolerant_nodes
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    conn.channel().queue_declare(QUEUE, durable=True, arguments={
        "x-queue-type": "quorum", "x-message-deduplication": True})
    conn.close()
    group_formed(tolerant_nodes, a)
    _publish(a.url, [(f"id-{i}", b"m%d" % i) for i in range(50)])
    _publish(a.url, [("id-0", b"dup")])  # the leader refuses it (confirmed, not enqueued)
    a.kill()
    wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name), 60,
             "a new leader", lambda: diagnose([b, c]))
    _publish(b.url, [(f"id-{i}", b"r%d" % i) for i in range(60)])
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        got = drain(conn.channel(), QUEUE)
    finally:
        conn.close()
    assert got == [b"m%d" % i for i in range(50)] + [b"r%d" % i for i in range(50, 60)]
