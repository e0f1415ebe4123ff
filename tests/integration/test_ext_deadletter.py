"""Dead-lettering: reasons, the x-death header as RabbitMQ 3.10 writes it, cycles, policies."""

from __future__ import annotations

import datetime

import pika

from tests.integration.ext_support import channel, count, get_msg, set_policy, wait_for


def _dlx(ch, name: str) -> None:
    ch.exchange_declare(f"{name}.dlx", "fanout")
    ch.queue_declare(f"{name}.dead")
    ch.queue_bind(f"{name}.dead", f"{name}.dlx")


def test_reject_and_nack_dead_letter_with_x_death(broker) -> None:
    with channel(broker.url) as ch:
        _dlx(ch, "dl1")
        ch.queue_declare("dl1.q", arguments={"x-dead-letter-exchange": "dl1.dlx"})
        ch.basic_publish("", "dl1.q", b"a", pika.BasicProperties(headers={"keep": "me"}))
        ch.basic_publish("", "dl1.q", b"b")
        m1 = get_msg_noack(ch, "dl1.q")
        ch.basic_reject(m1.delivery_tag, requeue=False)
        m2 = get_msg_noack(ch, "dl1.q")
        ch.basic_nack(m2.delivery_tag, multiple=True, requeue=False)
        method, props, body = get_msg(ch, "dl1.dead")
        assert body == b"a" and method.exchange == "dl1.dlx" and method.routing_key == "dl1.q"
        h = props.headers
        assert h["keep"] == "me"
        (death,) = h["x-death"]
        assert death["count"] == 1 and death["reason"] == "rejected"
        assert death["queue"] == "dl1.q" and death["exchange"] == ""
        assert death["routing-keys"] == ["dl1.q"]
        assert isinstance(death["time"], datetime.datetime)
        assert h["x-first-death-reason"] == "rejected"
        assert h["x-first-death-queue"] == "dl1.q"
        assert h["x-first-death-exchange"] == ""
        assert not any(k.startswith("x-last-death") for k in h)  # 3.13+ only
        assert get_msg(ch, "dl1.dead")[2] == b"b"


def get_msg_noack(ch, queue: str):
    return wait_for(lambda: ch.basic_get(queue, auto_ack=False)[0], 3)


def test_expired_with_routing_key_cc_and_original_expiration(broker) -> None:
    with channel(broker.url) as ch:
        ch.exchange_declare("dl2.dlx", "direct")
        ch.queue_declare("dl2.dead")
        ch.queue_bind("dl2.dead", "dl2.dlx", "to-dead")
        ch.queue_declare("dl2.q", arguments={"x-dead-letter-exchange": "dl2.dlx",
                                             "x-dead-letter-routing-key": "to-dead"})
        ch.queue_declare("dl2.other")
        ch.basic_publish("", "dl2.q", b"x", pika.BasicProperties(
            expiration="30", headers={"CC": ["dl2.other"]}))
        method, props, _body = get_msg(ch, "dl2.dead")
        assert method.routing_key == "to-dead"
        assert props.expiration is None
        h = props.headers
        assert "CC" not in h  # removed when a dead-letter routing key is set
        (death,) = h["x-death"]
        assert death["reason"] == "expired"
        assert death["original-expiration"] == "30"
        assert death["routing-keys"] == ["dl2.q", "dl2.other"]  # includes CC


def test_maxlen_drop_head_dead_letters(broker) -> None:
    with channel(broker.url) as ch:
        _dlx(ch, "dl3")
        ch.queue_declare("dl3.q", arguments={"x-max-length": 1,
                                             "x-dead-letter-exchange": "dl3.dlx"})
        ch.basic_publish("", "dl3.q", b"1")
        ch.basic_publish("", "dl3.q", b"2")
        _m, props, body = get_msg(ch, "dl3.dead")
        assert body == b"1" and props.headers["x-death"][0]["reason"] == "maxlen"
        assert count(ch, "dl3.q") == 1


