"""Structured logs: one JSON event per line, login refusals, HTTP request context."""

from __future__ import annotations

import json
import time

import pika
import pytest

from tests.integration._http import Api, q
from tests.support.brokerproc import BrokerProcess


def json_events(proc: BrokerProcess) -> list[dict]:
    events = []
    for line in proc.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))  # every JSON line parses on its own
    return events


def wait_for(proc: BrokerProcess, predicate, timeout: float = 5.0) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        for event in json_events(proc):
            if predicate(event):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no matching log event in:\n{proc.tail()}")
        time.sleep(0.05)


def test_json_logs(fresh_broker: BrokerProcess) -> None:
    fresh_broker.extra_args += ["--log-format", "json"]
    fresh_broker.start()
    started = wait_for(fresh_broker, lambda e: "HTTP API listening" in e.get("event", ""))
    assert {"event", "level", "logger", "timestamp"} <= set(started)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:wrong@127.0.0.1:{fresh_broker.port}/%2F"))
    refused = wait_for(fresh_broker, lambda e: "login refused" in e.get("event", ""))
    assert refused["level"] == "warning"
    params = pika.URLParameters(fresh_broker.url)
    params.client_properties = {"connection_name": "logged"}
    conn = pika.BlockingConnection(params)
    wait_for(fresh_broker, lambda e: "connection opened" in e.get("event", ""))
    api = Api(fresh_broker.http_url)
    name = api.get("/api/connections").json()[0]["name"]
    api.delete(f"/api/connections/{q(name)}", headers={"X-Reason": "log test"})
    closed = wait_for(fresh_broker, lambda e: "closing connection via HTTP API" in
                      e.get("event", ""))
    assert closed["http_user"] == "guest" and closed["http_method"] == "DELETE"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        for _ in range(50):
            conn.process_data_events(0.1)
    lines = [ln for ln in fresh_broker.log_path.read_text().splitlines() if ln.strip()]
    assert all(ln.startswith("{") for ln in lines), lines
