"""Exactly once through a three-node cluster: retrying publisher, dedup exchange, quorum queue.

Real processes: a private etcd, three amqpd nodes clustered through it, HAProxy in front
of all three (round robin: a publisher that reconnects lands on another node). An
``x-message-deduplication`` exchange -- whose cache in a cluster is the cluster's, in etcd
(amqpd/cluster/dedup_cache.py) -- routes to a quorum queue declared with
``x-message-deduplication`` (the queue's leader drops a retry whose first copy is still
in the queue: that covers a first copy the queue committed while its confirm was lost,
see docs/dedup.md). A publisher with confirms re-sends every message it got no confirm
for, same header, after reconnecting. Ten times, a node is killed with SIGKILL after a
random number of further confirms -- the queue's leader on odd cycles (started again once
another member leads the queue), the node the publisher is connected to on even ones (the
same node when it leads) -- and is back in the group before the next kill. At the end
the queue is drained: every confirmed message exactly once (0 lost, 0 duplicates).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.integration.cluster_support import ClusterNode, diagnose, three_nodes, wait_for
from tests.integration.warren_clients import Publisher, connect, drain_numbers
from tests.support import etcdproc, haproxyproc
from tests.support.etcdproc import EtcdProcess
from tests.support.haproxyproc import HAProxyProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.skipif(haproxyproc.find_haproxy() is None, reason=haproxyproc.SKIP_REASON),
    pytest.mark.timeout(1200),
    pytest.mark.slow,
]

EXCHANGE, QUEUE = "xo.dedup", "xo.qq"
CYCLES = 10


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """Failure detectors a loaded machine's stalls do not trip (as test_cluster_dedup)."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "5"},
                     lease_ttl=10.0) as started:
        yield started


def _info(node: ClusterNode, kind: str, name: str) -> dict[str, Any]:
    try:
        r = node.api.get(f"/api/{kind}/%2F/{quote(name, safe='')}")
    except OSError:
        return {}
    return r.json() if r.status == 200 else {}


def _group_whole(nodes: list[ClusterNode]) -> bool:
    names = sorted(n.name for n in nodes)
    infos = [_info(n, "queues", QUEUE) for n in nodes]
    leaders = {i.get("leader") for i in infos}
    return len(leaders) == 1 and None not in leaders and all(
        sorted(i.get("online", [])) == names for i in infos)


def _publisher_node(nodes: list[ClusterNode]) -> ClusterNode | None:
    """The node holding the publisher's connection (the only AMQP client during the run)."""
    for n in nodes:
        try:
            r = n.api.get("/api/connections")
        except OSError:
            continue
        # every node lists the whole cluster's connections, each naming its node
        if r.status == 200 and any(i.get("node") == n.name for i in r.json()):
            return n
    return None



def test_exactly_once_over_ten_kill9_cycles(tmp_path: Path, nodes: list[ClusterNode]) -> None:
    rng = random.Random()
    by_name = {n.name: n for n in nodes}
    conn = connect(nodes[0].url, time.monotonic() + 20)
    ch = conn.channel()
    ch.exchange_declare(EXCHANGE, "x-message-deduplication", durable=True, arguments={
        "x-cache-size": 1_000_000, "x-cache-persistence": "disk"})
    ch.queue_declare(QUEUE, durable=True, arguments={
        "x-queue-type": "quorum", "x-message-deduplication": True})
    ch.queue_bind(QUEUE, EXCHANGE)
    conn.close()
    wait_for(lambda: _group_whole(nodes), 60, "the quorum group formed",
             lambda: diagnose(nodes))
    hap = HAProxyProcess(tmp_path / "haproxy",
                         [(n.name, n.proc.port, n.proc.http_port)  # type: ignore[union-attr]
                          for n in nodes]).start()
    url = f"amqp://guest:guest@127.0.0.1:{hap.port}/%2F"
    pub: Publisher | None = None
    victims: list[str] = []
    failovers = 0
    try:
        pub = Publisher(url, QUEUE, exchange=EXCHANGE, resend=True).start()
        for cycle in range(CYCLES):
            threshold = len(pub.confirmed) + rng.randint(50, 300)

            def traffic(p: Publisher = pub, t: int = threshold) -> bool:
                return len(p.confirmed) >= t or p.error is not None
            wait_for(traffic, 120, f"traffic before kill {cycle + 1}", lambda: diagnose(nodes))
            assert pub.error is None, f"{pub.error}\n{diagnose(nodes)}"
            if cycle % 2 == 0:
                leader = _info(nodes[0], "queues", QUEUE).get("leader")
                victim = by_name.get(str(leader))
            else:
                victim = _publisher_node(nodes)
            assert victim is not None, f"no victim found in cycle {cycle + 1}"
            victims.append(victim.name)
            print(f"cycle {cycle + 1}: {len(pub.confirmed)} confirmed, kill {victim.name}",
                  flush=True)
            assert victim.proc is not None
            # back on the HTTP port HAProxy checks (the test's nodes take any at first)
            victim.extra_env["AMQPD_HTTP_PORT"] = str(victim.proc.http_port)
            leader_before = _info(victim, "queues", QUEUE).get("leader")
            victim.kill()  # kill -9
            others = [n for n in nodes if n is not victim]
            if leader_before == victim.name:
                # a real failover: another member leads before the victim returns

                def new_leader(rest: list[ClusterNode] = others, gone: str = victim.name,
                               ) -> bool:
                    led = {_info(n, "queues", QUEUE).get("leader") for n in rest}
                    return len(led) == 1 and led.pop() not in (None, gone)
                wait_for(new_leader, 120, f"a new leader after kill {cycle + 1}",
                         lambda rest=others: diagnose(rest))  # type: ignore[misc]
                failovers += 1
            victim.start()
            wait_for(lambda: _group_whole(nodes), 120, f"the group whole after kill {cycle + 1}",
                     lambda: diagnose(nodes))
        more = len(pub.confirmed) + 100

        def after(p: Publisher = pub) -> bool:
            return len(p.confirmed) >= more or p.error is not None
        wait_for(after, 120, "confirms after the last cycle", lambda: diagnose(nodes))
        pub.finish()
        assert pub.error is None, pub.error
        got = drain_numbers(url, QUEUE)
        copies = Counter(got)
        lost = sorted(set(pub.confirmed) - set(copies))
        duplicated = sorted(seq for seq, n in copies.items() if n > 1)
        ex_dups = sum(_info(n, "exchanges", EXCHANGE).get("deduplication", {})
                      .get("duplicates", 0) for n in nodes)
        lead = by_name.get(str(_info(nodes[0], "queues", QUEUE).get("leader")), nodes[0])
        q_dups = _info(lead, "queues", QUEUE).get("deduplication", {}).get("duplicates")
        print(f"victims {victims} ({failovers} leader failovers); "
              f"{len(pub.confirmed)} confirmed, {len(pub.failed)} re-sent, "
              f"{pub.reconnects} reconnects; consumed {len(got)}: {len(lost)} lost, "
              f"{len(duplicated)} duplicated; retries dropped by the exchange since the "
              f"nodes' last start {ex_dups}, by the queue's leader {q_dups}")
        assert not lost, f"{len(lost)} confirmed messages lost, first {lost[:10]}"
        assert not duplicated, f"{len(duplicated)} messages twice, first {duplicated[:10]}"
        assert pub.reconnects >= CYCLES // 2, "the publisher never saw its node die"
        assert failovers >= CYCLES // 2, "the queue's leader was not killed every other cycle"
        assert pub.failed  # retries happened, and none made a second copy
    finally:
        if pub is not None:
            pub.stop.set()
        hap.kill()
