"""Cluster nodes for integration tests: real amqpd processes with ``[cluster]`` set,
sharing one private etcd (tests/support/etcdproc.py) on loopback, each test under its
own etcd prefix. Optionally each node's etcd traffic goes through a TCP proxy and its
inbound heartbeats through a UDP relay, so a test can cut one node off (a partition).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess
from tests.support.etcdproc import EtcdProcess
from tests.support.tcpproxy import TcpProxy
from tests.support.udpproxy import UdpRelay

COOKIE = "cluster-test-cookie"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def new_prefix() -> str:
    return f"/amqpd-test/{uuid.uuid4().hex[:8]}"


@dataclass
class ClusterNode:
    name: str
    data_dir: Path
    etcd_url: str
    prefix: str
    cluster: str = "c1"
    partition_handling: str = "pause_minority"
    lease_ttl: float = 5.0
    # 3 s, not the product's 1 s: on a loaded CI machine (several brokers per xdist
    # worker, 2 cores) a busy node's event loop lags by a second at times, its heartbeats
    # arrive late and the others would fail it over although it runs (seen: a spurious
    # quorum election during a catch-up, CI 2026-12-02). Its own lag is excused by its
    # LoopClock; the others' view of it is what this covers. A test of detection speed
    # sets AMQPD_CLUSTER_HEARTBEAT_TIMEOUT in extra_env.
    heartbeat_timeout: float = 3.0
    # the partition test's controls: etcd reached through a proxy, heartbeats to this
    # node through a relay
    etcd_proxy: TcpProxy | None = None
    relay: UdpRelay | None = None
    hb_port: int = field(default_factory=free_udp_port)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. AMQPD_PLUGINS
    proc: BrokerProcess | None = None

    def start(self) -> ClusterNode:
        etcd = self.etcd_url
        if self.etcd_proxy is not None:
            etcd = f"http://127.0.0.1:{self.etcd_proxy.port}"
        env = {"AMQPD_NODE_NAME": self.name, "AMQPD_CLUSTER": self.cluster,
               "AMQPD_CLUSTER_ETCD": etcd, "AMQPD_CLUSTER_ETCD_PREFIX": self.prefix,
               "AMQPD_CLUSTER_COOKIE": COOKIE,
               "AMQPD_CLUSTER_PARTITION_HANDLING": self.partition_handling,
               "AMQPD_CLUSTER_LEASE_TTL": str(self.lease_ttl),
               "AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": str(self.heartbeat_timeout),
               "AMQPD_CLUSTER_HEARTBEAT_LISTEN": f"127.0.0.1:{self.hb_port}"}
        if self.relay is not None:
            env["AMQPD_CLUSTER_HEARTBEAT_ADVERTISE"] = self.relay.addr
        env.update(self.extra_env)
        if self.proc is None:
            self.proc = BrokerProcess(self.data_dir, env=env)
        else:
            self.proc.env = env
        self.proc.start(timeout=30)
        return self

    @property
    def url(self) -> str:
        assert self.proc is not None
        return self.proc.url

    @property
    def api(self) -> Api:
        assert self.proc is not None
        return Api(self.proc.http_url)

    def status(self) -> dict[str, Any]:
        r = self.api.get("/api/cluster/status")
        assert r.status == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``amqpctl --url <this node> ...``"""
        assert self.proc is not None
        out = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", self.proc.http_url,
                              *args], capture_output=True, text=True, timeout=30, check=False)
        if check:
            assert out.returncode == 0, out.stdout + out.stderr
        return out

    def ctl_json(self, *args: str) -> Any:
        return json.loads(self.ctl("--json", *args).stdout)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def tail(self) -> str:
        return self.proc.tail(60) if self.proc is not None else ""


def wait_for(cond: Callable[[], bool], timeout: float, what: str,
             diagnose: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except (OSError, AssertionError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}\n{diagnose()}")
        time.sleep(0.05)


def wait_formed(nodes: list[ClusterNode], timeout: float = 30.0) -> None:
    """Every node sees every node running, and none is paused."""
    names = sorted(n.name for n in nodes)

    def formed() -> bool:
        for n in nodes:
            s = n.status()
            if s["running_nodes"] != names or s["paused"]:
                return False
        return True

    wait_for(formed, timeout, f"cluster of {names} formed",
             lambda: "\n".join(f"--- {n.name}\n{n.tail()}" for n in nodes))


@contextlib.contextmanager
def private_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A private etcd under ``tmp_path``, killed (by its PID) on the way out."""
    proc = EtcdProcess(tmp_path / "etcd").start()
    try:
        yield proc
    finally:
        proc.kill()


@contextlib.contextmanager
def three_nodes(tmp_path: Path, etcd_url: str, extra_env: dict[str, str] | None = None,
                lease_ttl: float = 5.0) -> Iterator[list[ClusterNode]]:
    """node-a, node-b and node-c under a fresh prefix, formed; every one started is stopped
    on the way out, even when a later one failed to start. ``extra_env``: settings every
    node gets (e.g. a longer heartbeat timeout)."""
    prefix = new_prefix()
    started: list[ClusterNode] = []
    try:
        for name in ("a", "b", "c"):
            started.append(ClusterNode(f"node-{name}", tmp_path / name, etcd_url, prefix,
                                       lease_ttl=lease_ttl,
                                       extra_env=dict(extra_env or {})).start())
        wait_formed(started)
        yield started
    finally:
        for n in started:
            n.stop()
