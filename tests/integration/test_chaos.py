"""The randomized fault test (tests/chaos/driver.py), short, on fixed seeds: three
nodes and a real etcd, confirmed publishers and acking consumers on a quorum, an
``ha-mode: all`` and an ``ha-mode: exactly`` queue, new mirrored queues every few
seconds, faults one at a time for 25 s, then heal and check (no confirmed message lost,
duplicates only redelivered, every queue confirms within 30 s, every node answers
within 5 s, never two leaders). ``make chaos`` runs long ones; the seed is printed and
``python -m tests.chaos --seed N --duration 25 --gap 3 6`` replays the schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.driver import run
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(400),
]

DURATION = 25.0
GAP = (3.0, 6.0)

# Known failures, by seed, found by this test on the branch it was written on (issue 28
# items fixed on another branch; the integrator re-runs these once both are merged).
KNOWN: dict[int, str] = {}


def _case(seed: int) -> object:
    if seed in KNOWN:
        return pytest.param(seed, marks=pytest.mark.xfail(strict=False, reason=KNOWN[seed]))
    return seed


@pytest.mark.parametrize("seed", [_case(s) for s in (11, 12)])
def test_random_faults_lose_no_confirmed_message(seed: int, tmp_path: Path) -> None:
    result = run(seed, DURATION, tmp_path / f"seed-{seed}", gap=GAP, rate=80.0)
    print(result.report())
    assert not result.failures(), result.report()
