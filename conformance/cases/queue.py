"""Queue class: declare, bind, unbind, purge, delete; exclusivity and argument checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika.exceptions as pex
from pamqp import commands as C

from conformance.framework import Context, case, check, eq

A = "queue"


def _gone(ctx: Context, q: str, timeout: float = 2.0) -> bool:
    ch = ctx.channel()
    deadline = time.monotonic() + timeout
    while True:
        try:
            ch.queue_declare(q, passive=True)
        except pex.ChannelClosedByBroker as exc:
            return exc.reply_code == 404
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@case("queue.declare/server-named-queue-amq-gen-prefix", A)
def server_named(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, name="", exclusive=True)
    check(q.startswith("amq.gen-"), "a name starting with amq.gen-", q)


@case("queue.declare/server-names-are-unique", A)
def server_named_unique(ctx: Context) -> None:
    ch = ctx.channel()
    a = ctx.queue(ch, name="", exclusive=True)
    b = ctx.queue(ch, name="", exclusive=True)
    check(a != b, "two different names", (a, b))


@case("queue.declare/declare-ok-reports-message-count", A)
def declare_counts(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    ctx.sync(ch)
    ok = ch.queue_declare(q, passive=True)
    eq(ok.method.message_count, 3, "message_count")
    eq(ok.method.consumer_count, 0, "consumer_count")


@case("queue.declare/declare-ok-reports-consumer-count", A)
def declare_consumers(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_consume(q, lambda *a: None)
    ch.basic_consume(q, lambda *a: None)
    ok = ch.queue_declare(q, passive=True)
    eq(ok.method.consumer_count, 2, "consumer_count")


@case("queue.declare/passive-missing-404-NOT_FOUND", A)
def passive_missing(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.queue_declare(ctx.name(), passive=True), 404,
                      "NOT_FOUND")


@case("queue.declare/passive-ignores-other-fields", A)
def passive_ignores(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.queue_declare(q, passive=True, durable=True, arguments={"x-message-ttl": 5})


@case("queue.declare/amq-prefix-reserved-403-ACCESS_REFUSED", A)
def amq_prefix(ctx: Context) -> None:
    ch = ctx.channel()
    name = "amq." + ctx.name()
    ctx.track_queue(name)
    ctx.channel_error(ch, lambda: ch.queue_declare(name), 403, "ACCESS_REFUSED")


@case("queue.declare/redeclare-identical-ok", A)
def redeclare_ok(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 10})
    ch.queue_declare(q, arguments={"x-max-length": 10})


def _mismatch(kw1: dict[str, Any], kw2: dict[str, Any]) -> Callable[[Context], None]:
    def run(ctx: Context) -> None:
        ch = ctx.channel()
        q = ctx.queue(ch, **kw1)
        ctx.channel_error(ch, lambda: ch.queue_declare(q, **kw2), 406, "PRECONDITION_FAILED")
    return run


for _label, _a, _b in (
    ("durable", {"durable": False}, {"durable": True}),
    ("auto-delete", {"auto_delete": False}, {"auto_delete": True}),
    ("x-message-ttl", {"arguments": {"x-message-ttl": 1000}},
     {"arguments": {"x-message-ttl": 2000}}),
    ("x-max-length", {"arguments": {"x-max-length": 5}}, {"arguments": {"x-max-length": 6}}),
    ("x-dead-letter-exchange", {"arguments": {"x-dead-letter-exchange": "a"}},
     {"arguments": {"x-dead-letter-exchange": "b"}}),
    ("x-max-priority-added", {}, {"arguments": {"x-max-priority": 5}}),
):
    case(f"queue.declare/redeclare-other-{_label}-406-PRECONDITION_FAILED", A)(
        _mismatch(_a, _b))


for _label, _args in (
    ("x-message-ttl-string", {"x-message-ttl": "soon"}),
    ("x-message-ttl-negative", {"x-message-ttl": -1}),
    ("x-expires-zero", {"x-expires": 0}),
    ("x-max-length-negative", {"x-max-length": -1}),
    ("x-max-length-bytes-string", {"x-max-length-bytes": "big"}),
    ("x-overflow-unknown", {"x-overflow": "explode"}),
    ("x-max-priority-above-255", {"x-max-priority": 256}),
    ("x-dead-letter-routing-key-without-dlx", {"x-dead-letter-routing-key": "rk"}),
    ("x-single-active-consumer-not-bool", {"x-single-active-consumer": "yes"}),
):

    def _bad_arg(ctx: Context, args: dict[str, Any] = _args) -> None:
        ch = ctx.channel()
        q = ctx.name()
        ctx.track_queue(q)
        ctx.channel_error(ch, lambda: ch.queue_declare(q, arguments=args), 406,
                          "PRECONDITION_FAILED")

    case(f"queue.declare/invalid-argument-{_label}-406-PRECONDITION_FAILED", A)(_bad_arg)


@case("queue.declare/unknown-x-argument-ignored", A)
def unknown_arg(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.queue(ch, arguments={"x-conformance-unknown": 1})


@case("queue.declare/name-of-255-bytes-ok", A)
def long_name(ctx: Context) -> None:
    ch = ctx.channel()
    base = ctx.name()
    q = (base + "-" + "n" * 255)[:255]
    ctx.queue(ch, name=q)
    ch.basic_publish("", q, b"long")
    eq(ctx.must_get(ch, q).body, b"long", "body")


@case("queue.declare/exclusive-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_declare(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.queue_declare(q, exclusive=True), 405, "RESOURCE_LOCKED")


@case("queue.declare/exclusive-passive-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_passive(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.queue_declare(q, passive=True), 405)


@case("basic.consume/exclusive-queue-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_consume(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.basic_consume(q, lambda *a: None), 405)


@case("basic.get/exclusive-queue-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_get(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.basic_get(q), 405)


@case("queue.delete/exclusive-queue-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_delete(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.queue_delete(q), 405)


@case("queue.purge/exclusive-queue-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_purge(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.queue_purge(q), 405)


@case("queue.bind/exclusive-queue-from-other-connection-405-RESOURCE_LOCKED", A)
def exclusive_bind(ctx: Context) -> None:
    q = ctx.queue(ctx.channel(), exclusive=True)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.queue_bind(q, "amq.fanout"), 405)


@case("queue.declare/exclusive-usable-from-other-channel-same-connection", A)
def exclusive_same_conn(ctx: Context) -> None:
    conn = ctx.connect()
    q = ctx.queue(conn.channel(), exclusive=True)
    ch2 = conn.channel()
    ch2.basic_publish("", q, b"mine")
    eq(ctx.must_get(ch2, q).body, b"mine", "body")


@case("queue.declare/exclusive-publish-from-other-connection-allowed", A)
def exclusive_publish(ctx: Context) -> None:
    """Exclusivity restricts consumers and management, not publishers."""
    ch1 = ctx.channel()
    q = ctx.queue(ch1, exclusive=True)
    ch2 = ctx.connect().channel()
    ch2.basic_publish("", q, b"from-outside")
    eq(ctx.must_get(ch1, q).body, b"from-outside", "body")


@case("queue.declare/auto-delete-deleted-after-last-consumer-cancels", A)
def auto_delete(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, auto_delete=True)
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    check(_gone(ctx, q), "queue deleted", "queue still exists")


@case("queue.declare/auto-delete-kept-while-never-consumed", A)
def auto_delete_never(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, auto_delete=True)
    time.sleep(0.2)
    ch.queue_declare(q, passive=True)


@case("queue.declare/auto-delete-survives-one-of-two-consumers-cancelling", A)
def auto_delete_two(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, auto_delete=True)
    t1 = ch.basic_consume(q, lambda *a: None)
    ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    time.sleep(0.1)
    ok = ch.queue_declare(q, passive=True)
    eq(ok.method.consumer_count, 1, "consumer_count")


@case("queue.declare/x-expires-deletes-unused-queue", A)
def x_expires(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-expires": 200})
    time.sleep(0.7)  # a passive declare counts as use, so look only once it should be gone
    check(_gone(ctx, q, timeout=0), "queue deleted after x-expires", "queue exists")


@case("queue.declare/x-expires-postponed-by-consumer", A)
def x_expires_consumer(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-expires": 300})
    ch.basic_consume(q, lambda *a: None)
    time.sleep(0.7)
    ch.queue_declare(q, passive=True)


@case("queue.declare/nowait-then-passive-finds-it", A)
def declare_nowait(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    q = ctx.name()
    ctx.track_queue(q)
    rc.send_method(C.Queue.Declare(queue=q, nowait=True), 1)
    r = rc.rpc(C.Queue.Declare(queue=q, passive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Queue.DeclareOk), "queue.declare-ok", r)


@case("queue.bind/missing-queue-404-NOT_FOUND", A)
def bind_missing_queue(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.queue_bind(ctx.name(), "amq.direct", "k"), 404)


@case("queue.bind/missing-exchange-404-NOT_FOUND", A)
def bind_missing_exchange(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.queue_bind(q, ctx.name("x"), "k"), 404)


@case("queue.bind/default-exchange-403-ACCESS_REFUSED", A)
def bind_default(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.queue_bind(q, "", "other"), 403)


@case("queue.bind/double-bind-delivers-once", A)
def bind_twice(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "k")
    ch.queue_bind(q, x, "k")
    ch.basic_publish(x, "k", b"1")
    eq(len(ctx.drain(ch, q)), 1, "copies")


@case("queue.bind/empty-routing-key-binds-empty-key", A)
def bind_empty_key(ctx: Context) -> None:
    """queue.bind with an empty routing key binds the key "" (it does not default to the
    last declared queue's name; RabbitMQ)."""
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "")
    ch.basic_publish(x, "", b"empty-key")
    eq(ctx.must_get(ch, q).body, b"empty-key", "body")


