"""Queue-level deduplication on a quorum queue follows the queue to its new leader.

Three real nodes (etcd membership). A quorum queue declared with
``x-message-deduplication`` on node-a (its leader) takes 50 confirmed messages; node-a is
killed with kill -9; once a new leader is elected, a publisher on node-b re-sends the same
50 (same ``x-deduplication-header``) and 10 new ones. The new leader rebuilt the cache
from the messages its copy holds, and refuses the 50 whether the publish reached it
directly or was forwarded by node-b: the queue holds 60 messages, each once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
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
# what a queue holds after 50 confirmed (m0..m49) and 60 retried (r0..r59) publishes
FIRST_50_THEN_10_NEW = [b"m%d" % i for i in range(50)] + [b"r%d" % i for i in range(50, 60)]


@pytest.fixture
def tolerant_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """As test_cluster_quorum's kill test: failure detectors a loaded machine's stalls
    do not trip (heartbeat timeout 5 s, etcd lease 10 s)."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "5"},
                     lease_ttl=10.0) as started:
        yield started


def _publish(url: str, bodies: list[tuple[str, bytes]], queue: str = QUEUE,
             retry_for: float = 30.0) -> None:
    """Each confirmed; a nacked one is sent again (for ``retry_for`` seconds), as a
    client does: right after a take-over a node's stream to the new leader may not be
    open yet, and its publishes are nacked (CI, 2026-12-06: a publish through node-c
    just after the mirror's promotion)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        deadline = time.monotonic() + retry_for
        for value, body in bodies:
            while True:
                try:
                    ch.basic_publish("", queue, body, pika.BasicProperties(
                        delivery_mode=2, headers={"x-deduplication-header": value}))
                    break
                except pika.exceptions.NackError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    finally:
        conn.close()


def _drain_from(url: str, queue: str = QUEUE) -> list[bytes]:
    """Every body left in ``queue``, read through ``url`` (ext_support.drain)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return drain(conn.channel(), queue)
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
    assert _drain_from(b.url) == FIRST_50_THEN_10_NEW


EXCHANGE = "dx"


def _publish_mandatory(url: str, values: list[str], body: bytes,
                       retry_for: float = 30.0) -> tuple[int, int]:
    """Publish one message per value (mandatory, confirms): (acked, returned). A nacked
    one is sent again for ``retry_for`` seconds, as :func:`_publish` does (right after a
    take-over the node's stream to the new leader may not be open yet); a value is
    cached only once its message is confirmed (amqpd/broker/dedup.py), so the re-send is
    judged as the first send would have been. A nack past the deadline fails the test."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    acked = returned = 0
    deadline = time.monotonic() + retry_for
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for value in values:
            while True:
                try:
                    ch.basic_publish(EXCHANGE, "", body, pika.BasicProperties(
                        delivery_mode=2, headers={"x-deduplication-header": value}),
                        mandatory=True)
                except pika.exceptions.UnroutableError:
                    returned += 1
                except pika.exceptions.NackError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
                    continue
                acked += 1
                break
    finally:
        conn.close()
    return acked, returned


def test_exchange_cache_is_the_clusters(tolerant_nodes: list[ClusterNode]) -> None:
    """A value routed through node-a is recognised on node-b and node-c, after its
    message was consumed (so no queue holds it) and node-a was killed with kill -9."""
    a, b, c = tolerant_nodes
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    ch = conn.channel()
    ch.exchange_declare(EXCHANGE, "x-message-deduplication", durable=True,
                        arguments={"x-cache-size": 1000})
    ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind(QUEUE, EXCHANGE)
    conn.close()
    group_formed(tolerant_nodes, a)
    first = [f"id-{i}" for i in range(20)]
    assert _publish_mandatory(a.url, first, b"first") == (20, 0)
    assert _publish_mandatory(a.url, first[:5], b"again") == (5, 5)  # dropped on node-a
    assert _drain_from(a.url) == [b"first"] * 20  # consumed: no queue has them
    a.kill()
    wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name), 60,
             "a new leader", lambda: diagnose([b, c]))
    new = [f"id-{i}" for i in range(20, 25)]
    assert _publish_mandatory(b.url, first + new, b"retry") == (25, 20)
    assert _publish_mandatory(c.url, first + new, b"retry") == (25, 25)
    assert _drain_from(c.url) == [b"retry"] * 5
    info = b.api.get(f"/api/exchanges/%2F/{EXCHANGE}").json()["deduplication"]
    assert info["cache_scope"] == "cluster"
    assert info["duplicates"] == 20


MIRRORED = "mq"


def _mirror_info(node: ClusterNode) -> dict[str, Any]:
    r = node.api.get(f"/api/queues/%2F/{MIRRORED}")
    return r.json() if r.status == 200 else {}


def test_promoted_mirror_rebuilds_the_cache_from_its_copy(
        tolerant_nodes: list[ClusterNode]) -> None:
    """As the quorum test above, for a classic queue mirrored on every node (ha-mode
    all): 50 confirmed on node-a (its leader), kill -9, the synchronised mirror promoted,
    the 50 re-sent and 10 new through node-b (and the 50 once more through node-c): the
    queue holds 60, each once; the leader's cache shows 60 values."""
    a, b, c = tolerant_nodes
    r = a.api.put("/api/policies/%2F/ha-all", {
        "pattern": f"^{MIRRORED}$", "apply-to": "queues", "definition": {"ha-mode": "all"}})
    assert r.status in (201, 204), r.text
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    conn.channel().queue_declare(MIRRORED, durable=True,
                                 arguments={"x-message-deduplication": True})
    conn.close()
    wait_for(lambda: sorted(_mirror_info(b).get("synchronised_slave_nodes") or [])
             == [b.name, c.name], 60, "both mirrors synchronised", lambda: diagnose([a, b, c]))
    _publish(a.url, queue=MIRRORED, bodies=[(f"id-{i}", b"m%d" % i) for i in range(50)])
    _publish(a.url, queue=MIRRORED, bodies=[("id-0", b"dup")])  # the leader refuses it
    assert _mirror_info(a)["deduplication"]["cache_entries"] == 50
    a.kill()
    wait_for(lambda: _mirror_info(b).get("node") in (b.name, c.name)
             and _mirror_info(c).get("node") == _mirror_info(b).get("node"), 60,
             "a promoted mirror", lambda: diagnose([b, c]))
    _publish(b.url, queue=MIRRORED, bodies=[(f"id-{i}", b"r%d" % i) for i in range(60)])
    _publish(c.url, queue=MIRRORED, bodies=[(f"id-{i}", b"s%d" % i) for i in range(50)])
    leader = b if _mirror_info(b)["node"] == b.name else c
    dedup = _mirror_info(leader)["deduplication"]
    assert dedup["cache_entries"] == 60
    assert _drain_from(b.url, MIRRORED) == FIRST_50_THEN_10_NEW
