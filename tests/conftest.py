"""Shared fixtures: a real amqpd process per test module (or per test when it must die).

Also the order files run in: those holding a test marked ``slow`` first. Under
pytest-xdist (``make test``: ``--dist loadfile --no-loadscope-reorder``) each file goes
to one worker in this order, so the longest ones start at once instead of last, and the
many short files fill the other workers meanwhile. Within a file nothing moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import xdist_guard
from tests.support.brokerproc import BrokerProcess


def pytest_configure(config: pytest.Config) -> None:
    xdist_guard.install(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow)  # stable


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
