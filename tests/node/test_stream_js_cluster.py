"""rabbitmq-stream-js-client (npm, 0.4.2) unchanged against a three-node amqpd cluster
(issue 31), driven through tests/node/stream_js_cluster_check.js.

The nodes listen on 127.0.0.1, 127.0.0.2 and 127.0.0.3, so each advertises its own
host in metadata and open, as nodes on separate machines do: the client keys its
cached connections by stream and host alone (ConnectionPool.getCacheKey, one pool for
every client of the process), so with every node on 127.0.0.1 the new publisher after
the failover is handed the dead leader's cached connection (tried: its declare fails
with ERR_STREAM_DESTROYED).

* The client creates a stream through node-a (which leads it); the metadata names the
  leader and both replicas; its publisher goes to the leader (the open's
  advertised host and port say which node it reached) and n messages are confirmed.
* Its consumer from ``first`` lands on a replica's node and gets the n messages once
  each, in order; the offset it stores there is read back by a client on a node that
  does not lead the stream, and a consumer from the offset after it gets the rest.
* With k/2 more messages confirmed and k/2 in flight, node-a is killed (-9). 0.4.2
  does not reconnect: the publisher's connection closes and the client leaves it at
  that; the consumer on the surviving replica is ended by the broker's metadata-update
  (as RabbitMQ ends a subscription whose member restarts for a new leader), and the
  client's unsubscribe after it gets 0x04 (RabbitMQ's answer too), which the client
  throws from an event listener: an unhandled rejection that ends a Node process
  without a handler for it. What a user does instead: a new client on a surviving
  node declares the named producer again (the client connects to the new leader the
  metadata names), asks its last publishing id (at least every id confirmed before
  the kill) and re-sends every id not confirmed with its own id (those the new leader
  holds are confirmed and not stored again).
* A new process (an application started again, since 0.4.2's pool would hand a new
  client's consumer the old client's connection) on the surviving replica's node
  reads ids 1..n+k from ``first``, once each and in order, queries the stored offset,
  and deletes the stream there (a node not leading it: 0x02 before amqpd's fix).

Not run against RabbitMQ: no RabbitMQ cluster here, and 0.4.2 does not work with the
local 3.10.8 at all (tests/node/test_stream_js.py says why).
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    diagnose,
    new_prefix,
    private_etcd,
    wait_formed,
)
from tests.support import etcdproc

HERE = Path(__file__).parent
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
N, K = 300, 200  # messages before the kill, and sent right before it

pytestmark = [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
              pytest.mark.timeout(180)]


def _loopback_aliases() -> bool:
    """127.0.0.2 and .3 can be bound (Linux routes all of 127/8 to loopback; macOS
    has only 127.0.0.1 unless aliases are added)."""
    for host in HOSTS[1:]:
        try:
            with socket.socket() as s:
                s.bind((host, 0))
        except OSError:
            return False
    return True


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[ClusterNode]]:
    """node-a, node-b and node-c on 127.0.0.1, .2 and .3 with the stream listener on."""
    if not _loopback_aliases():
        pytest.skip("127.0.0.2/127.0.0.3 cannot be bound here (the nodes need a host each)")
    env = {"AMQPD_STREAM": "1", "AMQPD_STREAM_PORT": "0"}
    with private_etcd(tmp_path) as etcd:
        prefix = new_prefix()
        started: list[ClusterNode] = []
        try:
            for name, host in zip("abc", HOSTS, strict=True):
                started.append(ClusterNode(f"node-{name}", tmp_path / name, etcd.url, prefix,
                                           bind=host, extra_env=dict(env)).start())
            wait_formed(started)
            yield started
        finally:
            for n in started:
                n.stop()


def endpoint(node: ClusterNode) -> dict[str, Any]:
    assert node.proc is not None
    return {"host": node.bind, "port": int(node.proc.info["stream_port"])}


class Script:
    """The node script as a child process: its JSON lines as events, a line to its stdin."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            ["node", str(HERE / "stream_js_cluster_check.js"), json.dumps(config)], cwd=HERE,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def event(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {name!r} from the script within {timeout}s: "
                                     f"{self.stderr()}") from None
            if line is None:
                raise AssertionError(f"the script ended before {name!r}: {self.stderr()}")
            got: dict[str, Any] = json.loads(line)
            assert got["event"] == name, got
            return got

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def test_js_client_on_a_cluster_and_across_a_leader_kill(
        node_modules: Path, cluster: list[ClusterNode]) -> None:
    a, b, c = cluster
    ends = [endpoint(n) for n in cluster]
    script = Script({"nodes": ends, "stream": "js-cluster", "n": N, "k": K})
    try:
        md = script.event("metadata", 30)
        assert md["leader"] == {**ends[0], "reference": md["leader"]["reference"]}, md
        assert sorted((r["host"], r["port"]) for r in md["replicas"]) == \
            [(e["host"], e["port"]) for e in ends[1:]], md

        published = script.event("published", 30)
        assert published["publisher"] == ends[0], published  # the leader
        assert published["confirmed"] == N and not published["errored"], published

        consumed = script.event("consumed", 60)
        assert consumed["firstAt"] in ends[1:], consumed  # a replica's node
        assert consumed["first"] == [f"m{i}" for i in range(1, N + 1)]
        assert consumed["queriedAt"] in ends[1:]
        assert consumed["queried"] == N // 2 - 1
        assert consumed["fromConsumer"] == N // 2 - 1
        assert consumed["resumedAt"] in ends[1:]
        assert consumed["resumed"] == [f"m{i}" for i in range(N // 2 + 1, N + 1)]

        killing = script.event("kill-now", 30)
        a.kill()
        script.say("killed")
        rec = script.event("recovered", 90)
    finally:
        script.close()
    survivors = ends[1:]
    new_leader = {"host": rec["newLeader"]["host"], "port": rec["newLeader"]["port"]}
    assert new_leader in survivors, rec["newLeader"]
    assert rec["publisherAt"] == new_leader, rec
    # 0.4.2 by itself: the publisher's connection closes and stays closed; the consumer
    # on a surviving node is ended by the broker's metadata-update (RabbitMQ ends a
    # subscription whose member restarts for a new leader alike), and the client's
    # unsubscribe after it is answered 0x04 (RabbitMQ's answer for an ended one)
    assert rec["publisherClosed"], rec
    assert rec["firstClosed"] == [False], rec
    assert any("code 4" in r for r in rec["rejections"]), rec["rejections"]
    # nothing confirmed is lost: the new leader's sequence covers every confirm
    assert rec["confirmedBeforeKill"] >= killing["confirmed"] >= N + K // 2
    assert rec["sequence"] >= rec["maxConfirmedBeforeKill"], rec
    assert rec["confirmedAgain"] == rec["resent"] and not rec["erroredAgain"], rec
    assert rec["sequenceAfter"] == N + K, rec

    follower = next(e for e in survivors if e != new_leader)
    replay = Script({"phase": "replay", "nodes": [follower, new_leader], "stream": "js-cluster",
                     "n": N, "k": K})
    try:
        got = replay.event("replayed", 60)
    finally:
        replay.close()
    assert got["replay"] == list(range(1, N + K + 1)), (
        len(got["replay"]), got["replay"][N - 5:N + 5], diagnose([b, c]))
    assert got["replayAt"] == follower  # the one replica left
    assert got["queried"] == N // 2 - 1
    # deleted through the node that does not lead it (0x02 there before the fix)
    assert got["deleted"] is True and got["metadataAfterDelete"] == 0x02
    print(rec)  # what the client did, for the log (-s)
