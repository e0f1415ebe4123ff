"""Chaos against links: a shovel and a federation link through TCP proxies that delay,
reset and black-hole their connections while a publisher confirms messages at the source.

What must hold (issue 18): no confirmed message is lost (every confirmed body reaches the
destination), and every link recovers (its status is ``running`` again and messages flow)
after each fault. Both links run with ``ack-mode: on-confirm``, which is at-least-once:
what was in flight when a connection died is redelivered by the source, so duplicates
are allowed, at most a prefetch window per fault that broke a connection. How long a
recovery takes is measured by bench/link_chaos.py, not asserted here.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.support.linkchaos import (
    PREFETCH,
    ConfirmedPublisher,
    Scenario,
    drain_all,
    federation_scenario,
    inject,
    poll,
    shovel_scenario,
    standard_faults,
)

pytestmark = pytest.mark.slow


def _check(publisher: ConfirmedPublisher, bodies: list[bytes], faults: int) -> None:
    assert not publisher.error, publisher.error
    assert len(publisher.confirmed) > 500, "too few messages to prove anything"
    got = collections.Counter(int(b) for b in bodies)
    missing = set(publisher.confirmed) - set(got)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:10]}"
    duplicates = sum(n - 1 for n in got.values())
    # at-least-once (on-confirm): a window of unacked deliveries per broken connection
    assert duplicates <= PREFETCH * faults, duplicates


def _run(scenario: Scenario) -> None:
    publisher = scenario.publisher().start()
    try:
        poll(lambda: scenario.delivered() > 0, 30, "the link carrying messages")
        faults = standard_faults(scenario.proxies)
        for fault in faults:
            recovery = inject(fault, scenario.status, scenario.delivered)
            # a reset or a blackhole breaks the link's connection: it must notice
            assert recovery.noticed or fault.kind == "delay", recovery
    finally:
        publisher.stop()
    # everything confirmed at the source went over the link and was acked there
    poll(scenario.source_settled, 60, "the source drained and acked")
    _check(publisher, drain_all(scenario.dest_url, scenario.dest_queue), len(faults))


def test_shovel_through_delays_resets_and_blackholes(tmp_path: Path) -> None:
    """The shovel runs on B, reads from A through one proxy and writes to B through
    another: each side gets a delay, a reset and a blackhole while A takes confirms."""
    with shovel_scenario(tmp_path) as scenario:
        _run(scenario)


def test_federation_link_through_delays_resets_and_blackholes(tmp_path: Path) -> None:
    """An exchange federated from "hq" to "branch"; the link's upstream connection runs
    through a proxy that delays, resets and black-holes it while hq takes confirms."""
    with federation_scenario(tmp_path) as scenario:
        _run(scenario)
