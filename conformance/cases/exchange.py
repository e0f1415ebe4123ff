"""Exchange class: declare, delete, bind, unbind; reserved names and equivalence."""

from __future__ import annotations

import time

import pika.exceptions as pex

from conformance.framework import CaseFailure, Context, case, check, eq

A = "exchange"


for _type in ("direct", "fanout", "topic", "headers"):

    def _declare(ctx: Context, t: str = _type) -> None:
        ch = ctx.channel()
        x = ctx.exchange(ch, t)
        ch.exchange_declare(x, exchange_type=t, passive=True)

    case(f"exchange.declare/type-{_type}-declare-ok", A)(_declare)


@case("exchange.declare/unknown-type-503-COMMAND_INVALID", A)
def unknown_type(ctx: Context) -> None:
    """An unknown exchange type is a connection error 503 in RabbitMQ."""
    conn = ctx.connect()
    ch = conn.channel()
    x = ctx.name("x")
    ctx.track_exchange(x)
    ctx.connection_error(conn, lambda: ch.exchange_declare(x, exchange_type="no-such-type"), 503)


@case("exchange.declare/redeclare-identical-ok", A)
def redeclare_same(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic", durable=False)
    ch.exchange_declare(x, exchange_type="topic")


@case("exchange.declare/redeclare-other-type-406-PRECONDITION_FAILED", A)
def redeclare_type(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, exchange_type="fanout"), 406)


@case("exchange.declare/redeclare-other-durable-406-PRECONDITION_FAILED", A)
def redeclare_durable(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, exchange_type="direct", durable=True),
                      406)


@case("exchange.declare/redeclare-other-auto-delete-406-PRECONDITION_FAILED", A)
def redeclare_ad(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, exchange_type="direct",
                                                      auto_delete=True), 406)


@case("exchange.declare/redeclare-other-internal-406-PRECONDITION_FAILED", A)
def redeclare_internal(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, exchange_type="direct",
                                                      internal=True), 406)


