"""/api/stream/connections, /api/stream/publishers, /api/stream/consumers: the stream
protocol's clients in the management API (RabbitMQ's rabbitmq_stream_management names
the same paths and, where amqpd has the figure, the same fields). Each list shows only
the vhosts the HTTP user may see; ``/api/stream/.../{vhost}`` narrows to one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.http.core import Ctx, Router, json_response, select_columns

if TYPE_CHECKING:
    from amqpd.streamproto.connection import StreamConnection
    from amqpd.streamproto.transport import StreamListener


def _connections(listener: StreamListener, ctx: Ctx) -> list[StreamConnection]:
    vhost = ctx.params.get("vhost")
    out = []
    for proto in listener.connections:
        conn = proto.conn
        if conn is None or not conn.is_open:
            continue
        if (vhost is not None and conn.vhost != vhost) or not ctx.can_see_vhost(conn.vhost):
            continue
        out.append(conn)
    return sorted(out, key=lambda c: c.name)


def connection_view(conn: StreamConnection) -> dict[str, Any]:
    peer_host, peer_port = conn.peer if conn.peer is not None else ("", 0)
    return {"name": conn.name, "user": conn.username, "vhost": conn.vhost,
            "peer_host": peer_host, "peer_port": peer_port, "protocol": "stream",
            "client_properties": dict(conn.client_properties), "frame_max": conn.frame_max,
            "heartbeat": conn.heartbeat, "publishers": len(conn.publishers),
            "consumers": len(conn.subscriptions)}


def add_routes(listener: StreamListener) -> Any:
    """The router hook (BrokerAPI.plugin_http_routes calls it with the router)."""

    async def connections(ctx: Ctx) -> Any:
        return json_response(select_columns(
            [connection_view(c) for c in _connections(listener, ctx)], ctx))

    async def publishers(ctx: Ctx) -> Any:
        items = []
        for conn in _connections(listener, ctx):
            for pub in conn.publishers.values():
                items.append({"connection_details": {"name": conn.name},
                              "publisher_id": pub.id, "reference": pub.reference or "",
                              "queue": {"name": pub.queue.name, "vhost": conn.vhost},
                              "published": pub.published, "confirmed": pub.confirmed,
                              "errored": pub.errored})
        return json_response(select_columns(items, ctx))

    async def consumers(ctx: Ctx) -> Any:
        items = []
        for conn in _connections(listener, ctx):
            for sub in conn.subscriptions.values():
                log_ = sub.queue.log
                offset = sub.reader.offset if sub.reader is not None else 0
                items.append({"connection_details": {"name": conn.name},
                              "subscription_id": sub.id,
                              "queue": {"name": sub.queue.name, "vhost": conn.vhost},
                              "credits": sub.credit, "offset": offset,
                              "offset_lag": max(0, log_.flushed_offset - offset)
                              if sub.reader is not None else 0,
                              "active": sub.active,
                              "activity_status": "up" if sub.group is None else (
                                  "single_active" if sub.active else "waiting"),
                              "messages_consumed": sub.consumed,
                              "properties": dict(sub.properties)})
        return json_response(select_columns(items, ctx))

    def hook(r: Router) -> None:
        for path, handler in (("connections", connections), ("publishers", publishers),
                              ("consumers", consumers)):
            r.get(f"/api/stream/{path}", handler)
            r.get(f"/api/stream/{path}/{{vhost}}", handler)

    return hook


__all__ = ["add_routes", "connection_view"]
