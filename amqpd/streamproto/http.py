"""/api/stream/connections, /api/stream/publishers, /api/stream/consumers: the stream
protocol's clients in the management API (RabbitMQ's rabbitmq_stream_management names
the same paths and, where amqpd has the figure, the same fields). Each list shows only
the vhosts the HTTP user may see; ``/api/stream/.../{vhost}`` narrows to one, and
``/api/stream/connections/{vhost}/{name}`` (with ``/publishers``, ``/consumers``) is one
connection, as there. The web UI's Streams page and the Prometheus metrics
(:func:`amqpd.streamproto.metrics.lines`) read the same views. In a cluster the lists
are the whole cluster's, each connection naming its ``node`` (a publisher's or a
consumer's in its ``connection_details``), and one connection is found on whichever
node has it (amqpd.http.cluster_lists)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqpd.http.cluster_lists import (
    elsewhere,
    stamp_connection_node,
    stamp_node,
    whole_cluster,
)
from amqpd.http.core import Ctx, HttpError, Router, json_response, not_found, select_columns

if TYPE_CHECKING:
    from amqpd.streamproto.connection import Publisher, StreamConnection, Subscription
    from amqpd.streamproto.transport import StreamListener


def open_connections(listener: StreamListener) -> list[StreamConnection]:
    """Every opened stream connection, by name."""
    out = [p.conn for p in listener.connections if p.conn is not None and p.conn.is_open]
    return sorted(out, key=lambda c: c.name)


def _connections(listener: StreamListener, ctx: Ctx) -> list[StreamConnection]:
    vhost = ctx.params.get("vhost")
    name = ctx.params.get("name")
    out = [conn for conn in open_connections(listener)
           if (vhost is None or conn.vhost == vhost) and ctx.can_see_vhost(conn.vhost)
           and (name is None or conn.name == name)]
    if name is not None and not out:
        raise not_found()
    return out


def connection_view(conn: StreamConnection) -> dict[str, Any]:
    peer_host, peer_port = conn.peer if conn.peer is not None else ("", 0)
    return {"name": conn.name, "user": conn.username, "vhost": conn.vhost,
            "peer_host": peer_host, "peer_port": peer_port, "protocol": "stream",
            "client_properties": dict(conn.client_properties), "frame_max": conn.frame_max,
            "heartbeat": conn.heartbeat, "publishers": len(conn.publishers),
            "consumers": len(conn.subscriptions)}


def publisher_view(conn: StreamConnection, pub: Publisher) -> dict[str, Any]:
    """A publisher: its counters and publishing ids (the highest received; for a named
    one, the highest confirmed and kept for deduplication)."""
    stored = conn.stored_sequence(pub)
    return {"connection_details": {"name": conn.name}, "publisher_id": pub.id,
            "reference": pub.reference or "",
            "queue": {"name": pub.queue.name, "vhost": conn.vhost},
            "published": pub.published, "confirmed": pub.confirmed, "errored": pub.errored,
            "last_publishing_id": pub.last_id if pub.last_id >= 0 else None,
            "confirmed_publishing_id": stored}


def consumer_view(conn: StreamConnection, sub: Subscription) -> dict[str, Any]:
    """A subscription: where it reads, its lag and credit, and (single active
    consumer) its group and whether it is the active member."""
    log_ = sub.queue.log
    reading = sub.reader is not None
    offset = sub.reader.offset if sub.reader is not None else 0
    return {"connection_details": {"name": conn.name}, "subscription_id": sub.id,
            "queue": {"name": sub.queue.name, "vhost": conn.vhost},
            "credits": sub.credit, "offset": offset,
            "offset_lag": max(0, log_.flushed_offset - offset) if reading else 0,
            "consumed": sub.consumed, "messages_consumed": sub.consumed,
            "active": sub.active,
            "activity_status": "up" if sub.group is None else (
                "single_active" if sub.active else "waiting"),
            "group": sub.group[2] if sub.group is not None else None,
            "properties": dict(sub.properties)}


def add_routes(listener: StreamListener) -> Any:
    """The router hook (BrokerAPI.plugin_http_routes calls it with the router)."""

    async def connections(ctx: Ctx) -> Any:
        items = [connection_view(c) for c in _connections(listener, ctx)]
        return json_response(select_columns(
            await whole_cluster(ctx, items, stamp_node), ctx))

    async def connection(ctx: Ctx) -> Any:
        try:
            conn = _connections(listener, ctx)[0]
        except HttpError as exc:
            status, body = await elsewhere(ctx, exc)
            return json_response(body, status)
        view = connection_view(conn)
        if ctx.api.lists_cluster_wide():
            stamp_node(view, ctx.api.node_name())
        return json_response(view)

    async def _one_or_all(ctx: Ctx, items: list[dict[str, Any]]) -> Any:
        """A list of every connection's (the whole cluster's), or of one connection's
        (``/api/stream/connections/{vhost}/{name}/...``: the node that has it)."""
        if "name" in ctx.params:
            if ctx.api.lists_cluster_wide():
                for item in items:
                    stamp_connection_node(item, ctx.api.node_name())
            return json_response(select_columns(items, ctx))
        return json_response(select_columns(
            await whole_cluster(ctx, items, stamp_connection_node), ctx))

    def _of_one(ctx: Ctx) -> list[StreamConnection] | HttpError:
        try:
            return _connections(listener, ctx)
        except HttpError as exc:
            return exc

    def listing(items_of: Callable[[StreamConnection], list[dict[str, Any]]]) -> Any:
        """The handler of a list of the connections' publishers or consumers: the
        whole cluster's, or one connection's (its node's, if another node has it)."""

        async def handler(ctx: Ctx) -> Any:
            conns = _of_one(ctx)
            if isinstance(conns, HttpError):
                status, body = await elsewhere(ctx, conns)
                return json_response(select_columns(body, ctx) if isinstance(body, list)
                                     else body, status)
            return await _one_or_all(ctx, [item for conn in conns for item in items_of(conn)])

        return handler

    publishers = listing(lambda conn: [publisher_view(conn, pub)
                                       for pub in conn.publishers.values()])
    consumers = listing(lambda conn: [consumer_view(conn, sub)
                                      for sub in conn.subscriptions.values()])

    def hook(r: Router) -> None:
        for path, handler in (("connections", connections), ("publishers", publishers),
                              ("consumers", consumers)):
            r.get(f"/api/stream/{path}", handler)
            r.get(f"/api/stream/{path}/{{vhost}}", handler)
        one = "/api/stream/connections/{vhost}/{name}"
        r.get(one, connection)
        r.get(f"{one}/publishers", publishers)
        r.get(f"{one}/consumers", consumers)

    return hook


__all__ = ["add_routes", "connection_view", "consumer_view", "open_connections",
           "publisher_view"]
