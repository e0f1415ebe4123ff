"""Length limits: x-max-length, x-max-length-bytes, x-overflow; and their policies."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.ext_support import channel, count, drain, get_msg, set_policy, wait_for


def test_max_length_drop_head_keeps_newest(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("lim.q1", arguments={"x-max-length": 3})
        for i in range(10):
            ch.basic_publish("", "lim.q1", str(i).encode())
        assert drain(ch, "lim.q1") == [b"7", b"8", b"9"]


def test_max_length_bytes(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("lim.q2", arguments={"x-max-length-bytes": 10})
        for body in (b"aaaa", b"bbbb", b"cccc"):
            ch.basic_publish("", "lim.q2", body)
        assert drain(ch, "lim.q2") == [b"bbbb", b"cccc"]


def test_unacked_messages_do_not_count(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("lim.q3", arguments={"x-max-length": 1})
        ch.basic_publish("", "lim.q3", b"1")
        method = wait_for(lambda: ch.basic_get("lim.q3", auto_ack=False)[0], 3)
        ch.basic_publish("", "lim.q3", b"2")
        wait_for(lambda: count(ch, "lim.q3") == 1, 3)
        ch.basic_publish("", "lim.q3", b"3")  # now the ready one is dropped, not the unacked
        assert get_msg(ch, "lim.q3")[2] == b"3"
        ch.basic_ack(method.delivery_tag)


def test_reject_publish_nacks_confirm(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("lim.q4", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.queue_declare("lim.q4b")
        ch.queue_bind("lim.q4", "amq.fanout")
        ch.queue_bind("lim.q4b", "amq.fanout")
        ch.confirm_delivery()
        ch.basic_publish("amq.fanout", "", b"1")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("amq.fanout", "", b"2")
        assert drain(ch, "lim.q4") == [b"1"]  # the head is kept, the new one refused
        assert drain(ch, "lim.q4b") == [b"1", b"2"]  # other queues still take it
        ch.queue_unbind("lim.q4", "amq.fanout")
        ch.queue_unbind("lim.q4b", "amq.fanout")


def test_reject_publish_dlx_dead_letters_refused(broker) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("lim.dead")
        ch.queue_declare("lim.q5", arguments={
            "x-max-length": 1, "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "lim.dead"})
        ch.confirm_delivery()
        ch.basic_publish("", "lim.q5", b"1")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "lim.q5", b"2")
        _m, props, body = get_msg(ch, "lim.dead")
        assert body == b"2" and props.headers["x-death"][0]["reason"] == "maxlen"
        assert drain(ch, "lim.q5") == [b"1"]


def test_policy_max_length_lower_wins_and_overflow_argument_wins(broker) -> None:
    with channel(broker.url) as ch:
        assert set_policy(broker.http_url, "/", "lim-pol", "^limpol\\.",
                          {"max-length": 2, "overflow": "reject-publish"}) in (201, 204)
        ch.queue_declare("limpol.a", arguments={"x-max-length": 5, "x-overflow": "drop-head"})
        ch.queue_declare("limpol.b", arguments={"x-max-length": 1})
        for i in range(4):
            ch.basic_publish("", "limpol.a", str(i).encode())
            ch.basic_publish("", "limpol.b", str(i).encode())
        assert drain(ch, "limpol.a") == [b"2", b"3"]  # policy's 2 < 5, drop-head (argument)
        assert drain(ch, "limpol.b") == [b"0"]  # argument's 1 < 2, reject-publish (policy)


def test_invalid_overflow_is_406(broker) -> None:
    with channel(broker.url) as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("lim.bad", arguments={"x-overflow": "nope"})
    assert e.value.reply_code == 406 and "invalid_overflow" in e.value.reply_text


def test_policy_rejects_unknown_and_argument_only_keys(broker) -> None:
    assert set_policy(broker.http_url, "/", "bad1", ".*", {"max-priority": 5}) == 400
    assert set_policy(broker.http_url, "/", "bad2", ".*", {"max-length": -1}) == 400
    assert set_policy(broker.http_url, "/", "bad3", ".*", {"overflow": "x"}) == 400
