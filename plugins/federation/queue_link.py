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

from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage

from plugins.federation.base import Link, properties_of
from plugins.federation.headers import ROUTING_HEADER

POLL_INTERVAL = 0.05  # seconds between checks of the local queue's demand


class QueueLink(Link):
    kind = "queue"
    CHECK_INTERVAL = POLL_INTERVAL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consuming = False

    async def setup(self, conn: aiormq.abc.AbstractConnection,
                    channel: aiormq.abc.AbstractChannel) -> None:
        caps: Any = (conn.server_properties or {}).get("capabilities")
        if not isinstance(caps, dict) or caps.get("consumer_priorities") is not True:
            raise ConnectionError("upstream lacks consumer priorities")
        local = self.api.queue(self.vhost, self.name)
        await channel.queue_declare(self.upstream_object, durable=local.durable,
                                    auto_delete=local.auto_delete,
                                    arguments=dict(local.arguments) or None)
        if self.upstream.ack_mode != "no-ack":
            await channel.basic_qos(prefetch_count=self.upstream.prefetch_count)
        self.consuming = False
        await self.periodic()

    def _wants_messages(self) -> bool:
        if self.api.find_queue(self.vhost, self.name) is None:
            raise ConnectionError(f"queue {self.name!r} is gone")
        if self.api.alarms_active():  # a resource alarm blocks the link as a publisher
            return False
        return self.api.has_demand(self.vhost, self.name, min_priority=0)

    async def periodic(self) -> None:
        channel = self.channel
        if channel is None:
            return
        consumers = getattr(channel, "consumers", {})
        if self.consuming and self.upstream.consumer_tag not in consumers:
            self.consuming = False  # cancelled by the upstream (queue deleted...)
        want = self._wants_messages()
        if want and not self.consuming:
            await channel.basic_consume(
                self.upstream_object, self._on_message,
                no_ack=self.upstream.ack_mode == "no-ack",
                consumer_tag=self.upstream.consumer_tag, arguments={"x-priority": -1})
            self.consuming = True
        elif not want and self.consuming:
            await channel.basic_cancel(self.upstream.consumer_tag)
            self.consuming = False

    def _headers(self, delivered: DeliveredMessage, headers: dict[str, Any]) -> dict[str, Any]:
        table: dict[str, Any] = {"uri": self.uri, "queue": self.upstream_object}
        been = headers.get(ROUTING_HEADER)
        out = dict(headers)
        if isinstance(been, list):
            count = 0
            rest = []
            for item in been:
                if isinstance(item, dict) and all(item.get(k) == table.get(k)
                                                  for k in ("uri", "virtual_host", "queue")):
                    seen = item.get("visit-count")
                    count = seen if isinstance(seen, int) else 0
                else:
                    rest.append(item)
            been = rest
        else:
            out["x-original-exchange"] = getattr(delivered.delivery, "exchange", "") or ""
            out["x-original-routing-key"] = delivered.routing_key or ""
            been, count = [], 0
        if "CC" in out:
            out["x-original-cc"] = out.pop("CC")
        table["redelivered"] = bool(getattr(delivered.delivery, "redelivered", False))
        table["visit-count"] = count + 1
        out[ROUTING_HEADER] = [table, *been]
        return out

    async def _on_message(self, delivered: DeliveredMessage) -> None:
        props = properties_of(delivered)
        headers = props.get("headers") if isinstance(props.get("headers"), dict) else {}
        props["headers"] = self._headers(delivered, headers or {})
        self.republish(delivered, "", self.name, props)
