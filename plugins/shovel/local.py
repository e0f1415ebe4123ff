"""A shovel destination that is this node: ``dest-uri`` ``amqp://`` (no host).

RabbitMQ reaches its own node through a direct connection here; amqpd publishes
through the public broker API (:meth:`BrokerAPI.publish`), as a federation link does
for its local republish. What that buys is the per-queue publish of
:class:`~plugins.common.republish.LocalPublisher`: with ``ack-mode: on-confirm``, a
message whose destination exchange routes to several queues is published once per
queue, and when one of them refuses it (a quorum queue electing a leader, a queue at its
``x-max-length`` with ``reject-publish``) only that queue gets it again, after a backoff
and flagged ``x-shovel-retry``; the queues that confirmed it are never sent a second
copy. Over an AMQP connection the broker answers one confirm per publish, so the shovel
cannot tell which queue refused and a retry goes through the exchange again; a remote
amqpd does the per-queue part itself when the shovel announces ``publish_retry_of``
(docs/shovel.md).

The contract towards the runner is the one :class:`AMQPDestination` keeps: sequence
numbers 1, 2, ... per attempt, and a confirm per number. Here a confirm is always an
ack (a refusal is retried inside the publisher); after
:data:`~plugins.common.republish.MAX_ATTEMPTS` refused tries of one message, or when
the exchange or vhost is gone, :meth:`closed` completes and the attempt ends (the
source requeues what was not acked, as when a remote destination goes away).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import Message
from plugins.common.republish import Held, LocalPublisher
from plugins.common.taken import Pass
from plugins.shovel.destination import Destination, OnConfirm
from plugins.shovel.destination import Message as Outgoing
from plugins.shovel.params import ShovelDef
from plugins.shovel.wire import RETRY_OF_HEADER, decode_properties, encode_properties

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI

log = logging.getLogger("amqpd.shovel")

RETRY_HEADER = "x-shovel-retry"  # the try number on a publish sent again after a refusal
ALARM_POLL = 0.1  # seconds between looks at a resource alarm that holds publishes back


def mark_retry(properties: bytes, attempt: int, first: int | None = None) -> bytes:
    """The properties of try number ``attempt`` (2, 3, ...) of a refused message:
    ``x-shovel-retry`` says it may be a repeat (a refusal does not prove the queue
    lacks it). ``first``: the confirm sequence number of its first try, for a remote
    amqpd that routes the retry only into the queues that did not take that one
    (``x-publish-retry-of``, which that broker removes before storing the message)."""
    props = decode_properties(properties)
    headers = {**(props.headers or {}), RETRY_HEADER: attempt}
    if first is not None:
        headers[RETRY_OF_HEADER] = first
    props.headers = headers
    return encode_properties(props)


class LocalDestination(Destination):
    def __init__(self, defn: ShovelDef, api: BrokerAPI, vhost: str) -> None:
        self.defn = defn
        self.api = api
        self.vhost = vhost
        self.seq = 0
        self.publisher: LocalPublisher | None = None
        self._closed: asyncio.Future[Any] | None = None

    async def open(self, on_confirm: OnConfirm | None) -> None:
        d, api = self.defn, self.api
        self._closed = asyncio.get_running_loop().create_future()
        api.vhost(self.vhost)  # 404 when the vhost is missing: the attempt fails
        if d.dest_queue is not None:
            if api.find_queue(self.vhost, d.dest_queue) is None:
                api.declare_queue(self.vhost, d.dest_queue, durable=True,
                                  arguments=d.dest_queue_args or None)
        elif d.dest_exchange:
            api.exchange(self.vhost, d.dest_exchange)  # never declared: 404, as RabbitMQ
        self.seq = 0
        if on_confirm is not None:
            def settle(seq: int, ok: bool) -> None:
                on_confirm(seq, False, ok)

            self.publisher = LocalPublisher(
                api, self.vhost, f"shovel '{d.name}' in vhost '{d.vhost}'", settle,
                mark_retry, _no_status, self._give_up, log)

    async def publish_many(self, messages: list[Outgoing],
                           records: list[Pass | None] | None = None) -> int:
        closed = self._closed
        assert closed is not None
        # publishers are held back while a resource alarm is on: this one too
        while self.api.alarms_active() and not closed.done():
            await asyncio.sleep(ALARM_POLL)
        if closed.done():
            raise ConnectionError(f"destination closed: {closed.result()}")
        first = self.seq + 1
        publisher = self.publisher
        try:
            for i, (exchange, routing_key, properties, body) in enumerate(messages):
                self.seq += 1
                if publisher is not None:
                    # a repeat goes only into the queues its earlier pass missed
                    one = records[i] if records is not None else None
                    publisher.submit(Held(self.seq, exchange, routing_key, properties, body,
                                          record=one[0] if one else None,
                                          redelivered=bool(one and one[1])))
                else:
                    self.api.publish(self.vhost, exchange,
                                     Message(exchange, routing_key, properties, body), None)
        except Exception as exc:  # the exchange or the vhost went: the attempt ends
            reason = f"{type(exc).__name__}: {exc}"
            self._give_up(reason)
            raise ConnectionError(f"local publish failed: {reason}") from exc
        await asyncio.sleep(0)  # a fair turn for the rest of the node between batches
        return first

    def _give_up(self, reason: str) -> None:
        if self.publisher is not None:
            self.publisher.close()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(reason)

    def closed(self) -> asyncio.Future[Any]:
        assert self._closed is not None
        return self._closed

    async def close(self) -> None:
        self._give_up("closed by the shovel")


def _no_status(_reason: str | None) -> None:
    """The shovel's status keeps RabbitMQ's fields: a retry round is logged (by the
    publisher, once per round), the state stays ``running``."""
