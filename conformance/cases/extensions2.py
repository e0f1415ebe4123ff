"""RabbitMQ extensions, part 2: alternate exchanges, exchange-to-exchange bindings, CC/BCC,
direct reply-to, consumer priorities, single active consumer, confirms under load,
user-id validation, and the exchange types amqpd offers built in (skipped when absent)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pika
import pika.exceptions as pex
from pamqp import commands as C

from conformance.cases.confirm_tx import _pub, _raw, acks_until
from conformance.framework import CaseFailure, Context, Skip, case, check, eq
from conformance.rawclient import marshal_body, marshal_header

AE, E2E, CC = "ext/alternate-exchange", "ext/e2e-bindings", "ext/cc-bcc"
DRT, CPRI, SAC = "ext/direct-reply-to", "ext/consumer-priority", "ext/single-active-consumer"
LOAD, UID, AMQPD = "ext/confirms-under-load", "ext/user-id", "ext/amqpd-extensions"


def _props(**kw: Any) -> pika.BasicProperties:
    return pika.BasicProperties(**kw)


# -- alternate exchange ----------------------------------------------------------------


def _with_ae(ctx: Context) -> tuple[Any, str, str, str]:
    ch = ctx.channel()
    ae = ctx.exchange(ch, "fanout")
    aq = ctx.bound_queue(ch, ae)
    x = ctx.exchange(ch, "direct", arguments={"alternate-exchange": ae})
    return ch, ae, aq, x


@case("alternate-exchange/unroutable-goes-to-ae", AE)
def ae_basic(ctx: Context) -> None:
    ch, _ae, aq, x = _with_ae(ctx)
    ch.basic_publish(x, "nobody", b"lost?")
    m = ctx.must_get(ch, aq)
    eq((m.body, m.method.routing_key, m.method.exchange), (b"lost?", "nobody", x),
       "AE delivery keeps the original exchange and key")


@case("alternate-exchange/routable-does-not-use-ae", AE)
def ae_routable(ctx: Context) -> None:
    ch, _ae, aq, x = _with_ae(ctx)
    q = ctx.bound_queue(ch, x, "k")
    ch.basic_publish(x, "k", b"ok")
    ctx.must_get(ch, q)
    ctx.get_none(ch, aq)


@case("alternate-exchange/mandatory-not-returned-when-ae-routes", AE)
def ae_mandatory(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    ae = ctx.exchange(ch, "fanout")
    aq = ctx.bound_queue(ch, ae)
    x = ctx.exchange(ch, "direct", arguments={"alternate-exchange": ae})
    returned: list[Any] = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish(x, "nobody", b"m", mandatory=True)
    ctx.must_get(ch, aq)
    conn.process_data_events(time_limit=0.2)
    eq(returned, [], "returns")


@case("alternate-exchange/missing-ae-message-unroutable-returned", AE)
def ae_missing(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    x = ctx.exchange(ch, "direct", arguments={"alternate-exchange": ctx.name("x")})
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _c, m, _p, _b: returned.append(m))
    ch.basic_publish(x, "nobody", b"m", mandatory=True)
    ctx.pump(conn, lambda: bool(returned), 2)
    check(bool(returned) and returned[0].reply_code == 312, "basic.return 312", returned)


@case("alternate-exchange/chained-aes-followed", AE)
def ae_chain(ctx: Context) -> None:
    ch = ctx.channel()
    ae2 = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, ae2)
    ae1 = ctx.exchange(ch, "direct", arguments={"alternate-exchange": ae2})
    x = ctx.exchange(ch, "direct", arguments={"alternate-exchange": ae1})
    ch.basic_publish(x, "nobody", b"chain")
    eq(ctx.must_get(ch, q).body, b"chain", "body")


@case("alternate-exchange/ae-cycle-terminates", AE)
def ae_cycle(ctx: Context) -> None:
    ch = ctx.channel()
    a, b = ctx.name("x"), ctx.name("x")
    ctx.exchange(ch, "direct", name=a, arguments={"alternate-exchange": b})
    ctx.exchange(ch, "direct", name=b, arguments={"alternate-exchange": a})
    ch.basic_publish(a, "nobody", b"loop")
    ctx.sync(ch)
    check(ch.is_open, "channel open after AE cycle", "closed")


@case("alternate-exchange/ae-to-topic-uses-original-key", AE)
def ae_topic(ctx: Context) -> None:
    ch = ctx.channel()
    ae = ctx.exchange(ch, "topic")
    q = ctx.bound_queue(ch, ae, "orders.*")
    x = ctx.exchange(ch, "direct", arguments={"alternate-exchange": ae})
    ch.basic_publish(x, "orders.eu", b"1")
    ch.basic_publish(x, "users.eu", b"2")
    eq(ctx.bodies(ch, q), [b"1"], "AE routed by the original key")


# -- exchange-to-exchange bindings --------------------------------------------------------


@case("exchange.bind/chain-of-three-exchanges", E2E)
def e2e_chain(ctx: Context) -> None:
    ch = ctx.channel()
    a, b, c = (ctx.exchange(ch, "fanout") for _ in range(3))
    q = ctx.bound_queue(ch, c)
    ch.exchange_bind(b, a)
    ch.exchange_bind(c, b)
    ch.basic_publish(a, "", b"3-hops")
    eq(ctx.must_get(ch, q).body, b"3-hops", "body")


@case("exchange.bind/topic-source-filters-by-binding-key", E2E)
def e2e_topic(ctx: Context) -> None:
    ch = ctx.channel()
    src = ctx.exchange(ch, "topic")
    dst = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, dst)
    ch.exchange_bind(dst, src, "eu.#")
    ch.basic_publish(src, "eu.fr.paris", b"in")
    ch.basic_publish(src, "us.ny", b"out")
    eq(ctx.bodies(ch, q), [b"in"], "bodies")


@case("exchange.bind/cycle-delivers-once", E2E)
def e2e_cycle(ctx: Context) -> None:
    ch = ctx.channel()
    a = ctx.exchange(ch, "fanout")
    b = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, b)
    ch.exchange_bind(b, a)
    ch.exchange_bind(a, b)
    ch.basic_publish(a, "", b"cyc")
    eq(ctx.bodies(ch, q), [b"cyc"], "copies")


@case("exchange.bind/diamond-delivers-once-per-queue", E2E)
def e2e_diamond(ctx: Context) -> None:
    ch = ctx.channel()
    top, left, right = (ctx.exchange(ch, "fanout") for _ in range(3))
    q = ctx.queue(ch)
    ch.exchange_bind(left, top)
    ch.exchange_bind(right, top)
    ch.queue_bind(q, left, "")
    ch.queue_bind(q, right, "")
    ch.basic_publish(top, "", b"d")
    eq(ctx.bodies(ch, q), [b"d"], "copies")


@case("exchange.bind/routing-key-preserved-through-hops", E2E)
def e2e_key(ctx: Context) -> None:
    ch = ctx.channel()
    src = ctx.exchange(ch, "fanout")
    dst = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, dst, "final.key")
    ch.exchange_bind(dst, src)
    ch.basic_publish(src, "final.key", b"k")
    m = ctx.must_get(ch, q)
    eq((m.method.routing_key, m.method.exchange), ("final.key", src), "deliver fields")


@case("exchange.delete/destination-delete-removes-e2e-binding", E2E)
def e2e_delete_dest(ctx: Context) -> None:
    ch = ctx.channel()
    src = ctx.exchange(ch, "fanout")
    dst = ctx.exchange(ch, "fanout")
    ch.exchange_bind(dst, src)
    ch.exchange_delete(dst)
    ch.exchange_delete(src, if_unused=True)


@case("exchange.bind/auto-delete-source-removed-after-e2e-unbind", E2E)
def e2e_auto_delete(ctx: Context) -> None:
    ch = ctx.channel()
    src = ctx.exchange(ch, "fanout", auto_delete=True)
    dst = ctx.exchange(ch, "fanout")
    ch.exchange_bind(dst, src)
    ch.exchange_unbind(dst, src)
    time.sleep(0.2)
    ctx.channel_error(ch, lambda: ch.exchange_declare(src, passive=True), 404)


@case("exchange.bind/headers-source-binding-arguments", E2E)
def e2e_headers(ctx: Context) -> None:
    ch = ctx.channel()
    src = ctx.exchange(ch, "headers")
    dst = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, dst)
    ch.exchange_bind(dst, src, "", arguments={"x-match": "all", "t": "yes"})
    ch.basic_publish(src, "", b"y", _props(headers={"t": "yes"}))
    ch.basic_publish(src, "", b"n", _props(headers={"t": "no"}))
    eq(ctx.bodies(ch, q), [b"y"], "bodies")


# -- CC / BCC --------------------------------------------------------------------------------


@case("CC/routes-to-extra-keys-and-header-kept", CC)
def cc(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q1 = ctx.bound_queue(ch, x, "main")
    q2 = ctx.bound_queue(ch, x, "copy")
    ch.basic_publish(x, "main", b"c", _props(headers={"CC": ["copy"]}))
    ctx.must_get(ch, q1)
    m = ctx.must_get(ch, q2)
    eq(list(m.headers.get("CC") or []), ["copy"], "CC header")


@case("BCC/routes-to-extra-keys-and-header-removed", CC)
def bcc(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ctx.bound_queue(ch, x, "main")
    q2 = ctx.bound_queue(ch, x, "secret")
    ch.basic_publish(x, "main", b"b", _props(headers={"BCC": ["secret"]}))
    m = ctx.must_get(ch, q2)
    check("BCC" not in m.headers, "no BCC header at the consumer", m.headers)


@case("CC/same-queue-via-key-and-cc-gets-one-copy", CC)
def cc_dedup(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "a")
    ch.queue_bind(q, x, "b")
    ch.basic_publish(x, "a", b"1", _props(headers={"CC": ["b"]}))
    eq(ctx.bodies(ch, q), [b"1"], "copies")


@case("CC/topic-exchange-matches-cc-keys", CC)
def cc_topic(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    q = ctx.bound_queue(ch, x, "audit.#")
    ch.basic_publish(x, "orders.new", b"t", _props(headers={"CC": ["audit.orders"]}))
    eq(ctx.must_get(ch, q).body, b"t", "body")


@case("CC/default-exchange-cc-to-queue-names", CC)
def cc_default(ctx: Context) -> None:
    ch = ctx.channel()
    q1 = ctx.queue(ch)
    q2 = ctx.queue(ch)
    ch.basic_publish("", q1, b"d", _props(headers={"CC": [q2]}))
    ctx.must_get(ch, q1)
    ctx.must_get(ch, q2)


@case("CC/non-array-cc-406-PRECONDITION_FAILED", CC)
def cc_string(ctx: Context) -> None:
    """CC must be an array of longstr; RabbitMQ closes the channel with 406
    "invalid message: {unacceptable_type_in_header,\"CC\",longstr}"."""
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ctx.bound_queue(ch, x, "main")
    ctx.channel_error(ch, lambda: ch.basic_publish(x, "main", b"s",
                                                   _props(headers={"CC": "copy"})), 406)


@case("BCC/with-cc-both-route", CC)
def cc_and_bcc(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q1 = ctx.bound_queue(ch, x, "c")
    q2 = ctx.bound_queue(ch, x, "b")
    ch.basic_publish(x, "none", b"cb", _props(headers={"CC": ["c"], "BCC": ["b"]}))
    ctx.must_get(ch, q1)
    ctx.must_get(ch, q2)


# -- direct reply-to ---------------------------------------------------------------------------

RT = "amq.rabbitmq.reply-to"


@case("direct-reply-to/request-reply-round-trip", DRT)
def drt_round_trip(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    server_q = ctx.queue(ch)
    replies: list[bytes] = []
    ch.basic_consume(RT, lambda _c, _m, _p, b: replies.append(b), auto_ack=True)
    ch.basic_publish("", server_q, b"ping", _props(reply_to=RT))
    req = ctx.must_get(ctx.channel(), server_q)
    reply_to = req.properties.reply_to
    check(reply_to.startswith(RT + "."), f"reply_to rewritten to {RT}.<id>", reply_to)
    ctx.channel().basic_publish("", reply_to, b"pong")
    ctx.pump(conn, lambda: bool(replies), 3)
    eq(replies, [b"pong"], "replies")


@case("direct-reply-to/consume-without-no-ack-406-PRECONDITION_FAILED", DRT)
def drt_ack_mode(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_consume(RT, lambda *a: None, auto_ack=False), 406)


@case("direct-reply-to/publish-without-consumer-406-PRECONDITION_FAILED", DRT)
def drt_no_consumer(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_publish("", q, b"x", _props(reply_to=RT)), 406)


@case("direct-reply-to/passive-declare-of-pseudo-queue-ok", DRT)
def drt_passive(ctx: Context) -> None:
    ch = ctx.channel()
    ch.queue_declare(RT, passive=True)


@case("direct-reply-to/reply-to-stale-id-dropped", DRT)
def drt_stale(ctx: Context) -> None:
    """A reply to a reply-to name whose consumer is gone is silently dropped."""
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    tag = ch.basic_consume(RT, lambda *a: None, auto_ack=True)
    ch.basic_publish("", q, b"req", _props(reply_to=RT))
    reply_to = ctx.must_get(ch, q).properties.reply_to
    ch.basic_cancel(tag)
    other = ctx.channel()
    other.basic_publish("", reply_to, b"late")
    ctx.sync(other)
    check(other.is_open, "channel open", "closed")


# -- consumer priorities -------------------------------------------------------------------------


@case("x-priority/higher-priority-consumer-gets-messages", CPRI)
def cpri(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    got: list[str] = []
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                     consumer_tag="low", arguments={"x-priority": 1})
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                     consumer_tag="high", arguments={"x-priority": 10})
    for _ in range(6):
        ch.basic_publish("", q, b"p")
    ctx.pump(conn, lambda: len(got) >= 6, 3)
    eq(Counter(got), Counter({"high": 6}), "deliveries per consumer")


@case("x-priority/blocked-high-priority-lets-lower-consume", CPRI)
def cpri_blocked(ctx: Context) -> None:
    conn = ctx.connect()
    hi = conn.channel()
    lo = conn.channel()
    q = ctx.queue(hi)
    hi.basic_qos(prefetch_count=1)
    got: list[str] = []
    hi.basic_consume(q, lambda _c, m, _p, _b: got.append("high"),
                     arguments={"x-priority": 10})
    lo.basic_consume(q, lambda _c, m, _p, _b: got.append("low"), auto_ack=True,
                     arguments={"x-priority": 1})
    for _ in range(4):
        hi.basic_publish("", q, b"p")
    ctx.pump(conn, lambda: len(got) >= 4, 3)
    eq(Counter(got), Counter({"high": 1, "low": 3}), "deliveries")


@case("x-priority/equal-priorities-round-robin", CPRI)
def cpri_equal(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    got: list[str] = []
    for tag in ("a", "b"):
        ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                         consumer_tag=tag, arguments={"x-priority": 5})
    for _ in range(6):
        ch.basic_publish("", q, b"p")
    ctx.pump(conn, lambda: len(got) >= 6, 3)
    eq(Counter(got), Counter({"a": 3, "b": 3}), "deliveries")


@case("x-priority/negative-priority-below-default", CPRI)
def cpri_negative(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    got: list[str] = []
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                     consumer_tag="neg", arguments={"x-priority": -5})
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                     consumer_tag="default")
    for _ in range(4):
        ch.basic_publish("", q, b"p")
    ctx.pump(conn, lambda: len(got) >= 4, 3)
    eq(Counter(got), Counter({"default": 4}), "deliveries")


# -- single active consumer ------------------------------------------------------------------


@case("x-single-active-consumer/only-first-consumer-receives", SAC)
def sac(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch, arguments={"x-single-active-consumer": True})
    got: list[str] = []
    for tag in ("first", "second"):
        ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                         consumer_tag=tag)
    for _ in range(5):
        ch.basic_publish("", q, b"s")
    ctx.pump(conn, lambda: len(got) >= 5, 3)
    eq(Counter(got), Counter({"first": 5}), "deliveries")


@case("x-single-active-consumer/next-consumer-takes-over-on-cancel", SAC)
def sac_failover(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch, arguments={"x-single-active-consumer": True})
    got: list[str] = []
    for tag in ("first", "second"):
        ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), auto_ack=True,
                         consumer_tag=tag)
    ch.basic_cancel("first")
    for _ in range(3):
        ch.basic_publish("", q, b"s")
    ctx.pump(conn, lambda: len(got) >= 3, 3)
    eq(Counter(got), Counter({"second": 3}), "deliveries")


@case("x-single-active-consumer/unacked-requeued-to-next-consumer", SAC)
def sac_requeue(ctx: Context) -> None:
    c1 = ctx.connect()
    ch1 = c1.channel()
    q = ctx.queue(ch1, arguments={"x-single-active-consumer": True})
    ch1.basic_publish("", q, b"job")
    _, got1 = ctx.consume(ch1, q, 1)
    eq(len(got1), 1, "first consumer got the job")
    c2 = ctx.connect()
    ch2 = c2.channel()
    _, got2 = ctx.consume(ch2, q, 1, timeout=0.3)
    eq(got2, [], "second consumer idle while first is active")
    c1.close()
    ctx.pump(c2, lambda: bool(got2), 3)
    check(bool(got2) and got2[0].method.redelivered, "redelivered to the second consumer",
          [(m.body, m.method.redelivered) for m in got2])


@case("x-single-active-consumer/redeclare-without-argument-406", SAC)
def sac_mismatch(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-single-active-consumer": True})
    ctx.channel_error(ch, lambda: ch.queue_declare(q), 406)


# -- confirms under load -------------------------------------------------------------------


@case("confirms-under-load/2000-publishes-all-acked-in-order", LOAD, slow=True)
def load_acks(ctx: Context) -> None:
    q = ctx.queue()
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    n = 2000
    for i in range(n):
        _pub(rc, q, b"%d" % i)
    acks = acks_until(rc, n, timeout=30)
    check(all(k == "Ack" for k, _, _ in acks), "only acks", [a for a in acks if a[0] != "Ack"])
    tags = [t for _, t, _ in acks]
    eq(tags, sorted(tags), "confirm tags ascending")
    ch = ctx.channel()
    eq(ch.queue_declare(q, passive=True).method.message_count, n, "queued")


@case("confirms-under-load/persistent-fanout-to-4-durable-queues", LOAD, slow=True)
def load_fanout(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    qs = [ctx.bound_queue(ch, x) for _ in range(4)]
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    n = 500
    for _ in range(n):
        _pub(rc, "", b"p" * 100, exchange=x, props=C.Basic.Properties(delivery_mode=2))
    acks = acks_until(rc, n, timeout=30)
    check(all(k == "Ack" for k, _, _ in acks), "only acks", acks[-3:])
    for q in qs:
        eq(ch.queue_declare(q, passive=True).method.message_count, n, f"messages in {q}")


@case("confirms-under-load/pika-confirmed-publish-with-consumer-running", LOAD, slow=True)
def load_consumer(ctx: Context) -> None:
    pub = ctx.channel()
    q = ctx.queue(pub)
    pub.confirm_delivery()
    cconn = ctx.connect()
    cch = cconn.channel()
    got: list[bytes] = []
    cch.basic_consume(q, lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    for i in range(300):
        pub.basic_publish("", q, b"%d" % i)
    ctx.pump(cconn, lambda: len(got) >= 300, 10)
    eq([int(b) for b in got], list(range(300)), "consumed in order")


@case("confirms-under-load/multiple-channels-independent-tag-sequences", LOAD)
def load_channels(ctx: Context) -> None:
    q = ctx.queue()
    rc = _raw(ctx)
    rc.open_channel(2)
    for n in (1, 2):
        rc.rpc(C.Confirm.Select(), n, (C.Confirm.SelectOk,))
    for _ in range(5):
        for n in (1, 2):
            rc.send_method(C.Basic.Publish(exchange="", routing_key=q), n)
            rc.send(marshal_header(n, 1) + marshal_body(n, b"x"))
    top = {1: 0, 2: 0}
    deadline = time.monotonic() + 5
    while min(top.values()) < 5 and time.monotonic() < deadline:
        f = rc.read_frame()
        if isinstance(f.value, C.Basic.Ack):
            top[f.channel] = max(top[f.channel], f.value.delivery_tag)
    eq(top, {1: 5, 2: 5}, "highest confirmed tag per channel")


# -- user-id ----------------------------------------------------------------------------------


@case("user-id/absent-user-id-accepted", UID)
def uid_absent(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    eq(ctx.must_get(ch, q).properties.user_id, None, "user_id")


@case("user-id/mismatch-in-confirm-mode-closes-channel-406", UID)
def uid_confirm(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.confirm_delivery()
    ctx.channel_error(ch, lambda: ch.basic_publish(
        "", q, b"x", _props(user_id="impostor")), 406)


@case("user-id/mismatch-message-not-enqueued", UID)
def uid_not_enqueued(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    bad = ctx.channel()
    try:
        bad.basic_publish("", q, b"x", _props(user_id="impostor"))
        ctx.sync(bad)
    except pex.ChannelClosedByBroker:
        pass
    ctx.get_none(ch, q)


# -- amqpd built-in exchange types (RabbitMQ plugins) ------------------------------------------


def _declare_or_skip(ctx: Context, xtype: str, arguments: dict[str, Any] | None = None,
                     durable: bool = False) -> str:
    conn = ctx.connect()
    ch = conn.channel()
    name = ctx.name("x")
    try:
        ch.exchange_declare(name, exchange_type=xtype, arguments=arguments, durable=durable)
    except pex.ConnectionClosedByBroker as exc:
        if exc.reply_code in (503, 540):
            raise Skip(f"exchange type {xtype} not supported ({exc.reply_code})")
        raise
    except pex.ChannelClosedByBroker as exc:
        if exc.reply_code in (503, 540, 404):
            raise Skip(f"exchange type {xtype} not supported ({exc.reply_code})")
        raise
    ctx.track_exchange(name)
    return name


@case("x-delayed-message/delivers-after-x-delay", AMQPD)
def delayed(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-delayed-message", {"x-delayed-type": "direct"})
    ch = ctx.channel()
    q = ctx.bound_queue(ch, x, "k")
    t0 = time.monotonic()
    ch.basic_publish(x, "k", b"later", _props(headers={"x-delay": 300}))
    ctx.get_none(ch, q, settle=0.1)
    m = ctx.must_get(ch, q, timeout=3)
    eq(m.body, b"later", "body")
    check(time.monotonic() - t0 >= 0.25, "delivered after the delay", time.monotonic() - t0)


@case("x-delayed-message/no-delay-header-delivers-now", AMQPD)
def delayed_none(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-delayed-message", {"x-delayed-type": "direct"})
    ch = ctx.channel()
    q = ctx.bound_queue(ch, x, "k")
    ch.basic_publish(x, "k", b"now")
    eq(ctx.must_get(ch, q, timeout=1).body, b"now", "body")


@case("x-delayed-message/routes-by-x-delayed-type", AMQPD)
def delayed_type(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-delayed-message", {"x-delayed-type": "topic"})
    ch = ctx.channel()
    q = ctx.bound_queue(ch, x, "a.*")
    ch.basic_publish(x, "a.b", b"in", _props(headers={"x-delay": 50}))
    ch.basic_publish(x, "z.b", b"out", _props(headers={"x-delay": 50}))
    time.sleep(0.3)
    eq(ctx.bodies(ch, q), [b"in"], "bodies")


@case("x-delayed-message/missing-x-delayed-type-refused", AMQPD)
def delayed_no_type(ctx: Context) -> None:
    _declare_or_skip(ctx, "x-delayed-message", {"x-delayed-type": "direct"})
    conn = ctx.connect()
    ch = conn.channel()
    name = ctx.name("x")
    ctx.track_exchange(name)
    try:
        ch.exchange_declare(name, exchange_type="x-delayed-message")
    except (pex.ChannelClosedByBroker, pex.ConnectionClosedByBroker) as exc:
        check(exc.reply_code in (406, 503), "406 or 503", exc.reply_code)
        return
    raise CaseFailure("refusal without x-delayed-type", "declare-ok")


@case("x-consistent-hash/same-key-same-queue", AMQPD)
def chash_stable(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-consistent-hash")
    ch = ctx.channel()
    qs = [ctx.bound_queue(ch, x, "1") for _ in range(3)]
    for _ in range(10):
        ch.basic_publish(x, "customer-42", b"c")
    counts = [len(ctx.drain(ch, q)) for q in qs]
    eq(sorted(counts), [0, 0, 10], "all copies in one queue")


@case("x-consistent-hash/spreads-keys-over-queues", AMQPD)
def chash_spread(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-consistent-hash")
    ch = ctx.channel()
    qs = [ctx.bound_queue(ch, x, "1") for _ in range(2)]
    for i in range(400):
        ch.basic_publish(x, f"key-{i}", b"s")
    counts = [len(ctx.drain(ch, q)) for q in qs]
    eq(sum(counts), 400, "every message routed exactly once")
    check(min(counts) >= 100, "both queues get a fair share", counts)


@case("x-consistent-hash/weights-skew-distribution", AMQPD)
def chash_weight(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-consistent-hash")
    ch = ctx.channel()
    light = ctx.bound_queue(ch, x, "1")
    heavy = ctx.bound_queue(ch, x, "10")
    for i in range(600):
        ch.basic_publish(x, f"k{i}", b"w")
    nl, nh = len(ctx.drain(ch, light)), len(ctx.drain(ch, heavy))
    check(nh > 3 * nl, "heavy (weight 10) gets far more than light (weight 1)", (nl, nh))


@case("x-consistent-hash/hash-header-argument", AMQPD)
def chash_header(ctx: Context) -> None:
    x = _declare_or_skip(ctx, "x-consistent-hash", {"hash-header": "tenant"})
    ch = ctx.channel()
    qs = [ctx.bound_queue(ch, x, "1") for _ in range(3)]
    for i in range(12):
        ch.basic_publish(x, f"rk{i}", b"h", _props(headers={"tenant": "acme"}))
    counts = [len(ctx.drain(ch, q)) for q in qs]
    eq(sorted(counts), [0, 0, 12], "hashing by header: one queue")
