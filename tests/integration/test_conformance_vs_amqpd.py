"""The conformance suite against amqpd itself: every case must pass.

The same cases pass against a real RabbitMQ (test_conformance_vs_rabbitmq.py), so a
failure here is a place where amqpd differs from RabbitMQ. The memory alarm cases drive
amqpd's run-time watermark through amqpctl, as the RabbitMQ run does with rabbitmqctl.
"""

from __future__ import annotations

import shlex
import sys

from conformance.framework import Settings, run_all, select
from tests.support.brokerproc import BrokerProcess


def _watermark_cmd(broker: BrokerProcess, value: str) -> str:
    return (f"{shlex.quote(sys.executable)} -m amqpd.ctl --url {broker.http_url} "
            f"set_vm_memory_high_watermark {value}")


def test_suite_passes_against_amqpd(broker: BrokerProcess) -> None:
    cases = select(None)
    assert len(cases) >= 250
    settings = Settings(url=broker.url, http_url=broker.http_url,
                        alarm_cmd=_watermark_cmd(broker, "0.000001"),
                        clear_alarm_cmd=_watermark_cmd(broker, "0.4"))
    results = run_all(cases, settings, jobs=4)
    failed = [f"{r.id}: {r.detail}" for r in results if r.result == "fail"]
    assert failed == []
    skipped = [r.id for r in results if r.result == "skip"]
    assert skipped == []
