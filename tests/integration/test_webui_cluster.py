"""The web UI in a cluster and in a warren (issue 33), in headless Chromium.

A cluster node's UI shows every node (overview and Nodes page), whichever node it is;
a warren standby's UI says on every page that it is a standby and names the active (with
a link to the active's UI where the warren recorded its HTTP address). Real amqpd
processes: three cluster nodes on a private etcd, a static warren pair, and an etcd
warren pair. Skips where Chromium, its driver or etcd is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster_support import private_etcd, three_nodes
from tests.integration.warren_support import start_pair, status, wait_for
from tests.integration.webui_support import (
    go,
    login,
    page_errors,
    shot,
    text_of,
    wait,
    wait_text,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess
from tests.support.warren import WarrenNode, wait_active

pytestmark = pytest.mark.timeout(180)
needs_etcd = pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with private_etcd(tmp_path) as proc:
        yield proc


@needs_etcd
def test_a_cluster_nodes_ui_shows_every_node(browser: Any, tmp_path: Path,
                                             etcd: EtcdProcess) -> None:
    with three_nodes(tmp_path, etcd.url) as nodes:
        b = nodes[1]
        assert b.proc is not None
        login(browser, b.proc.http_url)
        go(browser, b.proc.http_url, "", "#overview-nodes")
        for n in nodes:
            wait_text(browser, "#overview-nodes", n.name)
        assert "node-b (this node)" in text_of(browser, "#overview-nodes")
        go(browser, b.proc.http_url, "nodes", "#nodes-table")
        wait(browser, lambda d: text_of(d, "#nodes-table tbody").count("running") >= 3,
             what="three running nodes")
        table = text_of(browser, "#nodes-table")
        assert all(n.name in table for n in nodes) and "cluster member" in table
        wait_text(browser, "#running-nodes", "node-a, node-b, node-c")
        assert text_of(browser, "#partitions") == "none"
        # the other members link to their own UI (the address the cluster recorded)
        links = {a.text: a.get_attribute("href")
                 for a in browser.find_elements("css selector", "#nodes-table td.name a")}
        assert set(links) == {"node-a", "node-c"}
        assert nodes[0].proc is not None
        assert links["node-a"].rstrip("/").endswith(f":{nodes[0].proc.http_port}")
        assert not page_errors(browser)
        shot(browser, "cluster-nodes")
        # a node that stops shows as not running on the others' pages
        nodes[2].stop()
        wait(browser, lambda d: "not running" in text_of(d, "#nodes-table"), timeout=40,
             what="node-c shown as not running")


def test_a_static_standbys_ui_says_it_is_a_standby(browser: Any,
                                                    tmp_path: Path) -> None:
    active, standby = start_pair(tmp_path)
    try:
        wait_for(lambda: any(s["in_sync"] for s in status(active).get("standbys", [])),
                 30, "an in-sync standby")
        login(browser, standby.http_url)
        wait_text(browser, "#role-banner", "is a standby")
        banner = text_of(browser, "#role-banner")
        assert "This node (node-b) is a standby" in banner and "node-a" in banner
        assert status(standby)["active"] in banner  # where the active replicates from
        go(browser, standby.http_url, "queues", "#queues-table")
        assert text_of(browser, "#role-banner") == banner  # on every page
        shot(browser, "standby", full=False)
        # the active's UI: no banner, its standby listed with its lag on the Nodes page
        login(browser, active.http_url)
        go(browser, active.http_url, "nodes", "#standbys-table")
        wait_text(browser, "#standbys-table", "node-b")
        assert "yes" in text_of(browser, "#standbys-table")  # in sync
        assert text_of(browser, "#replication-role") == "active"
        assert not browser.find_element("css selector", "#role-banner").is_displayed()
    finally:
        standby.stop()
        active.stop()


@needs_etcd
def test_an_etcd_warren_standby_links_to_the_active(browser: Any,
                                                    tmp_path: Path,
                                                    etcd: EtcdProcess) -> None:
    prefix = "/amqpd-test/webui-warren"
    first = WarrenNode("node-a", tmp_path / "a", [etcd.url], prefix).start()
    second: WarrenNode | None = None
    try:
        wait_active(first)
        second = WarrenNode("node-b", tmp_path / "b", [etcd.url], prefix,
                            peers=[first.repl_addr]).start()
        wait_for(lambda: second is not None and second.health("standby")[0] == 200, 30,
                 "node-b a standby")
        login(browser, second.http_url)
        wait_text(browser, "#role-banner", "is a standby")
        link = wait(browser, lambda d: d.find_elements("css selector", "#active-link"),
                    timeout=20, what="a link to the active's UI")[0]
        assert link.get_attribute("href").rstrip("/") == first.http_url
        assert "node-a" in link.text
        shot(browser, "warren-standby", full=False)
    finally:
        if second is not None:
            second.stop()
        first.stop()
