"""Shared fixtures: a real amqpd process per test module (or per test when it must die)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One amqpd for the whole module: tests use uniquely named resources."""
    proc = BrokerProcess(tmp_path_factory.mktemp("amqpd"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """An amqpd of this test's own (for kill/restart tests)."""
    proc = BrokerProcess(tmp_path / "amqpd")
    yield proc
    proc.stop()
