"""The randomized fault test (tests/chaos/driver.py), short, on fixed seeds: three
nodes and a real etcd, confirmed publishers and acking consumers on a quorum, an
``ha-mode: all`` and an ``ha-mode: exactly`` queue, new mirrored queues every few
seconds, faults one at a time for 20 s, then heal and check (no confirmed message lost,
duplicates only redelivered, every queue confirms within 30 s, every node answers
within 5 s, never two leaders). ``make chaos`` runs long ones; the seed is printed and
the report prints the command that replays the schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.driver import run
from tests.support import etcdproc, netns

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(400),
]

DURATION = 20.0
GAP = (3.0, 6.0)
DRAIN = 30.0  # seconds the consumers get after the heal (a loss waits all of it)

# What these seeds found before the fixes (2026-12-06), kept so a failure of either reads
# against its history: seed 8 (SIGSTOP of etcd, kill -9 of chaos-two's leader, kill -9
# of chaos-quorum's leader) lost 20 of 1,201 confirmed messages of chaos-quorum, the new
# leader answering "404 no queue" 1 ms after its election while its peers' publishes were
# confirmed (RemoteQueue.routable and CommitGate.abandon fixed it: 3 of 3 runs passed
# after); seed 7 saw two leaders of a mirrored queue after a partition healed (the
# leadership confirmation of amqpd/cluster/leadership.py fixed it: 3 of 3 failed before,
# 3 of 3 passed after).
SEEDS = (7, 8)
# Seed 3's schedule is two partitions (node-c for 4.8 s, then node-a for 4.4 s), cut
# through network namespaces: the inter-node links go silent too, which the proxy's cut
# (etcd and heartbeats only) never does.
NETNS_SEEDS = (3,)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_lose_no_confirmed_message(seed: int, tmp_path: Path) -> None:
    result = run(seed, DURATION, tmp_path / f"seed-{seed}", gap=GAP, rate=80.0,
                 drain_timeout=DRAIN, partition="proxy")
    print(result.report())
    assert not result.failures(), result.report()


@pytest.mark.parametrize("seed", NETNS_SEEDS)
def test_random_faults_with_namespace_partitions(seed: int, tmp_path: Path) -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"partitions through network namespaces: {why}")
    result = run(seed, DURATION, tmp_path / f"seed-{seed}", gap=GAP, rate=80.0,
                 drain_timeout=DRAIN, partition="netns")
    print(result.report())
    # Every check is hard. This seed once listed chaos-quorum on node-a and node-b 1.3 s
    # after node-a's partition healed (CI, 2026-12-06): the listing named node-a's own
    # stale GroupLeading; it names etcd's leader now (test_cluster_leadership_claims'
    # partition case reproduces it deterministically).
    assert not result.failures(), result.report()
