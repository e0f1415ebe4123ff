"""RabbitMQ extensions, part 2: alternate exchanges, exchange-to-exchange bindings, CC/BCC."""

from __future__ import annotations

import time
from typing import Any

import pika

from conformance.framework import Context, case, check, eq

AE, E2E, CC = "ext/alternate-exchange", "ext/e2e-bindings", "ext/cc-bcc"


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
