"""The stream protocol on a three-node cluster (issue 31): the metadata names a stream's
leader and its replicas, a subscriber on a replica's node reads that node's copy, and
no subscriber -- on the leader or a replica -- gets a record beyond the commit point.

Three nodes with the stream listener on (ephemeral ports) and etcd on loopback; a
three-member stream declared on node-a, which leads it.

* Metadata asked on every node names node-a's listener as the leader and node-b's and
  node-c's as the replicas (as RabbitMQ 3.10.8 answers: every member that runs).
* A raw-frame subscriber at node-c's stream port gets every record once, in order;
  rstream's consumer (which subscribes on a replica when the metadata names one) does
  too, and its subscription is on node-b or node-c, never on node-a. A publisher may
  be declared on a replica's node as on RabbitMQ 3.10.8 (its frames go to the
  leader's node: test_cluster_stream_publish.py).
* Offsets and publisher sequences work through a member's node, which asks the
  leader's node (where ``tracking.json`` lives), as RabbitMQ 3.10.8 writes tracking
  through the leader from any node: an offset stored at node-c's port is read back
  there and at node-a's, a burst of store-offsets for one reference ends with the
  last one stored and far fewer requests to node-a than store-offsets, and a named
  producer's sequence published on node-a is answered at node-c.
* A named producer's publishing ids and a stored offset survive kill -9 of the
  stream's leader (a three-node cluster with the default, short heartbeat timeout):
  the producer re-sends an overlapping range to the elected leader, which confirms
  the ids it holds without storing them again, so the stream holds each id once;
  query-publisher-sequence answers the last id and query-offset the stored offset.
* With node-b and node-c stopped (SIGSTOP; heartbeat timeout and lease long enough
  that node-a is not left alone and paused), records published on node-a are written
  there but committed nowhere: they are not confirmed and subscribers on node-a --
  one reading at the tail, one starting from the first offset -- get none of them;
  once the members resume, the subscribers get them all, in order.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpd.streamproto.codec import CHUNK_HEADER
from tests.integration.cluster_support import ClusterNode, diagnose, three_nodes, wait_for
from tests.integration.test_stream_protocol import RawClient, _s
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

rstream = pytest.importorskip("rstream", reason="rstream (test extra) is not installed")

pytestmark = [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
              pytest.mark.timeout(300)]

STREAM = "proto-stream"
OK, STREAM_DOES_NOT_EXIST, STREAM_NOT_AVAILABLE, NO_OFFSET = 0x01, 0x02, 0x06, 0x13
FIRST, NEXT = 1, 2  # offset specification types
DELIVER, CONFIRM, ERROR, METADATA_UPDATE = 0x08, 0x03, 0x04, 0x10
QUERY_OFFSET, QUERY_SEQUENCE = 0x0B, 0x05


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    # a stopped member must not count as lost within the test (node-a alone would
    # pause): a heartbeat timeout and lease longer than the stop
    env = {"AMQPD_STREAM": "1", "AMQPD_STREAM_PORT": "0",
           "AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "40"}
    with three_nodes(tmp_path, etcd.url, env, lease_ttl=40.0) as started:
        yield started


@pytest.fixture
def quick_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """Three nodes with the stream listener and the default heartbeat timeout (a
    killed node is counted down within seconds)."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_STREAM": "1",
                                          "AMQPD_STREAM_PORT": "0"}) as started:
        yield started


def stream_port(node: ClusterNode) -> int:
    assert node.proc is not None
    return int(node.proc.info["stream_port"])


def topology(node: ClusterNode, name: str) -> tuple[int, int | None, list[int]]:
    """``name`` as ``node``'s metadata answers it: code, the leader's stream port and
    the replicas' ports."""
    return topology_at(stream_port(node), name)


