"""/api/exchanges[/{vhost}[/{name}]], bindings by source/destination, and publish."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqpd.broker.api import AMQPError, Message
from amqpd.http.bindings import binding_view
from amqpd.http.core import (
    Ctx,
    Router,
    as_bool,
    as_dict,
    as_str,
    bad_request,
    created,
    json_response,
    no_content,
    not_authorised,
    not_found,
    select_columns,
    vhost_not_found,
)
from amqpd.http.messages import decode_payload, encode_json_properties
from amqpd.http.query_windows import windows
from amqpd.http.stats import EXCHANGE_NAMES

if TYPE_CHECKING:
    from amqpd.broker.api import Exchange, VHost


def url_name(name: str) -> str:
    """The API spells the default exchange ``amq.default``."""
    return "" if name == "amq.default" else name


def exchange_view(ctx: Ctx, ex: Exchange) -> dict[str, Any]:
    info = dict(ex.info())
    info["user_who_performed_action"] = "rmq-internal" if ex.name.startswith("amq.") or \
        ex.name == "" else ""
    if getattr(ex, "policy_name", None):
        info["policy"] = ex.policy_name  # type: ignore[attr-defined]
    # publish_in/publish_out with their rates, and with ?msg_rates_age=60 the last
    # minute's samples; no message_stats at all for one never published to (RabbitMQ)
    sampler = ctx.request.app["sampler"]
    stats = sampler.exchange_stats(ex)
    if stats is not None:
        info["message_stats"] = stats
        sampler.add_samples(ex, info, *windows(ctx), names=EXCHANGE_NAMES)
    return info


def _get(ctx: Ctx) -> tuple[VHost, Exchange]:
    vh = ctx.vhost()
    ex = ctx.api.find_exchange(vh.name, url_name(ctx.params["name"]))
    if ex is None:
        raise not_found()
    return vh, ex


async def list_exchanges(ctx: Ctx) -> Any:
    vhosts = [ctx.vhost()] if "vhost" in ctx.params else ctx.visible_vhosts()
    items = [exchange_view(ctx, ex) for vh in vhosts
             for ex in ctx.api.exchanges(vh)]
    return json_response(select_columns(items, ctx))


async def get_exchange(ctx: Ctx) -> Any:
    _, ex = _get(ctx)
    return json_response(exchange_view(ctx, ex))


async def put_exchange(ctx: Ctx) -> Any:
    vh = ctx.vhost(write=True, unknown=vhost_not_found())
    name = url_name(ctx.params["name"])
    body = await ctx.json_object()
    type_ = as_str(body.get("type"), "type")
    arguments = as_dict(body.get("arguments"), "arguments")
    ctx.check(vh.name, "configure", "exchange", name)
    if isinstance(arguments.get("alternate-exchange"), str):
        ctx.check(vh.name, "read", "exchange", name)
        ctx.check(vh.name, "write", "exchange", arguments["alternate-exchange"])
    existed = ctx.api.find_exchange(vh.name, name) is not None
    ctx.api.declare_exchange(
        vh, name, type_, durable=as_bool(body.get("durable"), "durable", True),
        auto_delete=as_bool(body.get("auto_delete"), "auto_delete"),
        internal=as_bool(body.get("internal"), "internal"),
        arguments=arguments)
    return no_content() if existed else created()


async def delete_exchange(ctx: Ctx) -> Any:
    vh, ex = _get(ctx)
    ctx.check(vh.name, "configure", "exchange", ex.name)
    ctx.api.delete_exchange(vh, ex.name, if_unused="if-unused" in ctx.query)
    return no_content()


async def source_bindings(ctx: Ctx) -> Any:
    vh, ex = _get(ctx)
    items = [binding_view(b, vh.name) for b in ex.bindings.values()]
    return json_response(select_columns(items, ctx))


async def destination_bindings(ctx: Ctx) -> Any:
    vh, ex = _get(ctx)
    items = [binding_view(b, vh.name) for b in ctx.api.bindings(vh)
             if b.destination is ex]
    return json_response(select_columns(items, ctx))


async def publish(ctx: Ctx) -> Any:
    # RabbitMQ 3.10.8 answers a publish into an unknown vhost as one without access
    ctx.vhost(unknown=not_authorised("Access refused."))
    vh, ex = _get(ctx)
    body = await ctx.json_object()
    routing_key = as_str(body.get("routing_key"), "routing_key")
    payload = decode_payload(body.get("payload"), body.get("payload_encoding"))
    props = encode_json_properties(body.get("properties"))
    ctx.check(vh.name, "write", "exchange", ex.name or "amq.default")
    if ex.internal:
        raise bad_request(f"cannot publish to internal exchange '{ex.name}'")
    if ctx.api.alarms_active():
        raise bad_request("publishing is blocked by a resource alarm")
    try:
        queues = ctx.api.publish(vh, ex.name, Message(ex.name, routing_key, props, payload),
                                 ctx.username)
    except AMQPError as exc:
        # RabbitMQ 3.10.8 publishes through a channel and answers 400 with the channel's
        # error, e.g. "403 ACCESS_REFUSED - access to topic 'b.x' in exchange
        # 'amq.topic' in vhost '/' refused for user 'guest'" (a topic write refusal) or
        # "406 PRECONDITION_FAILED - user_id property set to 'bob' but ..."
        raise bad_request(f"{exc.reply_code} {exc.name} - {exc.text}") from None
    return json_response({"routed": bool(queues)})


def routes(r: Router) -> None:
    r.get("/api/exchanges", list_exchanges)
    r.get("/api/exchanges/{vhost}", list_exchanges)
    r.get("/api/exchanges/{vhost}/{name}", get_exchange)
    r.put("/api/exchanges/{vhost}/{name}", put_exchange)
    r.delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.get("/api/exchanges/{vhost}/{name}/bindings/source", source_bindings)
    r.get("/api/exchanges/{vhost}/{name}/bindings/destination", destination_bindings)
    r.post("/api/exchanges/{vhost}/{name}/publish", publish)
