"""A node claims a queue's leadership only once etcd's record confirms it (issue 28).

An ``ha-mode: all`` queue led by one node; its leader is stopped (SIGSTOP) until a
mirror has been promoted, then woken: from its first answer on, its ``/api/queues``
must not list itself as the queue's leader (``node`` itself, ``state`` not ``down``)
while another node leads it. Then the new leader is killed (kill -9) and, once another
mirror leads, started again, its HTTP API polled from the moment it listens: the same.
Before the fix the woken node claimed the queue for 0.2-1.9 s, the restarted one for
0.3-0.6 s (two leaders in the chaos test's sampling, seed 7).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from bench.loadgen import Conn
from devtools.rabbitmq import free_ports
from tests.integration._http import Api
from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    diagnose,
    new_prefix,
    wait_for,
    wait_formed,
)
from tests.support import etcdproc, netns
from tests.support.etcdproc import EtcdProcess
from tests.support.tcpproxy import TcpProxy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

QUEUE = "claim.q"
WATCH = 5.0  # seconds a woken or restarted node is watched for a false claim


def _leader(node: ClusterNode) -> str | None:
    r = node.api.get(f"/api/queues/%2F/{QUEUE}")
    return str(r.json().get("node")) if r.status == 200 else None


class ClaimWatch(threading.Thread):
    """Polls ``api``'s /api/queues until stopped: every answer in which the node
    lists itself as the queue's leader (and not down), with its time."""

    def __init__(self, api: Api, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.name = api, name
        self.answers = 0
        self.claims: list[float] = []
        self.started_at = time.monotonic()
        self.halt = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while not self.halt.is_set() and time.monotonic() < deadline:
            try:
                r = self.api.get("/api/queues/%2F?columns=name,node,state")
            except OSError:
                time.sleep(0.01)
                continue
            if r.status == 200:
                self.answers += 1
                for q in r.json():
                    if q["name"] == QUEUE and q.get("node") == self.name \
                            and q.get("state") != "down":
                        self.claims.append(time.monotonic() - self.started_at)
            time.sleep(0.01)


def _declare(a: ClusterNode, kind: str) -> None:
    """The queue on node-a (mirrored: under an ha-all policy, put first), with a few
    confirmed messages: every member or mirror holds a copy of the queue then."""
    if kind == "mirrored":
        r = a.api.put("/api/policies/%2F/ha-all", {
            "pattern": "^claim\\.", "apply-to": "queues", "definition": {"ha-mode": "all"}})
        assert r.status in (201, 204), r.text
    conn = Conn(a.url)
    conn.declare_queue(conn.open_channel(1), QUEUE, durable=True,
                       arguments={"x-queue-type": "quorum"} if kind == "quorum" else None)
    conn.close()
    pub = ConfirmPublisher(a.url, QUEUE, batch=10)
    pub.publish_range(0, 10)
    assert pub.confirmed == set(range(10)), pub.nacked
    pub.conn.close()


@pytest.mark.parametrize("kind", ["mirrored", "quorum"])
def test_a_woken_or_restarted_leader_does_not_claim(tmp_path: Path, etcd: EtcdProcess,
                                                    kind: str) -> None:
    prefix = new_prefix()
    nodes: list[ClusterNode] = []
    try:
        for name in ("a", "b", "c"):
            (http_port,) = free_ports(1)
            nodes.append(ClusterNode(f"node-{name}", tmp_path / name, etcd.url, prefix,
                                     extra_env={"AMQPD_HTTP_PORT": str(http_port)}).start())
        wait_formed(nodes)
        a = nodes[0]
        _declare(a, kind)
        wait_for(lambda: all(_leader(n) == a.name for n in nodes), 20,
                 "every node sees node-a lead the queue", lambda: diagnose(nodes))

        # --- SIGSTOP of the leader until another node leads, then SIGCONT
        assert a.proc is not None and a.proc.proc is not None
        pid = a.proc.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _leader(nodes[1]) not in (None, a.name), 60,
                     "a mirror promoted while node-a is stopped", lambda: diagnose(nodes))
        finally:
            watch = ClaimWatch(a.api, a.name)
            watch.start()
            os.kill(pid, signal.SIGCONT)
        new = _leader(nodes[1])
        wait_for(lambda: _leader(a) == new, 20, f"node-a sees {new} lead the queue",
                 lambda: diagnose(nodes))
        time.sleep(0)  # (the watch runs on; stopped below)
        wait_for(lambda: time.monotonic() - watch.started_at > WATCH, WATCH + 1, "watch")
        watch.halt.set()
        watch.join(5)
        assert watch.answers > 0
        assert not watch.claims, (
            f"woken node-a claimed {QUEUE} while {new} led it, at {watch.claims[:5]} s "
            f"after SIGCONT\n{diagnose(nodes)}")

        # --- kill -9 of the new leader, restart it once another mirror leads
        leader = next(n for n in nodes if n.name == new)
        others = [n for n in nodes if n is not leader]
        leader.kill()
        wait_for(lambda: _leader(others[0]) not in (None, leader.name), 60,
                 f"a mirror promoted after {leader.name}'s kill", lambda: diagnose(others))
        assert leader.proc is not None
        watch = ClaimWatch(Api(f"http://127.0.0.1:{leader.extra_env['AMQPD_HTTP_PORT']}"),
                           leader.name)
        watch.start()
        leader.start()
        wait_for(lambda: watch.answers > 0 and _leader(leader) == _leader(others[0]), 30,
                 "the restarted node sees the new leader", lambda: diagnose(nodes))
        first_answer = time.monotonic()
        wait_for(lambda: time.monotonic() - first_answer > WATCH, WATCH + 1, "watch")
        watch.halt.set()
        watch.join(5)
        assert not watch.claims, (
            f"restarted {leader.name} claimed {QUEUE} while {_leader(others[0])} led it, "
            f"at {watch.claims[:5]} s\n{diagnose(nodes)}")
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.parametrize("kind", ["mirrored", "quorum"])
def test_a_leader_back_from_a_partition_does_not_claim(tmp_path: Path, etcd: EtcdProcess,
                                                       kind: str) -> None:
    """The same, for a leader cut off through its network namespace (its etcd, its
    heartbeats and its links at once) until another node leads the queue, then healed:
    polled from the host from the heal on, it must not list itself as the leader. CI
    saw a quorum queue listed by two nodes 1.3 s after such a heal (test_chaos's
    namespace seed): the listing named this node's own GroupLeading, kept until the
    next reconciliation, instead of etcd's record."""
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"partitions through network namespaces: {why}")
    prefix = new_prefix()
    nodes: list[ClusterNode] = []
    with netns.lab() as lab:
        bridge = TcpProxy("127.0.0.1", etcd.client_port, host=lab.host_address).start()
        try:
            for name in ("a", "b", "c"):
                nodes.append(ClusterNode(
                    f"node-{name}", tmp_path / name, f"http://{bridge.host}:{bridge.port}",
                    prefix, member=lab.add(f"node-{name}")).start())
            wait_formed(nodes)
            a = nodes[0]
            _declare(a, kind)
            wait_for(lambda: all(_leader(n) == a.name for n in nodes), 20,
                     "every node sees node-a lead the queue", lambda: diagnose(nodes))
            lab.cut(a.name)
            try:
                wait_for(lambda: _leader(nodes[1]) not in (None, a.name), 60,
                         "another node leads while node-a is cut off",
                         lambda: diagnose(nodes[1:]))
            finally:
                watch = ClaimWatch(a.api, a.name)
                watch.start()
                lab.restore(a.name)
            new = _leader(nodes[1])
            wait_for(lambda: watch.answers > 0 and _leader(a) == new, 30,
                     f"node-a sees {new} lead the queue", lambda: diagnose(nodes))
            first_answer = time.monotonic()
            wait_for(lambda: time.monotonic() - first_answer > WATCH, WATCH + 1, "watch")
            watch.halt.set()
            watch.join(5)
            assert not watch.claims, (
                f"node-a, back from its partition, claimed {QUEUE} while {new} led it, "
                f"at {watch.claims[:5]} s after the heal\n{diagnose(nodes)}")
        finally:
            for n in nodes:
                n.stop()
            bridge.stop()
