"""The management API's lists of a three-node cluster are the whole cluster's on any
node (issue 31; RabbitMQ 3.10 lists every node's connections, channels and consumers on
any node, each naming its ``node``).

Three nodes with the stream listener on (ephemeral ports), etcd on loopback. A
heartbeat timeout and lease longer than the test keep a stopped node counted running,
so the list must bound its wait for it (``cluster.list_timeout``, 1 s here) instead of
skipping a node the view already counts down.

* An AMQP connection with a channel and a consumer on node-a, another on node-b, and a
  stream-protocol connection on node-b: node-c lists both connections, both channels,
  both consumers (``channel_details.node``) and the stream connection, each with its
  node; the per-vhost forms too; paging, sorting and ``columns`` apply to the merged
  list; one connection of node-b is shown by node-c; ``amqpctl list_connections``
  against node-c prints both.
* ``DELETE /api/connections/{name}`` on node-c closes node-a's connection: its client
  gets connection.close 320 with the reason given.
* node-b stopped with SIGSTOP: node-c's list answers within a few seconds with
  node-a's connection and without node-b's, and node-c's log names node-b as left
  out; once node-b resumes its connection is listed again; node-b killed: left out
  again, at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration._http import q
from tests.integration.cluster_support import ClusterNode, diagnose, three_nodes, wait_for
from tests.integration.test_stream_protocol import RawClient
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
              pytest.mark.timeout(300)]


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    env = {"AMQPD_STREAM": "1", "AMQPD_STREAM_PORT": "0",
           "AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "60", "AMQPD_CLUSTER_LIST_TIMEOUT": "1"}
    with three_nodes(tmp_path, etcd.url, env, lease_ttl=60.0) as started:
        yield started


class Client:
    """A pika connection named ``name`` with one channel consuming from an exclusive
    queue of its own."""

    def __init__(self, node: ClusterNode, name: str) -> None:
        assert node.proc is not None
        params = pika.ConnectionParameters(
            host="127.0.0.1", port=node.proc.port,
            credentials=pika.PlainCredentials("guest", "guest"),
            client_properties={"connection_name": name})
        self.conn = pika.BlockingConnection(params)
        self.channel = self.conn.channel()
        queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.tag = self.channel.basic_consume(queue, lambda *a: None, auto_ack=True)

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


def _named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [i for i in items if i.get("user_provided_name") == name]
    assert len(found) == 1, items
    return found[0]


def _stream_port(node: ClusterNode) -> int:
    assert node.proc is not None
    return int(node.proc.info["stream_port"])


def test_every_node_lists_the_whole_cluster(nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    on_a, on_b = Client(a, "on-a"), Client(b, "on-b")
    stream = RawClient(_stream_port(b))
    try:
        stream.open()
        api = c.api
        conns = api.get("/api/connections").json()
        assert sorted(i["node"] for i in conns) == ["node-a", "node-b"], conns
        assert _named(conns, "on-a")["node"] == "node-a"
        assert _named(conns, "on-b")["node"] == "node-b"
        assert sorted(i["node"] for i in api.get(f"/api/vhosts/{q('/')}/connections")
                      .json()) == ["node-a", "node-b"]
        channels = api.get("/api/channels").json()
        assert sorted((i["node"], i["connection_details"]["name"]) for i in channels) == \
            sorted((i["node"], i["name"]) for i in conns)
        assert len(api.get(f"/api/vhosts/{q('/')}/channels").json()) == 2
        consumers = api.get("/api/consumers").json()
        assert sorted((i["channel_details"]["node"], i["consumer_tag"])
                      for i in consumers) == sorted([("node-a", on_a.tag),
                                                     ("node-b", on_b.tag)])
        assert len(api.get(f"/api/consumers/{q('/')}").json()) == 2
        # the list options apply to the merged list
        page = api.get("/api/connections?page=1&page_size=1&sort=node&sort_reverse=true"
                       "&columns=name,node").json()
        assert page["total_count"] == 2 and page["filtered_count"] == 2
        assert page["items"] == [{"name": _named(conns, "on-b")["name"], "node": "node-b"}]
        b_name = _named(conns, "on-b")["name"]
        one = api.get(f"/api/connections/{q(b_name)}")
        assert one.status == 200 and one.json()["node"] == "node-b"
        assert one.json()["user_provided_name"] == "on-b"
        assert len(api.get(f"/api/connections/{q(b_name)}/channels").json()) == 1
        chan = f"{b_name} (1)"
        assert api.get(f"/api/channels/{q(chan)}").json()["node"] == "node-b"
        assert api.get(f"/api/connections/{q('no such connection')}").status == 404
        # the stream protocol's connections
        streams = api.get("/api/stream/connections").json()
        assert [s["node"] for s in streams] == ["node-b"], streams
        s_one = api.get(f"/api/stream/connections/{q('/')}/{q(streams[0]['name'])}")
        assert s_one.status == 200 and s_one.json()["node"] == "node-b"
        # amqpctl against node-c: the same lists
        out = c.ctl("list_connections", "node", "client_properties").stdout
        assert "node-a" in out and "node-b" in out and "on-a" in out and "on-b" in out, out
        # node-a and node-b list the same connections
        for other in (a, b):
            assert sorted(i["name"] for i in other.api.get("/api/connections").json()) == \
                sorted(i["name"] for i in conns)
    finally:
        stream.close()
        on_a.close()
        on_b.close()


def test_closing_a_connection_through_another_node(nodes: list[ClusterNode]) -> None:
    a, _b, c = nodes
    on_a = Client(a, "closed-from-c")
    try:
        name = _named(c.api.get("/api/connections").json(), "closed-from-c")["name"]
        r = c.api.delete(f"/api/connections/{q(name)}", headers={"X-Reason": "go away"})
        assert r.status == 204, r.text
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                on_a.conn.process_data_events(time_limit=0.2)
        assert closed.value.reply_code == 320
        assert "go away" in closed.value.reply_text
        wait_for(lambda: all(i.get("user_provided_name") != "closed-from-c"
                             for i in c.api.get("/api/connections").json()), 10,
                 "the closed connection gone from node-c's list")
        assert c.api.delete(f"/api/connections/{q(name)}").status == 404
    finally:
        on_a.close()


def test_a_stopped_node_does_not_hang_the_list(nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    on_a, on_b = Client(a, "stays"), Client(b, "stopped")
    assert b.proc is not None and b.proc.proc is not None
    pid = b.proc.proc.pid
    try:
        wait_for(lambda: len(c.api.get("/api/connections").json()) == 2, 10,
                 "both connections listed", lambda: diagnose(nodes))
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            got = c.api.get("/api/connections")
            took = time.monotonic() - started
            assert got.status == 200, got.text
            assert [i["user_provided_name"] for i in got.json()] == ["stays"], got.json()
            assert took < 10, took  # the list's bound is cluster.list_timeout (1 s)
            consumers = c.api.get("/api/consumers").json()
            assert [i["channel_details"]["node"] for i in consumers] == ["node-a"]
            assert c.proc is not None
            log_path = c.proc.log_path
            wait_for(lambda: "node node-b left out" in log_path.read_text(errors="replace"),
                     10, "node-c's log names node-b left out")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: len(c.api.get("/api/connections").json()) == 2, 20,
                 "node-b's connection listed again", lambda: diagnose(nodes))
        # killed (its links close; the view still counts it running): left out at once
        b.kill()
        started = time.monotonic()
        got = c.api.get("/api/connections")
        assert got.status == 200, got.text
        assert [i["user_provided_name"] for i in got.json()] == ["stays"], got.json()
        assert time.monotonic() - started < 10
    finally:
        on_a.close()
        with contextlib.suppress(pika.exceptions.AMQPError):
            on_b.close()  # its node was killed
