"""Message deduplication (rabbitmq-message-deduplication semantics) with pika."""

from __future__ import annotations

import json
import urllib.request

import pika
import pika.exceptions
import pytest

from tests.integration.ext_support import channel, count, drain, get_msg, set_policy, wait_for

DEDUP = "x-message-deduplication"


def _props(value: object, **headers: object) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-deduplication-header": value, **headers},
                                delivery_mode=2)


def _exchange(ch, name: str, **arguments: object) -> None:
    ch.exchange_declare(name, DEDUP, arguments={"x-cache-size": 1000, **arguments})


def _http_json(url: str) -> object:
    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def test_hundred_identical_publishes_route_once(broker) -> None:
    with channel(broker.url) as ch:
        _exchange(ch, "dd1")
        ch.queue_declare("dd1.a")
        ch.queue_declare("dd1.b")
        ch.queue_bind("dd1.a", "dd1", "ignored")  # fanout: keys do not matter
        ch.queue_bind("dd1.b", "dd1")
        ch.confirm_delivery()
        for _ in range(100):
            ch.basic_publish("dd1", "any", b"once", _props("order-1"))  # all confirmed
        ch.basic_publish("dd1", "", b"other", _props("order-2"))
        ch.basic_publish("dd1", "", b"no header")
        ch.basic_publish("dd1", "", b"no header")
        assert drain(ch, "dd1.a") == [b"once", b"other", b"no header", b"no header"]
        assert drain(ch, "dd1.b") == [b"once", b"other", b"no header", b"no header"]


def test_duplicate_is_unroutable_for_mandatory_and_acked(broker) -> None:
    """As with the plugin: a dropped duplicate is an unroutable message."""
    with channel(broker.url) as ch:
        _exchange(ch, "dd2")
        ch.queue_declare("dd2.q")
        ch.queue_bind("dd2.q", "dd2")
        ch.confirm_delivery()
        ch.basic_publish("dd2", "", b"first", _props("x"), mandatory=True)
        with pytest.raises(pika.exceptions.UnroutableError) as info:
            ch.basic_publish("dd2", "", b"again", _props("x"), mandatory=True)
        (returned,) = info.value.messages
        assert returned.method.reply_code == 312 and returned.body == b"again"
        ch.basic_publish("dd2", "", b"again, not mandatory", _props("x"))  # acked
        assert drain(ch, "dd2.q") == [b"first"]


def test_ttl_expiry_lets_a_value_through_again(broker) -> None:
    with channel(broker.url) as ch:
        _exchange(ch, "dd3", **{"x-cache-ttl": 300})
        ch.queue_declare("dd3.q")
        ch.queue_bind("dd3.q", "dd3")
        ch.basic_publish("dd3", "", b"1", _props("v"))
        ch.basic_publish("dd3", "", b"dup", _props("v"))
        # the message's own x-cache-ttl overrides the exchange's
        ch.basic_publish("dd3", "", b"long", _props("w", **{"x-cache-ttl": 60_000}))
        assert drain(ch, "dd3.q") == [b"1", b"long"]

        def through() -> bool:
            ch.basic_publish("dd3", "", b"2", _props("v"))
            return count(ch, "dd3.q") == 1
        wait_for(through, 5, 0.05)
        ch.basic_publish("dd3", "", b"still a dup", _props("w"))
        assert drain(ch, "dd3.q") == [b"2"]


def test_cache_is_bounded_oldest_leaves_first(broker) -> None:
    with channel(broker.url) as ch:
        ch.exchange_declare("dd4", DEDUP, arguments={"x-cache-size": 3})
        ch.queue_declare("dd4.q")
        ch.queue_bind("dd4.q", "dd4")
        for v in ("a", "b", "c", "d"):  # "a" is evicted by "d"
            ch.basic_publish("dd4", "", v.encode(), _props(v))
        for v in ("b", "c", "d", "a"):
            ch.basic_publish("dd4", "", v.encode() + b"!", _props(v))
        assert drain(ch, "dd4.q") == [b"a", b"b", b"c", b"d", b"a!"]
        info = _http_json(f"{broker.http_url}/api/exchanges/%2F/dd4")
        assert info["deduplication"]["cache_size"] == 3  # type: ignore[index]
        assert info["deduplication"]["cache_entries"] == 3  # type: ignore[index]
        assert info["deduplication"]["duplicates"] == 3  # type: ignore[index]
        metrics = urllib.request.urlopen(f"{broker.http_url}/metrics", timeout=5).read()
        assert b'amqpd_dedup_cache_entries{vhost="/",exchange="dd4"} 3' in metrics


