"""kill -9 the broker at random moments and check that nothing confirmed is lost.

Each round: a publisher sends persistent messages with confirms to a durable queue while
a consumer acks some of them; the broker is killed with SIGKILL at a random moment and
restarted; then the queue is drained and checked:

* every confirmed and not-acked message is there exactly once;
* an acked message may come back only marked redelivered (its ack may not have reached
  the disk), never twice;
* order is kept (log order is publish order);
* every body is whole (no half-written record survives), and transient messages are gone.
"""

from __future__ import annotations

import random
import threading
import time

import pika
import pytest

from tests.support.brokerproc import BrokerProcess

ROUNDS = 3
QUEUE = "crash-q"


def _publisher(url: str, round_no: int, confirmed: list[int], stop: threading.Event) -> None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        seq = 0
        while not stop.is_set() and seq < 100_000:
            seq += 1
            body = f"{round_no}:{seq}:".encode() + b"x" * (seq % 200)
            ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
            confirmed.append(seq)  # basic_publish returned: the broker confirmed it
            if seq % 50 == 0:  # a transient one now and then: must not survive
                ch.basic_publish("", QUEUE, f"{round_no}:t{seq}:".encode())
    except Exception:  # the broker was killed under us
        return


def _consumer(url: str, acked: set[int], stop: threading.Event) -> None:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=20)
        deadline = time.monotonic() + 30
        for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.05):
            if stop.is_set() or time.monotonic() > deadline:
                break
            if method is None:
                continue
            seq_s = body.split(b":")[1]
            if seq_s.startswith(b"t"):
                ch.basic_ack(method.delivery_tag)
                continue
            seq = int(seq_s)
            if seq % 3 == 0:  # ack a third, leave the rest unacked (they are requeued)
                ch.basic_ack(method.delivery_tag)
                acked.add(seq)
    except Exception:
        return


def _drain(url: str) -> list[tuple[bytes, bool]]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    out: list[tuple[bytes, bool]] = []
    for _ in range(200_000):
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        out.append((body, method.redelivered))
    conn.close()
    return out


@pytest.mark.slow
def test_kill_9_loses_no_confirmed_message(fresh_broker: BrokerProcess) -> None:
    rng = random.Random(20261129)
    fresh_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    conn.channel().queue_declare(QUEUE, durable=True)
    conn.close()
    for round_no in range(1, ROUNDS + 1):
        confirmed: list[int] = []
        acked: set[int] = set()
        stop = threading.Event()
        threads = [
            threading.Thread(target=_publisher, args=(fresh_broker.url, round_no, confirmed, stop)),
            threading.Thread(target=_consumer, args=(fresh_broker.url, acked, stop)),
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        want = rng.randint(200, 1500)  # kill after a random amount of confirmed traffic
        while len(confirmed) < want and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.random() * 0.2)
        fresh_broker.kill()
        stop.set()
        for t in threads:
            t.join(15)
        assert confirmed, "publisher confirmed nothing before the kill"
        fresh_broker.start()
        drained = _drain(fresh_broker.url)

        seen: list[int] = []
        for body, redelivered in drained:
            r, seq_s, tail = body.split(b":", 2)
            assert int(r) == round_no, f"message from another round: {body!r}"
            assert not seq_s.startswith(b"t"), f"transient message survived: {body!r}"
            seq = int(seq_s)
            assert tail == b"x" * (seq % 200), f"damaged body for {seq}"
            if seq in acked:
                assert redelivered, f"acked message {seq} came back not marked redelivered"
            seen.append(seq)
        assert len(seen) == len(set(seen)), "a message came back twice"
        assert seen == sorted(seen), "queue order not kept"
        missing = sorted(set(confirmed) - acked - set(seen))
        assert not missing, f"round {round_no}: {len(missing)} confirmed messages lost: " \
                            f"{missing[:10]}"
    fresh_broker.stop()