@case("exchange.declare/redeclare-other-alternate-exchange-406-PRECONDITION_FAILED", A)
def redeclare_args(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct", arguments={"alternate-exchange": "ae-one"})
    ctx.channel_error(ch, lambda: ch.exchange_declare(
        x, exchange_type="direct", arguments={"alternate-exchange": "ae-two"}), 406)


@case("exchange.declare/passive-existing-ok", A)
def passive_ok(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    ch.exchange_declare(x, passive=True)


@case("exchange.declare/passive-missing-404-NOT_FOUND", A)
def passive_missing(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.exchange_declare(ctx.name("x"), passive=True), 404)


@case("exchange.declare/passive-ignores-type-mismatch", A)
def passive_type(ctx: Context) -> None:
    """A passive declare only checks existence; other fields are ignored."""
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    ch.exchange_declare(x, exchange_type="topic", passive=True)


@case("exchange.declare/amq-prefix-reserved-403-ACCESS_REFUSED", A)
def amq_prefix(ctx: Context) -> None:
    ch = ctx.channel()
    name = "amq." + ctx.name("x")
    ctx.track_exchange(name)
    ctx.channel_error(ch, lambda: ch.exchange_declare(name, exchange_type="direct"), 403)


@case("exchange.declare/redeclare-amq-direct-equivalent-ok", A)
def amq_direct_redeclare(ctx: Context) -> None:
    """An equivalent declare of an existing amq.* exchange succeeds (RabbitMQ checks the
    reserved prefix only when it would create the exchange)."""
    ch = ctx.channel()
    ch.exchange_declare("amq.direct", exchange_type="direct", durable=True)


@case("exchange.declare/redeclare-amq-direct-other-type-406-PRECONDITION_FAILED", A)
def amq_direct_redeclare_type(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.exchange_declare("amq.direct", exchange_type="fanout",
                                                      durable=True), 406)


for _pre, _t in (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                 ("amq.headers", "headers"), ("amq.match", "headers")):

    def _predeclared(ctx: Context, name: str = _pre, t: str = _t) -> None:
        ch = ctx.channel()
        ch.exchange_declare(name, exchange_type=t, passive=True)
        q = ctx.queue(ch)
        args = {"x-match": "all", "k": "v"} if t == "headers" else None
        ch.queue_bind(q, name, routing_key="rk", arguments=args)
        ch.basic_publish(name, "rk", b"via-" + name.encode(),
                         __import__("pika").BasicProperties(headers={"k": "v"}))
        eq(ctx.must_get(ch, q).body, b"via-" + name.encode(), "routed body")
        ch.queue_unbind(q, name, routing_key="rk", arguments=args)

    case(f"exchange.declare/predeclared-{_pre}-exists-and-routes", A)(_predeclared)


@case("exchange.declare/default-exchange-declare-refused", A)
def declare_default(ctx: Context) -> None:
    """Declaring the nameless default exchange is not allowed (403 in RabbitMQ)."""
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.exchange_declare("", exchange_type="direct"), 403)


@case("exchange.declare/nowait-then-passive-finds-it", A)
def declare_nowait(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.name("x")
    ctx.track_exchange(x)
    # pika has no nowait for exchange_declare on BlockingChannel; use the raw client.
    from pamqp import commands as C

    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    rc.send_method(C.Exchange.Declare(exchange=x, exchange_type="fanout", nowait=True), 1)
    r = rc.rpc(C.Exchange.Declare(exchange=x, passive=True), 1, (C.Exchange.DeclareOk,))
    check(isinstance(r, C.Exchange.DeclareOk), "exchange.declare-ok", r)
    ch.exchange_declare(x, passive=True)


@case("exchange.delete/delete-ok-then-passive-404", A)
def delete_ok(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ch.exchange_delete(x)
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, passive=True), 404)


@case("exchange.delete/missing-exchange-ok", A)
def delete_missing(ctx: Context) -> None:
    """RabbitMQ makes exchange.delete idempotent: deleting a missing exchange is ok."""
    ch = ctx.channel()
    ch.exchange_delete(ctx.name("x"))
    check(ch.is_open, "channel open", "closed")


@case("exchange.delete/if-unused-with-bindings-406-PRECONDITION_FAILED", A)
def delete_if_unused(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    ctx.bound_queue(ch, x)
    ctx.channel_error(ch, lambda: ch.exchange_delete(x, if_unused=True), 406)


@case("exchange.delete/if-unused-without-bindings-ok", A)
def delete_if_unused_ok(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    ch.exchange_delete(x, if_unused=True)
    ctx.channel_error(ch, lambda: ch.exchange_declare(x, passive=True), 404)


@case("exchange.delete/default-exchange-403-ACCESS_REFUSED", A)
def delete_default(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.exchange_delete(""), 403)


@case("exchange.delete/amq-direct-403-ACCESS_REFUSED", A)
def delete_amq(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.exchange_delete("amq.direct"), 403)


@case("exchange.delete/removes-its-bindings", A)
def delete_removes_bindings(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, x)
    ch.exchange_delete(x)
    ctx.exchange(ch, "fanout", name=x)
    ch.basic_publish(x, "", b"after")
    ctx.get_none(ch, q)


@case("exchange.declare/auto-delete-removed-after-last-unbind", A)
def auto_delete(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout", auto_delete=True)
    q = ctx.bound_queue(ch, x)
    ch.exchange_declare(x, passive=True)
    ch.queue_unbind(q, x, routing_key="")
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            ch.exchange_declare(x, passive=True)
        except pex.ChannelClosedByBroker as exc:
            eq(exc.reply_code, 404, "passive declare after last unbind")
            return
        time.sleep(0.05)
    raise CaseFailure("auto-delete exchange gone after its last binding", "still exists")


@case("exchange.declare/auto-delete-kept-until-first-binding", A)
def auto_delete_unbound(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout", auto_delete=True)
    time.sleep(0.2)
    ch.exchange_declare(x, passive=True)


@case("exchange.declare/internal-exchange-publish-403-ACCESS_REFUSED", A)
def internal_publish(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout", internal=True)
    ctx.channel_error(ch, lambda: ch.basic_publish(x, "", b"no"), 403)


@case("exchange.declare/durable-exchange-declare-ok", A)
def durable_ok(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct", durable=True)
    ch.exchange_declare(x, exchange_type="direct", durable=True)


@case("exchange.bind/missing-source-404-NOT_FOUND", A)
def bind_missing_source(ctx: Context) -> None:
    ch = ctx.channel()
    d = ctx.exchange(ch, "fanout")
    ctx.channel_error(ch, lambda: ch.exchange_bind(d, ctx.name("x")), 404)


@case("exchange.bind/missing-destination-404-NOT_FOUND", A)
def bind_missing_dest(ctx: Context) -> None:
    ch = ctx.channel()
    s = ctx.exchange(ch, "fanout")
    ctx.channel_error(ch, lambda: ch.exchange_bind(ctx.name("x"), s), 404)


@case("exchange.bind/bind-ok-routes-to-destination", A)
def bind_routes(ctx: Context) -> None:
    ch = ctx.channel()
    s = ctx.exchange(ch, "direct")
    d = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, d)
    ch.exchange_bind(d, s, routing_key="k")
    ch.basic_publish(s, "k", b"e2e")
    eq(ctx.must_get(ch, q).body, b"e2e", "body")


@case("exchange.unbind/unbind-ok-stops-routing", A)
def unbind_stops(ctx: Context) -> None:
    ch = ctx.channel()
    s = ctx.exchange(ch, "direct")
    d = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, d)
    ch.exchange_bind(d, s, routing_key="k")
    ch.exchange_unbind(d, s, routing_key="k")
    ch.basic_publish(s, "k", b"e2e")
    ctx.get_none(ch, q)


@case("exchange.unbind/missing-binding-ok", A)
def unbind_missing(ctx: Context) -> None:
    """Unbinding a binding that does not exist succeeds (RabbitMQ)."""
    ch = ctx.channel()
    s = ctx.exchange(ch, "direct")
    d = ctx.exchange(ch, "direct")
    ch.exchange_unbind(d, s, routing_key="never-bound")


@case("exchange.bind/to-default-exchange-403-ACCESS_REFUSED", A)
def bind_default(ctx: Context) -> None:
    ch = ctx.channel()
    d = ctx.exchange(ch, "fanout")
    ctx.channel_error(ch, lambda: ch.exchange_bind(d, "", routing_key="k"), 403)


@case("exchange.bind/idempotent-double-bind-delivers-once", A)
def bind_twice(ctx: Context) -> None:
    ch = ctx.channel()
    s = ctx.exchange(ch, "direct")
    d = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, d)
    ch.exchange_bind(d, s, routing_key="k")
    ch.exchange_bind(d, s, routing_key="k")
    ch.basic_publish(s, "k", b"once")
    eq(len(ctx.drain(ch, q)), 1, "copies delivered")


@case("exchange.declare/internal-reachable-through-e2e-binding", A)
def internal_via_e2e(ctx: Context) -> None:
    ch = ctx.channel()
    s = ctx.exchange(ch, "fanout")
    d = ctx.exchange(ch, "fanout", internal=True)
    q = ctx.bound_queue(ch, d)
    ch.exchange_bind(d, s)
    ch.basic_publish(s, "", b"in")
    eq(ctx.must_get(ch, q).body, b"in", "body")
