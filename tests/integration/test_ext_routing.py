"""Alternate exchanges, CC/BCC, user-id validation, direct reply-to, consistent hashing."""

from __future__ import annotations

import collections

import pika
import pika.exceptions
import pytest

from tests.integration.ext_support import channel, count, drain, get_msg, set_policy, wait_for


def test_alternate_exchange_argument_policy_and_precedence(broker) -> None:
    with channel(broker.url) as ch:
        ch.exchange_declare("ae.alt1", "fanout")
        ch.exchange_declare("ae.alt2", "fanout")
        ch.queue_declare("ae.unrouted1")
        ch.queue_declare("ae.unrouted2")
        ch.queue_bind("ae.unrouted1", "ae.alt1")
        ch.queue_bind("ae.unrouted2", "ae.alt2")
        ch.exchange_declare("ae.main", "direct", arguments={"alternate-exchange": "ae.alt1"})
        ch.queue_declare("ae.bound")
        ch.queue_bind("ae.bound", "ae.main", "k")
        ch.basic_publish("ae.main", "k", b"routed")
        ch.basic_publish("ae.main", "nope", b"unrouted")
        assert get_msg(ch, "ae.bound")[2] == b"routed"
        assert get_msg(ch, "ae.unrouted1")[2] == b"unrouted"
        # policy: applies to an exchange without the argument; the argument wins otherwise
        assert set_policy(broker.http_url, "/", "ae-pol", "^ae\\.(main|pol)$",
                          {"alternate-exchange": "ae.alt2"}, apply_to="exchanges") in (201, 204)
        ch.exchange_declare("ae.pol", "direct")
        ch.basic_publish("ae.pol", "x", b"via-policy")
        ch.basic_publish("ae.main", "x", b"via-argument")
        assert get_msg(ch, "ae.unrouted2")[2] == b"via-policy"
        assert get_msg(ch, "ae.unrouted1")[2] == b"via-argument"


def test_cc_and_bcc(broker) -> None:
    with channel(broker.url) as ch:
        for q in ("cc.main", "cc.cc", "cc.bcc"):
            ch.queue_declare(q)
        ch.basic_publish("", "cc.main", b"m", pika.BasicProperties(
            headers={"CC": ["cc.cc"], "BCC": ["cc.bcc"], "x": 1}))
        for q in ("cc.main", "cc.cc", "cc.bcc"):
            method, props, body = get_msg(ch, q)
            assert body == b"m" and method.routing_key == "cc.main"
            assert props.headers == {"CC": ["cc.cc"], "x": 1}  # BCC stripped everywhere


def test_cc_must_be_an_array(broker) -> None:
    with channel(broker.url) as ch:
        ch.basic_publish("", "cc.main", b"m", pika.BasicProperties(headers={"CC": "oops"}))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("cc.main", passive=True)
        assert e.value.reply_code == 406


def test_user_id_validation(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("uid.q")
        ch.basic_publish("", "uid.q", b"ok", pika.BasicProperties(user_id="guest"))
        assert get_msg(ch, "uid.q")[1].user_id == "guest"
        ch.basic_publish("", "uid.q", b"bad", pika.BasicProperties(user_id="mallory"))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("uid.q", passive=True)
        assert e.value.reply_code == 406
        assert "user_id property set to 'mallory'" in e.value.reply_text


def test_direct_reply_to_round_trip(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        server, client = conn.channel(), conn.channel()
        server.queue_declare("rpc.requests")

        def serve(c, m, p, body):
            c.basic_publish("", p.reply_to, body.upper(),
                            pika.BasicProperties(correlation_id=p.correlation_id))
            c.basic_ack(m.delivery_tag)

        server.basic_consume("rpc.requests", serve)
        replies: list[tuple[str, bytes]] = []
        client.basic_consume("amq.rabbitmq.reply-to",
                             lambda c, m, p, b: replies.append((p.correlation_id, b)),
                             auto_ack=True)
        for i in range(3):
            client.basic_publish("", "rpc.requests", f"ping{i}".encode(), pika.BasicProperties(
                reply_to="amq.rabbitmq.reply-to", correlation_id=str(i)))
        wait_for(lambda: (conn.process_data_events(0.01), len(replies) == 3)[1], 5)
        assert sorted(replies) == [("0", b"PING0"), ("1", b"PING1"), ("2", b"PING2")]
        ok = client.queue_declare("amq.rabbitmq.reply-to", passive=True)
        assert ok.method.queue == "amq.rabbitmq.reply-to"
    finally:
        conn.close()


def test_direct_reply_to_errors(broker) -> None:
    with channel(broker.url) as ch:
        ch.basic_publish("", "rpc.none", b"x",
                         pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_declare("rpc.none")
        assert e.value.reply_code == 406
        assert "fast reply consumer does not exist" in e.value.reply_text
    with channel(broker.url) as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False)
    assert "reply consumer cannot acknowledge" in e.value.reply_text


def test_capability_advertised(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        caps = conn._impl.server_properties["capabilities"]
        assert caps["direct_reply_to"] is True
    finally:
        conn.close()


def test_consistent_hash_exchange(broker) -> None:
    with channel(broker.url) as ch:
        ch.exchange_declare("chx", "x-consistent-hash")
        ch.queue_declare("chx.a")
        ch.queue_declare("chx.b")
        ch.queue_bind("chx.a", "chx", "1")
        ch.queue_bind("chx.b", "chx", "3")
        for i in range(2000):
            ch.basic_publish("chx", f"key-{i}", str(i).encode())
        for _i in range(50):  # the same routing key always lands in the same queue
            ch.basic_publish("chx", "sticky", b"s")
        wait_for(lambda: count(ch, "chx.a") + count(ch, "chx.b") == 2050, 5)
        a, b = drain(ch, "chx.a"), drain(ch, "chx.b")
        assert (a.count(b"s"), b.count(b"s")) in ((50, 0), (0, 50))
        share_b = (len(b) - b.count(b"s")) / 2000
        assert 0.6 < share_b < 0.9  # weight 3 of 4


def test_consistent_hash_on_header_and_bad_weight(broker) -> None:
    with channel(broker.url) as ch:
        ch.exchange_declare("chx.h", "x-consistent-hash", arguments={"hash-header": "user"})
        ch.queue_declare("chx.h1")
        ch.queue_declare("chx.h2")
        ch.queue_bind("chx.h1", "chx.h", "10")
        ch.queue_bind("chx.h2", "chx.h", "10")
        for i in range(200):
            ch.basic_publish("chx.h", str(i), b"", pika.BasicProperties(
                headers={"user": f"u{i % 3}"}))
        wait_for(lambda: count(ch, "chx.h1") + count(ch, "chx.h2") == 200, 5)
        where: dict[str, set[str]] = collections.defaultdict(set)
        for q in ("chx.h1", "chx.h2"):
            while True:
                method, props, _ = ch.basic_get(q, auto_ack=True)
                if method is None:
                    break
                where[props.headers["user"]].add(q)
        assert set(where) == {"u0", "u1", "u2"}
        assert all(len(queues) == 1 for queues in where.values())  # a user sticks to a queue
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.queue_bind("chx.h1", "chx.h", "heavy")
        assert e.value.reply_code == 406
