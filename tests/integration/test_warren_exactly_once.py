"""Exactly once through a warren: retrying publisher + disk deduplication exchange.

Real processes: a private etcd, two amqpd nodes electing through it, HAProxy in front
checking ``/health/active``. A publisher with confirms sends message after message
through HAProxy to an ``x-message-deduplication`` exchange (disk cache) bound to a durable
queue, and re-sends every message it got no confirm for, with the same
``x-deduplication-header``, after reconnecting. The active is killed with SIGKILL ten
times (a, b, a, ...), each time after a random number of further confirms; the killed
node comes back as an in-sync standby before the next kill. At the end the queue is
drained: every confirmed message is there exactly once (0 lost, 0 duplicates).

The consumer drains after the run, so consumer-side redeliveries (a consumer's unacked
messages at a kill, marked redelivered) do not enter the count: what is shown is that the
publisher's retries never make a second copy.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.warren_clients import Publisher, connect, drain_numbers
from tests.support import etcdproc, haproxyproc
from tests.support.etcdproc import EtcdProcess
from tests.support.haproxyproc import HAProxyProcess
from tests.support.warren import WarrenNode, wait_active, wait_for, wait_insync_standby

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.skipif(haproxyproc.find_haproxy() is None, reason=haproxyproc.SKIP_REASON),
    pytest.mark.timeout(600),
    pytest.mark.slow,
]

PREFIX = "/amqpd-test/warren-dedup"
EXCHANGE, QUEUE = "xo.dedup", "xo.q"
CYCLES = 10


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(tmp_path / "etcd").start()
    yield proc
    proc.kill()



def test_exactly_once_over_ten_kill9_cycles(tmp_path: Path, etcd: EtcdProcess) -> None:
    rng = random.Random()
    a = WarrenNode("a", tmp_path / "a", [etcd.url], PREFIX)
    b = WarrenNode("b", tmp_path / "b", [etcd.url], PREFIX)
    a.peers, b.peers = [b.repl_addr], [a.repl_addr]  # synchronous: confirms wait for both
    nodes = [a, b]
    hap: HAProxyProcess | None = None
    pub: Publisher | None = None
    try:
        a.start()
        wait_active(a)
        b.start()
        wait_insync_standby(a, b, etcd.url)
        hap = HAProxyProcess(tmp_path / "haproxy",
                             [(n.name, n.amqp_port, n.http_port) for n in nodes]).start()
        url = f"amqp://guest:guest@127.0.0.1:{hap.port}/%2F"
        conn = connect(url, time.monotonic() + 20)
        ch = conn.channel()
        ch.exchange_declare(EXCHANGE, "x-message-deduplication", durable=True, arguments={
            "x-cache-size": 1_000_000, "x-cache-persistence": "disk"})
        ch.queue_declare(QUEUE, durable=True)
        ch.queue_bind(QUEUE, EXCHANGE)
        conn.close()
        pub = Publisher(url, QUEUE, exchange=EXCHANGE, resend=True).start()
        active, standby = a, b
        for cycle in range(CYCLES):
            threshold = len(pub.confirmed) + rng.randint(50, 300)

            def traffic(p: Publisher = pub, t: int = threshold) -> bool:
                return len(p.confirmed) >= t or p.error is not None
            wait_for(traffic, 60, f"traffic before kill {cycle + 1}", active.tail)
            assert pub.error is None, pub.error
            active.kill()
            wait_active(standby, timeout=30)
            active.start()  # returns as a standby of the new active
            wait_insync_standby(standby, active, etcd.url)
            active, standby = standby, active
        more = len(pub.confirmed) + 100

        def after(p: Publisher = pub) -> bool:
            return len(p.confirmed) >= more
        wait_for(after, 60, "confirms after the last cycle", active.tail)
        pub.finish()
        assert pub.error is None, pub.error
        assert pub.reconnects >= CYCLES, "the publisher never saw the failovers"
        got = drain_numbers(url, QUEUE)
        copies = Counter(got)
        lost = sorted(set(pub.confirmed) - set(copies))
        duplicated = sorted(seq for seq, n in copies.items() if n > 1)
        print(f"{len(pub.confirmed)} confirmed, {len(pub.failed)} re-sent, "
              f"{pub.reconnects} reconnects; consumed {len(got)}: "
              f"{len(lost)} lost, {len(duplicated)} duplicated")
        assert not lost, f"{len(lost)} confirmed messages lost, first {lost[:10]}"
        assert not duplicated, f"{len(duplicated)} messages twice, first {duplicated[:10]}"
        assert pub.failed  # retries happened, and none made a second copy
    finally:
        if pub is not None:
            pub.stop.set()
        if hap is not None:
            hap.kill()
        for n in nodes:
            n.kill()
