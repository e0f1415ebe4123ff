"""Queue and consumer argument validation: RabbitMQ 3.10.8's 406 texts (checked against it)."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.ext_support import channel

Q = "for queue 'argq' in vhost '/'"


@pytest.mark.parametrize("args,text", [
    ({"x-queue-mode": "bogus"},
     f"invalid arg 'x-queue-mode' {Q}: \"unsupported queue mode 'bogus'\""),
    ({"x-dead-letter-exchange": 5},
     "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'argq' in vhost '/'"),
    ({"x-delivery-limit": 3},
     f"invalid arg 'x-delivery-limit' {Q} of queue type rabbit_classic_queue"),
    ({"x-max-priority": "high"},
     f"invalid arg 'x-max-priority' {Q}: \"expected integer, got longstr\""),
    ({"x-message-ttl": 2**40}, f"invalid arg 'x-message-ttl' {Q}: {{value_too_large,{2**40}}}"),
    ({"x-queue-version": 3},
     f"invalid arg 'x-queue-version' {Q}: \"unsupported queue version '3'\""),
    ({"x-overflow": 5}, f"invalid arg 'x-overflow' {Q}: {{unacceptable_type,signedint}}"),
    ({"x-dead-letter-routing-key": "k"},
     f"invalid arg 'x-dead-letter-routing-key' {Q}: routing_key_but_no_dlx_defined"),
    ({"x-queue-type": "bogus"},
     f"invalid arg 'x-queue-type' {Q}: \"unsupported queue type 'bogus'\""),
])
def test_invalid_queue_arguments(broker, args, text) -> None:
    with channel(broker.url) as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("argq", arguments=args)
    assert e.value.reply_code == 406
    assert e.value.reply_text == f"PRECONDITION_FAILED - {text}"


@pytest.mark.parametrize("args", [
    {"x-queue-mode": "lazy"}, {"x-queue-version": 2}, {"x-queue-type": "classic"},
    {"x-overflow": "reject-publish-dlx"}, {"x-max-length": 2**63 - 1},
])
def test_accepted_queue_arguments(broker, args) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("argok", arguments=args)
        ch.queue_delete("argok")


@pytest.mark.parametrize("args,text", [
    ({"x-priority": "high"},
     "invalid arg 'x-priority' for queue 'argc' in vhost '/': \"expected integer, got longstr\""),
    ({"x-stream-offset": "first"},
     "invalid arg 'x-stream-offset' for queue 'argc' in vhost '/' of queue type "
     "rabbit_classic_queue"),
])
def test_invalid_consumer_arguments(broker, args, text) -> None:
    with channel(broker.url) as ch:
        ch.queue_declare("argc")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch.basic_consume("argc", lambda *a: None, arguments=args)
    assert e.value.reply_text == f"PRECONDITION_FAILED - {text}"


def test_unknown_exchange_type_is_connection_error(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        conn.channel().exchange_declare("argx", "x-no-such-type")
    assert e.value.reply_code == 503
