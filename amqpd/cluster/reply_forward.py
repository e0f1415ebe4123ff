"""Direct reply-to across nodes: a reply published on one node to a requester on another.

RabbitMQ lets the responder publish its reply on any node of the cluster; with
``workers = N`` the responder's connection is on one worker and the requester's often
on the other. A reply token names its node (``amqpd.broker.reply_to``); the default
exchange of another node asks :meth:`ReplyForwards.route` for a stand-in of that inbox:
a :class:`RemoteQueue` whose leader is the requester's node and whose name is the
reply-to address. The publish pipeline forwards to it as to any queue led elsewhere
(batched on the link, confirmed by the owner), and the owner's side of the link opens
the stream on the inbox itself (``ClusterQueues._open``: :func:`reply_inbox`). An inbox
that is gone there answers the stream with 404 and its stand-in here is dropped, so a
later reply to it is dropped as on one node.

Stand-ins are kept for the replies to come (a requester gets many replies), at most
:data:`MAX_STANDINS`, the least recently used closed first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Final

from amqpd.cluster.remote_queue import RemoteQueue, remote_class

if TYPE_CHECKING:
    from amqpd.cluster.cluster_queues import ClusterQueues

MAX_STANDINS: Final = 1024


class ReplyForwards:
    """This node's stand-ins of other nodes' reply inboxes, (vhost, address) -> queue."""

    def __init__(self, queues: ClusterQueues) -> None:
        self.queues = queues
        self.standins: OrderedDict[tuple[str, str], RemoteQueue] = OrderedDict()

    def route(self, vhost: str, name: str, node: str) -> RemoteQueue | None:
        """The stand-in of ``node``'s inbox ``name``; None if ``node`` is no running
        member or the inbox is known to be gone."""
        key = (vhost, name)
        queue = self.standins.get(key)
        if queue is not None:
            if queue.gone or queue.deleted or queue.leader != node:
                self._drop(key)
                return None
            self.standins.move_to_end(key)
            return queue
        if node not in self.queues.view.nodes() or not self.queues.view.is_running(node):
            return None
        vh = self.queues.broker.vhosts.get(vhost)
        if vh is None:
            return None
        queue = remote_class("classic")(vh, name, durable=False, auto_delete=False,
                                        arguments={}, port=self.queues.broker)
        self.queues.adopt(queue, node)
        self.standins[key] = queue
        while len(self.standins) > MAX_STANDINS:
            self._drop(next(iter(self.standins)))
        return queue

    def _drop(self, key: tuple[str, str]) -> None:
        queue = self.standins.pop(key)
        self.queues.forget(queue)
        queue.deleted = True


__all__ = ["MAX_STANDINS", "ReplyForwards"]
