"""Operators see one node with ``workers = 2`` (docs/workers.md, "The HTTP port"): the
overview's message statistics and their samples, its queue and object totals, amqpctl
and the Prometheus counters count every message once, whichever worker its publisher,
its queue and its consumer are on; a web UI login made through the node's port opens
every worker.

Load goes through connections forced onto each worker (workers_support.connect_on),
into a queue owned by each, crossing both ways; what the node reports is checked
against what the test counted itself (publishes confirmed, messages got and acked).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.test_webui_api import Browser
from tests.integration.workers_support import (
    connect_on,
    node_api,
    read_ready,
    wait_for,
    worker_api,
    worker_info,
    workers_node,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(240)

# seconds between the workers' rate samples: short, so the samples catch up quickly
STATS = {"AMQPD_STATS_INTERVAL": "0.5"}
WINDOW = "msg_rates_age=60&msg_rates_incr=1&lengths_age=60&lengths_incr=1"


def scrape(node: BrokerProcess, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}{path}",
                                timeout=10) as resp:
        return str(resp.read().decode())


def series(text: str) -> dict[str, float]:
    """Prometheus text as {name and labels: value}; a series written twice fails."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            assert name not in out, f"{name} written twice"
            out[name] = float(value)
    return out


def amqpctl(node: BrokerProcess, *args: str) -> Any:
    """``amqpctl --json ARGS`` against the node's HTTP port, its output read."""
    run = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url",
                          f"http://127.0.0.1:{node.http_port}", "-u", "guest", "--password",
                          "guest", "--json", *args], capture_output=True, text=True,
                         timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def newest(details: dict[str, Any]) -> Any:
    samples = details.get("samples") or []
    return samples[0]["sample"] if samples else None


def cross_load(node: BrokerProcess) -> tuple[dict[str, int], list[pika.BlockingConnection]]:
    """Two connections, one on each worker, each owning a queue; each publishes (with
    confirms) into its own queue and the other's, and takes messages off the other's
    with basic.get and acks them. Returns what was done, counted here."""
    conns = [connect_on(node, 0), connect_on(node, 1)]
    chans = [c.channel() for c in conns]
    queues = ["ops.q0", "ops.q1"]
    for ch, q in zip(chans, queues, strict=True):
        ch.queue_declare(q)
        ch.confirm_delivery()
    for index in (0, 1):  # each worker knows the other's queue
        for q in queues:
            wait_for(lambda i=index, q=q: _known(node, i, q), 10, f"{q} on worker {index}")
    done = {"published": 0, "got": 0, "acked": 0}
    for ch, plan in zip(chans, ({"ops.q0": 9, "ops.q1": 7}, {"ops.q1": 5, "ops.q0": 4}),
                        strict=True):
        for q, n in plan.items():
            for i in range(n):
                ch.basic_publish("", q, f"{q}-{i}".encode())  # raises unless confirmed
                done["published"] += 1
    for ch, q, n in ((chans[0], "ops.q1", 6), (chans[1], "ops.q0", 3)):  # crossing
        deadline = time.monotonic() + 10
        got = 0
        while got < n and time.monotonic() < deadline:
            method, _props, _body = ch.basic_get(q)
            if method is None:
                continue
            got += 1
            ch.basic_ack(method.delivery_tag)
            done["acked"] += 1
        done["got"] += got
    # a consumer of each queue from the other worker's connection, on empty queues so
    # that nothing more is delivered: the consumer totals must count each once
    for ch, own in zip(chans, ("ops.e0", "ops.e1"), strict=True):
        ch.queue_declare(own)
    for index in (0, 1):
        for q in ("ops.e0", "ops.e1"):
            wait_for(lambda i=index, q=q: _known(node, i, q), 10, f"{q} on worker {index}")
    conns[0].channel().basic_consume("ops.e1", lambda *_a: None)
    conns[1].channel().basic_consume("ops.e0", lambda *_a: None)
    return done, conns


def _known(node: BrokerProcess, index: int, queue: str) -> bool:
    try:
        worker_api(node, index, f"/api/queues/%2F/{queue}")
    except urllib.error.HTTPError:
        return False
    return True


