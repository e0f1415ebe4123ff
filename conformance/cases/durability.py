"""Durability across a broker restart (needs --restart-cmd; skipped otherwise).

Each case prepares before the restart and returns what it needs to check; all of them
share one restart and then verify. The broker must come back at the same URL with its
data directory intact (a clean restart, as an operator would do).
"""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions as pex

from conformance.framework import CaseFailure, Context, eq, restart_case

A = "durability"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _publish_confirmed(ctx: Context, exchange: str, key: str, bodies: list[bytes],
                       props: pika.BasicProperties = PERSISTENT) -> None:
    ch = ctx.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish(exchange, key, b, props)


def _exists(ctx: Context, kind: str, name: str) -> bool:
    ch = ctx.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
    except pex.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    return True


@restart_case("durability/persistent-messages-in-durable-queue-survive-restart", A)
def persistent_prepare(ctx: Context) -> Any:
    q = ctx.queue(durable=True)
    _publish_confirmed(ctx, "", q, [b"p%d" % i for i in range(20)])
    return q


@persistent_prepare
def persistent_verify(ctx: Context, q: str) -> None:
    eq(ctx.bodies(ctx.channel(), q), [b"p%d" % i for i in range(20)], "bodies in order")


@restart_case("durability/transient-message-in-durable-queue-lost-on-restart", A)
def transient_prepare(ctx: Context) -> Any:
    q = ctx.queue(durable=True)
    _publish_confirmed(ctx, "", q, [b"transient"], pika.BasicProperties(delivery_mode=1))
    _publish_confirmed(ctx, "", q, [b"persistent"])
    return q


@transient_prepare
def transient_verify(ctx: Context, q: str) -> None:
    eq(ctx.bodies(ctx.channel(), q), [b"persistent"], "bodies after restart")


@restart_case("durability/non-durable-queue-deleted-by-restart", A)
def transient_queue_prepare(ctx: Context) -> Any:
    return ctx.queue(durable=False)


@transient_queue_prepare
def transient_queue_verify(ctx: Context, q: str) -> None:
    eq(_exists(ctx, "queue", q), False, "non-durable queue exists after restart")


@restart_case("durability/durable-exchange-and-bindings-survive-restart", A)
def exchange_prepare(ctx: Context) -> Any:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic", durable=True)
    q = ctx.queue(ch, durable=True)
    ch.queue_bind(q, x, "orders.*")
    return x, q


@exchange_prepare
def exchange_verify(ctx: Context, state: Any) -> None:
    x, q = state
    ch = ctx.channel()
    ch.basic_publish(x, "orders.eu", b"routed")
    eq(ctx.bodies(ch, q), [b"routed"], "routed through the recovered binding")


@restart_case("durability/non-durable-exchange-deleted-by-restart", A)
def transient_exchange_prepare(ctx: Context) -> Any:
    return ctx.exchange(ctx.channel(), "fanout", durable=False)


@transient_exchange_prepare
def transient_exchange_verify(ctx: Context, x: str) -> None:
    eq(_exists(ctx, "exchange", x), False, "non-durable exchange exists after restart")


@restart_case("durability/queue-arguments-survive-restart", A)
def args_prepare(ctx: Context) -> Any:
    return ctx.queue(durable=True, arguments={"x-max-length": 2})


@args_prepare
def args_verify(ctx: Context, q: str) -> None:
    ch = ctx.channel()
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i, PERSISTENT)
    eq(ctx.bodies(ch, q), [b"2", b"3"], "x-max-length still enforced")
    try:
        ch.queue_declare(q, durable=True, arguments={"x-max-length": 2})
    except pex.ChannelClosedByBroker as exc:
        raise CaseFailure("equivalent redeclare ok", f"{exc.reply_code} {exc.reply_text}")


