"""Basic class: publish, get, consume, cancel, deliver (settlement is in acks.py)."""

from __future__ import annotations

import datetime
import decimal
import time
from typing import Any

import pika
import pika.exceptions as pex
from pamqp import commands as C

from conformance.framework import CaseFailure, Context, case, check, eq

A = "basic"


@case("basic.publish/get-round-trip-body", A)
def round_trip(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"hello\x00world")
    eq(ctx.must_get(ch, q).body, b"hello\x00world", "body")


@case("basic.publish/properties-round-trip", A)
def props_round_trip(ctx: Context) -> None:
    """All basic properties reach the consumer unchanged."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip", delivery_mode=2,
        priority=3, correlation_id="corr-1", reply_to="reply-q", expiration="60000",
        message_id="mid-1", timestamp=1_700_000_000, type="order.created",
        user_id=ctx.user, app_id="conformance", cluster_id="c1")
    ch.basic_publish("", q, b"{}", props)
    p = ctx.must_get(ch, q).properties
    for f in ("content_type", "content_encoding", "delivery_mode", "priority",
              "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
              "user_id", "app_id"):
        eq(getattr(p, f), getattr(props, f), f"property {f}")


@case("basic.publish/headers-table-value-types-round-trip", A)
def headers_types(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    headers: dict[str, Any] = {
        "str": "text", "int": 42, "neg": -7, "big": 2**40, "bool": True, "false": False,
        "dec": decimal.Decimal("3.14"), "bytes": b"\x00\x01",
        "list": [1, "two", [3]], "table": {"nested": {"deep": 1}},
        "ts": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), "none": None,
    }
    ch.basic_publish("", q, b"h", pika.BasicProperties(headers=headers))
    got = ctx.must_get(ch, q).headers
    for k, v in headers.items():
        g = got.get(k)
        if isinstance(v, bytes) and isinstance(g, str):
            g = g.encode()
        eq(g, v, f"header {k}")


@case("basic.publish/empty-body", A)
def empty_body(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"")
    eq(ctx.must_get(ch, q).body, b"", "body")


@case("basic.publish/one-megabyte-body", A)
def big_body(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    body = bytes(range(256)) * 4096
    ch.basic_publish("", q, body)
    eq(ctx.must_get(ch, q).body, body, "1 MiB body")


@case("basic.publish/missing-exchange-404-NOT_FOUND", A)
def publish_missing_exchange(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_publish(ctx.name("x"), "k", b"x"), 404, "NOT_FOUND")


@case("basic.publish/unroutable-silently-dropped", A)
def unroutable_dropped(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ch.basic_publish(x, "nobody", b"lost")
    ctx.sync(ch)
    check(ch.is_open, "channel open", "closed")


@case("basic.publish/mandatory-unroutable-returns-312-NO_ROUTE", A)
def mandatory_return(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    x = ctx.exchange(ch, "direct")
    returned: list[tuple[Any, Any, bytes]] = []
    ch.add_on_return_callback(lambda _c, m, p, b: returned.append((m, p, b)))
    ch.basic_publish(x, "nobody", b"back", pika.BasicProperties(message_id="r1"),
                     mandatory=True)
    ctx.pump(conn, lambda: bool(returned), 3)
    check(bool(returned), "basic.return", "nothing")
    m, p, b = returned[0]
    ctx.note(f"Basic.Return {m.reply_code} {m.reply_text!r}")
    eq((m.reply_code, m.exchange, m.routing_key), (312, x, "nobody"), "return fields")
    check("NO_ROUTE" in m.reply_text, "reply text NO_ROUTE", m.reply_text)
    eq((b, p.message_id), (b"back", "r1"), "returned content")


@case("basic.publish/mandatory-routed-not-returned", A)
def mandatory_routed(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    returned: list[Any] = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("", q, b"ok", mandatory=True)
    ctx.must_get(ch, q)
    conn.process_data_events(time_limit=0.2)
    eq(returned, [], "returns")


@case("basic.publish/mandatory-to-missing-queue-via-default-exchange-returns-312", A)
def mandatory_default(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _c, m, p, b: returned.append(m))
    ch.basic_publish("", ctx.name(), b"x", mandatory=True)
    ctx.pump(conn, lambda: bool(returned), 3)
    check(bool(returned) and returned[0].reply_code == 312, "basic.return 312", returned)


@case("basic.get/empty-queue-get-empty", A)
def get_empty(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    method, _, _ = ch.basic_get(q)
    eq(method, None, "basic.get-empty")


@case("basic.get/get-ok-message-count-is-remaining", A)
def get_count(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    ctx.sync(ch)
    m = ctx.must_get(ch, q)
    eq(m.method.message_count, 2, "get-ok message_count")


@case("basic.get/get-ok-fields-exchange-routing-key-redelivered", A)
def get_fields(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "rk.1")
    ch.basic_publish(x, "rk.1", b"f")
    m = ctx.must_get(ch, q)
    eq((m.method.exchange, m.method.routing_key, m.method.redelivered), (x, "rk.1", False),
       "exchange/routing_key/redelivered")


@case("basic.get/missing-queue-404-NOT_FOUND", A)
def get_missing(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_get(ctx.name()), 404)


@case("basic.get/no-ack-false-requires-ack", A)
def get_requires_ack(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    ctx.must_get(ch, q, auto_ack=False)
    ok = ch.queue_declare(q, passive=True)
    eq(ok.method.message_count, 0, "ready messages while unacked")
    ch.close()
    m = ctx.must_get(ctx.channel(), q)
    eq(m.method.redelivered, True, "redelivered after channel close")


@case("basic.consume/deliveries-in-publish-order", A)
def order(ctx: Context) -> None:
    """Messages published on one channel to one queue are delivered in that order."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(200):
        ch.basic_publish("", q, b"%d" % i)
    _, got = ctx.consume(ch, q, 200, auto_ack=True)
    eq([int(m.body) for m in got], list(range(200)), "order")