@pytest.mark.parametrize("args,text", [
    ({}, "x-cache-size"),
    ({"x-cache-size": 0}, "x-cache-size"),
    ({"x-cache-size": "10"}, "x-cache-size"),
    ({"x-cache-size": 10, "x-cache-ttl": -1}, "x-cache-ttl"),
    ({"x-cache-size": 10, "x-cache-persistence": "tape"}, "x-cache-persistence"),
])
def test_bad_arguments_are_refused_with_406(broker, args, text) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.exchange_declare("dd5", DEDUP, arguments=args)
        assert info.value.reply_code == 406 and text in info.value.reply_text
    finally:
        conn.close()


def test_policy_caps_size_and_sets_ttl(broker) -> None:
    status = set_policy(broker.http_url, "/", "dd6", "^dd6$",
                        {"x-cache-size": 2, "x-cache-ttl": 60_000}, apply_to="exchanges")
    assert status in (201, 204)
    with channel(broker.url) as ch:
        _exchange(ch, "dd6")
        info = _http_json(f"{broker.http_url}/api/exchanges/%2F/dd6")
        dedup = info["deduplication"]  # type: ignore[index]
        assert dedup["cache_size"] == 2 and dedup["cache_ttl"] == 60_000
    assert set_policy(broker.http_url, "/", "dd6bad", "^none$",
                      {"x-cache-persistence": "tape"}, apply_to="exchanges") == 400


def test_disk_cache_survives_kill_9(fresh_broker) -> None:
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.exchange_declare("ddk", DEDUP, durable=True, arguments={
            "x-cache-size": 100, "x-cache-persistence": "disk"})
        ch.exchange_declare("ddm", DEDUP, durable=True, arguments={"x-cache-size": 100})
        ch.queue_declare("ddk.q", durable=True)
        ch.queue_declare("ddm.q", durable=True)
        ch.queue_bind("ddk.q", "ddk")
        ch.queue_bind("ddm.q", "ddm")
        ch.confirm_delivery()  # confirms wait for the log
        for i in range(20):
            ch.basic_publish("ddk", "", f"m{i}".encode(), _props(f"id-{i}"))
            ch.basic_publish("ddm", "", f"m{i}".encode(), _props(f"id-{i}"))
        ch.basic_publish("ddk", "", b"transient", pika.BasicProperties(
            headers={"x-deduplication-header": "id-t"}))
    fresh_broker.kill()  # kill -9 after the confirms
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.confirm_delivery()
        for i in range(20):  # a publisher retrying after the crash
            ch.basic_publish("ddk", "", f"r{i}".encode(), _props(f"id-{i}"))
            ch.basic_publish("ddm", "", f"r{i}".encode(), _props(f"id-{i}"))
        ch.basic_publish("ddk", "", b"rt", _props("id-t"))
        ch.basic_publish("ddk", "", b"new", _props("id-new"))
        # disk: every retry recognised, the transient's too (its message was lost)
        assert drain(ch, "ddk.q") == [f"m{i}".encode() for i in range(20)] + [b"new"]
        # memory: the cache was lost, the 20 retries went through
        assert len(drain(ch, "ddm.q")) == 40
        entries = _http_json(f"{fresh_broker.http_url}/api/exchanges/%2F/ddk")
        assert entries["deduplication"]["cache_entries"] == 22  # type: ignore[index]
    fresh_broker.stop()
    fresh_broker.start()  # a clean restart rebuilds it too
    with channel(fresh_broker.url) as ch:
        ch.basic_publish("ddk", "", b"again", _props("id-new"))
        ch.basic_publish("ddk", "", b"again", _props("id-3"))
        ch.basic_publish("ddk", "", b"fence", _props("id-fence"))
        assert get_msg(ch, "ddk.q")[2] == b"fence"
        assert count(ch, "ddk.q") == 0


# ---------------------------------------------------------------------- queue level
def _dedup_queue(ch, name: str, **arguments: object) -> None:
    ch.queue_declare(name, durable=True, arguments={DEDUP: True, **arguments})


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_queue_refuses_a_value_it_holds_and_releases_it_on_ack(broker, kind) -> None:
    with channel(broker.url) as ch:
        ch.queue_delete("qd1")
        _dedup_queue(ch, "qd1", **{"x-queue-type": kind})
        ch.confirm_delivery()
        ch.basic_publish("", "qd1", b"a", _props("v"), mandatory=True)
        # routed, then refused by the queue: not returned, confirmed (the plugin's way)
        ch.basic_publish("", "qd1", b"a again", _props("v"), mandatory=True)
        ch.basic_publish("", "qd1", b"b", _props("w"))
        assert count(ch, "qd1") == 2
        method, _, body = ch.basic_get("qd1", auto_ack=False)
        assert body == b"a"
        ch.basic_publish("", "qd1", b"while unacked", _props("v"))  # still in the queue
        ch.basic_nack(method.delivery_tag, requeue=True)  # back: still there
        ch.basic_publish("", "qd1", b"after requeue", _props("v"))
        got = []
        for _ in range(2):  # a quorum queue hands a returned message back later
            method, _, body = ch.basic_get("qd1", auto_ack=False)
            got.append(body)
        assert sorted(got) == [b"a", b"b"]
        ch.basic_publish("", "qd1", b"still unacked", _props("v"))
        ch.basic_ack(0, multiple=True)  # gone: the value is free
        ch.basic_publish("", "qd1", b"a2", _props("v"))
        assert drain(ch, "qd1") == [b"a2"]
        info = _http_json(f"{broker.http_url}/api/queues/%2F/qd1")
        assert info["deduplication"]["cache_entries"] == 0  # type: ignore[index]
        assert info["deduplication"]["duplicates"] == 4  # type: ignore[index]


