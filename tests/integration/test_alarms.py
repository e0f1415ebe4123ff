"""Memory alarm: set at run time, publishers get connection.blocked, health says why."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from base64 import b64encode

import pika

from tests.support.brokerproc import BrokerProcess


def _get(url: str) -> tuple[int, dict]:
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _ctl(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", broker.http_url, *args],
                          capture_output=True, text=True, timeout=30)


def test_memory_alarm_blocks_and_unblocks_publishers(broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    events: list[str] = []
    conn.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
    conn.add_on_connection_unblocked_callback(lambda *_: events.append("unblocked"))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"before")
    try:
        assert _ctl(broker, "set_vm_memory_high_watermark", "0.0000001").returncode == 0
        status, body = _get(broker.http_url + "/api/health/checks/alarms")
        assert status == 503 and body["alarms"][0]["resource"] == "memory"
        status, body = _get(broker.http_url + "/health/ready")
        assert status == 503
        deadline = time.monotonic() + 10
        while "blocked" not in events and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert events == ["blocked"]
        ch.basic_publish("", q, b"held")  # buffered by the client/socket, not lost
    finally:
        assert _ctl(broker, "set_vm_memory_high_watermark", "0.4").returncode == 0
    deadline = time.monotonic() + 10
    while "unblocked" not in events and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert events == ["blocked", "unblocked"]
    assert _get(broker.http_url + "/api/health/checks/alarms")[0] == 200
    bodies: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(bodies) < 2 and time.monotonic() < deadline:
        method, _props, body = ch.basic_get(q, auto_ack=True)
        if method is not None:
            bodies.append(body)
    assert bodies == [b"before", b"held"]
    conn.close()


def test_bad_watermark_is_a_usage_error(broker: BrokerProcess) -> None:
    result = _ctl(broker, "set_vm_memory_high_watermark", "lots")
    assert result.returncode == 64
    assert "not a fraction" in result.stderr