def test_count_increments_and_entry_moves_to_front(broker) -> None:
    """reject in A -> B (TTL) -> back to A: the x-death list as RabbitMQ 3.10 keeps it."""
    with channel(broker.url) as ch:
        ch.queue_declare("dl4.a", arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "dl4.b"})
        ch.queue_declare("dl4.b", arguments={"x-message-ttl": 20,
                                             "x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "dl4.a"})
        ch.basic_publish("", "dl4.a", b"m")
        for round_ in (1, 2):
            m = get_msg_noack(ch, "dl4.a")
            ch.basic_reject(m.delivery_tag, requeue=False)
            method, props, _ = wait_for(lambda: _get_full(ch, "dl4.a"), 3)
            deaths = props.headers["x-death"]
            assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
                ("dl4.b", "expired", round_), ("dl4.a", "rejected", round_)]
            assert props.headers["x-first-death-queue"] == "dl4.a"
            ch.basic_nack(method.delivery_tag, requeue=True)


def _get_full(ch, queue):
    method, props, body = ch.basic_get(queue, auto_ack=False)
    return (method, props, body) if method else None


def test_automatic_cycle_is_dropped(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("dl5.loop", arguments={"x-message-ttl": 20,
                                                "x-dead-letter-exchange": ""})
        ch.queue_declare("dl5.watch")
        ch.queue_declare("dl5.clock", arguments={"x-message-ttl": 150})
        ch.basic_publish("", "dl5.loop", b"m")
        ch.basic_publish("", "dl5.clock", b"tick")
        wait_for(lambda: count(ch, "dl5.loop") == 1, 3)
        # expires once, dead-letters back to itself: a cycle with no reject -> dropped
        wait_for(lambda: count(ch, "dl5.loop") == 0, 3)
        wait_for(lambda: count(ch, "dl5.clock") == 0, 3)  # 150 ms later: still gone
        assert count(ch, "dl5.loop") == 0


def test_missing_dlx_drops_and_no_dlx_drops(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("dl6.q", arguments={"x-dead-letter-exchange": "dl6.nonexistent"})
        ch.basic_publish("", "dl6.q", b"m")
        m = get_msg_noack(ch, "dl6.q")
        ch.basic_reject(m.delivery_tag, requeue=False)
        assert count(ch, "dl6.q") == 0


def test_dlx_by_policy_and_argument_wins(broker) -> None:
    with channel(broker.url) as ch:
        _dlx(ch, "dl7p")
        _dlx(ch, "dl7a")
        assert set_policy(broker.http_url, "/", "dl7", "^dl7\\.q",
                          {"dead-letter-exchange": "dl7p.dlx"}) in (201, 204)
        ch.queue_declare("dl7.q1")
        ch.queue_declare("dl7.q2", arguments={"x-dead-letter-exchange": "dl7a.dlx"})
        for q in ("dl7.q1", "dl7.q2"):
            ch.basic_publish("", q, q.encode())
            m = get_msg_noack(ch, q)
            ch.basic_reject(m.delivery_tag, requeue=False)
        assert get_msg(ch, "dl7p.dead")[2] == b"dl7.q1"
        assert get_msg(ch, "dl7a.dead")[2] == b"dl7.q2"
        assert count(ch, "dl7p.dead") == 0


def test_requeued_expired_message_is_dead_lettered_not_redelivered(broker) -> None:
    with channel(broker.url) as ch:
        _dlx(ch, "dl8")
        ch.queue_declare("dl8.q", arguments={"x-message-ttl": 60,
                                             "x-dead-letter-exchange": "dl8.dlx"})
        ch.queue_declare("dl8.clock", arguments={"x-message-ttl": 120})
        ch.basic_publish("", "dl8.q", b"m")
        ch.basic_publish("", "dl8.clock", b"tick")
        m = get_msg_noack(ch, "dl8.q")
        wait_for(lambda: count(ch, "dl8.clock") == 0, 3)  # > 60 ms have passed
        ch.basic_nack(m.delivery_tag, requeue=True)
        _m, props, body = get_msg(ch, "dl8.dead")
        assert body == b"m" and props.headers["x-death"][0]["reason"] == "expired"
        assert ch.basic_get("dl8.q", auto_ack=True)[0] is None
