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

# What these seeds found on the branch this test was written on (watch28, 2026-12-06),
# issue 28 items fixed on another branch (loss28); the integrator re-runs them once both
# are merged and removes the marks that no longer apply.
_UNSYNCED_PROMOTION = (
    "issue 28 confirmed loss (loss28's item): a new ha-mode all queue confirms its first "
    "50 messages before its mirrors exist; they start empty and unsynchronised "
    "(ha-sync-mode manual) and one is promoted anyway when the leader is cut off "
    "('candidates {...: 0} (synchronised [])'): 50 of 51 lost")
_CLAIM_LAG = ("issue 28: after a partition heals, the cut-off old leader still lists "
              "itself as the queue's leader in /api/queues for a sampling round while "
              "another leads (two leaders)")
KNOWN: dict[int, str] = {
    # 25 s run: partitions of node-b then node-c; chaos-all-new-2 lost 50 of 51; two
    # leaders of chaos-all-new-2 (node-a, node-c) 24 s in
    11: f"{_UNSYNCED_PROMOTION}; {_CLAIM_LAG}",
    # 25 s run: partition of node-a, SIGSTOP of node-c; chaos-all-new-1..4 lost 50 of 51
    # each; two leaders of chaos-quorum (node-a, node-b) right after the partition
    12: f"{_UNSYNCED_PROMOTION}; {_CLAIM_LAG}",
}


def _case(seed: int) -> object:
    if seed in KNOWN:
        return pytest.param(seed, marks=pytest.mark.xfail(strict=False, reason=KNOWN[seed]))
    return seed


@pytest.mark.parametrize("seed", [_case(s) for s in (11, 12)])
def test_random_faults_lose_no_confirmed_message(seed: int, tmp_path: Path) -> None:
    result = run(seed, DURATION, tmp_path / f"seed-{seed}", gap=GAP, rate=80.0,
                 drain_timeout=DRAIN)
    print(result.report())
    assert not result.failures(), result.report()
