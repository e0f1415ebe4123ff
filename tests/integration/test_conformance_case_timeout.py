"""conformance/runner.py: a case that outlives Settings.case_timeout fails, its
connections cut, instead of hanging the run (a CI run once waited 30 minutes on a
basic.get the broker never answered; pika's basic_get has no timeout)."""

from __future__ import annotations

import time

import pytest

from conformance.framework import Case, Context, Settings
from conformance.runner import run_all, run_case
from tests.support.brokerproc import BrokerProcess


def _waits_for_ever(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.name()
    ch.queue_declare(q, exclusive=True)
    ch.basic_consume(q, lambda *_: None)
    ch.start_consuming()  # nothing is ever published: this returns only when cut


@pytest.mark.timeout(120)
def test_a_case_that_never_ends_fails_after_its_timeout(broker: BrokerProcess) -> None:
    settings = Settings(url=broker.url, case_timeout=1.5)
    stuck = Case("test/waits-for-ever", "test", _waits_for_ever)
    quick = Case("test/passes", "test", lambda ctx: None)
    t0 = time.monotonic()
    result = run_case(stuck, settings)
    assert time.monotonic() - t0 < 30
    assert result.result == "fail", result
    assert result.detail.startswith("no result within 1.5 s: the case's connections were "
                                    "cut"), result.detail
    results = run_all([stuck, quick], settings, jobs=2)  # the pool's exit joins both
    assert [(r.id, r.result) for r in results] == [("test/waits-for-ever", "fail"),
                                                   ("test/passes", "pass")]
