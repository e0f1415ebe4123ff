"""Stream-protocol publishers declared on a node that does not lead the stream (issue
31), on a three-node amqpd cluster and on a three-node RabbitMQ 3.10.8 cluster with
``rabbitmq_stream`` enabled (devtools/rabbitmq_cluster.py; skipped with the reason where
RabbitMQ is missing or its cluster cannot start).

The stream is created on the first node, which leads it; the others hold its replicas.
Through the second node's stream port (a replica's) a raw-frame client:

* declares an unnamed publisher and publishes 10,000 messages in frames of 100, then
  sub-entry batches (uncompressed and gzip) as clients send them: every publishing id
  is confirmed;
* declares a named producer, publishes ids 1..200, then re-sends ids 101..200 (each is
  confirmed again and not stored twice) and publishes 201..210;
* asks query-publisher-sequence there (the leader's figure: 210) and on the third node.

Subscribers from the first offset at the leader's port and at the third node's port
read every record once, in publish order. rstream's Producer is not used: it always
publishes through the leader the metadata names (its ``_get_or_create_client``
connects to the leader's advertised address), so it cannot be pointed at a replica.

Then the leader is lost mid-flight (kill -9 of its node, or of its Erlang VM) while
the publisher on the second node goes on publishing: what that client gets (confirms,
publish-errors and their codes, metadata-updates, the connection's end) is recorded;
docs/streams.md has what each broker did. The test checks only what both do: every
id is answered at most once, and the client hears of the stream (metadata-update) or
of the ids (publish-error) or the connection ends: nothing is left silently
unanswered.

A second test makes a two-member stream and publishes through the node that holds no
copy of it: 1,000 ids of a named producer, all confirmed and read in order at the
leader's and the replica's ports.

A third test puts a named and an unnamed publisher on a replica's node (forwarded to
the leader) and a named one on the leader's node, each publishing 200 ids, 100 of them
again (re-sent: confirmed, not stored twice) and three sub-entry batches of five, and
reads their entries in the management API at each publisher's node
(``/api/stream/publishers`` and the connection's ``.../publishers``, with
``rabbitmq_management`` and ``rabbitmq_stream_management`` enabled on RabbitMQ). Then
subscribers at the leader's and both replicas' ports join, and another connection
deletes the stream. RabbitMQ 3.10.8 did, in the run recorded here: every publisher's
``published`` and ``confirmed`` counted publishing ids received (303 for 300 plain
ids and three batches of five: a batch counts once, a re-sent duplicate counts),
``errored`` 0, and its entries have no publishing ids (no ``last_publishing_id`` nor
``confirmed_publishing_id``: amqpd's own fields); on the delete every connection with
a publisher or a subscriber on the stream -- the forwarded publishers', the local
publisher's and the subscribers' at the leader and at both replicas -- got one
metadata-update with code 0x06 (stream not available) at once, without publishing,
and the deleting connection none; a publish afterwards got publish-error 0x12
(publisher does not exist). amqpd is checked to do the same, and its publishers'
``last_publishing_id`` and ``confirmed_publishing_id`` to be the highest id sent and
the highest confirmed (null for the unnamed one) on the replica's node as on the
leader's.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import time
import urllib.parse
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from amqpd.streamproto.codec import CHUNK_HEADER
from tests.integration.cluster_support import diagnose, three_nodes, wait_for
from tests.integration.test_cluster_stream_protocol import (
    Raw,
    queue_info,
    stream_port,
    topology_at,
)
from tests.integration.test_stream_protocol import _s
from tests.support import etcdproc

pytestmark = [pytest.mark.timeout(900)]

STREAM = "proto-stream"  # test_cluster_stream_protocol's helpers name this stream
OK, NOT_AVAILABLE = 0x01, 0x06
FIRST = 1
QUERY_SEQUENCE = 0x05
MESSAGES = 10_000
PER_FRAME = 100
BATCHES = 10  # sub-entry batches of BATCH_SIZE messages (half gzip)
BATCH_SIZE = 5


@dataclass
class Three:
    """A three-node cluster as the test sees it: the stream ports, node 0 to lead the
    stream; how to kill node 0; what to print when a wait fails."""

    kind: str
    ports: list[int]
    kill_leader: Callable[[], None]
    diagnose: Callable[[], str]
    ready: Callable[[int], None] = lambda members: None  # that many copies are there
    http: list[str] = field(default_factory=list)  # each node's management API
    notes: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(params=["amqpd", "rabbitmq"])
def three(request: pytest.FixtureRequest, tmp_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Three]:
    if request.param == "amqpd":
        if etcdproc.find_etcd() is None:
            pytest.skip(etcdproc.SKIP_REASON)
        etcd = request.getfixturevalue("etcd")
        with three_nodes(tmp_path, etcd.url, {"AMQPD_STREAM": "1",
                                              "AMQPD_STREAM_PORT": "0"}) as nodes:
            a = nodes[0]
            yield Three("amqpd", [stream_port(n) for n in nodes], a.kill,
                        lambda: diagnose(nodes),
                        ready=lambda members: wait_for(
                            lambda: len(queue_info(a).get("member_offsets", {}))
                            == members, 60, "every member's copy connected",
                            lambda: diagnose(nodes)),
                        http=[n.proc.http_url for n in nodes if n.proc is not None])
        return
    from devtools.rabbitmq import RabbitMQError, RabbitMQNotInstalled, find_server
    from devtools.rabbitmq_cluster import kill_node, start_cluster, stop_cluster

    try:
        find_server()
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    d = tmp_path_factory.mktemp("rabbitmq-stream-cluster")
    try:
        info = start_cluster(d, nodes=3, plugins=["rabbitmq_stream", "rabbitmq_management",
                                                  "rabbitmq_stream_management"])
    except RabbitMQError as exc:
        pytest.skip(f"a 3-node RabbitMQ cluster could not be started here: {exc}")
    try:
        first = info.nodes[0]
        yield Three("rabbitmq", [n.plugin_ports["rabbitmq_stream"] for n in info.nodes],
                    lambda: kill_node(first), lambda: f"RabbitMQ cluster in {d}",
                    http=[f"http://127.0.0.1:{n.plugin_ports['rabbitmq_management']}"
                          for n in info.nodes])
    finally:
        stop_cluster(d)


def _publish(client: Raw, pid: int, ids: range, prefix: str) -> None:
    body = b"".join(struct.pack(">QI", i, len(_body(prefix, i))) + _body(prefix, i)
                    for i in ids)
    client.send(0x02, struct.pack(">Bi", pid, len(ids)) + body, with_corr=False)


def _body(prefix: str, i: int) -> bytes:
    return f"{prefix}{i:05d}".encode()


def _batch_body(i: int, k: int) -> bytes:
    return f"b{i:05d}.{k}".encode()


def _publish_batches(client: Raw, pid: int, ids: range) -> None:
    """One frame of sub-entry batches, as rstream sends them: each id a batch of
    BATCH_SIZE messages, odd ids gzip-compressed."""
    parts = []
    for i in ids:
        data = b"".join(struct.pack(">I", len(m)) + m
                        for m in (_batch_body(i, k) for k in range(BATCH_SIZE)))
        compression = 1 if i % 2 else 0
        packed = gzip.compress(data) if compression else data
        parts.append(struct.pack(">QBHII", i, 0x80 | compression << 4, BATCH_SIZE,
                                 len(data), len(packed)) + packed)
    client.send(0x02, struct.pack(">Bi", pid, len(ids)) + b"".join(parts),
                with_corr=False)


def _records(chunk: bytes) -> list[bytes]:
    """A delivered chunk's messages, simple entries and sub-entry batches alike."""
    fields = CHUNK_HEADER.unpack_from(chunk, 0)
    entries, length = fields[2], fields[8]
    data = chunk[CHUNK_HEADER.size:CHUNK_HEADER.size + length]
    out: list[bytes] = []
    at = 0
    for _ in range(entries):
        if data[at] & 0x80:
            kind, n, _size, size = struct.unpack_from(">BHII", data, at)
            raw = data[at + 11:at + 11 + size]
            if (kind >> 4) & 0x7 == 1:
                raw = gzip.decompress(raw)
            pos = 0
            for _k in range(n):
                (m,) = struct.unpack_from(">I", raw, pos)
                out.append(raw[pos + 4:pos + 4 + m])
                pos += 4 + m
            at += 11 + size
        else:
            (size,) = struct.unpack_from(">I", data, at)
            out.append(data[at + 4:at + 4 + size])
            at += 4 + size
    return out


