"""The conformance suite against a real RabbitMQ: a case that fails here is a wrong case.

Starts a private RabbitMQ 3.10 (Debian's rabbitmq-server) with devtools.rabbitmq, runs
every conformance case in-process and expects no failure. Skipped when RabbitMQ is not
installed. Only the amqpd-only extensions (x-delayed-message) may be skipped.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.framework import Settings
from conformance.runner import run_all, select
from devtools.rabbitmq import RabbitInfo, RabbitMQNotInstalled, find_server, running_rabbitmq

pytestmark = pytest.mark.rabbitmq

PLUGINS = ("rabbitmq_management", "rabbitmq_consistent_hash_exchange")
ROOT = Path(__file__).resolve().parents[2]


def _ctl(info: RabbitInfo, *args: str) -> str:
    """A shell command running rabbitmqctl against the private node."""
    return (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m devtools.rabbitmq"
            f" ctl --dir {shlex.quote(info.dir)} -- " + " ".join(args))


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitInfo]:
    try:
        find_server()
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    with running_rabbitmq(tmp_path_factory.mktemp("rabbitmq"), plugins=PLUGINS) as info:
        yield info


# hundreds of cases: minutes on a loaded machine (seconds on a quiet one), so a
# longer limit than the suite's 300 s; slow files also start first under xdist
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_suite_passes_against_rabbitmq(rabbit: RabbitInfo) -> None:
    cases = select(None)
    assert len(cases) >= 250
    settings = Settings(url=rabbit.amqp_url, http_url=rabbit.http_url,
                        alarm_cmd=_ctl(rabbit, "set_vm_memory_high_watermark", "0.000001"),
                        clear_alarm_cmd=_ctl(rabbit, "set_vm_memory_high_watermark", "0.4"),
                        restart_cmd=_ctl(rabbit, "stop_app") + " && "
                        + _ctl(rabbit, "start_app"))
    results = run_all(cases, settings, jobs=4)
    failed = [f"{r.id}: {r.detail}" for r in results if r.result == "fail"]
    assert failed == []
    skipped = {r.id for r in results if r.result == "skip"}
    assert all(s.startswith("x-delayed-message/") for s in skipped), skipped


def test_every_method_has_a_case() -> None:
    from conformance.coverage import missing

    assert missing() == []


def test_cli_exit_status_and_report(rabbit: RabbitInfo, tmp_path: Path) -> None:
    from conformance.cli import main

    report = tmp_path / "r.json"
    rc = main(["--url", rabbit.amqp_url, "--only", "^exchange.direct/", "--report",
               str(report), "--quiet"])
    assert rc == 0
    assert '"result": "pass"' in report.read_text()
    # a URL where nothing listens: every case fails, exit status 1
    bad = rabbit.amqp_url.replace(f":{rabbit.amqp_port}/", ":1/")
    assert main(["--url", bad, "--only", "^exchange.direct/exact", "--quiet"]) == 1
