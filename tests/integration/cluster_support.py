"""Cluster nodes for integration tests: real amqpd processes with ``[cluster]`` set,
sharing one private etcd (tests/support/etcdproc.py) on loopback, each test under its
own etcd prefix. Optionally each node's etcd traffic goes through a TCP proxy and its
inbound heartbeats through a UDP relay, so a test can cut one node off (a partition).
Also the clients the queue failover tests share (mirrored and quorum queues): a publisher
with confirms, a consumer thread, and the kill-in-the-middle publishing loop.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header

from bench.loadgen import Conn, ProtocolError
from devtools.rabbitmq import free_ports
from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess
from tests.support.etcdproc import EtcdProcess
from tests.support.netns import Member
from tests.support.tcpproxy import TcpProxy
from tests.support.udpproxy import UdpRelay

COOKIE = "cluster-test-cookie"


def free_udp_port() -> int:
    """A UDP port for a node's heartbeats, kept across its restarts: outside the kernel's
    ephemeral range, so no other socket is handed it while the node is down."""
    return free_ports(1, socket.SOCK_DGRAM)[0]


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
    # run inside this network namespace (tests/support/netns.py), listening on its
    # address; ``etcd_url`` must then be reachable from there (the lab's bridge)
    member: Member | None = None
    # the loopback address the node listens on (AMQP, HTTP, stream, heartbeats): nodes
    # on 127.0.0.1, .2 and .3 are told apart by host, as on separate machines
    bind: str = "127.0.0.1"
    proc: BrokerProcess | None = None

    def start(self) -> ClusterNode:
        etcd = self.etcd_url
        if self.etcd_proxy is not None:
            etcd = f"http://{self.etcd_proxy.host}:{self.etcd_proxy.port}"
        host = self.member.address if self.member is not None else self.bind
        env = {"AMQPD_NODE_NAME": self.name, "AMQPD_CLUSTER": self.cluster,
               "AMQPD_CLUSTER_ETCD": etcd, "AMQPD_CLUSTER_ETCD_PREFIX": self.prefix,
               "AMQPD_CLUSTER_COOKIE": COOKIE,
               "AMQPD_CLUSTER_PARTITION_HANDLING": self.partition_handling,
               "AMQPD_CLUSTER_LEASE_TTL": str(self.lease_ttl),
               "AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": str(self.heartbeat_timeout),
               "AMQPD_CLUSTER_HEARTBEAT_LISTEN": f"{host}:{self.hb_port}"}
        if self.member is not None:
            # the inter-node links on the namespace's address; guest may log in from
            # the host, which is not loopback as the node sees it
            env["AMQPD_CLUSTER_LINK_LISTEN"] = f"{host}:0"
            env["AMQPD_LOOPBACK_USERS"] = ""
        if self.relay is not None:
            env["AMQPD_CLUSTER_HEARTBEAT_ADVERTISE"] = self.relay.addr
        env.update(self.extra_env)
        if self.proc is None:
            self.proc = BrokerProcess(self.data_dir, env=env, bind=host, command_prefix=(
                self.member.prefix if self.member is not None else []))
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


def wait_counted_down(nodes: list[ClusterNode], lost: str, timeout: float = 30.0) -> None:
    """Every one of ``nodes`` counts ``lost`` down (its heartbeat timeout passed). Only
    from then on are ``lost``'s queues unroutable there (an ack, a basic.return if
    mandatory, as RabbitMQ 3.10 for a queue whose node is down); before, their
    publishes are nacked (amqpd.cluster.remote_queue.RemoteQueue.routable)."""
    wait_for(lambda: all(lost not in n.status()["running_nodes"] for n in nodes), timeout,
             f"{lost} counted down by {[n.name for n in nodes]}")


@contextlib.contextmanager
def private_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A private etcd under ``tmp_path``, killed (by its PID) on the way out."""
    proc = EtcdProcess(tmp_path / "etcd").start()
    try:
        yield proc
    finally:
        proc.kill()


@contextlib.contextmanager
def cluster_of(tmp_path: Path, etcd_url: str, names: tuple[str, ...],
               extra_env: dict[str, str] | None = None, lease_ttl: float = 5.0,
               partition_handling: str = "pause_minority") -> Iterator[list[ClusterNode]]:
    """``node-{name}`` for each of ``names`` under a fresh prefix, formed; every one
    started is stopped on the way out, even when a later one failed to start.
    ``extra_env``: settings every node gets (e.g. plugins, a longer heartbeat timeout)."""
    prefix = new_prefix()
    started: list[ClusterNode] = []
    try:
        for name in names:
            started.append(ClusterNode(f"node-{name}", tmp_path / name, etcd_url, prefix,
                                       lease_ttl=lease_ttl,
                                       partition_handling=partition_handling,
                                       extra_env=dict(extra_env or {})).start())
        wait_formed(started)
        yield started
    finally:
        for n in started:
            n.stop()


