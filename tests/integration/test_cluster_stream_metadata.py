"""The stream protocol's metadata in a cluster names each stream's leader node (issue 31:
"metadata ... leader ..., so clients connect to the right node of a cluster").

Three nodes with the stream listener on (ephemeral ports) and etcd on loopback. A
replicated stream declared over AMQP 0-9-1 on node-a: metadata asked on node-b and on
node-c names node-a's stream listener as the leader (its advertised host and port, which
each node puts in its cluster record); a name that is no stream is
STREAM_DOES_NOT_EXIST on every node. After node-a's kill -9 the elected leader is named.

Also over AMQP 0-9-1 on a node that does not lead the stream: a consumer without a
prefetch is refused with 406 and one with automatic acks with 540, as on the leader
(issue 30; the leader does not see the consuming channel's prefetch).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.cluster_support import ClusterNode, diagnose, three_nodes, wait_for
from tests.integration.test_stream_protocol import RawClient, _s
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
              pytest.mark.timeout(240)]

STREAM = "meta-stream"
OK, STREAM_DOES_NOT_EXIST = 1, 2


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    env = {"AMQPD_STREAM": "1", "AMQPD_STREAM_PORT": "0"}
    with three_nodes(tmp_path, etcd.url, env) as started:
        yield started


def stream_port(node: ClusterNode) -> int:
    assert node.proc is not None
    return int(node.proc.info["stream_port"])


def metadata(node: ClusterNode, *names: str) -> dict[str, tuple[int, tuple[str, int] | None]]:
    """``names`` as ``node`` answers metadata: code and the leader's (host, port)."""
    client = RawClient(stream_port(node))
    try:
        client.open()
        client.send(0x0F, struct.pack(">i", len(names)) + b"".join(_s(n) for n in names))
        key, rest = client.frame()
        assert key == 0x800F, hex(key)
        pos = 4  # the correlation id
        (count,) = struct.unpack_from(">I", rest, pos)
        pos += 4
        brokers: dict[int, tuple[str, int]] = {}
        for _ in range(count):
            ref, size = struct.unpack_from(">Hh", rest, pos)
            pos += 4
            host = rest[pos:pos + size].decode()
            pos += size
            (port,) = struct.unpack_from(">I", rest, pos)
            pos += 4
            brokers[ref] = (host, port)
        (count,) = struct.unpack_from(">I", rest, pos)
        pos += 4
        out: dict[str, tuple[int, tuple[str, int] | None]] = {}
        for _ in range(count):
            (size,) = struct.unpack_from(">h", rest, pos)
            pos += 2
            name = rest[pos:pos + size].decode()
            pos += size
            code, leader, replicas = struct.unpack_from(">HHI", rest, pos)
            pos += 8 + 2 * replicas
            out[name] = (code, brokers.get(leader))
        return out
    finally:
        client.close()


def leader_name(node: ClusterNode) -> str | None:
    r = node.api.get(f"/api/queues/%2F/{STREAM}")
    return r.json().get("leader") if r.status == 200 else None


def test_metadata_names_the_leaders_node_on_every_node(nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    try:
        conn.channel().queue_declare(STREAM, durable=True,
                                     arguments={"x-queue-type": "stream"})
    finally:
        conn.close()
    wait_for(lambda: all(leader_name(n) == a.name for n in nodes), 30,
             "every node lists node-a leading the stream", lambda: diagnose(nodes))
    refused_as_on_the_leader(b)
    a_port = stream_port(a)
    for n in nodes:
        got = metadata(n, STREAM, "no-such-stream")
        code, where = got[STREAM]
        assert code == OK and where is not None and where[1] == a_port, (n.name, got, a_port)
        assert got["no-such-stream"] == (STREAM_DOES_NOT_EXIST, None), (n.name, got)
        # the advertised host reaches node-a's listener
        socket.create_connection(where, timeout=5).close()

    a.kill()
    survivors = [b, c]
    wait_for(lambda: leader_name(b) in (b.name, c.name) and leader_name(c) == leader_name(b),
             60, "a new leader elected", lambda: diagnose(survivors))
    new = b if leader_name(b) == b.name else c
    def names_new(n: ClusterNode) -> bool:
        where = metadata(n, STREAM)[STREAM][1]
        return where is not None and where[1] == stream_port(new)

    wait_for(lambda: all(names_new(n) for n in survivors), 30,
             f"metadata names {new.name} on both survivors", lambda: diagnose(survivors))


def refused_as_on_the_leader(node: ClusterNode) -> None:
    """basic.consume of the stream on ``node`` (not its leader): 406 (a channel error)
    without a prefetch, 540 (a connection error) with no_ack; with a prefetch it is
    taken."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_consume(STREAM, lambda *_: None)
        assert refused.value.reply_code == 406, refused.value
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(STREAM, lambda *_: None)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            ch.basic_consume(STREAM, lambda *_: None, auto_ack=True)
        assert closed.value.reply_code == 540, closed.value
    finally:
        if conn.is_open:
            conn.close()
