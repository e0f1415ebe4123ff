"""amqpctl tells which broker it talks to and refuses amqpd-only commands elsewhere.

Issue 33: with no --url and no amqpd config, amqpctl silently used whatever answered on
15672 (there a RabbitMQ: ``amqpctl status`` printed ``product: RabbitMQ 3.10.8``). It now
says which API it chose, and a command only amqpd serves (the warren, the cluster's
membership, quorum-queue members, node memory) is refused against another product with
the product named, checked here against a private RabbitMQ 3.10.8."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpd.ctl_target import DEFAULT_CONFIG
from devtools.rabbitmq import RabbitInfo
from tests.support.brokerproc import BrokerProcess
from tests.support.targets import private_rabbitmq


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """amqpctl with no AMQPCTL_* or AMQPD_* settings of the test session."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AMQPCTL_", "AMQPD_")) or k == "AMQPD_PURE_PYTHON"}
    return subprocess.run([sys.executable, "-m", "amqpd.ctl", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitInfo]:
    with private_rabbitmq(tmp_path_factory, ("rabbitmq_management",)) as info:
        yield info


def test_amqpd_only_commands_refuse_another_product(rabbit: RabbitInfo) -> None:
    assert rabbit.http_url is not None  # the management plugin is enabled
    for command in (["promote"], ["replication_status"], ["grow", "rabbit@x", "all"],
                    ["set_vm_memory_high_watermark", "0.5"]):
        r = ctl("--url", rabbit.http_url, *command)
        assert r.returncode == 64, r.stderr
        assert r.stderr == (f"Error: {command[0]} is an amqpd command, but the broker at "
                            f"{rabbit.http_url} is RabbitMQ 3.10.8; pass --url to reach "
                            "an amqpd broker\n")
    # what both brokers serve still works against RabbitMQ
    r = ctl("--url", rabbit.http_url, "list_vhosts", "name")
    assert r.returncode == 0 and "/" in r.stdout.split(), r.stderr


def test_amqpd_only_commands_run_on_amqpd(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "amqpd").start()
    try:
        r = ctl("--url", broker.http_url, "set_vm_memory_high_watermark", "0.5")
        assert r.returncode == 0, r.stderr
    finally:
        broker.stop()


def test_no_url_and_no_config_says_which_api(tmp_path: Path) -> None:
    """With nothing to go by amqpctl uses amqpd's default (127.0.0.1:15672) and says so
    first; whatever answers there (or nothing) is not this test's business, only that
    the line comes before it."""
    if os.path.exists(DEFAULT_CONFIG):
        pytest.skip(f"{DEFAULT_CONFIG} exists on this machine: amqpctl would read it")
    r = ctl("--timeout", "2", "list_vhosts")
    assert r.stderr.splitlines()[0] == (
        "amqpctl: no --url, no amqpd config file and no AMQPD_* variables: using the API "
        "at http://127.0.0.1:15672 (amqpd's defaults)"), r.stderr