@contextlib.contextmanager
def three_nodes(tmp_path: Path, etcd_url: str, extra_env: dict[str, str] | None = None,
                lease_ttl: float = 5.0, partition_handling: str = "pause_minority",
                ) -> Iterator[list[ClusterNode]]:
    """node-a, node-b and node-c (:func:`cluster_of`)."""
    with cluster_of(tmp_path, etcd_url, ("a", "b", "c"), extra_env, lease_ttl,
                    partition_handling) as nodes:
        yield nodes


def diagnose(nodes: list[ClusterNode]) -> str:
    """The cluster lines (and errors) of every node's log, for a failing wait."""
    out = []
    for n in nodes:
        assert n.proc is not None
        lines = n.proc.log_path.read_text(errors="replace").splitlines()
        out.append(f"--- {n.name}")
        out += [ln for ln in lines if "amqpd.cluster" in ln or "Traceback" in ln
                or "Error" in ln][-60:]
    return "\n".join(out)


def declare_durable(node: ClusterNode, name: str,
                    arguments: dict[str, Any] | None = None) -> None:
    """A durable queue ``name`` declared on ``node`` over AMQP (``arguments``: e.g.
    ``x-queue-type``)."""
    conn = Conn(node.url)
    try:
        conn.declare_queue(conn.open_channel(1), name, durable=True, arguments=arguments)
    finally:
        conn.close()


class ConfirmPublisher:
    """Persistent publishes to ``queue`` with confirms in a window over one raw
    connection; knows which message (its body, a number) each confirm or nack is for.
    ``body_size``: bodies padded with spaces to that many bytes (int() still reads the
    number back)."""

    def __init__(self, url: str, queue: str, window: int = 1000, batch: int = 100,
                 body_size: int = 0) -> None:
        self.conn = Conn(url)
        self.ch = self.conn.open_channel(1)
        self.conn.rpc(self.ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.queue = queue
        self.window = window
        self.batch = batch
        self.seq = 0
        self.outstanding: dict[int, int] = {}  # delivery tag -> message number
        self.confirmed: set[int] = set()
        self.nacked: set[int] = set()
        self.props = commands.Basic.Properties(delivery_mode=2)
        self.body_size = body_size

    def _frames(self, number: int) -> bytes:
        data = (b"%010d" % number).ljust(self.body_size)
        return b"".join((
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=self.queue),
                          self.ch),
            frame.marshal(header.ContentHeader(0, len(data), self.props), self.ch),
            frame.marshal(pbody.ContentBody(data), self.ch)))

    def _answer(self, fr: Any) -> None:
        if isinstance(fr, commands.Basic.Ack | commands.Basic.Nack):
            into = self.confirmed if isinstance(fr, commands.Basic.Ack) else self.nacked
            tags = [fr.delivery_tag]
            if fr.multiple:
                tags = [t for t in self.outstanding if t <= fr.delivery_tag]
            for tag in tags:
                number = self.outstanding.pop(tag, None)
                if number is not None:
                    into.add(number)
        elif isinstance(fr, commands.Channel.Close | commands.Connection.Close):
            raise ProtocolError(f"closed by the broker: {fr.reply_code} {fr.reply_text}")

    def publish(self, first: int, count: int) -> None:
        out = bytearray()
        for number in range(first, first + count):
            self.seq += 1
            self.outstanding[self.seq] = number
            out += self._frames(number)
        self.conn.sock.sendall(out)
        while len(self.outstanding) > self.window - self.batch:
            self._answer(self.conn.read_frame()[1])

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.outstanding and time.monotonic() < deadline:
            self._answer(self.conn.read_frame()[1])

    def publish_range(self, first: int, end: int) -> None:
        """Messages ``first`` to ``end`` - 1 in batches, then their answers (60 s)."""
        for number in range(first, end, self.batch):
            self.publish(number, min(self.batch, end - number))
        self.drain(60)

    def publish_resending(self, first: int, end: int, retry_for: float = 30.0) -> None:
        """Messages ``first`` to ``end`` - 1 (:meth:`publish_range`); each one nacked is
        sent again under its number, for ``retry_for`` seconds, as a client re-sends
        (RabbitMQ's advice for publisher confirms). Right after a take-over another
        node's remote queue may answer a passive declare while its stream to the new
        leader is not open yet: its publishes are then nacked ("leader unreachable"),
        never acked and dropped (docs/clustering.md, "Clients right after a failover").
        The caller asserts what was confirmed."""
        self.publish_range(first, end)
        wanted = set(range(first, end))
        deadline = time.monotonic() + retry_for
        while self.nacked & wanted and time.monotonic() < deadline:
            again = sorted(self.nacked & wanted)
            self.nacked -= wanted
            time.sleep(0.2)
            for number in again:
                self.publish(number, 1)
            self.drain(60)


