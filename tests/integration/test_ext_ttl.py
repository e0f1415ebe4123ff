"""Message TTL (x-message-ttl, per-message expiration) and queue expiry (x-expires)."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.ext_support import (
    channel,
    count,
    get_msg,
    queue_exists,
    set_policy,
    wait_for,
)


def test_queue_ttl_expires_head_without_consumers(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("ttl.q1", arguments={"x-message-ttl": 80})
        for i in range(3):
            ch.basic_publish("", "ttl.q1", str(i).encode())
        wait_for(lambda: count(ch, "ttl.q1") == 3, 3)
        wait_for(lambda: count(ch, "ttl.q1") == 0, 3)
        assert ch.basic_get("ttl.q1", auto_ack=True)[0] is None


def test_per_message_expiration_never_delivered(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("ttl.q2")  # a plain queue: per-message TTL still applies
        ch.basic_publish("", "ttl.q2", b"short", pika.BasicProperties(expiration="150"))
        ch.basic_publish("", "ttl.q2", b"long", pika.BasicProperties(expiration="60000"))
        wait_for(lambda: count(ch, "ttl.q2") == 2, 3)
        wait_for(lambda: count(ch, "ttl.q2") == 1, 3)
        _m, props, body = get_msg(ch, "ttl.q2")
        assert body == b"long" and props.expiration == "60000"


def test_lower_of_queue_and_message_ttl_applies(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("ttl.q3", arguments={"x-message-ttl": 60000})
        ch.basic_publish("", "ttl.q3", b"a", pika.BasicProperties(expiration="40"))
        wait_for(lambda: count(ch, "ttl.q3") == 0, 3)
        ch.queue_declare("ttl.q4", arguments={"x-message-ttl": 40})
        ch.basic_publish("", "ttl.q4", b"a", pika.BasicProperties(expiration="60000"))
        wait_for(lambda: count(ch, "ttl.q4") == 0, 3)


def test_consumer_gets_only_unexpired(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("ttl.q5", arguments={"x-message-ttl": 50})
        ch.basic_publish("", "ttl.q5", b"old")
        wait_for(lambda: count(ch, "ttl.q5") == 1, 3)
        wait_for(lambda: count(ch, "ttl.q5") == 0, 3)
        ch.queue_declare("ttl.q5", arguments={"x-message-ttl": 50})
        got: list[bytes] = []
        ch.basic_consume("ttl.q5", lambda c, m, p, b: got.append(b), auto_ack=True)
        ch.basic_publish("", "ttl.q5", b"fresh")
        wait_for(lambda: (ch.connection.process_data_events(0.02), got)[1], 3)
        assert got == [b"fresh"]


def test_invalid_expiration_is_406(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("ttl.q6")
        ch.basic_publish("", "ttl.q6", b"x", pika.BasicProperties(expiration="abc"))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("ttl.q6", passive=True)
        assert err.value.reply_code == 406
        assert "invalid expiration 'abc'" in err.value.reply_text


@pytest.mark.parametrize("args,text", [
    ({"x-message-ttl": -1}, "{value_negative,-1}"),
    ({"x-expires": 0}, "{value_zero,0}"),
    ({"x-message-ttl": "1"}, "expected integer, got longstr"),
])
def test_invalid_ttl_arguments_are_406(broker, args, text) -> None:
    with channel(broker.url) as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("ttl.bad", arguments=args)
    assert err.value.reply_code == 406
    assert text in err.value.reply_text
    assert "for queue 'ttl.bad' in vhost '/'" in err.value.reply_text


def test_x_expires_deletes_unused_queue(broker) -> None:
    # the HTTP API loads at its first request (amqpd/http/listener.py), which can take
    # longer than the lease below: asked once before, it answers at once after
    queue_exists(broker.http_url, "/", "ttl.none")
    with channel(broker.url) as ch:
        ch.queue_declare("ttl.exp1", arguments={"x-expires": 600})
        ch.queue_declare("ttl.exp2", arguments={"x-expires": 600})
        ch.basic_consume("ttl.exp2", lambda *a: None, auto_ack=True)

        assert queue_exists(broker.http_url, "/", "ttl.exp1")
        # (a passive declare would renew the lease, as in RabbitMQ: ask over HTTP)
        wait_for(lambda: not queue_exists(broker.http_url, "/", "ttl.exp1"), 5, 0.05)
        # the queue with a consumer stays
        with channel(broker.url) as c2:
            assert c2.queue_declare("ttl.exp2", passive=True).method.consumer_count == 1


def test_ttl_by_policy_lower_value_wins(broker) -> None:
    with channel(broker.url) as ch:
        assert set_policy(broker.http_url, "/", "ttl-pol", "^ttlpol\\.",
                          {"message-ttl": 60000}, apply_to="queues") in (201, 204)
        ch.queue_declare("ttlpol.a", arguments={"x-message-ttl": 50})  # argument lower
        ch.queue_declare("ttlpol.b")  # policy only: 60 s
        ch.basic_publish("", "ttlpol.a", b"x")
        ch.basic_publish("", "ttlpol.b", b"x")
        wait_for(lambda: count(ch, "ttlpol.a") == 0, 3)
        assert count(ch, "ttlpol.b") == 1
        set_policy(broker.http_url, "/", "ttl-pol", "^ttlpol\\.", {"message-ttl": 30},
                   apply_to="queues")  # now the policy is lower, for new messages
        ch.queue_purge("ttlpol.b")
        ch.basic_publish("", "ttlpol.b", b"y")
        wait_for(lambda: count(ch, "ttlpol.b") == 0, 3)