@case("basic.consume/deliver-fields-consumer-tag-exchange-routing-key", A)
def deliver_fields(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    q = ctx.bound_queue(ch, x, "a.*")
    ch.basic_publish(x, "a.b", b"d")
    tag, got = ctx.consume(ch, q, 1, auto_ack=True, consumer_tag="my-tag-1")
    eq(tag, "my-tag-1", "consumer tag")
    m = got[0].method
    eq((m.consumer_tag, m.exchange, m.routing_key, m.redelivered),
       ("my-tag-1", x, "a.b", False), "deliver fields")


@case("basic.consume/server-generated-consumer-tag", A)
def server_tag(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    r = rc.rpc(C.Basic.Consume(queue=q, consumer_tag=""), 1, (C.Basic.ConsumeOk,))
    check(isinstance(r, C.Basic.ConsumeOk), "basic.consume-ok", r)
    check(bool(r.consumer_tag), "a non-empty generated tag", r.consumer_tag)
    del ch


@case("basic.consume/missing-queue-404-NOT_FOUND", A)
def consume_missing(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_consume(ctx.name(), lambda *a: None), 404)


@case("basic.consume/duplicate-consumer-tag-530-NOT_ALLOWED", A)
def consume_dup_tag(ctx: Context) -> None:
    """Reusing a consumer tag on the same channel is a connection error 530 (RabbitMQ)."""
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_consume(q, lambda *a: None, consumer_tag="dup")
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    rc.rpc(C.Basic.Consume(queue=q, consumer_tag="dup"), 1, (C.Basic.ConsumeOk,))
    rc.send_method(C.Basic.Consume(queue=q, consumer_tag="dup"), 1)
    close = rc.expect_close()
    assert close is not None, "expected connection.close 530, got socket closed"
    eq(close.reply_code, 530, "connection.close code")


@case("basic.consume/exclusive-consumer-when-others-exist-403-ACCESS_REFUSED", A)
def exclusive_when_others(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_consume(q, lambda *a: None)
    ch2 = ctx.channel()
    ctx.channel_error(ch2, lambda: ch2.basic_consume(q, lambda *a: None, exclusive=True), 403,
                      "ACCESS_REFUSED")


@case("basic.consume/second-consumer-on-exclusively-consumed-queue-403", A)
def second_after_exclusive(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch2 = ctx.channel()
    ctx.channel_error(ch2, lambda: ch2.basic_consume(q, lambda *a: None), 403)


@case("basic.consume/round-robin-between-consumers", A)
def round_robin(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    seen: dict[str, int] = {}

    def cb(_c: Any, m: Any, _p: Any, _b: bytes) -> None:
        seen[m.consumer_tag] = seen.get(m.consumer_tag, 0) + 1

    ch.basic_consume(q, cb, auto_ack=True, consumer_tag="c1")
    ch.basic_consume(q, cb, auto_ack=True, consumer_tag="c2")
    for _ in range(10):
        ch.basic_publish("", q, b"r")
    ctx.pump(conn, lambda: sum(seen.values()) >= 10, 3)
    eq(seen, {"c1": 5, "c2": 5}, "deliveries per consumer")


@case("basic.consume/no-ack-messages-not-redelivered", A)
def no_ack(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"fire-and-forget")
    _, got = ctx.consume(ch, q, 1, auto_ack=True)
    eq(len(got), 1, "deliveries")
    conn.close()
    ctx.get_none(ctx.channel(), q)


@case("basic.cancel/cancel-ok-and-no-more-deliveries", A)
def cancel(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    tag, _ = ctx.consume(ch, q, 0, timeout=0)
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"after-cancel")
    ctx.sync(ch)
    eq(ch.queue_declare(q, passive=True).method.message_count, 1, "message left in queue")


@case("basic.cancel/unknown-consumer-tag-cancel-ok", A)
def cancel_unknown(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    r = rc.rpc(C.Basic.Cancel(consumer_tag="never-existed"), 1, (C.Basic.CancelOk,))
    check(isinstance(r, C.Basic.CancelOk), "basic.cancel-ok", r)


@case("basic.cancel/unacked-deliveries-stay-unacked-after-cancel", A)
def cancel_keeps_unacked(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"u")
    tag, got = ctx.consume(ch, q, 1)
    ch.basic_cancel(tag)
    ch.basic_ack(got[0].method.delivery_tag)
    ctx.sync(ch)
    eq(ch.queue_declare(q, passive=True).method.message_count, 0, "ready after ack")


@case("basic.deliver/redelivered-false-on-first-delivery", A)
def first_not_redelivered(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    _, got = ctx.consume(ch, q, 1, auto_ack=True)
    eq(got[0].method.redelivered, False, "redelivered")


@case("basic.publish/user-id-mismatch-406-PRECONDITION_FAILED", A)
def user_id_mismatch(ctx: Context) -> None:
    """RabbitMQ validates user_id against the connection's user."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_publish(
        "", q, b"x", pika.BasicProperties(user_id="not-" + ctx.user)), 406)


@case("basic.publish/user-id-matching-accepted", A)
def user_id_ok(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x", pika.BasicProperties(user_id=ctx.user))
    eq(ctx.must_get(ch, q).properties.user_id, ctx.user, "user_id")


@case("basic.publish/persistent-message-to-durable-queue", A)
def persistent(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, durable=True)
    ch.basic_publish("", q, b"p", pika.BasicProperties(delivery_mode=2))
    eq(ctx.must_get(ch, q).properties.delivery_mode, 2, "delivery_mode")


@case("basic.publish/many-channels-one-connection-independent-order", A)
def channels_order(ctx: Context) -> None:
    conn = ctx.connect()
    chans = [conn.channel() for _ in range(3)]
    q = ctx.queue(chans[0])
    for i in range(30):
        for n, c in enumerate(chans):
            c.basic_publish("", q, b"%d:%d" % (n, i))
    got = ctx.drain(chans[0], q)
    for n in range(3):
        seq = [int(m.body.split(b":")[1]) for m in got if m.body.startswith(b"%d:" % n)]
        eq(seq, list(range(30)), f"order of channel {n}")


@case("basic.consume/cancel-then-consume-again-gets-redelivery", A)
def consume_again(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"again")
    tag, got = ctx.consume(ch, q, 1)
    ch.basic_cancel(tag)
    ch.basic_reject(got[0].method.delivery_tag, requeue=True)
    _, got2 = ctx.consume(ch, q, 1)
    check(bool(got2) and got2[0].method.redelivered, "a redelivery", [
        (m.body, m.method.redelivered) for m in got2])


@case("basic.get/after-consumer-requeue-sees-message", A)
def requeue_visible(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"v")
    m = ctx.must_get(ch, q, auto_ack=False)
    eq(ctx.get(ch, q, timeout=0.1), None, "second get while unacked")
    ch.basic_reject(m.method.delivery_tag)
    ctx.must_get(ch, q)


@case("basic.consume/consumer-gets-messages-published-before-it-started", A)
def backlog(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i)
    time.sleep(0.05)
    _, got = ctx.consume(ch, q, 20, auto_ack=True)
    eq(len(got), 20, "backlog delivered")


@case("channel.close/closing-channel-cancels-its-consumers", A)
def close_cancels(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    other = ctx.channel()
    deadline = time.monotonic() + 2
    while other.queue_declare(q, passive=True).method.consumer_count:
        if time.monotonic() > deadline:
            raise CaseFailure("0 consumers after channel close", "still a consumer")
        time.sleep(0.05)


@case("basic.publish/to-exchange-after-channel-error-needs-new-channel", A)
def closed_channel_unusable(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.queue_declare(ctx.name(), passive=True), 404)
    try:
        ch.basic_publish("", "x", b"x")
    except (pex.ChannelWrongStateError, pex.ChannelClosed):
        return
    raise CaseFailure("closed channel refuses publish", "publish accepted")
