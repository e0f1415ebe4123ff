"""An exchange link: the upstream exchange's messages, as the local bindings want them.

What it declares on the upstream is exactly what RabbitMQ 3.10's
``rabbit_federation_exchange_link`` declares, so either broker can sit on either side:

    upstream X  --(local bindings, mirrored, x-bound-from)-->  "federation: X -> C A"
        (type x-federation-upstream, durable internal auto-delete; fanout on 503)
    "federation: X -> C A"  --("")-->  queue "federation: X -> C"  (durable, x-expires,
        x-message-ttl, x-internal-purpose)  ==consume==>  local X (x-received-from)

``C`` is the downstream's cluster name, suffixed ``:{DownX}`` (or ``:{vhost}:{DownX}``
when the vhosts differ) when the local exchange's name is not the upstream's. The
internal exchange alternates between suffixes ``A`` and ``B`` each time the link starts:
the new one gets the current bindings, then the old one is deleted, so a restart never
leaves a stale binding behind. While running, the link re-syncs bindings when the local
exchange's bindings change, and passively re-declares its internal exchange now and then
(every 90 s; a deleted one restarts the link: the "silent" failure fixed by
rabbitmq-federation #60).
"""

from __future__ import annotations

import os
import struct
import time
import urllib.parse
from typing import Any

from amqpd.broker.api import args_key
from plugins.federation.base import PRODUCT, Link, log
from plugins.federation.headers import (
    BINDING_HEADER,
    ROUTING_HEADER,
    RawHeaders,
    forward_ok,
    prepend,
    prepend_raw,
)
from plugins.shovel.methods import field_value
from plugins.shovel.wire import AMQPError, Connection, Delivery, NotFound

# RabbitMQ's ``internal_exchange_check_interval`` (90 s); the environment can shorten it
INTERNAL_CHECK_INTERVAL = float(os.environ.get(
    "AMQPD_FEDERATION_INTERNAL_EXCHANGE_CHECK_INTERVAL", "90"))
PURPOSE = {"x-internal-purpose": "federation"}


def upstream_vhost(uri: str) -> str:
    path = urllib.parse.urlsplit(uri).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def upstream_queue_name(upstream_x: str, upstream_vh: str, cluster: str, down_vhost: str,
                        down_x: str) -> str:
    if down_vhost == upstream_vh:
        suffix = "" if down_x == upstream_x else f":{down_x}"
    else:
        suffix = f":{down_vhost}:{down_x}"
    return f"federation: {upstream_x} -> {cluster}{suffix}"


