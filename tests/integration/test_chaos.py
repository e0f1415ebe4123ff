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
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(400),
]

DURATION = 20.0
GAP = (3.0, 6.0)
DRAIN = 30.0  # seconds the consumers get after the heal (a loss waits all of it)

# What these seeds found on the branch this test was written on (watch28, 2026-12-06);
# the bugs are issue 28 items fixed on another branch (loss28): the integrator re-runs
# these once both are merged and removes the marks that no longer apply. (Seed 7's mark
# went with lag28's leadership confirmation, amqpd/cluster/leadership.py: it failed 3
# of 3 runs before, passed 3 of 3 after.)
KNOWN: dict[int, str] = {
    # faults: SIGSTOP of etcd 3.9 s, kill -9 of chaos-two's leader (node-a), kill -9 of
    # node-b (chaos-quorum's leader). chaos-quorum lost 20 of 1201 confirmed messages,
    # one publisher batch confirmed at the election: node-a was elected ("0 messages")
    # and answered "404 no queue 'chaos-quorum'" 1 ms later, while its peers' publishes
    # were being confirmed (issue 28: 404 during promotion, then acks for publishes
    # never delivered)
    8: "issue 28 confirmed loss (loss28's 404-during-promotion item): chaos-quorum lost "
       "20 of 1201 confirmed messages around the election after kill -9 of its leader",
}


def _case(seed: int) -> object:
    if seed in KNOWN:
        return pytest.param(seed, marks=pytest.mark.xfail(strict=False, reason=KNOWN[seed]))
    return seed


@pytest.mark.parametrize("seed", [_case(s) for s in (7, 8)])
def test_random_faults_lose_no_confirmed_message(seed: int, tmp_path: Path) -> None:
    result = run(seed, DURATION, tmp_path / f"seed-{seed}", gap=GAP, rate=80.0,
                 drain_timeout=DRAIN)
    print(result.report())
    assert not result.failures(), result.report()