def topology_at(port: int, name: str) -> tuple[int, int | None, list[int]]:
    """``name`` as the metadata at stream port ``port`` answers it (:func:`topology`)."""
    client = RawClient(port)
    try:
        client.open()
        client.send(0x0F, struct.pack(">i", 1) + _s(name))
        key, rest = client.frame()
        assert key == 0x800F, hex(key)
        pos = 4
        (count,) = struct.unpack_from(">I", rest, pos)
        pos += 4
        ports: dict[int, int] = {}
        for _ in range(count):
            ref, size = struct.unpack_from(">Hh", rest, pos)
            pos += 4 + size
            (ports[ref],) = struct.unpack_from(">I", rest, pos)
            pos += 4
        (count,) = struct.unpack_from(">I", rest, pos)
        assert count == 1
        (size,) = struct.unpack_from(">h", rest, pos + 4)
        pos += 6 + size
        code, leader, n = struct.unpack_from(">HHI", rest, pos)
        refs = struct.unpack_from(f">{n}H", rest, pos + 8)
        return code, ports.get(leader), sorted(ports[r] for r in refs)
    finally:
        client.close()


def queue_info(node: ClusterNode) -> dict[str, Any]:
    r = node.api.get(f"/api/queues/%2F/{STREAM}")
    return r.json() if r.status == 200 else {}