class ExchangeLink(Link):
    kind = "exchange"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.suffix = "A"  # of the live internal exchange; flipped on every start
        self.queue = ""
        self.consumer_tag = ""
        self.internal = ""
        self.uvhost = "/"
        self._bound: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._next_check = 0.0
        self._hops: dict[bool, bytes] = {}

    @property
    def cluster(self) -> str:
        return self.api.cluster_name()

    # ------------------------------------------------------------------ setup
    async def setup(self, conn: Connection, channel: int) -> None:
        up = self.upstream
        ux = self.upstream_object
        self.uvhost = upstream_vhost(self._connected_uri())
        self._hops = {}  # x-received-from tables, per redelivered flag (a new connection)
        local = self.api.exchange(self.vhost, self.name)
        await self._ensure_upstream_exchange(conn, channel, ux, local.info())
        self.queue = upstream_queue_name(ux, self.uvhost, self.cluster, self.vhost, self.name)
        args: dict[str, Any] = {}
        if up.expires is not None:
            args["x-expires"] = up.expires
        if up.message_ttl is not None:
            args["x-message-ttl"] = up.message_ttl
        args.update(PURPOSE)
        await conn.queue_declare(channel, self.queue, durable=True, arguments=args)
        if up.ack_mode != "no-ack":
            await conn.basic_qos(channel, up.prefetch_count)
        self.consumer_tag = ""
        conn.on_delivery[channel] = self.on_delivery
        await self._flow(conn, channel)
        # a fresh internal exchange, bound now; then the previous one goes. Which suffix is
        # live is read from the upstream (RabbitMQ keeps it in its database): the live one
        # stays bound until the new one is, so nothing published meanwhile is missed
        a_live = await self._exists(conn, f"{self.queue} A")
        old = f"{self.queue} {'A' if a_live else 'B'}"
        self.suffix = "B" if a_live else "A"
        self.internal = f"{self.queue} {self.suffix}"
        await self._disposable(conn, lambda ch: conn.exchange_delete(ch, self.internal))
        await self._declare_internal(conn, channel)
        await conn.queue_bind(channel, self.queue, self.internal, "")
        self._bound = {}
        await self._sync_bindings(conn, channel)
        await self._disposable(conn, lambda ch: conn.exchange_delete(ch, old))
        self._next_check = time.monotonic() + INTERNAL_CHECK_INTERVAL

    def _connected_uri(self) -> str:
        return self.current_uri or self.upstream.uris[0]

    async def _ensure_upstream_exchange(self, conn: Connection, channel: int, name: str,
                                        info: dict[str, Any]) -> None:
        try:
            await self._disposable(conn, lambda ch: conn.exchange_declare(
                ch, name, passive=True), raise_errors=True)
        except NotFound:
            await conn.exchange_declare(
                channel, name, info["type"], durable=info["durable"],
                auto_delete=info["auto_delete"], internal=info["internal"],
                arguments=info["arguments"] or None)

    async def _declare_internal(self, conn: Connection, channel: int) -> None:
        """x-federation-upstream on a disposable connection (503 closes the connection);
        plain fanout on the link's channel if the upstream does not know the type."""
        xfu_args: dict[str, Any] = {
            "x-max-hops": self.upstream.max_hops, "x-downstream-name": self.cluster,
            "x-downstream-vhost": self.vhost, **PURPOSE}
        try:
            side: Connection | None = await Connection.open(self._connected_uri(),
                                                            product=PRODUCT)
        except Exception:
            side = None
        try:
            if side is not None:
                ch = await side.channel()
                await side.exchange_declare(ch, self.internal, "x-federation-upstream",
                                            durable=True, internal=True, auto_delete=True,
                                            arguments=xfu_args)
                return
        except AMQPError as exc:
            if exc.code != 503:  # COMMAND_INVALID: an upstream without the type
                raise
        finally:
            if side is not None:
                await side.close()
        await conn.exchange_declare(channel, self.internal, "fanout", durable=True,
                                    internal=True, auto_delete=True, arguments=dict(PURPOSE))

    async def _exists(self, conn: Connection, name: str) -> bool:
        try:
            await self._disposable(conn, lambda ch: conn.exchange_declare(
                ch, name, passive=True), raise_errors=True)
        except NotFound:
            return False
        return True

    @staticmethod
    async def _disposable(conn: Connection, call: Any, raise_errors: bool = False) -> None:
        """Run ``call(channel)`` on a channel of its own (a channel error, such as a
        passive declare's 404, closes only that one)."""
        ch = await conn.channel()
        try:
            await call(ch)
        except AMQPError as exc:
            if exc.scope != "channel":
                raise
            if raise_errors:
                raise
        finally:
            await conn.close_channel(ch)

    # ------------------------------------------------------------------ bindings
    def _upstream_binding_args(self, args: dict[str, Any]) -> dict[str, Any] | None:
        """3.10's ``update_binding``: hop count for propagating bindings, or None."""
        max_hops = self.upstream.max_hops
        previous = args.get(BINDING_HEADER)
        if not isinstance(previous, list) or not previous:
            hops = max_hops
        else:
            seen = any(isinstance(t, dict) and t.get("cluster-name") == self.upstream_cluster
                       and t.get("vhost") == self.uvhost for t in previous)
            first = previous[0] if isinstance(previous[0], dict) else {}
            prev_hops = first.get("hops", max_hops)
            prev_hops = prev_hops if isinstance(prev_hops, int) else max_hops
            hops = 0 if seen else min(prev_hops - 1, max_hops)
        if hops <= 0:
            return None
        info = {"cluster-name": self.cluster, "vhost": self.vhost,
                "exchange": f"{self.vhost}:{self.name} {self.suffix}", "hops": hops}
        return prepend(args, BINDING_HEADER, info)

    def _wanted(self) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
        ex = self.api.find_exchange(self.vhost, self.name)
        if ex is None:
            raise ConnectionError(f"exchange {self.name!r} is gone")
        wanted: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        for binding in ex.bindings.values():
            args = self._upstream_binding_args(binding.arguments)
            if args is not None:
                wanted[(binding.routing_key, args_key(args))] = (binding.routing_key, args)
        return wanted

    async def _sync_bindings(self, conn: Connection, channel: int) -> None:
        wanted = self._wanted()
        ux = self.upstream_object
        for key, (rk, args) in wanted.items():
            if key not in self._bound:
                await conn.exchange_bind(channel, self.internal, ux, rk, args)
                self._bound[key] = (rk, args)
        for key in [k for k in self._bound if k not in wanted]:
            rk, args = self._bound.pop(key)
            await conn.exchange_unbind(channel, self.internal, ux, rk, args)

    async def _flow(self, conn: Connection, channel: int) -> None:
        """Consume unless a local resource alarm (memory, disk) is on: like a publisher,
        the link stops feeding a broker that is blocking publishers. The upstream queue
        holds the messages meanwhile."""
        blocked = self.api.alarms_active()
        if not blocked and not self.consumer_tag:
            self.consumer_tag = await conn.basic_consume(
                channel, self.queue, no_ack=self.upstream.ack_mode == "no-ack")
        elif blocked and self.consumer_tag:
            await conn.basic_cancel(channel, self.consumer_tag)
            self.consumer_tag = ""

    async def periodic(self) -> None:
        channel, conn = self.channel, self.conn
        if not channel or conn is None:
            return
        await self._flow(conn, channel)
        await self._sync_bindings(conn, channel)
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + INTERNAL_CHECK_INTERVAL
            try:
                await self._disposable(conn, lambda ch: conn.exchange_declare(
                    ch, self.internal, passive=True), raise_errors=True)
            except NotFound:
                raise ConnectionError(
                    f"internal upstream exchange {self.internal!r} is gone; restarting"
                ) from None

    async def quiesce(self, conn: Connection, channel: int) -> None:
        if self.consumer_tag:
            tag, self.consumer_tag = self.consumer_tag, ""
            await conn.basic_cancel(channel, tag)

    async def cleanup(self, conn: Connection) -> None:
        """No longer federated: the upstream queue and internal exchange go, as in RabbitMQ
        (messages waiting there would never be consumed)."""
        if self.queue:
            await self._disposable(conn, lambda ch: conn.queue_delete(ch, self.queue))
        if self.internal:
            await self._disposable(conn, lambda ch: conn.exchange_delete(ch, self.internal))

    # ------------------------------------------------------------------ deliveries
    def on_delivery(self, delivery: Delivery) -> None:
        """Loop and hop check, then ``x-received-from`` prepended, on the raw properties
        (:class:`~plugins.federation.headers.RawHeaders`)."""
        try:
            headers = RawHeaders.parse(delivery.properties)
            received = headers.decoded(ROUTING_HEADER)
        except (ValueError, IndexError, struct.error) as exc:
            # the upstream accepted it, so this is unlikely; never loop on it
            log.warning("federation %s: dropping a message with unreadable headers: %s",
                        self.key, exc)
            self.settle_drop(delivery)
            return
        if not forward_ok(received, self.upstream.max_hops, self.cluster, self.vhost):
            self.settle_drop(delivery)
            return
        # forwarded before (an upstream that failed over may not know it delivered it)
        fp = self.fingerprint(delivery)
        again = self.seen.check_and_add_fp(fp) or delivery.redelivered
        hop = self._hops.get(again)
        if hop is None:  # the same for every message of this connection: encoded once
            table: dict[str, Any] = {"uri": self.uri, "exchange": self.upstream_object,
                                     "redelivered": again}
            if self.upstream_cluster is not None:
                table["cluster-name"] = self.upstream_cluster
            table["vhost"] = self.uvhost
            hop = self._hops[again] = field_value(table)
        prepend_raw(headers, ROUTING_HEADER, hop)
        self.republish(delivery, self.name, delivery.routing_key, headers.encode(), fp)
