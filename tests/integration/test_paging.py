"""Memory pressure: past its budgets the broker keeps messages only in the shared log, and
every one still comes back whole and in order.

The broker runs with tiny budgets (message_memory_budget 256 KiB, queue_memory_limit
64 KiB) so a few megabytes of messages push it into paging: transient messages fanned out
to several queues are written once for all of them, persistent ones in durable queues are
never written twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.support.brokerproc import BrokerProcess

BODY = 512
COUNT = 3000


@pytest.fixture
def tight_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data", env={
        "AMQPD_MESSAGE_MEMORY_BUDGET": str(256 * 1024),
        "AMQPD_QUEUE_MEMORY_LIMIT": str(64 * 1024),
    }).start()
    try:
        yield broker
    finally:
        broker.stop()


def log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in data_dir.rglob("*.log") if p.name != "amqpd.log")


def settled_log_bytes(data_dir: Path, at_least: int = 0, timeout: float = 15.0) -> int:
    """The log's size once it has stopped growing (transient messages are confirmed
    before the writer thread has them on disk)."""
    size, since = -1, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = log_bytes(data_dir)
        if now != size:
            size, since = now, time.monotonic()
        elif size >= at_least and time.monotonic() - since > 0.5:
            return size
        time.sleep(0.05)
    return size


def body(i: int) -> bytes:
    return i.to_bytes(4, "big") * (BODY // 4)


def drain(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> list[int]:
    got: list[int] = []
    for _ in range(10 * COUNT):
        method, _props, data = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        assert data == body(int.from_bytes(data[:4], "big")), "body damaged"
        got.append(int.from_bytes(data[:4], "big"))
    return got


def test_fanout_under_memory_pressure_is_written_once_and_delivered_whole(
        tight_broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(tight_broker.url))
    try:
        ch = conn.channel()
        ch.exchange_declare("page.fx", "fanout")
        queues = ["page.q.durable", "page.q.a", "page.q.b"]
        ch.queue_declare(queues[0], durable=True)
        for q in queues[1:]:
            ch.queue_declare(q)
        for q in queues:
            ch.queue_bind(q, "page.fx")
        ch.confirm_delivery()
        # the broker checks its budget once a second: publish until it pages
        n = 0
        for n in range(COUNT):
            ch.basic_publish("page.fx", "", body(n))  # transient
        start = log_bytes(tight_broker.data_dir)
        deadline = time.monotonic() + 10
        while log_bytes(tight_broker.data_dir) == start:
            assert time.monotonic() < deadline, "the broker never paged"
            n += 1
            ch.basic_publish("page.fx", "", body(n))
        before = settled_log_bytes(tight_broker.data_dir)
        for i in range(n + 1, n + 1 + COUNT):
            ch.basic_publish("page.fx", "", body(i))
        payload = COUNT * BODY
        written = settled_log_bytes(tight_broker.data_dir, before + payload) - before
        # paging: each message is in the log once, whatever the number of queues
        assert payload <= written < 1.5 * payload, f"{written} bytes logged for {payload}"
        for q in queues:
            assert drain(ch, q) == list(range(n + 1 + COUNT)), q
    finally:
        conn.close()


def test_persistent_backlog_past_the_queue_limit_is_delivered_whole(
        tight_broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(tight_broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare("page.persistent", durable=True)
        ch.confirm_delivery()
        before = log_bytes(tight_broker.data_dir)
        props = pika.BasicProperties(delivery_mode=2)
        for i in range(COUNT):
            ch.basic_publish("", "page.persistent", body(i), props)
        written = log_bytes(tight_broker.data_dir) - before
        assert COUNT * BODY <= written < 1.5 * COUNT * BODY  # each message once
        assert drain(ch, "page.persistent") == list(range(COUNT))
    finally:
        conn.close()
