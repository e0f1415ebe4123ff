"""A partitioned active fences itself; the standby takes over; nothing confirmed is lost.

The active (node a) reaches etcd only through one TCP proxy the test controls and its
standby (node b) reaches a's replication listener only through another (a advertises
the proxy's address in etcd). Cutting both (a blackhole: bytes stop, sockets stay open,
as with a pulled cable) leaves a alone with its clients. It must fence itself before its
lease runs out; b must take over. A poller reads both nodes' ``/health/active`` every
100 ms and must never see two 200s at once. After the partition heals, a follows b, and
every message a publisher got a confirm for is consumed.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.warren_clients import Consumer, Publisher, check_delivery, connect
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess
from tests.support.tcpproxy import TcpProxy
from tests.support.warren import (
    WarrenNode,
    wait_active,
    wait_for,
    wait_insync_standby,
)

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(240),
]

PREFIX = "/amqpd-test/partition"
QUEUE = "partition-q"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(tmp_path / "etcd").start()
    yield proc
    proc.kill()


class HealthPoller:
    """Both nodes' /health/active every 100 ms: (monotonic time, status a, status b)."""

    def __init__(self, a: WarrenNode, b: WarrenNode) -> None:
        self.nodes = (a, b)
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="health-poller")

    def _run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            # both asked at once, each with a deadline well under the period
            results: list[int] = [0, 0]
            askers = [threading.Thread(target=self._ask, args=(i, results)) for i in (0, 1)]
            for th in askers:
                th.start()
            for th in askers:
                th.join(1.0)
            self.samples.append((t, results[0], results[1]))
            self.stop.wait(max(0.0, 0.1 - (time.monotonic() - t)))

    def _ask(self, i: int, results: list[int]) -> None:
        results[i] = self.nodes[i].health("active", timeout=0.09)[0]

    def __enter__(self) -> HealthPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def _metric(node: WarrenNode, name: str) -> float:
    with urllib.request.urlopen(f"{node.http_url}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, f"{name} not in {node.name}'s metrics"
    return float(found.group(1))


def test_partitioned_active_fences_and_nothing_confirmed_is_lost(
        tmp_path: Path, etcd: EtcdProcess) -> None:
    to_etcd = TcpProxy("127.0.0.1", etcd.client_port).start()
    a = WarrenNode("a", tmp_path / "a", [f"http://127.0.0.1:{to_etcd.port}"], PREFIX)
    to_a = TcpProxy("127.0.0.1", a.repl_port).start()
    a.advertise = f"127.0.0.1:{to_a.port}"
    b = WarrenNode("b", tmp_path / "b", [etcd.url], PREFIX)
    a.peers, b.peers = [b.repl_addr], [a.advertise]  # synchronous: confirms wait for b
    nodes = [a, b]
    pub: Publisher | None = None
    con: Consumer | None = None
    try:
        a.start()
        wait_active(a)
        b.start()
        wait_insync_standby(a, b, etcd.url)
        urls = [a.url, b.url]
        conn = connect(urls, time.monotonic() + 20)
        conn.channel().queue_declare(QUEUE, durable=True)
        conn.close()
        pub = Publisher(urls, QUEUE).start()
        with HealthPoller(a, b) as poller:
            wait_for(lambda: len(pub.confirmed) >= 300, 60, "confirms before the cut",
                     a.tail)
            to_etcd.cut("blackhole")
            to_a.cut("blackhole")
            cut_at = time.monotonic()
            wait_active(b, timeout=30)
            status, body = a.health("active")
            assert status == 503 and body["role"] != "active", body
            assert _metric(a, "amqpd_warren_fences_total") == 1
            # b has taken over; a sees neither etcd nor b until the partition heals
            to_etcd.restore()
            to_a.restore()
            wait_insync_standby(b, a, etcd.url)
            start = len(pub.confirmed)
            wait_for(lambda: len(pub.confirmed) >= start + 200, 60,
                     "confirms after the partition healed",
                     lambda: a.tail() + "\n" + b.tail())
        pub.finish()
        assert pub.error is None, pub.error

        both = [(t, sa, sb) for t, sa, sb in poller.samples if sa == 200 and sb == 200]
        assert not both, f"two active nodes at once: {both[:5]}"
        last_a = max(t for t, sa, _ in poller.samples if sa == 200)
        first_b = min(t for t, _, sb in poller.samples if sb == 200)
        assert last_a < first_b, "a stopped answering as active only after b began"
        assert len(poller.samples) > 20

        con = Consumer([b.url, a.url], QUEUE).start()
        wait_for(lambda: {s for s, _ in con.seen} >= set(pub.confirmed), 60,
                 "every confirmed message consumed",
                 lambda: f"{len(con.seen)} seen, {len(pub.confirmed)} confirmed, missing "
                 f"{sorted(set(pub.confirmed) - {s for s, _ in con.seen})[:20]}; queue on b: "
                 f"{b.api('/api/queues/%2F/' + QUEUE).get('messages')}\n{b.tail()}")
        con.finish()
        assert con.error is None, con.error
        check_delivery(QUEUE, pub, con)
        print(f"partition: {len(pub.confirmed)} confirmed, {len(pub.failed)} unconfirmed, "
              f"{len(poller.samples)} health samples, a last active "
              f"{last_a - cut_at:+.2f}s and b first active {first_b - cut_at:+.2f}s "
              "from the cut")
    finally:
        for w in (pub, con):
            if w is not None:
                w.stop.set()
        for n in nodes:
            n.kill()
        to_etcd.stop()
        to_a.stop()