class Reader(Raw):
    """A subscriber that keeps every message of every chunk (batches too)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.got: list[bytes] = []

    def read(self, count: int, timeout: float) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            self.sock.settimeout(max(0.1, min(1.0, deadline - time.monotonic())))
            try:
                key, rest = self.frame()
            except TimeoutError:
                continue
            if key == 0x08:
                self.got += _records(rest[1:])
                self.sock.sendall(_credit(rest[0]))
            elif key == 0x10:
                self.updates.append(struct.unpack_from(">H", rest)[0])
        return self.got

    def pump(self, timeout: float) -> None:
        """Take what arrives within ``timeout`` seconds (sub-entry batches too)."""
        self.read(len(self.got) + (1 << 30), timeout)


def _credit(sid: int) -> bytes:
    body = struct.pack(">HHBH", 0x09, 1, sid, 1)
    return struct.pack(">I", len(body)) + body


def _create(three: Three, members: int = 3) -> list[int]:
    """The stream, led by node 0, with ``members`` copies; once every node's metadata
    names node 0 and the same replicas: those replicas' stream ports."""
    client = Raw(three.ports[0])
    args = {"initial-cluster-size": str(members)} if members != 3 else {}
    try:
        client.open()
        body = b"".join(_s(k) + _s(v) for k, v in args.items())
        client.send(0x0D, _s(STREAM) + struct.pack(">i", len(args)) + body)
        assert client.response(0x0D)[0] == OK
    finally:
        client.close()
    three.ready(members)
    leader = three.ports[0]

    def known() -> bool:
        answers = {tuple(map(str, topology_at(p, STREAM))) for p in three.ports}
        code, at, replicas = topology_at(leader, STREAM)
        return len(answers) == 1 and (code, at) == (OK, leader) and \
            len(replicas) == members - 1

    wait_for(known, 60, "every node's metadata names node 0 and the same replicas",
             lambda: str([topology_at(p, STREAM) for p in three.ports]) + three.diagnose())
    return topology_at(leader, STREAM)[2]