class Raw(RawClient):
    """Publish and subscribe in raw frames, keeping what arrives by kind."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.records: dict[int, list[tuple[int, bytes]]] = {}  # subscription -> got
        self.confirmed: list[int] = []
        self.errored: list[int] = []
        self.error_codes: list[int] = []  # each errored id's response code
        self.updates: list[int] = []

    def subscribe(self, sid: int, kind: int, credit: int = 100) -> int:
        self.send(0x07, struct.pack(">B", sid) + _s(STREAM) + struct.pack(">H", kind)
                  + struct.pack(">H", credit) + struct.pack(">i", 0))
        self.records.setdefault(sid, [])
        return self.response(0x07)[0]

    def declare_publisher(self, pid: int, reference: str = "") -> int:
        self.send(0x01, struct.pack(">B", pid) + _s(reference) + _s(STREAM))
        return self.response(0x01)[0]

    def store_offset(self, reference: str, offset: int) -> None:
        self.send(0x0A, _s(reference) + _s(STREAM) + struct.pack(">Q", offset),
                  with_corr=False)

    def query(self, key: int, reference: str) -> tuple[int, int]:
        """query-offset (0x0B) or query-publisher-sequence (0x05): (code, value)."""
        self.send(key, _s(reference) + _s(STREAM))
        code, rest = self.response(key)
        return code, struct.unpack_from(">Q", rest)[0]

    def publish(self, pid: int, first: int, count: int) -> None:
        body = b"".join(struct.pack(">QI", i, 6) + f"r{i:05d}".encode()
                        for i in range(first, first + count))
        self.send(0x02, struct.pack(">Bi", pid, count) + body, with_corr=False)

    def pump(self, timeout: float) -> None:
        """Take what arrives within ``timeout`` seconds (a chunk gives its credit back)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                key, rest = self.frame()
            except TimeoutError:
                return
            if key == DELIVER:
                sid = rest[0]
                self.records[sid] += _entries(rest[1:])
                self.sock.sendall(_credit(sid))
            elif key == CONFIRM:
                (n,) = struct.unpack_from(">i", rest, 1)
                self.confirmed += struct.unpack_from(f">{n}Q", rest, 5)
            elif key == ERROR:
                (n,) = struct.unpack_from(">i", rest, 1)
                self.errored += [struct.unpack_from(">Q", rest, 5 + 10 * i)[0]
                                 for i in range(n)]
                self.error_codes += [struct.unpack_from(">H", rest, 13 + 10 * i)[0]
                                     for i in range(n)]
            elif key == METADATA_UPDATE:
                self.updates.append(struct.unpack_from(">H", rest)[0])

    def wait_confirms(self, count: int, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(self.confirmed) < count and time.monotonic() < deadline:
            self.pump(min(1.0, deadline - time.monotonic()))
        return self.confirmed

    def wait_records(self, sid: int, count: int, timeout: float) -> list[tuple[int, bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.records[sid]) < count and time.monotonic() < deadline:
            self.pump(min(1.0, deadline - time.monotonic()))
        return self.records[sid]


def _credit(sid: int) -> bytes:
    body = struct.pack(">HHBH", 0x09, 1, sid, 1)
    return struct.pack(">I", len(body)) + body


def _entries(chunk: bytes) -> list[tuple[int, bytes]]:
    """A delivered chunk's records: (offset, body), simple entries only."""
    fields = CHUNK_HEADER.unpack_from(chunk, 0)
    entries, first, length = fields[2], fields[6], fields[8]
    data = chunk[CHUNK_HEADER.size:CHUNK_HEADER.size + length]
    out, at = [], 0
    for i in range(entries):
        (size,) = struct.unpack_from(">I", data, at)
        out.append((first + i, data[at + 4:at + 4 + size]))
        at += 4 + size
    return out


def _bodies(first: int, end: int) -> list[tuple[int, bytes]]:
    return [(i, f"r{i:05d}".encode()) for i in range(first, end)]


async def _rstream_read(node: ClusterNode, count: int, nodes: list[ClusterNode]
                        ) -> tuple[list[tuple[int, bytes]], dict[str, int]]:
    """``count`` records from the first offset through rstream's consumer connected
    to ``node`` (it subscribes where the metadata sends it), and how many stream
    consumers each node holds meanwhile (by the ``node`` the cluster's list names)."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def on_message(msg: Any, ctx: Any) -> None:
        got.append((ctx.offset, bytes(msg)))
        if len(got) >= count:
            done.set()

    consumer = rstream.Consumer("127.0.0.1", port=stream_port(node), username="guest",
                                password="guest", load_balancer_mode=False)
    await consumer.start()
    try:
        await consumer.subscribe(STREAM, on_message, offset_specification=(
            rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST)))
        await asyncio.wait_for(done.wait(), 60)
        # every node lists the whole cluster's subscriptions, each naming its node
        listed = nodes[0].api.get("/api/stream/consumers").json()
        where = {n.name: sum(1 for i in listed if i["connection_details"]["node"] == n.name)
                 for n in nodes}
        return got, where
    finally:
        await consumer.close()


def _declare(a: ClusterNode, nodes: list[ClusterNode]) -> None:
    client = RawClient(stream_port(a))
    try:
        client.open()
        client.send(0x0D, _s(STREAM) + struct.pack(">i", 0))
        assert client.response(0x0D)[0] == OK
    finally:
        client.close()
    wait_for(lambda: sorted(queue_info(a).get("member_offsets", {})) == sorted(
        n.name for n in nodes), 30, "every member's copy connected", lambda: diagnose(nodes))


def test_metadata_names_replicas_and_a_replica_serves_its_subscribers(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    _declare(a, nodes)
    wait_for(lambda: all(topology(n, STREAM)[2] == sorted([stream_port(b), stream_port(c)])
                         for n in nodes), 30, "metadata names both replicas on every node",
             lambda: str([topology(n, STREAM) for n in nodes]))
    for n in nodes:
        assert topology(n, STREAM) == (OK, stream_port(a),
                                       sorted([stream_port(b), stream_port(c)])), n.name

    on_c = Raw(stream_port(c))
    pub = Raw(stream_port(a))
    try:
        on_c.open()
        pub.open()
        # a publisher may be declared on a replica's node too (its frames go to the
        # leader's: test_cluster_stream_publish.py)
        assert on_c.declare_publisher(1) == OK
        assert pub.declare_publisher(1) == OK
        pub.publish(1, 0, 300)
        assert sorted(pub.wait_confirms(300, 30)) == list(range(300)), diagnose(nodes)
        assert on_c.subscribe(1, FIRST) == OK
        pub.publish(1, 300, 200)  # while it reads
        got = on_c.wait_records(1, 500, 60)
        assert got == _bodies(0, 500), (len(got), got[:3], diagnose(nodes))
        on_c.pump(1.0)
        assert on_c.records[1] == _bodies(0, 500)  # nothing twice
    finally:
        on_c.close()
        pub.close()

    got, where = asyncio.run(_rstream_read(b, 500, nodes))
    assert got == _bodies(0, 500), (len(got), got[:3], where)
    # rstream subscribed on a replica (the metadata named two), not on the leader
    assert where[a.name] == 0 and where[b.name] + where[c.name] == 1, where

    on_c, on_a = Raw(stream_port(c)), Raw(stream_port(a))
    try:
        on_c.open()
        on_a.open()
        _offsets_through_a_member(c, on_c, on_a)
    finally:
        on_c.close()
        on_a.close()


def _offsets_through_a_member(c: ClusterNode, on_c: Raw, on_a: Raw) -> None:
    """store-offset at node-c's port is kept by node-a: read back on both nodes; a
    named producer's sequence kept by node-a is answered at node-c."""
    # nothing stored yet: answered through the member as on the leader
    assert on_c.query(QUERY_OFFSET, "app") == (NO_OFFSET, 0)
    assert on_c.query(QUERY_SEQUENCE, "producer-a") == (OK, 0)
    assert on_a.declare_publisher(2, "producer-a") == OK
    on_a.publish(2, 1, 10)  # publishing ids 1..10 (a named producer starts after 0)
    wait_for(lambda: on_a.query(QUERY_SEQUENCE, "producer-a") == (OK, 10), 30,
             "producer-a's ids confirmed on node-a")
    assert on_c.query(QUERY_SEQUENCE, "producer-a") == (OK, 10)

    on_c.store_offset("app", 123)
    # a query after a store on the same node waits for it: no poll needed
    assert on_c.query(QUERY_OFFSET, "app") == (OK, 123)
    assert on_a.query(QUERY_OFFSET, "app") == (OK, 123)
    assert on_a.query(QUERY_OFFSET, "other") == (NO_OFFSET, 0)
    # a client storing per chunk: coalesced, the latest wins; each request is one
    # question over the link to node-a, logged by the asking node
    assert c.proc is not None
    sent = "request 'stream-store-offset'"
    before = c.proc.log_path.read_text(errors="replace").count(sent)
    burst = 200
    for offset in range(1000, 1000 + burst):
        on_c.store_offset("app", offset)
    assert on_c.query(QUERY_OFFSET, "app") == (OK, 1000 + burst - 1)
    assert on_a.query(QUERY_OFFSET, "app") == (OK, 1000 + burst - 1)
    log_c = c.proc.log_path.read_text(errors="replace")
    requests = log_c.count(sent) - before
    assert 1 <= requests < burst // 4, requests
    assert "to node node-a over the link" in log_c


def test_a_stream_is_deleted_through_a_node_that_does_not_lead_it(
        nodes: list[ClusterNode]) -> None:
    """delete-stream on a replica's node deletes the stream cluster-wide, as RabbitMQ
    3.10.8 deletes from any node (rabbitmq-stream-js-client's deleteStream goes through
    whatever node its locator reached). Before, that node answered 0x02 (no such
    stream) and kept it."""
    a, b, c = nodes
    _declare(a, nodes)
    on_c = Raw(stream_port(c))
    deleter = RawClient(stream_port(b))
    try:
        on_c.open()
        wait_for(lambda: on_c.subscribe(1, FIRST) == OK, 30, "a subscriber on node-c",
                 lambda: diagnose(nodes))
        deleter.open()
        deleter.send(0x0E, _s(STREAM))
        assert deleter.response(0x0E)[0] == OK, diagnose(nodes)
        wait_for(lambda: all(topology(n, STREAM)[0] == STREAM_DOES_NOT_EXIST
                             for n in nodes), 30, "every node's metadata: no such stream",
                 lambda: str([topology(n, STREAM) for n in nodes]))
        assert queue_info(a) == {}
        deadline = time.monotonic() + 30
        while not on_c.updates and time.monotonic() < deadline:
            on_c.pump(0.5)
        assert on_c.updates == [STREAM_NOT_AVAILABLE]  # its subscription ended
        deleter.send(0x0E, _s(STREAM))  # gone now, on this node too
        assert deleter.response(0x0E)[0] == STREAM_DOES_NOT_EXIST
    finally:
        on_c.close()
        deleter.close()


def test_subscribers_on_the_leader_get_only_committed_records(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    _declare(a, nodes)
    tail = Raw(stream_port(a))
    try:
        tail.open()
        assert tail.subscribe(1, NEXT) == OK
        assert tail.declare_publisher(1) == OK
        tail.publish(1, 0, 10)
        assert tail.wait_records(1, 10, 30) == _bodies(0, 10)
        assert b.proc is not None and b.proc.proc is not None
        assert c.proc is not None and c.proc.proc is not None
        stopped = [b.proc.proc.pid, c.proc.proc.pid]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            tail.publish(1, 10, 5)
            wait_for(lambda: queue_info(a).get("stream", {}).get("last_offset") == 14, 20,
                     "offsets 10..14 written on the leader", lambda: str(queue_info(a)))
            fresh = Raw(stream_port(a))
            try:
                fresh.open()
                assert fresh.subscribe(2, FIRST) == OK
                fresh.pump(3.0)
                tail.pump(1.0)
                assert fresh.records[2] == _bodies(0, 10), "beyond the commit point"
            finally:
                fresh.close()
            assert tail.records[1] == _bodies(0, 10), "beyond the commit point"
            assert not set(tail.confirmed) & set(range(10, 15)), "confirmed uncommitted"
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        assert tail.wait_records(1, 15, 60) == _bodies(0, 15), diagnose(nodes)
    finally:
        tail.close()


def test_a_named_producer_is_deduplicated_across_a_leader_failover(
        quick_nodes: list[ClusterNode]) -> None:
    nodes = quick_nodes
    a, b, c = nodes
    _declare(a, nodes)
    on_a = Raw(stream_port(a))
    try:
        on_a.open()
        # stored before the records: the members have it once they hold those
        on_a.store_offset("app", 77)
        assert on_a.declare_publisher(1, "producer-f") == OK
        on_a.publish(1, 1, 200)  # publishing ids 1..200, offsets 0..199
        assert sorted(on_a.wait_confirms(200, 30)) == list(range(1, 201)), diagnose(nodes)
        assert on_a.query(QUERY_SEQUENCE, "producer-f") == (OK, 200)
        assert on_a.query(QUERY_OFFSET, "app") == (OK, 77)
    finally:
        on_a.close()

    a.kill()

    def elected() -> str | None:
        infos = [queue_info(b), queue_info(c)]
        leaders = {i.get("leader") for i in infos}
        return leaders.pop() if len(leaders) == 1 and leaders <= {b.name, c.name} else None

    wait_for(lambda: elected() is not None, 60, "a survivor leads the stream",
             lambda: diagnose([b, c]))
    leader = b if elected() == b.name else c
    wait_for(lambda: topology(leader, STREAM)[:2] == (OK, stream_port(leader)), 30,
             "the metadata names the new leader", lambda: str(topology(leader, STREAM)))

    again = Raw(stream_port(leader))
    try:
        again.open()
        assert again.query(QUERY_SEQUENCE, "producer-f") == (OK, 200)
        assert again.query(QUERY_OFFSET, "app") == (OK, 77)
        assert again.declare_publisher(1, "producer-f") == OK
        # the client re-sends from 151 (say its last confirms were lost) and goes on
        again.publish(1, 151, 110)  # ids 151..260: 151..200 are there already
        assert sorted(again.wait_confirms(110, 30)) == list(range(151, 261)), \
            diagnose([b, c])
        assert not again.errored
        assert again.query(QUERY_SEQUENCE, "producer-f") == (OK, 260)
        assert again.subscribe(1, FIRST) == OK
        got = again.wait_records(1, 260, 60)
        again.pump(1.0)  # nothing more comes
        assert [body for _, body in again.records[1]] == \
            [f"r{i:05d}".encode() for i in range(1, 261)], (len(again.records[1]),
                                                           again.records[1][195:205])
        assert [offset for offset, _ in got] == list(range(260))
    finally:
        again.close()
    assert queue_info(leader)["stream"]["last_offset"] == 259
