"""A quorum queue's returned messages across a restart (graceful and kill -9).

A returned delivery (nack/reject with requeue) is written to the log again with its
``x-delivery-count`` (broker/quorum.py). That record must keep what the publish
pipeline stamped on the first one (publish time, per-message expiry: an ENQUEUE_META
record, store/format.py), as a classic queue's record keeps it, so that a restart does
not restart the message's TTL clock; and after a kill -9 the message comes back
redelivered, at the back of the queue, with the count it had.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.ext_support import channel, count, get_msg
from tests.support.brokerproc import BrokerProcess

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    try:
        yield b
    finally:
        b.kill()


def _written(ch: pika.adapters.blocking_connection.BlockingChannel) -> None:
    """Return once everything the broker appended to its log so far is durable: a
    confirmed persistent publish to a durable queue waits for the group commit, which
    covers every earlier record of the one log."""
    ch.queue_declare("qr.fence", durable=True)
    ch.basic_publish("", "qr.fence", b"fence", pika.BasicProperties(delivery_mode=2))


def _return_once(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> None:
    method, _props, _body = get_msg_unacked(ch, queue)
    ch.basic_nack(method.delivery_tag, requeue=True)


def get_msg_unacked(ch: pika.adapters.blocking_connection.BlockingChannel,
                    queue: str) -> tuple[pika.spec.Basic.GetOk, pika.BasicProperties, bytes]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=False)
        if method is not None:
            return method, props, body
        time.sleep(0.01)
    raise AssertionError(f"nothing in {queue} within 5 s")


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_ttl_of_a_returned_message_keeps_running_across_a_restart(
        broker: BrokerProcess, how: str) -> None:
    """TTL 4 s (queue and per message), returned once, restart at ~2.5 s: at 5 s both
    are gone. A record written without the first one's publish time and expiry restarted
    the clock at recovery (gone only at >= 6.5 s)."""
    broker.start()
    published = time.monotonic()
    with channel(broker.url) as ch:
        ch.confirm_delivery()
        ch.queue_declare("qr.qttl", durable=True, arguments={**QUORUM, "x-message-ttl": 4000})
        ch.queue_declare("qr.mttl", durable=True, arguments=QUORUM)
        ch.queue_declare("qr.keep", durable=True, arguments=QUORUM)
        ch.basic_publish("", "qr.qttl", b"q", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "qr.mttl", b"m", pika.BasicProperties(expiration="4000"))
        ch.basic_publish("", "qr.keep", b"k", pika.BasicProperties(delivery_mode=2))
        for queue in ("qr.qttl", "qr.mttl", "qr.keep"):
            _return_once(ch, queue)
        _written(ch)
    while time.monotonic() < published + 2.5:
        time.sleep(0.05)
    if how == "stop":
        assert broker.stop() == 0
    else:
        broker.kill()
    broker.start()
    with channel(broker.url) as ch:
        assert count(ch, "qr.keep") == 1  # recovered at all
        while time.monotonic() < published + 5.0:
            time.sleep(0.05)
        assert count(ch, "qr.qttl") == 0, "queue TTL restarted at recovery"
        assert count(ch, "qr.mttl") == 0, "per-message TTL restarted at recovery"
        assert count(ch, "qr.keep") == 1


def test_a_returned_message_comes_back_redelivered_with_its_count_after_kill(
        broker: BrokerProcess) -> None:
    """Two messages returned three times in turn, then kill -9: they come back in the
    order the returns left them, redelivered, with x-delivery-count 1 and 2 (basic.get
    shows the count)."""
    broker.start()
    with channel(broker.url) as ch:
        ch.confirm_delivery()
        ch.queue_declare("qr.count", durable=True, arguments=QUORUM)
        for body in (b"returned", b"fresh"):
            ch.basic_publish("", "qr.count", body, pika.BasicProperties(delivery_mode=2))
        for expected in (b"returned", b"fresh", b"returned"):  # each to the back
            method, _props, body = get_msg_unacked(ch, "qr.count")
            assert body == expected
            ch.basic_nack(method.delivery_tag, requeue=True)
        _written(ch)
    broker.kill()
    broker.start()
    with channel(broker.url) as ch:
        seen = []
        for _ in range(2):
            method, props, body = get_msg(ch, "qr.count")
            seen.append((body, method.redelivered, props.headers["x-delivery-count"]))
        assert seen == [(b"fresh", True, 1), (b"returned", True, 2)]
