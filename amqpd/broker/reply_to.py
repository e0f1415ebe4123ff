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

In a cluster (and between the workers of one node, which form one) a reply may be
published on another node than the requester's, as RabbitMQ allows: there a token
starts with its node's name (url-safe base64, then ``.``), and a reply to another node's
token is routed to the stand-in the cluster keeps for that inbox
(``cluster.reply_queue``), which forwards it over the link like any publish to a queue
led elsewhere. On a single node the token is what it always was.
"""

from __future__ import annotations

import base64
import binascii
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

def node_tag(node: str) -> str:
    """What starts the reply tokens of ``node`` in a cluster (no ``.`` in it)."""
    return base64.urlsafe_b64encode(node.encode()).decode().rstrip("=")


def token_node(token: str) -> str | None:
    """The node whose tag starts ``token``; None if it has none."""
    tag, dot, _rest = token.partition(".")
    if not dot or not tag:
        return None
    try:
        node = base64.b64decode(tag + "=" * (-len(tag) % 4), altchars=b"-_",
                                validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return node or None


class ReplyRegistry:
    """One vhost's reply inboxes (``vhost.replies``)."""

    def __init__(self, vhost: VHost | None = None) -> None:
        self.vhost = vhost  # its broker's cluster, if any, reaches other nodes' inboxes
        self.by_token: dict[str, ReplyQueue] = {}
        self.by_channel: dict[object, str] = {}  # requester's channel -> its token

    def route(self, routing_key: str) -> list[Any]:
        """The inbox for a reply addressed ``amq.rabbitmq.reply-to.<token>`` (in a
        cluster, the stand-in of another node's inbox)."""
        token = routing_key[len(PREFIX):]
        queue = self.by_token.get(token)
        if queue is not None:
            return [] if queue.deleted else [queue]
        cluster = self.vhost.broker.cluster if self.vhost is not None else None
        if cluster is None:
            return []
        node = token_node(token)
        if node is None or node == cluster.node_name:
            return []
        assert self.vhost is not None
        elsewhere = cluster.reply_queue(self.vhost.name, routing_key, node)
        return [elsewhere] if elsewhere is not None else []


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
            for callback in self.on_removed:  # another node's stream to it closes
                callback(self)
            self.on_removed.clear()


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
    cluster = channel.vhost.broker.cluster
    if cluster is not None:  # other nodes route replies to it by its node's tag
        token = node_tag(cluster.node_name) + "." + token
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


def inbox(vhost: VHost, name: str) -> ReplyQueue | None:
    """This node's live inbox addressed ``name`` (``amq.rabbitmq.reply-to.<token>``):
    where another node's stand-in delivers a reply (amqpd.cluster.reply_forward)."""
    if not name.startswith(PREFIX):
        return None
    queue = vhost.replies.by_token.get(name[len(PREFIX):])
    return queue if queue is not None and not queue.deleted else None


def pseudo_queue(vhost: VHost, name: str) -> Queue | None:
    """What a passive queue.declare of the reply-to names finds (RabbitMQ answers ok)."""
    if name == PSEUDO_QUEUE or (name.startswith(PREFIX)
                                and name[len(PREFIX):] in vhost.replies.by_token):
        return Queue(vhost, name)
    return None


__all__ = ["PREFIX", "PSEUDO_QUEUE", "DefaultExchange", "ReplyQueue", "ReplyRegistry",
           "consume", "inbox", "node_tag", "pseudo_queue", "rewrite", "token_node"]