def _expected() -> list[bytes]:
    out = [_body("m", i) for i in range(MESSAGES)]
    for i in range(MESSAGES, MESSAGES + BATCHES):
        out += [_batch_body(i, k) for k in range(BATCH_SIZE)]
    out += [_body("n", i) for i in range(1, 211)]
    return out


def test_publish_through_a_replicas_node(three: Three) -> None:
    assert _create(three) == sorted(three.ports[1:])
    leader_port, via_port, third_port = three.ports
    pub = Raw(via_port)
    try:
        pub.open()
        # declared at a replica's node, as RabbitMQ 3.10.8 takes it
        assert pub.declare_publisher(1) == OK
        for first in range(0, MESSAGES, PER_FRAME):
            _publish(pub, 1, range(first, first + PER_FRAME), "m")
            if first % 2000 == 0:
                pub.pump(0.05)  # take confirms as they come
        _publish_batches(pub, 1, range(MESSAGES, MESSAGES + BATCHES))
        total = MESSAGES + BATCHES
        got = pub.wait_confirms(total, 120)
        assert sorted(got) == list(range(total)), (len(got), three.diagnose())
        assert not pub.errored

        # a named producer through the same node: ids 1..200, 101..200 again, 201..210
        pub.confirmed.clear()
        assert pub.declare_publisher(2, "producer-r") == OK
        _publish(pub, 2, range(1, 201), "n")
        assert sorted(pub.wait_confirms(200, 60)) == list(range(1, 201)), three.diagnose()
        assert pub.query(QUERY_SEQUENCE, "producer-r") == (OK, 200)
        _publish(pub, 2, range(101, 201), "n")  # re-sent: confirmed, not stored twice
        _publish(pub, 2, range(201, 211), "n")
        got = pub.wait_confirms(310, 60)
        assert sorted(got) == sorted([*range(1, 201), *range(101, 211)]), three.diagnose()
        assert not pub.errored
        assert pub.query(QUERY_SEQUENCE, "producer-r") == (OK, 210)
    finally:
        pub.close()

    third = Raw(third_port)
    try:
        third.open()
        assert third.query(QUERY_SEQUENCE, "producer-r") == (OK, 210)
    finally:
        third.close()

    expected = _expected()
    for port in (leader_port, third_port):
        reader = Reader(port)
        try:
            reader.open()
            assert reader.subscribe(1, FIRST) == OK
            got_records = reader.read(len(expected), 120)
            # let anything beyond arrive: nothing may
            reader.read(len(expected) + 1, 2.0)
            assert len(reader.got) == len(expected), (port, len(reader.got))
            assert reader.got == expected, (port, [
                (i, a, b) for i, (a, b) in enumerate(zip(got_records, expected, strict=False))
                if a != b][:3])
        finally:
            reader.close()

    _leader_lost(three)