def publish_killing(pub: ConfirmPublisher, total: int, kill_at: int, victim: ClusterNode,
                    backoff: Callable[[], None] | None = None) -> int:
    """Messages 0 to ``total`` - 1 in batches of ``pub.batch``; ``victim`` killed with
    kill -9 just before the batch holding message ``kill_at`` (in the middle of the
    publisher's window). After the kill, while a batch comes back with nacks, ``backoff``
    is called (for the first 60 s), as a client would back off. Answers how many were
    confirmed at the kill. The caller drains."""
    killed_at_confirmed = -1
    number = 0
    backoff_until = time.monotonic() + 60
    while number < total:
        n = min(pub.batch, total - number)
        if number <= kill_at < number + n:
            killed_at_confirmed = len(pub.confirmed)
            victim.kill()
        nacked = len(pub.nacked)
        pub.publish(number, n)
        number += n
        if backoff is not None and killed_at_confirmed >= 0 and \
                len(pub.nacked) > nacked and time.monotonic() < backoff_until:
            backoff()
    return killed_at_confirmed


def publishing_thread(pub: ConfirmPublisher, first: int, stop: threading.Event,
                      failure: list[BaseException]) -> threading.Thread:
    """A thread (not started) that publishes batches from message ``first`` on until
    ``stop`` is set, then waits for the answers (60 s); what it raises goes into
    ``failure``, for the test thread to report."""

    def publish() -> None:
        number = first
        try:
            while not stop.is_set():
                pub.publish(number, pub.batch)
                number += pub.batch
            pub.drain(60)
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)

    return threading.Thread(target=publish)


class QueueConsumer(threading.Thread):
    """Consumes ``queue`` on one node (prefetch, acks in batches) until told to stop;
    what it got: (number, redelivered). A cancel or a closed connection is recorded and
    the consumer starts again (a client would)."""

    def __init__(self, node: ClusterNode, queue: str, prefetch: int = 500,
                 ack: bool = True) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.queue = queue
        self.prefetch = prefetch
        self.ack = ack  # False: holds every delivery unacknowledged
        self.got: list[tuple[int, bool]] = []
        self.at: list[float] = []  # time.monotonic() of each of ``got``
        self.seen: set[int] = set()
        self.stopped = threading.Event()
        self.interruptions: list[str] = []
        # x-delivery-count of each redelivered message (None: no header)
        self.counts: dict[int, Any] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                try:
                    self._consume()
                except (OSError, ProtocolError) as exc:
                    self.interruptions.append(str(exc))
                    if len(self.interruptions) > 20:
                        raise
                    time.sleep(0.5)
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def _consume(self) -> None:
        conn = Conn(self.node.url)
        try:
            ch = conn.open_channel(1)
            conn.rpc(ch, commands.Basic.Qos(prefetch_count=self.prefetch),
                     commands.Basic.QosOk)
            conn.rpc(ch, commands.Basic.Consume(queue=self.queue, consumer_tag="reader"),
                     commands.Basic.ConsumeOk)
            conn.sock.settimeout(0.3)
            redelivered = False
            count: Any = None
            unacked = 0
            tag = 0
            while not self.stopped.is_set():
                try:
                    _ch, fr = conn.read_frame()
                except TimeoutError:
                    if unacked and self.ack:
                        conn.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=True))
                        unacked = 0
                    continue
                if isinstance(fr, commands.Basic.Deliver):
                    redelivered = bool(fr.redelivered)
                    assert fr.delivery_tag is not None
                    tag = fr.delivery_tag
                elif isinstance(fr, header.ContentHeader):
                    count = (fr.properties.headers or {}).get("x-delivery-count")
                elif isinstance(fr, pbody.ContentBody):
                    number = int(fr.value)
                    if redelivered:
                        self.counts[number] = count
                    self.got.append((number, redelivered))
                    self.at.append(time.monotonic())
                    self.seen.add(number)
                    unacked += 1
                    if unacked >= 100 and self.ack:
                        conn.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=True))
                        unacked = 0
                elif isinstance(fr, commands.Basic.Cancel | commands.Channel.Close |
                                commands.Connection.Close):
                    raise ProtocolError(f"consumer stopped by the broker: {fr}")
            if unacked and self.ack:
                conn.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=True))
        finally:
            conn.sock.close()


@contextlib.contextmanager
def running(*consumers: QueueConsumer) -> Iterator[None]:
    """The consumers started, and on the way out told to stop and joined (30 s each)."""
    for c in consumers:
        c.start()
    try:
        yield
    finally:
        for c in consumers:
            c.stopped.set()
        for c in consumers:
            c.join(30)


def check_consumed(got: list[tuple[int, bool]], confirmed: set[int]) -> None:
    """Every confirmed message among ``got``, and one delivered twice only redelivered."""
    numbers = [n for n, _r in got]
    missing = confirmed - set(numbers)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:10]}"
    first: set[int] = set()
    for n, redelivered in got:
        if n in first:
            assert redelivered, f"message {n} delivered twice without redelivered"
        first.add(n)
