"""RabbitMQ extensions, part 1: TTL, dead-lettering, length limits, priorities."""

from __future__ import annotations

import time
from typing import Any

import pika

from conformance.framework import Context, Message, case, check, eq

TTL, DLX, LEN, PRI = "ext/ttl", "ext/dlx", "ext/length-limits", "ext/priority"


def _props(**kw: Any) -> pika.BasicProperties:
    return pika.BasicProperties(**kw)


# -- TTL ---------------------------------------------------------------------------


@case("x-message-ttl/expired-messages-not-delivered", TTL)
def queue_ttl(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-message-ttl": 50})
    ch.basic_publish("", q, b"old")
    time.sleep(0.25)
    ctx.get_none(ch, q, settle=0)


@case("x-message-ttl/unexpired-messages-delivered", TTL)
def queue_ttl_alive(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", q, b"fresh")
    eq(ctx.must_get(ch, q).body, b"fresh", "body")


@case("x-message-ttl/zero-ttl-expires-unless-consumer-ready", TTL)
def queue_ttl_zero(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"now-or-never")
    ctx.get_none(ch, q, settle=0.1)
    tag, got = ctx.consume(ch, q, 0, timeout=0)
    ch.basic_publish("", q, b"to-consumer")
    ctx.pump(ch.connection, lambda: bool(got), 2)
    eq([m.body for m in got], [b"to-consumer"], "delivered to a waiting consumer")
    ch.basic_cancel(tag)


@case("expiration/per-message-ttl-expires", TTL)
def msg_ttl(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"short", _props(expiration="50"))
    ch.basic_publish("", q, b"long", _props(expiration="60000"))
    time.sleep(0.25)
    eq(ctx.bodies(ch, q), [b"long"], "remaining")


@case("expiration/lower-of-message-and-queue-ttl-wins", TTL)
def msg_ttl_min(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-message-ttl": 50})
    ch.basic_publish("", q, b"x", _props(expiration="60000"))
    time.sleep(0.25)
    ctx.get_none(ch, q, settle=0)


@case("expiration/invalid-expiration-406-PRECONDITION_FAILED", TTL)
def msg_ttl_invalid(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_publish("", q, b"x", _props(expiration="soon")),
                      406)


@case("expiration/negative-expiration-406-PRECONDITION_FAILED", TTL)
def msg_ttl_negative(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_publish("", q, b"x", _props(expiration="-5")), 406)


@case("expiration/property-kept-on-delivery", TTL)
def msg_ttl_kept(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x", _props(expiration="60000"))
    eq(ctx.must_get(ch, q).properties.expiration, "60000", "expiration")


@case("x-message-ttl/requeued-message-keeps-original-expiry", TTL)
def ttl_requeue(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-message-ttl": 300})
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    time.sleep(0.45)
    ch.basic_reject(m.method.delivery_tag, requeue=True)
    time.sleep(0.1)
    ctx.get_none(ch, q, settle=0)


@case("x-expires/queue-with-messages-but-unused-deleted", TTL)
def expires_with_messages(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-expires": 200})
    ch.basic_publish("", q, b"x")
    time.sleep(0.7)
    ctx.channel_error(ch, lambda: ch.queue_declare(q, passive=True), 404)


# -- dead-lettering ------------------------------------------------------------------


def _dlx_pair(ctx: Context, qargs: dict[str, Any] | None = None,
              dlx_type: str = "fanout") -> tuple[Any, str, str, str]:
    ch = ctx.channel()
    dlx = ctx.exchange(ch, dlx_type)
    dlq = ctx.bound_queue(ch, dlx, "#" if dlx_type == "topic" else "")
    args = {"x-dead-letter-exchange": dlx}
    args.update(qargs or {})
    q = ctx.queue(ch, arguments=args)
    return ch, dlx, dlq, q


def _death(m: Message) -> dict[str, Any]:
    deaths = m.headers.get("x-death")
    check(isinstance(deaths, list) and len(deaths) > 0, "an x-death header", m.headers)
    assert isinstance(deaths, list)
    return dict(deaths[0])


@case("x-dead-letter-exchange/rejected-message-dead-lettered", DLX)
def dlx_reject(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx)
    ch.basic_publish("", q, b"bad")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    d = _death(ctx.must_get(ch, dlq))
    eq((d.get("reason"), d.get("queue"), d.get("count")), ("rejected", q, 1), "x-death entry")


@case("x-dead-letter-exchange/nacked-message-dead-lettered", DLX)
def dlx_nack(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx)
    ch.basic_publish("", q, b"bad")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_nack(m.method.delivery_tag, requeue=False)
    eq(_death(ctx.must_get(ch, dlq)).get("reason"), "rejected", "reason")


@case("x-dead-letter-exchange/requeued-reject-not-dead-lettered", DLX)
def dlx_requeue(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx)
    ch.basic_publish("", q, b"again")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=True)
    ctx.get_none(ch, dlq)


@case("x-dead-letter-exchange/expired-message-dead-lettered", DLX)
def dlx_expired(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx, {"x-message-ttl": 30})
    ch.basic_publish("", q, b"late")
    d = _death(ctx.must_get(ch, dlq, timeout=3))
    eq(d.get("reason"), "expired", "reason")


@case("x-dead-letter-exchange/maxlen-drop-head-dead-lettered", DLX)
def dlx_maxlen(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx, {"x-max-length": 1})
    ch.basic_publish("", q, b"first")
    ch.basic_publish("", q, b"second")
    m = ctx.must_get(ch, dlq)
    eq((m.body, _death(m).get("reason")), (b"first", "maxlen"), "dead-lettered head")


@case("x-death/fields-exchange-routing-keys-time", DLX)
def dlx_fields(ctx: Context) -> None:
    ch = ctx.channel()
    dlx = ctx.exchange(ch, "fanout")
    dlq = ctx.bound_queue(ch, dlx)
    src = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, src, "orig.key", queue_args={"x-dead-letter-exchange": dlx})
    ch.basic_publish(src, "orig.key", b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    d = _death(ctx.must_get(ch, dlq))
    eq(d.get("exchange"), src, "x-death exchange")
    eq(list(d.get("routing-keys") or []), ["orig.key"], "x-death routing-keys")
    check(d.get("time") is not None, "x-death time", d)


@case("x-first-death/headers-set-on-first-dead-lettering", DLX)
def first_death(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx)
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    h = ctx.must_get(ch, dlq).headers
    eq((h.get("x-first-death-reason"), h.get("x-first-death-queue"),
        h.get("x-first-death-exchange")), ("rejected", q, ""), "x-first-death-*")


@case("x-dead-letter-routing-key/overrides-routing-key", DLX)
def dlx_rk(ctx: Context) -> None:
    ch = ctx.channel()
    dlx = ctx.exchange(ch, "direct")
    dlq = ctx.bound_queue(ch, dlx, "dead")
    q = ctx.queue(ch, arguments={"x-dead-letter-exchange": dlx,
                                 "x-dead-letter-routing-key": "dead"})
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    eq(ctx.must_get(ch, dlq).method.routing_key, "dead", "routing key")


@case("x-dead-letter-exchange/keeps-original-routing-key", DLX)
def dlx_keep_rk(ctx: Context) -> None:
    ch = ctx.channel()
    dlx = ctx.exchange(ch, "direct")
    q = ctx.queue(ch, arguments={"x-dead-letter-exchange": dlx})
    dlq = ctx.bound_queue(ch, dlx, q)
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    eq(ctx.must_get(ch, dlq).method.routing_key, q, "routing key")


@case("x-dead-letter-exchange/default-exchange-as-dlx", DLX)
def dlx_default(ctx: Context) -> None:
    ch = ctx.channel()
    dlq = ctx.queue(ch)
    q = ctx.queue(ch, arguments={"x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    eq(ctx.must_get(ch, dlq).body, b"x", "body")


@case("x-dead-letter-exchange/missing-dlx-drops-silently", DLX)
def dlx_missing(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-dead-letter-exchange": ctx.name("x")})
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    ctx.sync(ch)
    ctx.get_none(ch, q)


@case("x-death/count-increments-on-repeat", DLX)
def death_count(ctx: Context) -> None:
    """Dead-lettered twice from the same queue for the same reason: one entry, count 2."""
    ch = ctx.channel()
    dlx = ctx.exchange(ch, "fanout")
    work = ctx.queue(ch, arguments={"x-dead-letter-exchange": dlx})
    retry = ctx.bound_queue(ch, dlx)
    ch.basic_publish("", work, b"x")
    for _ in range(2):
        m = ctx.must_get(ch, work, auto_ack=False)
        ch.basic_reject(m.method.delivery_tag, requeue=False)
        back = ctx.must_get(ch, retry)
        ch.basic_publish("", work, back.body, back.properties)
    m = ctx.must_get(ch, work)
    deaths = m.headers.get("x-death") or []
    eq(len(deaths), 1, "x-death entries")
    eq(deaths[0].get("count"), 2, "count")


@case("x-death/original-expiration-recorded-and-expiration-removed", DLX)
def death_expiration(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx)
    ch.basic_publish("", q, b"x", _props(expiration="30"))
    m = ctx.must_get(ch, dlq, timeout=3)
    eq(_death(m).get("original-expiration"), "30", "original-expiration")
    eq(m.properties.expiration, None, "expiration after dead-lettering")


@case("x-death/new-reason-prepended", DLX)
def death_two_reasons(ctx: Context) -> None:
    ch = ctx.channel()
    dlx = ctx.exchange(ch, "fanout")
    q1 = ctx.queue(ch, arguments={"x-dead-letter-exchange": dlx})
    final = ctx.queue(ch)
    # q1 rejects into q2 (through dlx); q2 expires into `final` (through the default exchange)
    q2 = ctx.bound_queue(ch, dlx, queue_args={"x-message-ttl": 30,
                                              "x-dead-letter-exchange": "",
                                              "x-dead-letter-routing-key": final})
    ch.basic_publish("", q1, b"x")
    m = ctx.must_get(ch, q1, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    m = ctx.must_get(ch, final, timeout=3)
    deaths = m.headers.get("x-death") or []
    eq([(d.get("reason"), d.get("queue")) for d in deaths],
       [("expired", q2), ("rejected", q1)], "x-death entries, newest first")


@case("x-dead-letter-exchange/cc-header-keys-in-routing-keys", DLX)
def dlx_cc(ctx: Context) -> None:
    ch = ctx.channel()
    dlx = ctx.exchange(ch, "fanout")
    dlq = ctx.bound_queue(ch, dlx)
    src = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, src, "main", queue_args={"x-dead-letter-exchange": dlx})
    ch.basic_publish(src, "main", b"x", _props(headers={"CC": ["copy"], "BCC": ["hidden"]}))
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    d = _death(ctx.must_get(ch, dlq))
    eq(sorted(d.get("routing-keys") or []), ["copy", "main"], "routing-keys (CC, no BCC)")


# -- length limits -------------------------------------------------------------------


@case("x-max-length/drop-head-keeps-newest", LEN)
def maxlen(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 2})
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    eq(ctx.bodies(ch, q), [b"3", b"4"], "remaining")


@case("x-max-length/zero-keeps-nothing", LEN)
def maxlen_zero(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 0})
    ch.basic_publish("", q, b"x")
    ctx.get_none(ch, q)


@case("x-max-length-bytes/drop-head-by-body-bytes", LEN)
def maxbytes(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length-bytes": 10})
    for b in (b"aaaa", b"bbbb", b"cccc"):
        ch.basic_publish("", q, b)
    eq(ctx.bodies(ch, q), [b"bbbb", b"cccc"], "remaining")


@case("x-overflow/reject-publish-drops-new", LEN)
def reject_publish(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    eq(ctx.bodies(ch, q), [b"0", b"1"], "remaining")


@case("x-overflow/reject-publish-dlx-dead-letters-rejected", LEN)
def reject_publish_dlx(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx, {"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    ch.basic_publish("", q, b"kept")
    ch.basic_publish("", q, b"rejected")
    eq(ctx.bodies(ch, q), [b"kept"], "queue")
    m = ctx.must_get(ch, dlq)
    eq((m.body, _death(m).get("reason")), (b"rejected", "maxlen"), "dead-lettered")


@case("x-overflow/reject-publish-without-dlx-not-dead-lettered", LEN)
def reject_publish_nodlx(ctx: Context) -> None:
    ch, _dlx, dlq, q = _dlx_pair(ctx, {"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"kept")
    ch.basic_publish("", q, b"rejected")
    ctx.get_none(ch, dlq)


@case("x-max-length/unacked-messages-do-not-count", LEN)
def maxlen_unacked(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 1})
    ch.basic_publish("", q, b"a")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_publish("", q, b"b")
    ctx.sync(ch)
    eq(ch.queue_declare(q, passive=True).method.message_count, 1, "ready")
    ch.basic_ack(m.method.delivery_tag)
    eq(ctx.must_get(ch, q).body, b"b", "body")


@case("x-max-length/declare-ok-count-capped", LEN)
def maxlen_count(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 3})
    for _ in range(10):
        ch.basic_publish("", q, b"x")
    ctx.sync(ch)
    eq(ch.queue_declare(q, passive=True).method.message_count, 3, "message_count")


# -- priorities ----------------------------------------------------------------------


@case("x-max-priority/higher-priority-delivered-first", PRI)
def priority(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 10})
    for p in (1, 5, 3, 9, 0):
        ch.basic_publish("", q, b"%d" % p, _props(priority=p))
    eq(ctx.bodies(ch, q), [b"9", b"5", b"3", b"1", b"0"], "order")


@case("x-max-priority/fifo-within-same-priority", PRI)
def priority_fifo(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 5})
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i, _props(priority=2))
    eq(ctx.bodies(ch, q), [b"%d" % i for i in range(5)], "order")


@case("x-max-priority/above-max-treated-as-max", PRI)
def priority_cap(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 3})
    ch.basic_publish("", q, b"max", _props(priority=3))
    ch.basic_publish("", q, b"over", _props(priority=200))
    eq(ctx.bodies(ch, q), [b"max", b"over"], "order (200 counts as 3, FIFO)")


@case("x-max-priority/missing-priority-is-zero", PRI)
def priority_none(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 3})
    ch.basic_publish("", q, b"none")
    ch.basic_publish("", q, b"one", _props(priority=1))
    eq(ctx.bodies(ch, q), [b"one", b"none"], "order")


@case("x-max-priority/non-priority-queue-ignores-priority", PRI)
def priority_ignored(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"low", _props(priority=0))
    ch.basic_publish("", q, b"high", _props(priority=9))
    eq(ctx.bodies(ch, q), [b"low", b"high"], "order")


@case("x-max-priority/requeued-message-returns-to-its-priority", PRI)
def priority_requeue(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 5})
    ch.basic_publish("", q, b"high", _props(priority=5))
    ch.basic_publish("", q, b"low", _props(priority=1))
    m = ctx.must_get(ch, q, auto_ack=False)
    eq(m.body, b"high", "first")
    ch.basic_reject(m.method.delivery_tag, requeue=True)
    eq(ctx.bodies(ch, q), [b"high", b"low"], "order after requeue")


@case("x-max-priority/priority-property-delivered-unchanged", PRI)
def priority_prop(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 2})
    ch.basic_publish("", q, b"x", _props(priority=7))
    eq(ctx.must_get(ch, q).properties.priority, 7, "priority property")
