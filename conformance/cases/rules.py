"""Further rules across classes: the "last declared queue" shorthand, negotiation corner
cases, consumer/prefetch interplay, dead-letter cycles and property preservation."""

from __future__ import annotations

import time
from typing import Any

import pika
from pamqp import commands as C

from conformance.framework import CaseFailure, Context, case, check, eq
from conformance.rawclient import RawClient, RawClosed, RawConnectionClosed

Q, B, CN, F, CF = "queue", "basic", "connection", "errors/frames", "confirm"
DLX, TTL, DRT, SAC = "ext/dlx", "ext/ttl", "ext/direct-reply-to", "ext/single-active-consumer"


def _raw(ctx: Context) -> RawClient:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    return rc


def _declare_server_named(ctx: Context, rc: RawClient) -> str:
    r = rc.rpc(C.Queue.Declare(queue="", exclusive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Queue.DeclareOk), "queue.declare-ok", r)
    return str(r.queue)


# -- the empty queue name means "the last queue declared on this channel" -------------------


@case("queue.bind/empty-queue-name-means-last-declared-queue", Q)
def bind_last_declared(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    x = ctx.exchange(ctx.channel(), "direct")
    r = rc.rpc(C.Queue.Bind(queue="", exchange=x, routing_key="k"), 1, (C.Queue.BindOk,))
    check(isinstance(r, C.Queue.BindOk), "queue.bind-ok", r)
    rc.publish(1, x, "k", b"to-last")
    r = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(r, C.Basic.GetOk), "the message in the last declared queue", r)


@case("queue.bind/empty-queue-name-without-declared-queue-404-NOT_FOUND", Q)
def bind_no_last(ctx: Context) -> None:
    rc = _raw(ctx)
    r = rc.rpc(C.Queue.Bind(queue="", exchange="amq.direct", routing_key="k"), 1,
               (C.Queue.BindOk,))
    check(isinstance(r, C.Channel.Close), "channel.close 404", r)
    eq(r.reply_code, 404, "reply code")


