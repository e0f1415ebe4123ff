"""A member removed from a stream while it could not be told keeps no files (issue 30):
three amqpd processes and etcd on loopback, pika and amqpctl.

node-c is killed, and removed from the stream's members (``amqpctl delete_replica``)
before the cluster counts it down (a long heartbeat timeout here: the window a kill
leaves in production is the timeout, 1 s by default), so the leader's ``SDROP`` goes to
a closed link. When node-c comes back, the stream's group record no longer names it:
its copy's files go, with a log line, and it still reads the stream through the leader.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from amqpd.broker.api import stream_directory
from tests.integration.cluster_support import (
    ClusterNode,
    cluster_of,
    diagnose,
    private_etcd,
    wait_for,
)
from tests.integration.test_cluster_streams import (  # noqa: F401 - a fixture
    STREAM,
    connect,
    member_offsets,
    pika_connections,
    publish_confirmed,
    queue_info,
    read,
)
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(240),
]

SLOW = {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "60"}  # a killed node counts as running 60 s


@pytest.fixture
def slow_nodes(tmp_path: Path) -> Iterator[list[ClusterNode]]:
    with private_etcd(tmp_path) as etcd, cluster_of(
            tmp_path, etcd.url, ("a", "b", "c"), SLOW, lease_ttl=60.0) as started:
        yield started


def test_a_member_removed_while_down_deletes_its_copy_when_back(
        slow_nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, b, c = slow_nodes
    connect(a, opened).channel().queue_declare(STREAM, durable=True,
                                               arguments={"x-queue-type": "stream"})
    names = sorted(n.name for n in slow_nodes)
    wait_for(lambda: sorted(member_offsets(a)) == names, 30, "every member connected",
             lambda: diagnose(slow_nodes))
    publish_confirmed(a, opened, 0, 50)
    wait_for(lambda: member_offsets(a).get(c.name) == 50, 30, "node-c holds 0..49",
             lambda: str(queue_info(a)))
    copy = stream_directory(c.data_dir, "/", STREAM)
    assert any(p.suffix == ".seg" for p in copy.iterdir()), list(copy.iterdir())

    c.kill()
    a.ctl("delete_replica", STREAM, c.name)  # node-c still counts as running
    wait_for(lambda: sorted(queue_info(a).get("members", [])) == [a.name, b.name], 30,
             "node-c is no member any more", lambda: str(queue_info(a)))
    assert copy.is_dir()  # nobody could tell node-c

    c.start()
    wait_for(lambda: not copy.exists(), 60, "node-c deleted its copy", c.tail)
    assert "this node is no longer a member" in c.tail(), c.tail()
    # the stream is still there for node-c's clients, read through the leader once
    # node-c's link to it is up
    wait_for(lambda: bool(queue_info(c)) and queue_info(c).get("state") != "down", 30,
             "node-c reaches the leader", lambda: str(queue_info(c)))
    ch = connect(c, opened).channel()
    ch.basic_qos(prefetch_count=10)
    gen = ch.consume(STREAM, arguments={"x-stream-offset": "first"}, inactivity_timeout=0.5)
    assert read(ch, gen, 50, 30) == [(i, i) for i in range(50)]
    assert not copy.exists()