def test_publish_through_a_node_without_a_copy(three: Three) -> None:
    """A two-member stream; the third node, which holds no copy, takes the publisher
    and its 1,000 messages reach the leader and the replica, in order."""
    (replica,) = _create(three, members=2)
    leader = three.ports[0]
    (bare,) = set(three.ports) - {leader, replica}
    pub = Raw(bare)
    try:
        pub.open()
        assert pub.declare_publisher(1, "producer-b") == OK
        for first in range(1, 1001, PER_FRAME):
            _publish(pub, 1, range(first, first + PER_FRAME), "m")
        got = pub.wait_confirms(1000, 60)
        assert sorted(got) == list(range(1, 1001)), three.diagnose()
        assert pub.query(QUERY_SEQUENCE, "producer-b") == (OK, 1000)
    finally:
        pub.close()
    expected = [_body("m", i) for i in range(1, 1001)]
    for port in (leader, replica):
        reader = Reader(port)
        try:
            reader.open()
            assert reader.subscribe(1, FIRST) == OK
            assert reader.read(len(expected), 60) == expected, port
        finally:
            reader.close()


def _leader_lost(three: Three) -> None:
    """The leader's node dies while a publisher on a replica's node publishes: what
    the client gets is recorded (docs/streams.md), the common rule checked."""
    pub = Raw(three.ports[1])
    pub.open()
    assert pub.declare_publisher(3) == OK
    sent = 0
    ended = ""
    late = range(0)
    try:
        for first in range(0, 2000, PER_FRAME):
            _publish(pub, 3, range(first, first + PER_FRAME), "x")
            sent = first + PER_FRAME
        three.kill_leader()  # with publishes in flight (none read back yet)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not pub.updates and \
                len(pub.confirmed) + len(pub.errored) < sent:
            try:
                if sent < 4000:  # publishing goes on meanwhile
                    _publish(pub, 3, range(sent, sent + PER_FRAME), "x")
                    sent += PER_FRAME
                pub.pump(0.5)
            except (OSError, EOFError) as exc:
                ended = repr(exc)
                break
        try:
            pub.pump(3.0)  # what follows the first sign
            if not ended:  # and a publish after it
                _publish(pub, 3, range(sent, sent + 10), "x")
                late = range(sent, sent + 10)
                sent += 10
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and not set(late) <= set(
                        pub.confirmed + pub.errored):
                    pub.pump(0.5)
        except (OSError, EOFError) as exc:
            ended = ended or repr(exc)
    finally:
        pub.close()
    codes = dict(zip(pub.errored, pub.error_codes, strict=True))
    answered = pub.confirmed + pub.errored
    outcome = {"broker": three.kind, "sent": sent, "confirmed": len(pub.confirmed),
               "errored": len(pub.errored), "error_codes": sorted(set(pub.error_codes)),
               "metadata_updates": pub.updates,
               "connection_ended": ended,
               "unanswered": sent - len(set(answered)),
               "after_the_update": sorted({codes.get(i, 0) for i in late}) if late else []}
    out = os.environ.get("STREAM_LEADER_LOSS_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(outcome) + "\n")
    print(outcome)
    assert len(answered) == len(set(answered)), "an id answered twice"
    assert set(answered) <= set(range(sent))
    assert pub.updates or pub.errored or ended, outcome
    if pub.updates and not ended:
        # the publisher is gone with the leader (both brokers): 0x12 for what follows
        assert outcome["after_the_update"] == [0x12], outcome


def _get(base: str, path: str) -> Any:
    req = urllib.request.Request(base + path, headers={
        "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _publishers(three: Three, node: int, reference: str, count: int) -> dict[str, Any]:
    """Publisher ``reference``'s entry in node ``node``'s /api/stream/publishers once
    it shows ``count`` ids confirmed (RabbitMQ's figures come every 5 s), checked
    equal to the same entry in its connection's publishers."""
    found: dict[str, Any] = {}

    def shown() -> bool:
        found.clear()
        for x in _get(three.http[node], "/api/stream/publishers"):
            if x["reference"] == reference and x["queue"]["name"] == STREAM:
                found.update(x)
        return found.get("confirmed") == count

    wait_for(shown, 60, f"publisher {reference!r} with {count} confirmed in the API",
             lambda: f"{found} {three.diagnose()}")
    conn = urllib.parse.quote(found["connection_details"]["name"], safe="")
    per_conn = _get(three.http[node], f"/api/stream/connections/%2F/{conn}/publishers")
    assert [x for x in per_conn if x["reference"] == reference] == [found]
    return found


def _publish_three_ways(pub: Raw, pid: int) -> None:
    """Ids 1..200, 101..200 again, sub-entry batches 201..203: 303 ids confirmed."""
    _publish(pub, pid, range(1, 201), "n")
    _publish(pub, pid, range(101, 201), "n")
    _publish_batches(pub, pid, range(201, 204))


def test_forwarded_publishers_in_the_api_and_a_deleted_stream_told_at_once(
        three: Three) -> None:
    _create(three)
    leader, via, _third = three.ports
    forwarded, local, deleter = Raw(via), Raw(leader), Raw(leader)
    readers = [Reader(port) for port in three.ports]
    clients = [forwarded, local, deleter, *readers]
    try:
        for client in clients:
            client.open()
        assert forwarded.declare_publisher(1, "producer-f") == OK
        assert forwarded.declare_publisher(2) == OK
        assert local.declare_publisher(1, "producer-l") == OK
        _publish_three_ways(forwarded, 1)
        _publish(forwarded, 2, range(50), "u")
        _publish_three_ways(local, 1)
        assert len(forwarded.wait_confirms(353, 60)) == 353, three.diagnose()
        assert len(local.wait_confirms(303, 60)) == 303, three.diagnose()
        assert not forwarded.errored and not local.errored

        entries = {"producer-f": _publishers(three, 1, "producer-f", 303),
                   "": _publishers(three, 1, "", 50),
                   "producer-l": _publishers(three, 0, "producer-l", 303)}
        for ref, x in entries.items():
            sent = 50 if ref == "" else 303
            assert (x["published"], x["confirmed"], x["errored"]) == (sent, sent, 0), x
            if three.kind == "amqpd":  # amqpd's own fields (RabbitMQ has none)
                assert x["last_publishing_id"] == (49 if ref == "" else 203), x
                assert x["confirmed_publishing_id"] == (None if ref == "" else 203), x
            else:
                assert "last_publishing_id" not in x, x
                assert "confirmed_publishing_id" not in x, x

        for reader in readers:
            assert reader.subscribe(1, FIRST) == OK
        for reader in readers:
            reader.read(1, 30)
        assert all(reader.got for reader in readers), three.diagnose()

        deleter.send(0x0E, _s(STREAM))
        assert deleter.response(0x0E)[0] == OK
        told = [forwarded, local, *readers]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(c.updates for c in told):
            for client in told:
                client.pump(0.1)
        for client in clients:
            client.pump(1.0)  # anything beyond the first notice
        # one notice per connection (the forwarded publishers' without publishing), none
        # for the connection that only deleted the stream
        assert [c.updates for c in told] == [[NOT_AVAILABLE]] * len(told), (
            [c.updates for c in told], three.diagnose())
        assert deleter.updates == []
        assert not forwarded.errored  # nothing was left unanswered

        for pub in (forwarded, local):  # the publishers are gone with the stream
            _publish(pub, 1, range(300, 301), "z")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not pub.errored:
                pub.pump(0.2)
            assert list(zip(pub.errored, pub.error_codes, strict=True)) == [(300, 0x12)]
    finally:
        for client in clients:
            client.close()