def test_the_overview_and_metrics_count_each_message_once(tmp_path: Path) -> None:
    """Publishes, gets and acks crossing between the workers: the overview's counts, the
    newest of its samples (every worker's, added up point by point), its queue totals
    and the Prometheus counters are what was done, as one process reports them (a copy
    of the other worker's queue counted each crossing message again, and the samples
    were the first worker's alone)."""
    with workers_node(tmp_path / "node", env=STATS) as node:
        done, conns = cross_load(node)
        left = done["published"] - done["got"]
        assert done["got"] > 0 and left > 0
        want_counts = {"publish": done["published"], "confirm": done["published"],
                       "deliver_get": done["got"], "ack": done["acked"], "redeliver": 0}

        def overview() -> dict[str, Any] | None:
            for conn in conns:
                conn.process_data_events(0)
            body = node_api(node, f"/api/overview?{WINDOW}")
            stats, totals = body["message_stats"], body["queue_totals"]
            counts = {k: stats.get(k) for k in want_counts}
            samples = {k: newest(stats.get(f"{k}_details", {})) for k in want_counts}
            lengths = (totals["messages"], totals["messages_ready"],
                       newest(totals["messages_details"]),
                       newest(totals["messages_ready_details"]))
            ok = counts == want_counts and samples == want_counts and lengths == (
                left, left, left, left)
            return body if ok else None

        try:
            body = wait_for(overview, 30, "the overview to count each message once")
        except AssertionError:
            raise AssertionError(f"done {done}, overview said "
                                 f"{node_api(node, f'/api/overview?{WINDOW}')}") from None
        assert body["object_totals"]["queues"] == 4
        assert body["object_totals"]["consumers"] == 2
        assert body["object_totals"]["connections"] == 2
        assert body["queue_totals"]["messages_unacknowledged"] == 0
        assert body["message_stats"]["deliver"] == done["got"]
        # amqpctl reads the same node: its status and lists are the whole node's
        status = amqpctl(node, "status")
        assert (status["connections"], status["queues"], status["consumers"],
                status["messages"]) == (2, 4, 2, left)
        queues = amqpctl(node, "list_queues", "name", "messages", "consumers")
        assert sum(q["messages"] for q in queues) == left
        assert sum(q["consumers"] for q in queues) == 2
        assert len(amqpctl(node, "list_connections")) == 2
        assert sorted(c["queue_name"] for c in amqpctl(node, "list_consumers")) == [
            "ops.e0", "ops.e1"]
        for conn in conns:
            conn.close()


def test_prometheus_counts_each_message_once_and_per_worker(tmp_path: Path) -> None:
    """The same crossing load: /metrics's global counters and totals are what was done
    (a copy of the other worker's queue counted each crossing message again), every
    series is written once, and /metrics/per-worker's figures, one per worker with its
    ``worker`` label, add up to the node's."""
    with workers_node(tmp_path / "node", env=STATS) as node:
        done, conns = cross_load(node)
        left = done["published"] - done["got"]

        def metrics() -> dict[str, float] | None:
            got = series(scrape(node, "/metrics"))
            wanted = {"rabbitmq_global_messages_received_total": done["published"],
                      "rabbitmq_global_messages_delivered_total": done["got"],
                      "rabbitmq_global_messages_acknowledged_total": done["acked"],
                      "rabbitmq_queue_messages": left, "rabbitmq_queues": 4,
                      "rabbitmq_consumers": 2, "rabbitmq_connections": 2}
            return got if all(got.get(k) == v for k, v in wanted.items()) else None

        try:
            wait_for(metrics, 30, "/metrics to count each message once")
        except AssertionError:
            raise AssertionError(f"done {done}, /metrics said "
                                 f"{scrape(node, '/metrics')}") from None
        # per worker: each figure once per worker, labelled, adding up to the node's
        per_worker = series(scrape(node, "/metrics/per-worker"))
        for name, value in (("rabbitmq_global_messages_received_total", done["published"]),
                            ("rabbitmq_global_messages_acknowledged_total", done["acked"])):
            assert sum(per_worker[f'{name}{{worker="{i}"}}'] for i in (0, 1)) == value
        series(scrape(node, "/metrics/per-object"))  # no series twice
        # each worker's own overview still shows its own view, copies included
        for index in (0, 1):
            assert worker_api(node, index, "/api/overview")["object_totals"]["queues"] == 4
        for conn in conns:
            conn.close()


def test_a_web_ui_login_through_the_node_opens_every_worker(tmp_path: Path) -> None:
    """The UI logs in through the node's port (the front sends that to the first worker)
    and then asks, with its cookie alone, for things only worker 1 has: its connection's
    page and the list with both workers' connections; closing that connection from the
    UI works, and a logout through the node ends the session on every worker."""
    with workers_node(tmp_path / "node") as node:
        conns = [connect_on(node, 0), connect_on(node, 1)]
        ui = Browser(f"http://127.0.0.1:{node.http_port}")
        status, _headers, page = ui.call("GET", "/", ui=False)
        assert status == 200 and b"app.js" in page
        status, _headers, body = ui.call("POST", "/api/login",
                                         {"username": "guest", "password": "guest"})
        assert status == 200, body
        listed = json.loads(ui.call("GET", "/api/connections")[2])
        assert len(listed) == 2, listed
        on_one = [c["name"] for c in worker_api(node, 1, "/api/connections")]
        assert len(on_one) == 1
        path = "/api/connections/" + urllib.parse.quote(on_one[0], safe="")
        status, _headers, body = ui.call("GET", path)
        assert status == 200, body
        assert json.loads(body)["name"] == on_one[0]
        # the worker itself takes the cookie (the UI's next request may go to it)
        cookie = "; ".join(f"{c.name}={c.value}" for c in ui.jar)
        port = worker_info(node, 1)["http_port"]
        direct = Browser(f"http://127.0.0.1:{port}")
        assert direct.call("GET", "/api/whoami", headers={"Cookie": cookie})[0] == 200
        status, _headers, body = ui.call("DELETE", path, headers={"X-Reason": "ui"})
        assert status == 204, body
        wait_for(lambda: not worker_api(node, 1, "/api/connections"), 10,
                 "worker 1's connection closed from the UI")
        assert ui.call("POST", "/api/logout")[0] == 204
        assert direct.call("GET", "/api/whoami", headers={"Cookie": cookie})[0] == 401
        assert ui.call("GET", "/api/overview")[0] == 401
        assert len(read_ready(node)["workers"]) == 2
        conns[0].close()
