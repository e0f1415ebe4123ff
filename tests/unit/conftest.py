"""Fixtures the unit tests share: a private etcd per test module, for the code that
talks to etcd itself (the warren's election, the cluster's membership, definitions and
requests). Tests that need none never start it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.etcdproc import EtcdProcess


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(Path(tmp_path_factory.mktemp("etcd"))).start()
    yield proc
    proc.kill()