@case("queue.purge/empty-queue-name-means-last-declared-queue", Q)
def purge_last(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    rc.publish(1, "", q, b"1")
    rc.publish(1, "", q, b"2")
    time.sleep(0.05)
    r = rc.rpc(C.Queue.Purge(queue=""), 1, (C.Queue.PurgeOk,))
    check(isinstance(r, C.Queue.PurgeOk), "queue.purge-ok", r)
    eq(r.message_count, 2, "purged")


@case("basic.get/empty-queue-name-means-last-declared-queue", B)
def get_last(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    rc.publish(1, "", q, b"g")
    time.sleep(0.05)
    r = rc.rpc(C.Basic.Get(queue="", no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(r, C.Basic.GetOk), "basic.get-ok", r)


@case("basic.consume/empty-queue-name-means-last-declared-queue", B)
def consume_last(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    r = rc.rpc(C.Basic.Consume(queue="", consumer_tag="c", no_ack=True), 1,
               (C.Basic.ConsumeOk,))
    check(isinstance(r, C.Basic.ConsumeOk), "basic.consume-ok", r)
    rc.publish(1, "", q, b"c")
    f = rc.read_until((C.Basic.Deliver,))
    eq(f.value.routing_key, q, "delivered from the last declared queue")


@case("queue.delete/empty-queue-name-means-last-declared-queue", Q)
def delete_last(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    r = rc.rpc(C.Queue.Delete(queue=""), 1, (C.Queue.DeleteOk,))
    check(isinstance(r, C.Queue.DeleteOk), "queue.delete-ok", r)
    r = rc.rpc(C.Queue.Declare(queue=q, passive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Channel.Close) and r.reply_code == 404, "404 for the deleted queue",
          r)


# -- negotiation --------------------------------------------------------------------------


def _refused(ctx: Context, **kw: Any) -> None:
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(**kw)
        rc.open_channel(1)
    except (RawClosed, RawConnectionClosed):
        return
    raise CaseFailure("the connection refused", f"channel opened with {kw}")


@case("connection.tune-ok/frame-max-zero-refused-when-server-has-a-limit", CN, slow=True)
def frame_max_zero(ctx: Context) -> None:
    """0 means "no limit", which exceeds the broker's 131072: RabbitMQ refuses."""
    _refused(ctx, frame_max=0)


@case("connection.tune-ok/channel-max-zero-refused-when-server-has-a-limit", CN, slow=True)
def channel_max_zero(ctx: Context) -> None:
    _refused(ctx, channel_max=0)


@case("connection.tune-ok/smaller-channel-max-accepted", CN)
def channel_max_small(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(channel_max=10)
    rc.open_channel(10)


@case("connection.tune-ok/heartbeat-larger-than-proposed-accepted", CN)
def heartbeat_larger(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(heartbeat=600)
    rc.open_channel(1)


# -- frames -------------------------------------------------------------------------------


@case("frame/empty-body-frame-accepted", F)
def empty_body_frame(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    from conformance.rawclient import marshal_body, marshal_header, marshal_method, raw_frame

    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1)
            + marshal_header(1, 3) + raw_frame(3, 1, b"") + marshal_body(1, b"abc"))
    r = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(r, C.Basic.GetOk), "basic.get-ok", r)
    rc.read_frame()
    eq(rc.read_frame().payload, b"abc", "body")


@case("frame/body-in-one-byte-frames", F)
def tiny_frames(ctx: Context) -> None:
    rc = _raw(ctx)
    q = _declare_server_named(ctx, rc)
    from conformance.rawclient import marshal_body, marshal_header, marshal_method

    body = b"0123456789abcdef"
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1)
            + marshal_header(1, len(body)) + b"".join(marshal_body(1, body[i:i + 1])
                                                      for i in range(len(body))))
    r = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(r, C.Basic.GetOk), "basic.get-ok", r)
    rc.read_frame()
    got = b""
    while len(got) < len(body):
        got += rc.read_frame().payload
    eq(got, body, "body")


@case("exchange.declare/passive-on-default-exchange-403-ACCESS_REFUSED", "exchange")
def passive_default(ctx: Context) -> None:
    """Even a passive declare of "" is refused by RabbitMQ 3.10."""
    rc = _raw(ctx)
    r = rc.rpc(C.Exchange.Declare(exchange="", passive=True), 1, (C.Exchange.DeclareOk,))
    check(isinstance(r, C.Channel.Close), "channel.close 403", r)
    eq(r.reply_code, 403, "reply code")


@case("basic.publish/amq-default-name-is-not-an-alias-404-NOT_FOUND", B)
def amq_default(ctx: Context) -> None:
    """"amq.default" names the default exchange only in the management API; over AMQP it
    is an ordinary (missing) exchange name."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_publish("amq.default", q, b"x"), 404)


@case("queue.declare/x-queue-type-unknown-406-PRECONDITION_FAILED", Q)
def queue_type_bad(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.name()
    ctx.track_queue(q)
    ctx.channel_error(ch, lambda: ch.queue_declare(q, arguments={"x-queue-type": "bogus"}),
                      406, "x-queue-type")


@case("queue.declare/x-queue-type-classic-accepted", Q)
def queue_type_classic(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.queue(ch, arguments={"x-queue-type": "classic"})


@case("queue.declare/durable-exclusive-accepted", Q)
def durable_exclusive(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.queue(ch, durable=True, exclusive=True)


@case("queue.bind/same-key-different-arguments-are-distinct-bindings", Q)
def bind_args_identity(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "k", arguments={"tag": "a"})
    ch.queue_bind(q, x, "k", arguments={"tag": "b"})
    ch.queue_unbind(q, x, "k", arguments={"tag": "a"})
    ch.basic_publish(x, "k", b"still-bound")
    eq(ctx.bodies(ch, q), [b"still-bound"], "bodies (binding 'b' remains)")


# -- consumers and prefetch -----------------------------------------------------------------


@case("basic.qos/per-consumer-prefetch-applies-to-consumers-started-after-it", B)
def qos_new_consumers(ctx: Context) -> None:
    """RabbitMQ: basic.qos global=false sets the limit for consumers created afterwards;
    an existing consumer keeps the limit it started with."""
    conn = ctx.connect()
    ch = conn.channel()
    q1 = ctx.queue(ch)
    q2 = ctx.queue(ch)
    ch.basic_qos(prefetch_count=1)
    for _ in range(4):
        ch.basic_publish("", q1, b"1")
        ch.basic_publish("", q2, b"2")
    _, old = ctx.consume(ch, q1, 1)
    ch.basic_qos(prefetch_count=3)
    _, new = ctx.consume(ch, q2, 3)
    ctx.settle_count(conn, new, 3)
    eq((len(old), len(new)), (1, 3), "unacked deliveries (old consumer, new consumer)")


@case("basic.qos/channel-limit-set-after-consumer-limit-caps-both", B)
def qos_both(ctx: Context) -> None:
    """qos(2, global=false) then qos(5, global=true): each consumer gets at most 2 and the
    channel at most 5. (In RabbitMQ 3.10 the reverse order loses the channel limit.)"""
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_qos(prefetch_count=2, global_qos=False)
    ch.basic_qos(prefetch_count=5, global_qos=True)
    for _ in range(10):
        ch.basic_publish("", q, b"x")
    got: list[str] = []
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), consumer_tag="a")
    eq(ctx.settle_count(conn, got, 2), 2, "per-consumer limit 2")
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), consumer_tag="b")
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), consumer_tag="c")
    eq(ctx.settle_count(conn, got, 5), 5, "channel-wide limit 5")


@case("basic.ack/multiple-covers-deliveries-of-all-consumers-on-channel", B)
def ack_multi_consumers(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q1 = ctx.queue(ch)
    q2 = ctx.queue(ch)
    ch.basic_publish("", q1, b"1")
    ch.basic_publish("", q2, b"2")
    got: list[Any] = []
    ch.basic_consume(q1, lambda _c, m, _p, _b: got.append(m))
    ch.basic_consume(q2, lambda _c, m, _p, _b: got.append(m))
    ctx.pump(conn, lambda: len(got) >= 2, 2)
    ch.basic_ack(max(m.delivery_tag for m in got), multiple=True)
    ch.close()
    other = ctx.channel()
    eq((other.queue_declare(q1, passive=True).method.message_count,
        other.queue_declare(q2, passive=True).method.message_count), (0, 0),
       "messages left after acking all")


@case("basic.nack/multiple-requeue-keeps-original-order", B)
def nack_order(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    ms = [ctx.must_get(ch, q, auto_ack=False) for _ in range(5)]
    ch.basic_nack(ms[-1].method.delivery_tag, multiple=True, requeue=True)
    eq(ctx.bodies(ch, q), [b"%d" % i for i in range(5)], "order after requeue")


@case("basic.get/takes-messages-while-queue-has-idle-consumer", B)
def get_with_consumer(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_qos(prefetch_count=1)
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    _, held = ctx.consume(ch, q, 1)
    eq([m.body for m in held], [b"1"], "consumer holds the first message")
    other = ctx.channel()
    eq(ctx.must_get(other, q).body, b"2", "basic.get body while consumer is saturated")


@case("basic.consume/exclusive-consumer-cancel-frees-queue", B)
def exclusive_cancel(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tag = ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch.basic_cancel(tag)
    ctx.channel().basic_consume(q, lambda *a: None)


@case("basic.recover/redelivers-to-active-consumer", B)
def recover_consumer(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"r")
    _, got = ctx.consume(ch, q, 1)
    ch.basic_recover(requeue=True)
    ctx.pump(conn, lambda: len(got) >= 2, 2)
    check(len(got) >= 2 and got[1].method.redelivered, "a redelivery to the consumer",
          [(m.body, m.method.redelivered) for m in got])


# -- dead-letter cycles, property preservation ------------------------------------------------


@case("x-dead-letter-exchange/expiry-cycle-to-same-queue-dropped", DLX)
def dlx_cycle(ctx: Context) -> None:
    """A message expiring back into the queue it expired from, with no rejection in the
    cycle, is dropped rather than circulating forever."""
    ch = ctx.channel()
    q = ctx.name()
    ctx.queue(ch, name=q, arguments={"x-message-ttl": 30, "x-dead-letter-exchange": "",
                                     "x-dead-letter-routing-key": q})
    ch.basic_publish("", q, b"loop")
    time.sleep(0.4)
    ctx.get_none(ch, q, settle=0)


@case("x-dead-letter-exchange/properties-and-body-preserved", DLX)
def dlx_props(ctx: Context) -> None:
    ch = ctx.channel()
    dlq = ctx.queue(ch)
    q = ctx.queue(ch, arguments={"x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": dlq})
    props = pika.BasicProperties(message_id="m-1", correlation_id="c-1", content_type="t/x",
                                 headers={"app": "h"}, delivery_mode=2, priority=4)
    ch.basic_publish("", q, b"payload", props)
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    d = ctx.must_get(ch, dlq)
    eq((d.body, d.properties.message_id, d.properties.correlation_id,
        d.properties.content_type, d.headers.get("app"), d.properties.delivery_mode,
        d.properties.priority), (b"payload", "m-1", "c-1", "t/x", "h", 2, 4),
       "body and properties")


@case("x-dead-letter-exchange/maxlen-zero-with-dlx-dead-letters-every-publish", DLX)
def dlx_maxlen_zero(ctx: Context) -> None:
    ch = ctx.channel()
    dlq = ctx.queue(ch)
    q = ctx.queue(ch, arguments={"x-max-length": 0, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    eq(ctx.bodies(ch, dlq), [b"a", b"b"], "dead-lettered")


@case("basic.ack/confirm-for-message-dropped-by-ttl-zero", CF)
def confirm_ttl0(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-message-ttl": 0})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"gone")  # raises NackError if nacked
    ctx.get_none(ch, q, settle=0.05)


@case("expiration/ttl-applies-in-dead-letter-queue", TTL)
def ttl_in_dlq(ctx: Context) -> None:
    ch = ctx.channel()
    dlq = ctx.queue(ch, arguments={"x-message-ttl": 50})
    q = ctx.queue(ch, arguments={"x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    time.sleep(0.3)
    ctx.get_none(ch, dlq, settle=0)


@case("direct-reply-to/consumer-must-be-on-publishing-channel-406", DRT)
def drt_other_channel(ctx: Context) -> None:
    conn = ctx.connect()
    consumer = conn.channel()
    publisher = conn.channel()
    q = ctx.queue(publisher)
    consumer.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    ctx.channel_error(publisher, lambda: publisher.basic_publish(
        "", q, b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")), 406)


@case("x-single-active-consumer/declare-ok-counts-all-consumers", SAC)
def sac_count(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-single-active-consumer": True})
    ch.basic_consume(q, lambda *a: None)
    ch.basic_consume(q, lambda *a: None)
    eq(ch.queue_declare(q, passive=True).method.consumer_count, 2, "consumer_count")


# -- more rules: exclusivity mismatch, auto-delete, headers typing, tx on close, names ----


@case("queue.declare/exclusive-redeclare-of-shared-queue-405-RESOURCE_LOCKED", Q)
def exclusive_mismatch(ctx: Context) -> None:
    """Declaring an existing non-exclusive queue as exclusive is refused."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch2 = ctx.connect().channel()
    ctx.channel_error(ch2, lambda: ch2.queue_declare(q, exclusive=True), 405)


@case("queue.declare/auto-delete-queue-deleted-when-consuming-channel-closes", Q)
def auto_delete_channel_close(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch, auto_delete=True)
    ch.basic_consume(q, lambda *a: None)
    ch.close()
    other = ctx.channel()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            other.queue_declare(q, passive=True)
        except Exception:
            return
        time.sleep(0.05)
    raise CaseFailure("auto-delete queue gone with its last consumer's channel", "exists")


@case("exchange.headers/value-types-must-match", "routing")
def headers_types(ctx: Context) -> None:
    """A binding value 5 (integer) does not match a header "5" (string)."""
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.bound_queue(ch, x, "", arguments={"x-match": "all", "n": 5})
    ch.basic_publish(x, "", b"str", pika.BasicProperties(headers={"n": "5"}))
    ch.basic_publish(x, "", b"int", pika.BasicProperties(headers={"n": 5}))
    eq(ctx.bodies(ch, q), [b"int"], "bodies")


@case("exchange.headers/all-does-not-match-message-without-headers", "routing")
def headers_none(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.bound_queue(ch, x, "", arguments={"x-match": "all", "a": "1"})
    ch.basic_publish(x, "", b"bare")
    ctx.get_none(ch, q)


@case("basic.publish/mandatory-to-fanout-without-bindings-returned", B)
def mandatory_fanout(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    x = ctx.exchange(ch, "fanout")
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _c, m, _p, _b: returned.append(m))
    ch.basic_publish(x, "", b"m", mandatory=True)
    ctx.pump(conn, lambda: bool(returned), 3)
    check(bool(returned) and returned[0].reply_code == 312, "basic.return 312", returned)


@case("basic.publish/mandatory-routed-through-e2e-binding-not-returned", B)
def mandatory_e2e(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    src = ctx.exchange(ch, "fanout")
    dst = ctx.exchange(ch, "fanout")
    q = ctx.bound_queue(ch, dst)
    ch.exchange_bind(dst, src)
    returned: list[Any] = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish(src, "", b"m", mandatory=True)
    ctx.must_get(ch, q)
    conn.process_data_events(time_limit=0.2)
    eq(returned, [], "returns")


@case("basic.publish/mandatory-e2e-to-nowhere-returned", B)
def mandatory_e2e_nowhere(ctx: Context) -> None:
    """An exchange-to-exchange hop that reaches no queue is still unroutable."""
    conn = ctx.connect()
    ch = conn.channel()
    src = ctx.exchange(ch, "fanout")
    dst = ctx.exchange(ch, "fanout")
    ch.exchange_bind(dst, src)
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _c, m, _p, _b: returned.append(m))
    ch.basic_publish(src, "", b"m", mandatory=True)
    ctx.pump(conn, lambda: bool(returned), 3)
    check(bool(returned) and returned[0].reply_code == 312, "basic.return 312", returned)


@case("tx.commit/uncommitted-publishes-discarded-when-connection-closes", "tx")
def tx_close(ctx: Context) -> None:
    conn = ctx.connect()
    tx = conn.channel()
    q = ctx.queue(ctx.channel())
    tx.tx_select()
    tx.basic_publish("", q, b"never")
    ctx.sync(tx)
    conn.close()
    ctx.get_none(ctx.channel(), q)


@case("tx.commit/uncommitted-ack-not-applied-when-channel-closes", "tx")
def tx_ack_close(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"keep")
    tx = ctx.channel()
    tx.tx_select()
    m = ctx.must_get(tx, q, auto_ack=False)
    tx.basic_ack(m.method.delivery_tag)
    tx.close()
    eq(ctx.must_get(ch, q).body, b"keep", "message back after an uncommitted ack")


@case("confirm.select/tags-count-only-publishes-after-select", CF)
def confirm_after(ctx: Context) -> None:
    q = ctx.queue()
    rc = _raw(ctx)
    for _ in range(3):
        rc.publish(1, "", q, b"before")
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    rc.publish(1, "", q, b"after")
    f = rc.read_until((C.Basic.Ack, C.Basic.Nack))
    eq((f.value.name, f.value.delivery_tag), ("Basic.Ack", 1), "first confirm")


@case("queue.declare/unicode-queue-name-round-trip", Q)
def unicode_queue(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, name=ctx.name() + "-ünïcødé-队列")
    ch.basic_publish("", q, b"u")
    m = ctx.must_get(ch, q)
    eq(m.method.routing_key, q, "routing key")


@case("exchange.topic/unicode-words-match", "routing")
def unicode_topic(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    q = ctx.bound_queue(ch, x, "café.*")
    ch.basic_publish(x, "café.crème", b"u")
    eq(ctx.must_get(ch, q).body, b"u", "body")


@case("exchange.topic/routing-key-of-255-bytes", "routing")
def long_key(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    key = ".".join(["w"] * 127) + "x"  # 255 bytes, 128 words
    q = ctx.bound_queue(ch, x, "w.#")
    ch.basic_publish(x, key, b"long")
    m = ctx.must_get(ch, q)
    eq(m.method.routing_key, key, "routing key")


@case("basic.publish/large-header-value-round-trip", B)
def big_header(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    value = "v" * 100_000
    ch.basic_publish("", q, b"h", pika.BasicProperties(headers={"big": value}))
    eq(ctx.must_get(ch, q).headers.get("big"), value, "100 kB header value")


@case("x-max-priority/combined-with-message-ttl", "ext/priority")
def priority_ttl(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 5, "x-message-ttl": 60000})
    ch.basic_publish("", q, b"short", pika.BasicProperties(priority=5, expiration="30"))
    ch.basic_publish("", q, b"low", pika.BasicProperties(priority=1))
    time.sleep(0.2)
    eq(ctx.bodies(ch, q), [b"low"], "the expired high-priority message is gone")
