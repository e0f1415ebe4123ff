"""/api/connections, /api/channels, /api/consumers (and their per-vhost forms). In a
cluster the lists are the whole cluster's and one connection or channel is found on
whichever node has it (amqpd.http.cluster_lists)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from amqpd.http.cluster_lists import elsewhere, whole_cluster
from amqpd.http.core import (
    Ctx,
    HttpError,
    Router,
    json_response,
    no_content,
    not_found,
    select_columns,
)
from amqpd.http.query_windows import windows

if TYPE_CHECKING:
    from amqpd.broker.api import Channel, Session

log = logging.getLogger("amqpd.http.connections")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _tls(session: Session) -> bool:
    proto = getattr(session, "protocol", None)
    transport = getattr(proto, "transport", None)
    return bool(transport is not None and transport.get_extra_info("sslcontext") is not None)


def connection_view(ctx: Ctx, session: Session) -> dict[str, Any]:
    info = dict(session.info())
    info["client_properties"] = _jsonable(info.get("client_properties") or {})
    proto = getattr(session, "protocol", None)
    transport = getattr(proto, "transport", None)
    sock = transport.get_extra_info("sockname") if transport is not None else None
    info.update({
        "node": ctx.api.node_name(),
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "auth_mechanism": "PLAIN",
        "ssl": _tls(session),
        "host": sock[0] if sock else None,
        "port": sock[1] if sock else None,
        "user_who_performed_action": info.get("user"),
        "channel_max": info.get("channel_max"),
    })
    for key in ("ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash",
                "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity"):
        info.setdefault(key, None)  # RabbitMQ lists them, null without client certificates
    # bytes sent and received, and its channels' message counts, with the last minute's
    # samples when asked (?data_rates_age=60 / ?msg_rates_age=60)
    sampler = ctx.request.app["sampler"]
    info.update(sampler.connection_stats(session))
    sampler.add_samples(session, info, *windows(ctx))
    name = info["client_properties"].get("connection_name")
    if isinstance(name, str):  # what a client names its connection, as RabbitMQ shows it
        info["user_provided_name"] = name
    return info


def channel_name(session: Session, channel: Channel) -> str:
    return f"{session.name} ({channel.number})"


def channel_view(ctx: Ctx, session: Session, channel: Channel) -> dict[str, Any]:
    sampler = ctx.request.app["sampler"]
    view: dict[str, Any] = {
        "name": channel_name(session, channel),
        "number": channel.number,
        "node": ctx.api.node_name(),
        "user": session.username,
        "vhost": session.vhost.name if session.vhost else None,
        "connection_details": {"name": session.name,
                               "peer_host": session.peer[0] if session.peer else None,
                               "peer_port": session.peer[1] if session.peer else None},
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "messages_unconfirmed": 0,
        "messages_uncommitted": len(channel.tx_publishes),
        "acks_uncommitted": len(channel.tx_acks),
        "prefetch_count": channel.prefetch_consumer,
        "global_prefetch_count": channel.prefetch_channel,
        "confirm": channel.confirm_mode,
        "transactional": channel.tx_mode,
        "state": "running" if channel.flow_active else "flow",
        "message_stats": sampler.message_stats(channel),
    }
    sampler.add_samples(channel, view, *windows(ctx))
    return view


def consumer_view(ctx: Ctx, session: Session, channel: Channel, consumer: Any) -> dict[str, Any]:
    q = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": q.name, "vhost": q.vhost.name},
        "channel_details": {
            "name": channel_name(session, channel), "number": channel.number,
            "connection_name": session.name, "user": session.username,
            "node": ctx.api.node_name(),
            "peer_host": session.peer[0] if session.peer else None,
            "peer_port": session.peer[1] if session.peer else None,
        },
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "arguments": _jsonable(consumer.arguments),
        "active": True,
        "activity_status": "up",
        "consumer_timeout": None,
    }


def visible_sessions(ctx: Ctx, vhost: str | None = None) -> list[Session]:
    out = []
    for s in ctx.api.sessions():
        if s.vhost is None or (vhost is not None and s.vhost.name != vhost):
            continue
        if ctx.is_monitor or s.username == ctx.username:
            out.append(s)
    return sorted(out, key=lambda s: s.name)


def _find_session(ctx: Ctx, name: str) -> Session:
    for s in visible_sessions(ctx):
        if s.name == name:
            return s
    raise not_found()


async def list_connections(ctx: Ctx) -> Any:
    vhost = None
    if "vhost" in ctx.params:
        vhost = ctx.vhost().name
    items = [connection_view(ctx, s) for s in visible_sessions(ctx, vhost)]
    return json_response(select_columns(await whole_cluster(ctx, items), ctx))


async def _from_elsewhere(ctx: Ctx, missing: HttpError) -> Any:
    """The answer of the node that has what this one does not (404 if none has); a
    list (a connection's channels) with the list options applied here."""
    status, body = await elsewhere(ctx, missing)
    if isinstance(body, list):
        body = select_columns(body, ctx)
    return no_content() if status == 204 else json_response(body, status)


async def get_connection(ctx: Ctx) -> Any:
    try:
        session = _find_session(ctx, ctx.params["name"])
    except HttpError as exc:
        return await _from_elsewhere(ctx, exc)
    return json_response(connection_view(ctx, session))


async def close_connection(ctx: Ctx) -> Any:
    try:
        session = _find_session(ctx, ctx.params["name"])
    except HttpError as exc:
        return await _from_elsewhere(ctx, exc)
    if not ctx.is_admin and session.username != ctx.username:
        raise not_found()
    reason = ctx.request.headers.get("X-Reason", "Closed via management plugin")
    log.info("closing connection via HTTP API: connection=%s user=%s reason=%s", session.name,
             session.username, reason)
    ctx.api.close_connection(session, reason)
    return no_content()


async def connection_channels(ctx: Ctx) -> Any:
    try:
        session = _find_session(ctx, ctx.params["name"])
    except HttpError as exc:
        return await _from_elsewhere(ctx, exc)
    items = [channel_view(ctx, session, ch) for ch in session.channels.values()]
    return json_response(select_columns(items, ctx))


async def list_channels(ctx: Ctx) -> Any:
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    items = [channel_view(ctx, s, ch) for s in visible_sessions(ctx, vhost)
             for ch in s.channels.values()]
    return json_response(select_columns(await whole_cluster(ctx, items), ctx))


async def get_channel(ctx: Ctx) -> Any:
    for s in visible_sessions(ctx):
        for ch in s.channels.values():
            if channel_name(s, ch) == ctx.params["name"]:
                return json_response(channel_view(ctx, s, ch))
    return await _from_elsewhere(ctx, not_found())


async def list_consumers(ctx: Ctx) -> Any:
    vhost = ctx.vhost().name if "vhost" in ctx.params else None
    items = []
    for s in ctx.api.sessions():
        if s.vhost is None or (vhost is not None and s.vhost.name != vhost):
            continue
        if not ctx.can_see_vhost(s.vhost.name):
            continue
        for ch in s.channels.values():
            for consumer in ch.consumers.values():
                items.append(consumer_view(ctx, s, ch, consumer))
    return json_response(select_columns(await whole_cluster(ctx, items), ctx))


def routes(r: Router) -> None:
    r.get("/api/connections", list_connections)
    r.get("/api/connections/{name}", get_connection)
    r.delete("/api/connections/{name}", close_connection)
    r.get("/api/connections/{name}/channels", connection_channels)
    r.get("/api/vhosts/{vhost}/connections", list_connections)
    r.get("/api/channels", list_channels)
    r.get("/api/channels/{name}", get_channel)
    r.get("/api/vhosts/{vhost}/channels", list_channels)
    r.get("/api/consumers", list_consumers)
    r.get("/api/consumers/{vhost}", list_consumers)
