"""Basic class, settlement and flow: ack, nack, reject, recover, recover-async, qos."""

from __future__ import annotations

from pamqp import commands as C

from conformance.framework import Context, case, check, eq

A = "basic"


@case("basic.ack/unknown-delivery-tag-406-PRECONDITION_FAILED", A)
def ack_unknown(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_ack(9999), 406, "unknown delivery tag")


@case("basic.ack/double-ack-406-PRECONDITION_FAILED", A)
def double_ack(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)

    def twice() -> None:
        ch.basic_ack(m.method.delivery_tag)
        ch.basic_ack(m.method.delivery_tag)

    ctx.channel_error(ch, twice, 406)


@case("basic.ack/tag-from-other-channel-406-PRECONDITION_FAILED", A)
def ack_other_channel(ctx: Context) -> None:
    """Delivery tags are scoped to their channel."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch2 = ctx.channel()
    ctx.channel_error(ch2, lambda: ch2.basic_ack(m.method.delivery_tag), 406)


@case("basic.ack/ack-of-auto-ack-delivery-406-PRECONDITION_FAILED", A)
def ack_noack(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=True)
    ctx.channel_error(ch, lambda: ch.basic_ack(m.method.delivery_tag), 406)


@case("basic.ack/multiple-acks-up-to-tag", A)
def ack_multiple(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    ms = [ctx.must_get(ch, q, auto_ack=False) for _ in range(5)]
    ch.basic_ack(ms[2].method.delivery_tag, multiple=True)
    ch.close()
    eq([m.body for m in ctx.drain(ctx.channel(), q)], [b"3", b"4"], "requeued after close")


@case("basic.ack/multiple-with-tag-0-acks-all", A)
def ack_all(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    for _ in range(4):
        ctx.must_get(ch, q, auto_ack=False)
    ch.basic_ack(0, multiple=True)
    ch.close()
    ctx.get_none(ctx.channel(), q)


@case("basic.ack/delivery-tags-start-at-1-and-increase", A)
def tags(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for _ in range(3):
        ch.basic_publish("", q, b"t")
    got = [ctx.must_get(ch, q, auto_ack=False).method.delivery_tag for _ in range(3)]
    eq(got, [1, 2, 3], "delivery tags")


@case("basic.ack/tags-shared-between-get-and-consume-on-channel", A)
def tags_shared(ctx: Context) -> None:
    ch = ctx.channel()
    q1 = ctx.queue(ch)
    q2 = ctx.queue(ch)
    ch.basic_publish("", q1, b"a")
    ch.basic_publish("", q2, b"b")
    t1 = ctx.must_get(ch, q1, auto_ack=False).method.delivery_tag
    _, got = ctx.consume(ch, q2, 1)
    eq((t1, got[0].method.delivery_tag), (1, 2), "tags across get and consume")


@case("basic.nack/requeue-true-redelivers-with-redelivered-flag", A)
def nack_requeue(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"n")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_nack(m.method.delivery_tag, requeue=True)
    m2 = ctx.must_get(ch, q)
    eq((m2.body, m2.method.redelivered), (b"n", True), "redelivery")


@case("basic.nack/requeue-false-discards", A)
def nack_drop(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"n")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_nack(m.method.delivery_tag, requeue=False)
    ctx.get_none(ch, q)


@case("basic.nack/multiple-requeues-all-up-to-tag", A)
def nack_multiple(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    ms = [ctx.must_get(ch, q, auto_ack=False) for _ in range(3)]
    ch.basic_nack(ms[1].method.delivery_tag, multiple=True, requeue=True)
    got = ctx.drain(ch, q)
    eq(sorted(m.body for m in got), [b"0", b"1"], "requeued")


@case("basic.nack/unknown-delivery-tag-406-PRECONDITION_FAILED", A)
def nack_unknown(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_nack(777), 406)


@case("basic.reject/requeue-true-redelivers", A)
def reject_requeue(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"r")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=True)
    eq(ctx.must_get(ch, q).method.redelivered, True, "redelivered")


@case("basic.reject/requeue-false-discards", A)
def reject_drop(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"r")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    ctx.get_none(ch, q)


@case("basic.reject/unknown-delivery-tag-406-PRECONDITION_FAILED", A)
def reject_unknown(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, lambda: ch.basic_reject(31337), 406)


@case("basic.reject/requeued-message-keeps-its-position", A)
def requeue_position(ctx: Context) -> None:
    """A requeued message goes back to its original place, ahead of newer messages."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    m0 = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m0.method.delivery_tag, requeue=True)
    eq([m.body for m in ctx.drain(ch, q)], [b"0", b"1", b"2"], "order after requeue")


