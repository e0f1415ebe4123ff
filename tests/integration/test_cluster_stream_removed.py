"""A member removed from a stream while it could not be told keeps no files (issue 30):
three amqpd processes and etcd on loopback, pika and amqpctl.

node-c is killed, and removed from the stream's members (``amqpctl delete_replica``)
before the cluster counts it down (a long heartbeat timeout here: the window a kill
leaves in production is the timeout, 1 s by default), so the leader's ``SDROP`` goes to
a closed link. When node-c comes back, the stream's group record no longer names it:
its copy's files go, with a log line, and it still reads the stream through the leader.

A stream deleted while a member's node was down (killed with kill -9) leaves no group
record: the returning node deletes its copy, with a log line, and a stream declared
again under that name starts empty on every member. Declared again before the node
returned, the new stream's leader finds the old copy (its term is older than the new
stream's first) and it is deleted before the new copy is opened: the node then holds
and serves only the new stream's records.
"""

from __future__ import annotations

import base64
import functools
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from amqpd.broker.api import stream_directory
from amqpd.cluster.mirror_state import key_part
from tests.integration.cluster_support import (
    ClusterNode,
    cluster_of,
    diagnose,
    private_etcd,
    wait_counted_down,
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


@pytest.fixture
def quick_nodes(tmp_path: Path) -> Iterator[list[ClusterNode]]:
    with private_etcd(tmp_path) as etcd, cluster_of(
            tmp_path, etcd.url, ("a", "b", "c")) as started:
        yield started


def _declare(node: ClusterNode, opened: list[pika.BlockingConnection]) -> None:
    connect(node, opened).channel().queue_declare(
        STREAM, durable=True, arguments={"x-queue-type": "stream",
                                         "x-initial-cluster-size": 3})


def _replicated(nodes: list[ClusterNode], leader: ClusterNode, count: int) -> None:
    names = sorted(n.name for n in nodes)
    wait_for(lambda: member_offsets(leader) == dict.fromkeys(names, count), 30,
             f"every member holds offsets 0..{count - 1}", lambda: str(queue_info(leader)))


def _group_record(node: ClusterNode) -> dict[str, Any]:
    """The stream's group record in etcd ({} when there is none)."""
    key = f"{node.prefix}/{node.cluster}/stream/{key_part('/')}/{key_part(STREAM)}"
    req = urllib.request.Request(
        f"{node.etcd_url}/v3/kv/range", method="POST",
        data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    return dict(json.loads(base64.b64decode(kvs[0]["value"]))) if kvs else {}


def _fresh_record(node: ClusterNode, old_term: int) -> None:
    """The stream declared again has a record of its own: one epoch, from offset 0, of
    a term above every term of the deleted one (nothing of the old stream's history)."""
    rec = _group_record(node)
    assert len(rec["epochs"]) == 1 and rec["epochs"][0][1] == 0, rec
    assert rec["epochs"][0][0] == rec["term"] > old_term, (rec, old_term)


def _segment_files(copy: Path) -> list[Path]:
    return sorted(p for p in copy.iterdir() if p.suffix == ".seg") if copy.is_dir() else []


def _read_on(node: ClusterNode, opened: list[pika.BlockingConnection], want: int
             ) -> list[tuple[int, int]]:
    ch = connect(node, opened).channel()
    ch.basic_qos(prefetch_count=100)
    gen = ch.consume(STREAM, arguments={"x-stream-offset": "first"}, inactivity_timeout=0.5)
    got = read(ch, gen, want, 30)
    got += read(ch, gen, 1, 1.5)  # and nothing more
    return got


def _no_copy(node: ClusterNode) -> bool:
    return not stream_directory(node.data_dir, "/", STREAM).exists()


def _kill_and_delete(nodes: list[ClusterNode], opened: list[pika.BlockingConnection]
                     ) -> tuple[Path, int]:
    """node-c (a member) killed, the stream deleted on node-a: node-c's copy is left.
    The copy's directory and the deleted stream's last term."""
    a, b, c = nodes
    _declare(a, opened)
    _replicated(nodes, a, 0)
    publish_confirmed(a, opened, 0, 50)
    _replicated(nodes, a, 50)
    copy = stream_directory(c.data_dir, "/", STREAM)
    assert _segment_files(copy), list(copy.iterdir())
    old_term = int(_group_record(a)["term"])
    c.kill()
    wait_counted_down([a, b], c.name)
    connect(a, opened).channel().queue_delete(STREAM)
    for n in (a, b):
        wait_for(functools.partial(_no_copy, n), 30, f"{n.name} deleted its copy", n.tail)
    assert _segment_files(copy)  # nobody could tell node-c
    return copy, old_term


def test_a_stream_deleted_while_a_member_is_down_is_deleted_there_when_it_returns(
        quick_nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, _b, c = quick_nodes
    copy, old_term = _kill_and_delete(quick_nodes, opened)

    c.start()
    wait_for(lambda: not copy.exists(), 60, "node-c deleted its copy", c.tail)
    assert "was deleted while this node was down" in c.tail(), c.tail()

    # declared again, the stream starts empty on every member
    wait_for(lambda: not _group_record(a), 30, "the deleted stream's record is gone")
    _declare(a, opened)
    _replicated(quick_nodes, a, 0)
    _fresh_record(a, old_term)
    publish_confirmed(a, opened, 100, 5)
    _replicated(quick_nodes, a, 5)
    assert _read_on(c, opened, 5) == [(i, 100 + i) for i in range(5)]
    assert json.loads((copy / "tracking.json").read_text())["offsets"] == {}


def test_a_stream_deleted_and_declared_again_while_a_member_is_down(
        quick_nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, _b, c = quick_nodes
    copy, old_term = _kill_and_delete(quick_nodes, opened)
    _declare(a, opened)  # node-c is a member again (x-initial-cluster-size 3)
    names = sorted(n.name for n in quick_nodes)
    wait_for(lambda: sorted(queue_info(a).get("members", [])) == names, 30,
             "node-c is a member of the new stream", lambda: str(queue_info(a)))
    _fresh_record(a, old_term)
    publish_confirmed(a, opened, 100, 5)

    c.start()
    _replicated(quick_nodes, a, 5)
    assert "is of an earlier stream of that name" in c.tail(), c.tail()
    assert _read_on(c, opened, 5) == [(i, 100 + i) for i in range(5)]
    assert json.loads((copy / "tracking.json").read_text())["offsets"] == {}


def test_a_stream_deleted_and_declared_again_at_once_has_a_record_of_its_own(
        quick_nodes: list[ClusterNode], request: pytest.FixtureRequest) -> None:
    """Declared again before the leader's reconciliation saw the delete (the same
    channel, at once): the old record is replaced, not taken up as a restart's, and
    every member holds only the new stream's records."""
    opened: list[pika.BlockingConnection] = request.getfixturevalue("pika_connections")
    a, b, c = quick_nodes
    _declare(a, opened)
    _replicated(quick_nodes, a, 0)
    publish_confirmed(a, opened, 0, 50)
    _replicated(quick_nodes, a, 50)
    old_term = int(_group_record(a)["term"])
    ch = connect(a, opened).channel()
    ch.queue_delete(STREAM)
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream",
                                                      "x-initial-cluster-size": 3})
    _replicated(quick_nodes, a, 0)
    _fresh_record(a, old_term)
    publish_confirmed(a, opened, 100, 5)
    _replicated(quick_nodes, a, 5)
    for n in (b, c):
        assert _read_on(n, opened, 5) == [(i, 100 + i) for i in range(5)], n.name
