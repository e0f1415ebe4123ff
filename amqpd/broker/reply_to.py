"""Direct reply-to (``amq.rabbitmq.reply-to``), as RabbitMQ documents it.

A requester consumes from the pseudo-queue ``amq.rabbitmq.reply-to`` in no-ack mode and
publishes requests with ``reply_to = "amq.rabbitmq.reply-to"`` *on the same channel*; the
broker rewrites that property to ``amq.rabbitmq.reply-to.<token>``. A responder publishes
the reply to the default exchange with that name as routing key and it goes straight to
the requester's consumer, with no queue declared anywhere.

Here the consumer is attached to a private, unnamed-in-the-vhost :class:`ReplyQueue`, so
delivery, flow control and channel close work exactly as for any queue. Each vhost keeps
its own :class:`ReplyRegistry` (token -> inbox, channel -> token); the vhost's default
exchange (:class:`DefaultExchange`) routes a reply key to the inbox, so a reply is an
ordinary routing result of the default exchange. An inbox dies with its consumer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from amqpd.broker import rawprops
from amqpd.broker.exchange import Destination
from amqpd.broker.exchanges.direct import DirectExchange
from amqpd.broker.message import Message
from amqpd.broker.queue import Consumer, Queue
from amqpd.protocol import codec
from amqpd.protocol.constants import BASIC_CONSUME_OK
from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.channel import Channel
    from amqpd.broker.vhost import VHost

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = PSEUDO_QUEUE + "."

class ReplyRegistry:
    """One vhost's reply inboxes (``vhost.replies``)."""

    def __init__(self) -> None:
        self.by_token: dict[str, ReplyQueue] = {}
        self.by_channel: dict[object, str] = {}  # requester's channel -> its token

    def route(self, routing_key: str) -> list[Queue]:
        """The inbox for a reply addressed ``amq.rabbitmq.reply-to.<token>``."""
        queue = self.by_token.get(routing_key[len(PREFIX):])
        return [queue] if queue is not None and not queue.deleted else []


class DefaultExchange(DirectExchange):
    """A vhost's default exchange: direct by queue name, and reply keys to their inbox."""

    def __init__(self, vhost: str, replies: ReplyRegistry) -> None:
        super().__init__(vhost, "", durable=True)
        self.replies = replies

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        if routing_key.startswith(PREFIX):
            return self.replies.route(routing_key)
        return super().route(message, routing_key)


class ReplyQueue(Queue):
    """The requester's private inbox: never in ``vhost.queues``, gone with its consumer."""

    def __init__(self, vhost: VHost, token: str, channel: Any) -> None:
        super().__init__(vhost, PSEUDO_QUEUE)
        self.token = token
        self.channel = channel

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        if not self.consumers:
            self.deleted = True
            self.ready.clear()
            replies = self.vhost.replies
            replies.by_token.pop(self.token, None)
            if replies.by_channel.get(self.channel) == self.token:
                del replies.by_channel[self.channel]


def consume(channel: Channel, consumer_tag: str, no_ack: bool, nowait: bool) -> None:
    """basic.consume on ``amq.rabbitmq.reply-to``."""
    from amqpd.broker.vhost import generate_name

    if not no_ack:
        raise PreconditionFailed("reply consumer cannot acknowledge")
    replies = channel.vhost.replies
    if channel in replies.by_channel:
        raise PreconditionFailed("reply consumer already set")
    tag = consumer_tag or generate_name("amq.ctag-")
    token = generate_name("")
    queue = ReplyQueue(channel.vhost, token, channel)
    consumer = Consumer(channel, queue, tag, True, False, 0, {})
    channel.consumers[tag] = consumer
    replies.by_token[token] = queue
    replies.by_channel[channel] = token
    if not nowait:
        channel.session.conn.write(codec.method_frame(channel.number, BASIC_CONSUME_OK,
                                                   codec.shortstr(tag)))
    queue.add_consumer(consumer)


def rewrite(channel: Channel, message: Message) -> Message:
    """A request's ``reply_to = amq.rabbitmq.reply-to`` becomes this channel's address."""
    if message.props.get("reply_to") != PSEUDO_QUEUE:
        return message
    token = channel.vhost.replies.by_channel.get(channel)
    if token is None:
        raise PreconditionFailed("fast reply consumer does not exist")
    fields = rawprops.split_properties(message.properties)  # other fields stay as sent
    fields["reply_to"] = rawprops.shortstr_field(PREFIX + token)
    return Message(message.exchange, message.routing_key, rawprops.join_properties(fields),
                   message.body, persistent=message.persistent)


def pseudo_queue(vhost: VHost, name: str) -> Queue | None:
    """What a passive queue.declare of the reply-to names finds (RabbitMQ answers ok)."""
    if name == PSEUDO_QUEUE or (name.startswith(PREFIX)
                                and name[len(PREFIX):] in vhost.replies.by_token):
        return Queue(vhost, name)
    return None


__all__ = ["PREFIX", "PSEUDO_QUEUE", "DefaultExchange", "ReplyQueue", "ReplyRegistry",
           "consume", "pseudo_queue", "rewrite"]
