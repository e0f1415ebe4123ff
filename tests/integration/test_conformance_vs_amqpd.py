"""The conformance suite against amqpd itself: every case must pass, none skipped.

The same cases pass against a real RabbitMQ (test_conformance_vs_rabbitmq.py), so a
failure here is a place where amqpd differs from RabbitMQ. The hooks the suite needs
are amqpd's own: the memory alarm through amqpctl (as the RabbitMQ run uses
rabbitmqctl), and restarts through devtools.amqpdproc (same ports, same data).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.framework import Settings
from conformance.runner import run_all, select
from devtools import amqpdproc

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def amqpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("amqpd-conformance")
    info = amqpdproc.start(d)
    info["dir"] = str(d)
    try:
        yield info
    finally:
        amqpdproc.stop(d)


# hundreds of cases: minutes on a loaded machine (seconds on a quiet one), so a
# longer limit than the suite's 300 s; slow files also start first under xdist
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_suite_passes_against_amqpd(amqpd: dict[str, Any]) -> None:
    py = shlex.quote(sys.executable)
    ctl = f"{py} -m amqpd.ctl --url {amqpd['http_url']} set_vm_memory_high_watermark"
    restart = (f"cd {shlex.quote(str(ROOT))} && {py} -m devtools.amqpdproc restart "
               f"--dir {shlex.quote(amqpd['dir'])}")
    cases = select(None)
    assert len(cases) >= 250
    settings = Settings(url=str(amqpd["amqp_url"]), http_url=str(amqpd["http_url"]),
                        alarm_cmd=f"{ctl} 0.000001", clear_alarm_cmd=f"{ctl} 0.4",
                        restart_cmd=restart)
    results = run_all(cases, settings, jobs=4)
    failed = [f"{r.id}: {r.detail}" for r in results if r.result == "fail"]
    assert failed == []
    skipped = [r.id for r in results if r.result == "skip"]
    assert skipped == []
