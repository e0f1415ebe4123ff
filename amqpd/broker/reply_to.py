"""Direct reply-to (``amq.rabbitmq.reply-to``), as RabbitMQ documents it.

A requester consumes from the pseudo-queue ``amq.rabbitmq.reply-to`` in no-ack mode and
publishes requests with ``reply_to = "amq.rabbitmq.reply-to"`` *on the same channel*; the
broker rewrites that property to ``amq.rabbitmq.reply-to.<token>``. A responder publishes
the reply to the default exchange with that name as routing key and it goes straight to
the requester's consumer, with no queue declared anywhere.

Here the consumer is attached to a private, unnamed-in-the-vhost :class:`Queue`, so
delivery, flow control and channel close work exactly as for any queue; the token maps to
that queue in a process-wide registry and dies with the consumer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.broker import rawprops
from amqpd.broker.message import Message
from amqpd.broker.queue import Consumer, Queue
from amqpd.broker.vhost import generate_name
from amqpd.protocol import codec
from amqpd.protocol.constants import BASIC_CONSUME_OK
from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.channel import Channel
    from amqpd.broker.vhost import VHost

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = PSEUDO_QUEUE + "."

_by_token: dict[str, ReplyQueue] = {}
_by_channel: dict[int, str] = {}


class ReplyQueue(Queue):
    """The requester's private inbox: never in ``vhost.queues``, gone with its consumer."""

    def __init__(self, vhost: VHost, token: str, channel: Any) -> None:
        super().__init__(vhost, PSEUDO_QUEUE)
        self.token = token
        self.channel_id = id(channel)

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        if not self.consumers:
            self.deleted = True
            self.ready.clear()
            _by_token.pop(self.token, None)
            if _by_channel.get(self.channel_id) == self.token:
                del _by_channel[self.channel_id]


def consume(channel: Channel, consumer_tag: str, no_ack: bool, nowait: bool) -> None:
    """basic.consume on ``amq.rabbitmq.reply-to``."""
    if not no_ack:
        raise PreconditionFailed("reply consumer cannot acknowledge")
    if id(channel) in _by_channel:
        raise PreconditionFailed("reply consumer already set")
    tag = consumer_tag or generate_name("amq.ctag-")
    token = generate_name("")
    queue = ReplyQueue(channel.vhost, token, channel)
    consumer = Consumer(channel, queue, tag, True, False, 0, {})
    channel.consumers[tag] = consumer
    _by_token[token] = queue
    _by_channel[id(channel)] = token
    if not nowait:
        channel.session.conn.write(codec.method_frame(channel.number, BASIC_CONSUME_OK,
                                                   codec.shortstr(tag)))
    queue.add_consumer(consumer)


def rewrite(channel: Channel, message: Message) -> Message:
    """A request's ``reply_to = amq.rabbitmq.reply-to`` becomes this channel's address."""
    if message.props.get("reply_to") != PSEUDO_QUEUE:
        return message
    token = _by_channel.get(id(channel))
    if token is None:
        raise PreconditionFailed("fast reply consumer does not exist")
    fields = rawprops.split_properties(message.properties)  # other fields stay as sent
    fields["reply_to"] = rawprops.shortstr_field(PREFIX + token)
    return Message(message.exchange, message.routing_key, rawprops.join_properties(fields),
                   message.body, persistent=message.persistent)


def route(routing_key: str) -> list[Queue]:
    """The requester's inbox for a reply addressed ``amq.rabbitmq.reply-to.<token>``."""
    queue = _by_token.get(routing_key[len(PREFIX):])
    return [queue] if queue is not None and not queue.deleted else []


def pseudo_queue(vhost: VHost, name: str) -> Queue | None:
    """What a passive queue.declare of the reply-to names finds (RabbitMQ answers ok)."""
    if name == PSEUDO_QUEUE or (name.startswith(PREFIX) and name[len(PREFIX):] in _by_token):
        return Queue(vhost, name)
    return None


__all__ = ["PREFIX", "PSEUDO_QUEUE", "ReplyQueue", "consume", "pseudo_queue", "rewrite", "route"]