@case("queue.unbind/unbind-ok-stops-routing", A)
def unbind(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "k")
    ch.queue_unbind(q, x, "k")
    ch.basic_publish(x, "k", b"x")
    ctx.get_none(ch, q)


@case("queue.unbind/missing-binding-ok", A)
def unbind_missing(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.queue(ch)
    ch.queue_unbind(q, x, "never")


@case("queue.unbind/default-exchange-403-ACCESS_REFUSED", A)
def unbind_default(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.queue_unbind(q, "", q), 403)


@case("queue.purge/purge-ok-returns-count-and-empties", A)
def purge(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for _ in range(4):
        ch.basic_publish("", q, b"p")
    ctx.sync(ch)
    ok = ch.queue_purge(q)
    eq(ok.method.message_count, 4, "purge-ok message_count")
    ctx.get_none(ch, q, settle=0)


@case("queue.purge/missing-queue-404-NOT_FOUND", A)
def purge_missing(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.queue_purge(ctx.name()), 404)


@case("queue.purge/unacked-messages-not-purged", A)
def purge_unacked(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"held")
    ch.basic_publish("", q, b"ready")
    m = ctx.must_get(ch, q, auto_ack=False)
    eq(ch.queue_purge(q).method.message_count, 1, "purged (ready only)")
    ch.basic_nack(m.method.delivery_tag, requeue=True)
    eq(ctx.must_get(ch, q).body, b"held", "requeued body after purge")


@case("queue.delete/delete-ok-returns-message-count", A)
def delete_count(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    ctx.sync(ch)
    eq(ch.queue_delete(q).method.message_count, 2, "delete-ok message_count")
    check(_gone(ctx, q), "queue gone", "exists")


@case("queue.delete/missing-queue-ok", A)
def delete_missing(ctx: Context) -> None:
    """RabbitMQ makes queue.delete idempotent: deleting a missing queue returns delete-ok."""
    ch = ctx.channel()
    eq(ch.queue_delete(ctx.name()).method.message_count, 0, "message_count")


@case("queue.delete/if-unused-with-consumer-406-PRECONDITION_FAILED", A)
def delete_if_unused(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_consume(q, lambda *a: None)
    ch2 = ctx.channel()
    ctx.channel_error(ch2, lambda: ch2.queue_delete(q, if_unused=True), 406)


@case("queue.delete/if-empty-with-messages-406-PRECONDITION_FAILED", A)
def delete_if_empty(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    ctx.sync(ch)
    ctx.channel_error(ch, lambda: ch.queue_delete(q, if_empty=True), 406)


@case("queue.delete/if-empty-on-empty-queue-ok", A)
def delete_if_empty_ok(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.queue_delete(q, if_empty=True)
    check(_gone(ctx, q), "queue gone", "exists")


@case("queue.delete/cancels-consumers-with-basic-cancel", A)
def delete_cancels(ctx: Context) -> None:
    """consumer_cancel_notify: deleting a queue sends basic.cancel to its consumers."""
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(lambda m: cancelled.append(m))
    ch.basic_consume(q, lambda *a: None)
    other = ctx.channel()
    other.queue_delete(q)
    ctx.pump(conn, lambda: bool(cancelled), 3)
    check(bool(cancelled), "basic.cancel from the broker", "nothing")


@case("queue.delete/removes-bindings", A)
def delete_bindings(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, x)
    ch.queue_delete(q)
    ctx.queue(ch, name=q)
    ch.basic_publish(x, "", b"after")
    ctx.get_none(ch, q)


@case("queue/default-exchange-routes-by-queue-name", A)
def default_exchange(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"default")
    eq(ctx.must_get(ch, q).body, b"default", "body")


@case("queue/messages-survive-in-queue-without-consumers", A)
def kept(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"wait")
    ctx.conn.close()
    ch2 = ctx.connect().channel()
    eq(ctx.must_get(ch2, q).body, b"wait", "body")


@case("queue.declare/durable-queue-declare-ok", A)
def durable(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, durable=True)
    ch.queue_declare(q, durable=True)


@case("queue.declare/exclusive-queue-deleted-on-connection-close", A)
def exclusive_deleted(ctx: Context) -> None:
    conn = ctx.connect()
    q = ctx.queue(conn.channel(), exclusive=True)
    conn.close()
    check(_gone(ctx, q), "queue deleted", "exists")


@case("queue.declare/redeclare-exclusive-from-owner-ok", A)
def exclusive_redeclare(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, exclusive=True)
    ch.queue_declare(q, exclusive=True)


