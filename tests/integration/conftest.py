"""Fixtures the integration tests share: a private etcd and three amqpd nodes joined through
it (tests/integration/cluster_support.py starts them). A test file that needs another
shape (two nodes, other settings) defines its own fixture of the same name. The
federation tests share ``two_sites`` (an upstream and a downstream single node) and
``upstream_and_pair`` (an upstream single node and a two-node cluster).

The web UI tests' fixtures live in webui_support.py and are made visible here, so a test
file names them as arguments without importing them: ``browser`` (headless Chromium, or
a skip saying what is missing), ``api`` (the HTTP API of the module's ``broker``) and
``ui`` (the browser logged in to it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster_support import ClusterNode, cluster_of, private_etcd, three_nodes
from tests.integration.fed_support import site, started_sites
from tests.integration.webui_support import api, browser, ui  # noqa: F401 - fixtures
from tests.support.brokerproc import BrokerProcess
from tests.support.etcdproc import EtcdProcess


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with private_etcd(tmp_path) as proc:
        yield proc


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    with three_nodes(tmp_path, etcd.url) as started:
        yield started


@pytest.fixture
def two_sites(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """An upstream site ("site-up") and a downstream one ("site-down"), single nodes
    with federation enabled (the federation tests' pair)."""
    with started_sites(tmp_path, "site-up", "site-down") as sites:
        yield sites


@pytest.fixture
def upstream_and_pair(tmp_path: Path) -> Iterator[tuple[BrokerProcess, list[ClusterNode]]]:
    """An upstream amqpd ("links-up", federation), and a two-node cluster (node-a,
    node-b) with the shovel and federation plugins; ``ignore``: one of two may serve
    alone."""
    up = site(tmp_path, "links-up").start()
    try:
        with private_etcd(tmp_path) as etcd, cluster_of(
                tmp_path, etcd.url, ("a", "b"), {"AMQPD_PLUGINS": "shovel,federation"},
                partition_handling="ignore") as pair:
            yield up, pair
    finally:
        up.stop()
