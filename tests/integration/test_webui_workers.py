"""The web UI of a node with two workers, in headless Chromium (issue 35: operators see
one node).

A login made through the node's HTTP port must hold for every page, whichever worker
serves the objects behind it (the session file the workers share); the lists show both
workers' connections and queues, one node on the nodes page, and a connection of either
worker opens and closes from its page. Before the shared sessions a login was valid on
one worker only (a connection page of the other worker was a 404); that was shown over
HTTP, never in a browser. One node for the module; skips where Chromium or its driver
is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration._http import Api, q
from tests.integration.webui_support import (
    go,
    module_broker,
    page_errors,
    shot,
    text_of,
    uid,
    wait,
    wait_text,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    yield from module_broker(tmp_path_factory, {"AMQPD_WORKERS": "2",
                                                "AMQPD_STATS_INTERVAL": "1"})


def worker_urls(broker: BrokerProcess) -> list[str]:
    """Each worker's private AMQP address (the ready file's), worker 0 first."""
    info = json.loads((broker.data_dir / "ready.json").read_text())
    workers = sorted(info["workers"], key=lambda w: w["index"])
    assert len(workers) == 2, info
    return [f"amqp://guest:guest@127.0.0.1:{w['amqp_port']}/%2F" for w in workers]


def connect(url: str, label: str) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    params.client_properties = {"connection_name": label}
    return pika.BlockingConnection(params)


def test_one_login_sees_and_acts_on_both_workers(ui: Any, broker: BrokerProcess,
                                                 api: Api) -> None:
    labels = [uid("on-worker-0"), uid("on-worker-1")]
    queues = [uid("q-worker-0"), uid("q-worker-1")]
    conns = [connect(url, label) for url, label in zip(worker_urls(broker), labels,
                                                       strict=True)]
    try:
        for conn, queue in zip(conns, queues, strict=True):
            conn.channel().queue_declare(queue)  # owned by the worker declaring it
        # the lists: both workers' connections and queues, one node
        go(ui, broker.http_url, "connections", "#connections-table")
        for label in labels:
            wait_text(ui, "#connections-table", label)
        shot(ui, "workers-connections")
        go(ui, broker.http_url, "queues", "#queues-table")
        for queue in queues:
            wait_text(ui, "#queues-table", queue)
        go(ui, broker.http_url, "nodes", "#nodes-table")
        node = api.get("/api/overview").json()["node"]
        wait_text(ui, "#nodes-table", node)
        rows = ui.find_elements("css selector", "#nodes-table tbody tr")
        assert len(rows) == 1, text_of(ui, "#nodes-table")  # one node, not a worker each
        go(ui, broker.http_url, "", "#rate-chart")
        assert not page_errors(ui)
        # each worker's connection opens from its page, and the second one closes there
        listed = {c["client_properties"].get("connection_name"): c["name"]
                  for c in api.get("/api/connections").json()}
        for label in labels:
            go(ui, broker.http_url, f"connections/{q(listed[label])}",
               "#connection-channels table")
            assert not page_errors(ui), label
            assert label in ui.find_element("css selector", "main").text
        shot(ui, "workers-connection-of-worker-1")
        ui.find_element("css selector", "main button.danger").click()
        ui.switch_to.alert.accept()
        wait(ui, lambda d: d.current_url.endswith("#/connections"), what="back to the list")
        deadline = time.monotonic() + 10
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            while time.monotonic() < deadline:
                conns[1].process_data_events(0.1)
        assert closed.value.reply_code == 320  # closed by the page
        assert conns[0].is_open  # the other worker's client is not touched
        conns[0].process_data_events(0)
    finally:
        for conn in conns:
            if conn.is_open:
                conn.close()
