"""A queue link: pull from the upstream queue only while the local queue can use it.

As in RabbitMQ 3.10's ``rabbit_federation_queue_link``: the link declares the upstream
queue with the local queue's durable/auto-delete/arguments, sets ``basic.qos`` to
``prefetch-count`` and consumes (consumer tag ``federation-link-{upstream}``, priority
``x-priority = -1`` so the upstream's own consumers go first) **only while** the local
queue is empty and has a consumer with spare credit and a priority >= 0 (so a chain of
federated queues with nobody reading pulls nothing). When that stops being true the
link cancels its upstream consumer; deliveries already in flight still land locally.

Each message is republished to the default exchange with the local queue's name, with a
table prepended to ``x-received-from`` (``uri``, ``queue``, ``redelivered``,
``visit-count``, incremented when the message comes back through the same upstream),
``x-original-exchange``/``x-original-routing-key`` on the first hop, and ``CC`` renamed
to ``x-original-cc`` (so the local publish does not fan out again).
"""

from __future__ import annotations

import struct
from typing import Any

from plugins.federation.base import Link, log
from plugins.federation.headers import ROUTING_HEADER, RawHeaders, array_items
from plugins.shovel.methods import field_value
from plugins.shovel.wire import Connection, Delivery

POLL_INTERVAL = 0.05  # seconds between checks of the local queue's demand


class QueueLink(Link):
    kind = "queue"
    CHECK_INTERVAL = POLL_INTERVAL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consuming = False

    async def setup(self, conn: Connection, channel: int) -> None:
        caps: Any = conn.server_properties.get("capabilities")
        if not isinstance(caps, dict) or caps.get("consumer_priorities") is not True:
            raise ConnectionError("upstream lacks consumer priorities")
        local = self.api.queue(self.vhost, self.name)
        await conn.queue_declare(channel, self.upstream_object, durable=local.durable,
                                 auto_delete=local.auto_delete,
                                 arguments=dict(local.arguments) or None)
        if self.upstream.ack_mode != "no-ack":
            await conn.basic_qos(channel, self.upstream.prefetch_count)
        self.consuming = False
        conn.on_delivery[channel] = self.on_delivery
        conn.on_cancel[channel] = self._cancelled
        await self.periodic()

    def _cancelled(self, _consumer_tag: str) -> None:
        """The upstream cancelled our consumer (its queue was deleted...)."""
        self.consuming = False

    def _wants_messages(self) -> bool:
        if self.api.find_queue(self.vhost, self.name) is None:
            raise ConnectionError(f"queue {self.name!r} is gone")
        if self.api.alarms_active():  # a resource alarm blocks the link as a publisher
            return False
        return self.api.has_demand(self.vhost, self.name, min_priority=0)

    async def periodic(self) -> None:
        channel, conn = self.channel, self.conn
        if not channel or conn is None:
            return
        want = self._wants_messages()
        if want and not self.consuming:
            await conn.basic_consume(
                channel, self.upstream_object, no_ack=self.upstream.ack_mode == "no-ack",
                consumer_tag=self.upstream.consumer_tag, arguments={"x-priority": -1})
            self.consuming = True
        elif not want and self.consuming:
            await conn.basic_cancel(channel, self.upstream.consumer_tag)
            self.consuming = False

    async def quiesce(self, conn: Connection, channel: int) -> None:
        if self.consuming:
            self.consuming = False
            await conn.basic_cancel(channel, self.upstream.consumer_tag)

    def _headers(self, delivery: Delivery, headers: RawHeaders) -> None:
        """Rewrite the raw headers for the local republish (see the module docstring);
        entries and earlier hops that do not change are kept byte for byte."""
        table: dict[str, Any] = {"uri": self.uri, "queue": self.upstream_object}
        been = headers.decoded(ROUTING_HEADER)
        kept: list[bytes] = []
        count = 0
        if isinstance(been, list):
            for item, raw in zip(been, array_items(headers.get(ROUTING_HEADER)), strict=True):
                if isinstance(item, dict) and all(item.get(k) == table.get(k)
                                                  for k in ("uri", "virtual_host", "queue")):
                    seen = item.get("visit-count")
                    count = seen if isinstance(seen, int) else 0
                else:
                    kept.append(raw)
        else:
            headers.set("x-original-exchange", field_value(delivery.exchange))
            headers.set("x-original-routing-key", field_value(delivery.routing_key))
        cc = headers.pop("CC")
        if cc is not None:
            headers.set("x-original-cc", cc)
        # forwarded before (an upstream that failed over may not know it delivered it)
        table["redelivered"] = self.seen.check_and_add_fp(self.fingerprint(delivery)) \
            or delivery.redelivered
        table["visit-count"] = count + 1
        items = field_value(table) + b"".join(kept)
        headers.set(ROUTING_HEADER, b"A" + len(items).to_bytes(4, "big") + items)

    def on_delivery(self, delivery: Delivery) -> None:
        try:
            headers = RawHeaders.parse(delivery.properties)
            self._headers(delivery, headers)
        except (ValueError, IndexError, struct.error) as exc:
            log.warning("federation %s: dropping a message with unreadable headers: %s",
                        self.key, exc)
            self.settle_drop(delivery)
            return
        self.republish(delivery, "", self.name, headers.encode(), self.fingerprint(delivery))
