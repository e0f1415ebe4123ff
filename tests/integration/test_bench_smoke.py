"""Smoke test of the benchmark load generator against a real amqpd (no timing asserted).

Runs the raw-socket publisher and consumer for about a second and checks that what the
consumer counted is consistent with what the publisher sent: every message delivered
once, in order, with publisher confirms accounted for.
"""

from __future__ import annotations

import pytest

from bench.brokers import Broker
from bench.loadgen import ConsumerSpec, PublisherSpec, Target
from bench.runner import cleanup, declare, run_flow
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(120)


class _Running(Broker):
    name = "amqpd"

    def __init__(self, proc: BrokerProcess) -> None:
        self.url = proc.url
        self.pid = proc.proc.pid if proc.proc else None


def test_publish_consume_counts_are_consistent(broker: BrokerProcess) -> None:
    b = _Running(broker)
    declare(b, ["bench.smoke"])
    try:
        run = run_flow(b, [PublisherSpec(1, [Target("", "bench.smoke")], duration=1.0)],
                       [[ConsumerSpec(["bench.smoke"], prefetch=1000)]])
    finally:
        cleanup(b, ["bench.smoke"])
    assert run.valid, run.invalid
    assert run.metrics["published"] > 0
    assert run.metrics["delivered"] == run.metrics["published"]


def test_confirms_and_fanout_counts(broker: BrokerProcess) -> None:
    b = _Running(broker)
    qs = ["bench.smoke.f1", "bench.smoke.f2"]
    declare(b, qs, exchange=("bench.smoke.fx", "fanout"))
    try:
        run = run_flow(b, [PublisherSpec(1, [Target("bench.smoke.fx", "")], duration=1.0,
                                         confirm_window=1000)],
                       [[ConsumerSpec([q]) for q in qs]], fanout=2)
    finally:
        cleanup(b, qs, "bench.smoke.fx")
    assert run.valid, run.invalid
    assert run.metrics["confirmed"] == run.metrics["published"] > 0
    assert run.metrics["delivered"] == 2 * run.metrics["published"]
