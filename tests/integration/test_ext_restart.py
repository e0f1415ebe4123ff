"""Extensions on durable queues and exchanges survive a restart (graceful and kill -9)."""

from __future__ import annotations

import time

import pika

from tests.integration.ext_support import channel, count, drain, get_msg, set_policy, wait_for

PERSISTENT = 2


def _pub(ch, exchange: str, key: str, body: bytes, **props) -> None:
    ch.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=PERSISTENT,
                                                               **props))


def test_ttl_dead_letters_and_priorities_survive_restart(fresh_broker) -> None:
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.confirm_delivery()
        ch.queue_declare("r.dead", durable=True)
        ch.queue_declare("r.ttl", durable=True, arguments={
            "x-message-ttl": 1500, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "r.dead"})
        ch.queue_declare("r.keep", durable=True, arguments={"x-message-ttl": 600000})
        ch.queue_declare("r.prio", durable=True, arguments={"x-max-priority": 9})
        ch.queue_declare("r.rej", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "r.dead"})
        _pub(ch, "", "r.ttl", b"expires-after-restart")
        _pub(ch, "", "r.keep", b"kept")
        for body, prio in ((b"low", 1), (b"high", 9), (b"mid", 5), (b"high2", 9)):
            _pub(ch, "", "r.prio", body, priority=prio)
        ch.queue_declare("r.plain", durable=True)  # per-message TTL in a plain queue
        _pub(ch, "", "r.plain", b"expiring", expiration="1500")
        _pub(ch, "", "r.plain", b"staying")
        _pub(ch, "", "r.rej", b"rejected-before")
        method = wait_for(lambda: ch.basic_get("r.rej", auto_ack=False)[0], 3)
        ch.basic_reject(method.delivery_tag, requeue=False)
        wait_for(lambda: count(ch, "r.dead") == 1, 3)
    fresh_broker.stop()
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        assert count(ch, "r.keep") == 1
        assert drain(ch, "r.prio") == [b"high", b"high2", b"mid", b"low"]
        # the message dead-lettered before the restart kept its x-death
        _m, props, body = get_msg(ch, "r.dead")
        assert body == b"rejected-before"
        assert props.headers["x-death"][0]["reason"] == "rejected"
        # TTL still applies after the restart: the message expires and is dead-lettered
        _m, props, body = get_msg(ch, "r.dead", timeout=5)
        assert body == b"expires-after-restart"
        assert props.headers["x-death"][0]["reason"] == "expired"
        assert props.headers["x-death"][0]["queue"] == "r.ttl"
        assert count(ch, "r.ttl") == 0
        # the per-message TTL of a recovered message in a plain queue applies too
        wait_for(lambda: count(ch, "r.plain") == 1, 5)
        assert drain(ch, "r.plain") == [b"staying"]
        # and a new message still gets the queue's priorities
        for body, prio in ((b"a", 0), (b"b", 3)):
            _pub(ch, "", "r.prio", body, priority=prio)
        assert drain(ch, "r.prio") == [b"b", b"a"]


def test_delayed_messages_survive_kill(fresh_broker) -> None:
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.exchange_declare("r.delay", "x-delayed-message", durable=True,
                            arguments={"x-delayed-type": "direct"})
        ch.queue_declare("r.delayed", durable=True)
        ch.queue_bind("r.delayed", "r.delay", "k")
        ch.confirm_delivery()  # confirms wait for the log
        for i in range(20):
            _pub(ch, "r.delay", "k", f"m{i}".encode(), headers={"x-delay": 1200 + 10 * i})
        ch.basic_publish("r.delay", "k", b"transient", pika.BasicProperties(
            headers={"x-delay": 1200}))
    fresh_broker.kill()  # kill -9 after the confirms
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        wait_for(lambda: count(ch, "r.delayed") == 20, 10, 0.05)
        assert drain(ch, "r.delayed") == [f"m{i}".encode() for i in range(20)]
    fresh_broker.stop()
    fresh_broker.start()  # delivered messages were settled under the exchange's key
    with channel(fresh_broker.url) as ch:
        assert count(ch, "r.delayed") == 0
        ch.basic_publish("", "r.delayed", b"fence")
        assert get_msg(ch, "r.delayed")[2] == b"fence"


def test_policies_survive_restart(fresh_broker) -> None:
    fresh_broker.start()
    assert set_policy(fresh_broker.http_url, "/", "r-pol", "^rpol\\.",
                      {"max-length": 1}, priority=3, apply_to="queues") in (201, 204)
    with channel(fresh_broker.url) as ch:
        ch.queue_declare("rpol.q", durable=True)
    fresh_broker.stop()
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        for body in (b"1", b"2", b"3"):
            ch.basic_publish("", "rpol.q", body)
        assert drain(ch, "rpol.q") == [b"3"]


def test_held_messages_keep_their_due_time_in_the_log_index(fresh_broker, tmp_path) -> None:
    """A held message is written as the publish pipeline writes one for a durable queue
    (ENQUEUE_META), its due time as the record's expiry: the store's index carries it,
    so recovery learns every due time without reading a held message, and after a kill
    -9 the messages are released in due order, not before they are due. (Records from
    before this kept the due time only inside the message's exchange field, which
    recovery had to read back message by message.)"""
    import shutil

    from amqpd.broker.exchanges.delayed import store_key
    from amqpd.store.log import SharedLog

    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.exchange_declare("r.meta", "x-delayed-message", durable=True,
                            arguments={"x-delayed-type": "direct"})
        ch.queue_declare("r.meta.q", durable=True)
        ch.queue_bind("r.meta.q", "r.meta", "k")
        ch.confirm_delivery()  # confirms wait for the log
        # due times fixed up front, 300 ms apart, each delay counted from its own
        # publish: the confirmed publishes (an fsync each) may take longer than the
        # spacing on a loaded machine, which must not reorder the due times
        before = int(time.time() * 1000)
        targets = [before + 3000 + 300 * i for i in range(5)]
        for i in reversed(range(5)):
            delay = targets[i] - int(time.time() * 1000)
            _pub(ch, "r.meta", "k", f"d{i}".encode(), headers={"x-delay": delay})
        after = int(time.time() * 1000)
    fresh_broker.kill()
    copy = tmp_path / "log-copy"  # read offline, the broker's own directory untouched
    shutil.copytree(fresh_broker.data_dir / "log", copy)
    store = SharedLog(copy)
    try:
        held = store.open().queues[store_key("/", "r.meta")]
    finally:
        store.close()
    assert len(held.positions) == 5
    assert all(stamp >> 1 for stamp in held.stamps), "no publish time in the record"
    dues = sorted(extra >> 8 for extra in held.extra)
    # each due time is its target plus the time its publish took to reach the broker
    assert all(t <= due <= t + (after - before) for t, due in zip(targets, dues, strict=True))
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        wait_for(lambda: count(ch, "r.meta.q") >= 1, 10, 0.02)
        assert int(time.time() * 1000) >= targets[0], "released before due"
        wait_for(lambda: count(ch, "r.meta.q") == 5, 10, 0.05)
        assert drain(ch, "r.meta.q") == [f"d{i}".encode() for i in range(5)]