@case("basic.recover/requeue-true-redelivers-unacked", A)
def recover(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"rc")
    ctx.must_get(ch, q, auto_ack=False)
    ch.basic_recover(requeue=True)
    m = ctx.must_get(ch, q)
    eq((m.body, m.method.redelivered), (b"rc", True), "recovered")


@case("basic.recover-async/requeues-unacked", A)
def recover_async(ctx: Context) -> None:
    """The deprecated basic.recover-async (no reply) still requeues (RabbitMQ)."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"ra")
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    rc.send_method(C.Basic.Get(queue=q, no_ack=False), 1)
    rc.read_until((C.Basic.GetOk,))
    rc.read_frame()
    rc.read_frame()
    rc.send_method(C.Basic.RecoverAsync(requeue=True), 1)
    r = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(r, C.Basic.GetOk) and r.redelivered, "get-ok redelivered", r)


@case("basic.consume/unacked-requeued-on-channel-close-redelivered", A)
def requeue_on_close(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"c")
    ctx.consume(ch, q, 1)
    ch.close()
    m = ctx.must_get(ctx.channel(), q)
    eq(m.method.redelivered, True, "redelivered")


@case("basic.consume/unacked-requeued-on-connection-close", A)
def requeue_on_conn_close(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ctx.channel())
    ch.basic_publish("", q, b"c")
    ctx.consume(ch, q, 1)
    conn.close()
    m = ctx.must_get(ctx.channel(), q)
    eq((m.body, m.method.redelivered), (b"c", True), "redelivery")


@case("basic.qos/prefetch-count-limits-unacked-per-consumer", A)
def qos_prefetch(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_qos(prefetch_count=2)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    _, got = ctx.consume(ch, q, 2)
    eq(ctx.settle_count(conn, got, 2), 2, "deliveries with prefetch 2 and no acks")
    ch.basic_ack(got[1].method.delivery_tag, multiple=True)
    ctx.pump(conn, lambda: len(got) >= 4, 2)
    eq(len(got), 4, "deliveries after acking two")


@case("basic.qos/per-consumer-limit-with-global-false", A)
def qos_per_consumer(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_qos(prefetch_count=1, global_qos=False)
    for _ in range(6):
        ch.basic_publish("", q, b"x")
    got: list[str] = []
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), consumer_tag="a")
    ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.consumer_tag), consumer_tag="b")
    ctx.settle_count(conn, got, 2)
    eq(sorted(got), ["a", "b"], "one unacked delivery per consumer")


@case("basic.qos/global-true-limits-whole-channel", A)
def qos_global(ctx: Context) -> None:
    """RabbitMQ reinterprets global=true as a limit shared by the channel's consumers."""
    conn = ctx.connect()
    ch = conn.channel()
    q1 = ctx.queue(ch)
    q2 = ctx.queue(ch)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    for _ in range(5):
        ch.basic_publish("", q1, b"1")
        ch.basic_publish("", q2, b"2")
    got: list[bytes] = []
    ch.basic_consume(q1, lambda _c, _m, _p, b: got.append(b))
    ch.basic_consume(q2, lambda _c, _m, _p, b: got.append(b))
    eq(ctx.settle_count(conn, got, 3), 3, "unacked deliveries on the channel")


@case("basic.qos/prefetch-zero-means-unlimited", A)
def qos_zero(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_qos(prefetch_count=0)
    for _ in range(50):
        ch.basic_publish("", q, b"u")
    _, got = ctx.consume(ch, q, 50)
    eq(len(got), 50, "deliveries")


@case("basic.qos/does-not-limit-basic-get", A)
def qos_get(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_qos(prefetch_count=1)
    for _ in range(3):
        ch.basic_publish("", q, b"g")
    got = [ctx.get(ch, q, auto_ack=False) for _ in range(3)]
    check(all(m is not None for m in got), "3 unacked gets despite prefetch 1",
          [m is not None for m in got])


@case("basic.qos/qos-ok", A)
def qos_ok(ctx: Context) -> None:
    ch = ctx.channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_qos(prefetch_count=65535)