def test_queue_releases_on_purge_expiry_and_dead_letter(broker) -> None:
    with channel(broker.url) as ch:
        _dedup_queue(ch, "qd2")
        ch.basic_publish("", "qd2", b"1", _props("p"))
        ch.queue_purge("qd2")
        ch.basic_publish("", "qd2", b"2", _props("p"))
        assert drain(ch, "qd2") == [b"2"]
        ch.queue_declare("qd3.dlq")
        _dedup_queue(ch, "qd3", **{"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": "qd3.dlq"})
        ch.basic_publish("", "qd3", b"expires", _props("e"))
        assert get_msg(ch, "qd3.dlq")[2] == b"expires"  # expired and dead-lettered
        ch.basic_publish("", "qd3", b"again", _props("e"))
        assert count(ch, "qd3") == 1


def test_queue_dedup_by_policy_and_bad_argument(broker) -> None:
    assert set_policy(broker.http_url, "/", "qd4", "^qd4$", {DEDUP: True},
                      apply_to="queues") in (201, 204)
    with channel(broker.url) as ch:
        ch.queue_declare("qd4")
        ch.basic_publish("", "qd4", b"1", _props(7))
        ch.basic_publish("", "qd4", b"2", _props(7))
        ch.basic_publish("", "qd4", b"3", _props("7"))  # another type: another value
        assert drain(ch, "qd4") == [b"1", b"3"]
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            conn.channel().queue_declare("qd5", arguments={DEDUP: "yes"})
        assert info.value.reply_code == 406 and DEDUP in info.value.reply_text
    finally:
        conn.close()


def test_queue_cache_is_rebuilt_from_its_messages_after_kill_9(fresh_broker) -> None:
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.queue_declare("qdk", durable=True, arguments={DEDUP: True})
        ch.confirm_delivery()
        for i in range(10):
            ch.basic_publish("", "qdk", f"m{i}".encode(), _props(f"id-{i}"))
    fresh_broker.kill()
    fresh_broker.start()
    with channel(fresh_broker.url) as ch:
        ch.confirm_delivery()
        for i in range(10):
            ch.basic_publish("", "qdk", f"r{i}".encode(), _props(f"id-{i}"))
        assert drain(ch, "qdk") == [f"m{i}".encode() for i in range(10)]


def test_a_nacked_message_is_forgotten_so_its_retry_goes_through(broker) -> None:
    """A queue's reject-publish refuses the first try (nack): the retry is not a duplicate."""
    with channel(broker.url) as ch:
        _exchange(ch, "dd7")
        ch.queue_declare("dd7.q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.queue_bind("dd7.q", "dd7")
        ch.confirm_delivery()
        ch.basic_publish("dd7", "", b"a", _props("a"))
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("dd7", "", b"b", _props("b"))  # the queue is full
        assert get_msg(ch, "dd7.q")[2] == b"a"
        ch.basic_publish("dd7", "", b"b", _props("b"))  # the retry: routed, acked
        assert drain(ch, "dd7.q") == [b"b"]


def test_cc_keys_ask_the_cache_once(broker) -> None:
    """vhost routing asks the exchange once per routing key (CC/BCC): one decision."""
    with channel(broker.url) as ch:
        _exchange(ch, "dd8")
        ch.queue_declare("dd8.q")
        ch.queue_bind("dd8.q", "dd8")
        ch.basic_publish("dd8", "a", b"1", _props("c", CC=["b", "c"]))
        ch.basic_publish("dd8", "a", b"2", _props("c", CC=["b"]))
        assert drain(ch, "dd8.q") == [b"1"]
        info = _http_json(f"{broker.http_url}/api/exchanges/%2F/dd8")
        assert info["deduplication"]["duplicates"] == 1  # type: ignore[index]
