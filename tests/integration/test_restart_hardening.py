"""What a restart (SIGTERM or kill -9) must never do, seen from a client:

* bring back a transient message, even one paged to the log under memory pressure;
* hand out a message that may have been delivered before a crash with redelivered=false;
* restart a TTL clock: a message expires when it would have without the restart.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.support.brokerproc import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    try:
        yield b
    finally:
        b.kill()


def _channel(b: BrokerProcess) -> tuple[pika.BlockingConnection, object]:
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    return conn, conn.channel()


def _count(b: BrokerProcess, queue: str) -> int:
    conn, ch = _channel(b)
    try:
        return int(ch.queue_declare(queue, passive=True).method.message_count)  # type: ignore[attr-defined]
    finally:
        conn.close()


def _log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "log").glob("*.log"))


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_paged_transient_messages_do_not_survive_a_restart(tmp_path: Path, how: str) -> None:
    b = BrokerProcess(tmp_path / "data", env={
        "AMQPD_MESSAGE_MEMORY_BUDGET": str(256 * 1024),
        "AMQPD_QUEUE_MEMORY_LIMIT": str(64 * 1024),
    }).start()
    try:
        conn, ch = _channel(b)
        ch.queue_declare("hard.transient", durable=True)  # type: ignore[attr-defined]
        ch.confirm_delivery()  # type: ignore[attr-defined]
        before = _log_bytes(b.data_dir)
        # paging of transient messages starts once the broker's once-a-second memory
        # check sees the budget exceeded: a fast broker can take 3,000 publishes before
        # that, so publish in rounds (at most 20,000 messages) until the log has grown
        sent = 0
        for _round in range(20):
            for _ in range(1000):
                ch.basic_publish("", "hard.transient", b"%06d" % sent + b"t" * 1018)  # type: ignore[attr-defined]
                sent += 1
            if _log_bytes(b.data_dir) - before >= 200_000:
                break
        conn.close()
        # paging happened: hundreds of KiB of transient messages went to the log
        deadline = time.monotonic() + 15
        while _log_bytes(b.data_dir) - before < 200_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _log_bytes(b.data_dir) - before >= 200_000, "nothing was paged"
        if how == "stop":
            assert b.stop() == 0
        else:
            b.kill()
        b.start()
        assert _count(b, "hard.transient") == 0, "transient messages came back"
    finally:
        b.kill()


def _publisher(url: str, queue: str, stop: threading.Event, sent: list[int]) -> None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        for seq in range(1, 200_000):
            if stop.is_set():
                break
            ch.basic_publish("", queue, b"%d" % seq, pika.BasicProperties(delivery_mode=2))
            sent.append(seq)
    except Exception:  # killed under us
        return


def _consumer(url: str, queue: str, stop: threading.Event, seen: set[int]) -> None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        for method, _props, body in ch.consume(queue, inactivity_timeout=0.05):
            if method is None:
                if stop.is_set():
                    break
                continue
            # delivered: it must come back redelivered if it comes back (its ack may
            # not have reached the disk)
            seen.add(int(body))
            if method.delivery_tag % 10 == 0:
                ch.basic_ack(method.delivery_tag, multiple=True)
    except Exception:
        return


@pytest.mark.slow
def test_every_message_delivered_before_a_kill_comes_back_redelivered(
        broker: BrokerProcess) -> None:
    rng = random.Random(18)
    broker.start()
    queue = "hard.redelivered"
    conn, ch = _channel(broker)
    ch.queue_declare(queue, durable=True)  # type: ignore[attr-defined]
    conn.close()
    wrong: list[int] = []
    for _round in range(4):
        stop = threading.Event()
        sent: list[int] = []
        seen: set[int] = set()
        threads = [threading.Thread(target=_publisher, args=(broker.url, queue, stop, sent)),
                   threading.Thread(target=_consumer, args=(broker.url, queue, stop, seen))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        want = rng.randint(1500, 4000)
        while len(sent) < want and time.monotonic() < deadline:
            time.sleep(0.005)
        broker.kill()
        stop.set()
        for t in threads:
            t.join(15)
        assert seen, "the consumer got nothing before the kill"
        broker.start()
        conn, ch = _channel(broker)
        for _ in range(400_000):
            method, _props, body = ch.basic_get(queue, auto_ack=True)  # type: ignore[attr-defined]
            if method is None:
                break
            if int(body) in seen and not method.redelivered:
                wrong.append(int(body))
        conn.close()
    assert not wrong, f"{len(wrong)} delivered messages came back with redelivered=false"


def test_ttl_clocks_keep_running_across_a_restart(broker: BrokerProcess) -> None:
    """TTL 4 s; restart at ~2.5 s; at 5 s both messages are gone (a clock that restarted
    at recovery would keep them until >= 6.5 s)."""
    broker.start()
    conn, ch = _channel(broker)
    ch.queue_declare("hard.qttl", durable=True, arguments={"x-message-ttl": 4000})  # type: ignore[attr-defined]
    ch.queue_declare("hard.mttl", durable=True)  # type: ignore[attr-defined]
    ch.queue_declare("hard.nottl", durable=True)  # type: ignore[attr-defined]
    ch.confirm_delivery()  # type: ignore[attr-defined]
    persistent = pika.BasicProperties(delivery_mode=2)
    published = time.monotonic()
    ch.basic_publish("", "hard.qttl", b"q", persistent)  # type: ignore[attr-defined]
    ch.basic_publish("", "hard.mttl", b"m", pika.BasicProperties(  # type: ignore[attr-defined]
        delivery_mode=2, expiration="4000"))
    ch.basic_publish("", "hard.nottl", b"n", persistent)  # type: ignore[attr-defined]
    conn.close()
    while time.monotonic() < published + 2.5:
        time.sleep(0.05)
    assert broker.stop() == 0
    broker.start()
    while time.monotonic() < published + 5.0:
        time.sleep(0.05)
    assert _count(broker, "hard.qttl") == 0, "queue TTL restarted at recovery"
    assert _count(broker, "hard.mttl") == 0, "per-message TTL restarted at recovery"
    assert _count(broker, "hard.nottl") == 1