@restart_case("durability/unacked-persistent-message-back-and-redelivered", A)
def unacked_prepare(ctx: Context) -> Any:
    ch = ctx.channel()
    q = ctx.queue(ch, durable=True)
    _publish_confirmed(ctx, "", q, [b"in-flight"])
    ctx.must_get(ch, q, auto_ack=False)  # left unacked across the restart
    return q


@unacked_prepare
def unacked_verify(ctx: Context, q: str) -> None:
    m = ctx.must_get(ctx.channel(), q)
    eq((m.body, m.method.redelivered), (b"in-flight", True), "body/redelivered")


@restart_case("durability/acked-messages-stay-gone-after-restart", A)
def acked_prepare(ctx: Context) -> Any:
    ch = ctx.channel()
    q = ctx.queue(ch, durable=True)
    _publish_confirmed(ctx, "", q, [b"a", b"b", b"c"])
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_ack(m.method.delivery_tag)
    ctx.sync(ch)
    return q


@acked_prepare
def acked_verify(ctx: Context, q: str) -> None:
    eq(ctx.bodies(ctx.channel(), q), [b"b", b"c"], "remaining after restart")


@restart_case("durability/message-properties-and-headers-survive-restart", A)
def props_prepare(ctx: Context) -> Any:
    q = ctx.queue(durable=True)
    props = pika.BasicProperties(delivery_mode=2, message_id="m-7", correlation_id="c-7",
                                 content_type="application/json", priority=3,
                                 headers={"tenant": "acme", "n": 5}, timestamp=1700000000)
    _publish_confirmed(ctx, "", q, [b"{}"], props)
    return q


@props_prepare
def props_verify(ctx: Context, q: str) -> None:
    p = ctx.must_get(ctx.channel(), q).properties
    eq((p.message_id, p.correlation_id, p.content_type, p.priority, p.timestamp,
        dict(p.headers or {})),
       ("m-7", "c-7", "application/json", 3, 1700000000, {"tenant": "acme", "n": 5}),
       "properties")


@restart_case("durability/500-confirmed-persistent-messages-all-survive", A)
def many_prepare(ctx: Context) -> Any:
    q = ctx.queue(durable=True)
    _publish_confirmed(ctx, "", q, [b"%d" % i for i in range(500)])
    return q


@many_prepare
def many_verify(ctx: Context, q: str) -> None:
    ch = ctx.channel()
    eq(ch.queue_declare(q, passive=True).method.message_count, 500, "message_count")


@restart_case("durability/dead-letter-arguments-work-after-restart", A)
def dlx_prepare(ctx: Context) -> Any:
    ch = ctx.channel()
    dlq = ctx.queue(ch, durable=True)
    q = ctx.queue(ch, durable=True, arguments={"x-dead-letter-exchange": "",
                                               "x-dead-letter-routing-key": dlq})
    _publish_confirmed(ctx, "", q, [b"to-reject"])
    return q, dlq


@dlx_prepare
def dlx_verify(ctx: Context, state: Any) -> None:
    q, dlq = state
    ch = ctx.channel()
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    eq(ctx.must_get(ch, dlq).body, b"to-reject", "dead-lettered after restart")


@restart_case("x-delayed-message/durable-delayed-message-survives-restart", A)
def delayed_prepare(ctx: Context) -> Any:
    """amqpd extension (skipped where x-delayed-message is not supported): a persistent
    message waiting in a durable delayed exchange is delivered after a restart."""
    from conformance.cases.extensions3 import _declare_or_skip

    x = _declare_or_skip(ctx, "x-delayed-message", {"x-delayed-type": "direct"}, durable=True)
    ch = ctx.channel()
    q = ctx.queue(ch, durable=True)
    ch.queue_bind(q, x, "k")
    ch.basic_publish(x, "k", b"delayed", pika.BasicProperties(delivery_mode=2,
                                                               headers={"x-delay": 1500}))
    ctx.sync(ch)
    return q


@delayed_prepare
def delayed_verify(ctx: Context, q: str) -> None:
    eq(ctx.must_get(ctx.channel(), q, timeout=10).body, b"delayed", "delivered after restart")
