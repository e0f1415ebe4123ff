"""Boundaries and RabbitMQ-specific details: frame_max and channel_max limits exactly,
x-match variants, overflow with mandatory, priority queues with length limits."""

from __future__ import annotations

import pika
from pamqp import commands as C

from conformance.framework import CaseFailure, Context, case, check, eq
from conformance.rawclient import RawClient, marshal_header, marshal_method, raw_frame

F, R = "errors/frames", "routing"


def _opened(ctx: Context, frame_max: int | None = None) -> RawClient:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost, frame_max=frame_max)
    rc.open_channel(1)
    return rc


@case("frame/body-frame-exactly-frame-max-accepted", F)
def frame_max_exact(ctx: Context) -> None:
    """A frame of exactly frame_max octets (payload frame_max - 8) is legal."""
    rc = _opened(ctx, frame_max=4096)
    r = rc.rpc(C.Queue.Declare(queue="", exclusive=True), 1, (C.Queue.DeclareOk,))
    q = r.queue
    body = b"b" * (4096 - 8)
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1)
            + marshal_header(1, len(body)) + raw_frame(3, 1, body))
    got = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(got, C.Basic.GetOk), "basic.get-ok", got)


@case("frame/payload-of-frame-max-octets-tolerated", F)
def frame_max_lenient(ctx: Context) -> None:
    """Spec: frame_max counts the whole frame, so the payload limit is frame_max - 8.
    RabbitMQ 3.10.8 tolerates payloads up to frame_max itself (clients with that off-by-8
    work with it), so a drop-in broker must too."""
    rc = _opened(ctx, frame_max=4096)
    r = rc.rpc(C.Queue.Declare(queue="", exclusive=True), 1, (C.Queue.DeclareOk,))
    body = b"b" * 4096
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=r.queue), 1)
            + marshal_header(1, len(body)) + raw_frame(3, 1, body))
    got = rc.rpc(C.Basic.Get(queue=r.queue, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(got, C.Basic.GetOk), "basic.get-ok", got)


@case("frame/payload-over-frame-max-501-FRAME_ERROR", F)
def frame_max_over(ctx: Context) -> None:
    rc = _opened(ctx, frame_max=4096)
    body = b"b" * 4097
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key="nowhere"), 1)
            + marshal_header(1, len(body)) + raw_frame(3, 1, body))
    close = rc.expect_close()
    if close is None:
        raise CaseFailure("connection.close 501", "socket closed without close")
    eq(close.reply_code, 501, "reply code")


@case("channel-max/all-negotiated-channels-usable", F)
def channel_max_all(ctx: Context) -> None:
    """Up to channel_max channels may be open at once (default 2047)."""
    rc = ctx.raw(timeout=15)
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    n = rc.channel_max or 2047
    rc.send(b"".join(marshal_method(C.Channel.Open(), i) for i in range(1, n + 1)))
    opened = 0
    while opened < n:
        f = rc.read_frame()
        if isinstance(f.value, C.Channel.OpenOk):
            opened += 1
        elif isinstance(f.value, (C.Connection.Close, C.Channel.Close)):
            raise CaseFailure(f"{n} channels open", f"{f.value.name} {f.value.reply_code} "
                              f"{f.value.reply_text} after {opened}")
    rc.send_method(C.Channel.Open(), n + 1)
    close = rc.expect_close(timeout=10)
    check(close is not None and close.reply_code == 530, "connection.close 530 for one more",
          close and close.reply_code)


@case("exchange.declare/type-names-are-case-sensitive-503", "exchange")
def type_case(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    x = ctx.name("x")
    ctx.track_exchange(x)
    ctx.connection_error(conn, lambda: ch.exchange_declare(x, exchange_type="DIRECT"), 503)


@case("exchange.headers/any-with-x-matches-x-prefixed-headers", R)
def any_with_x(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.bound_queue(ch, x, "", arguments={"x-match": "any-with-x", "x-tenant": "acme"})
    ch.basic_publish(x, "", b"m", pika.BasicProperties(headers={"x-tenant": "acme"}))
    eq(ctx.must_get(ch, q).body, b"m", "body")


@case("exchange.headers/all-with-x-requires-x-prefixed-headers", R)
def all_with_x(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.bound_queue(ch, x, "", arguments={"x-match": "all-with-x", "x-a": "1", "b": "2"})
    ch.basic_publish(x, "", b"partial", pika.BasicProperties(headers={"b": "2"}))
    ch.basic_publish(x, "", b"full", pika.BasicProperties(headers={"x-a": "1", "b": "2"}))
    eq(ctx.bodies(ch, q), [b"full"], "bodies")


@case("exchange.headers/any-ignores-x-prefixed-headers", R)
def any_ignores_x(ctx: Context) -> None:
    """Plain "any" never matches on x- prefixed keys (they are ignored in the binding)."""
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.bound_queue(ch, x, "", arguments={"x-match": "any", "x-a": "1", "b": "2"})
    ch.basic_publish(x, "", b"x-only", pika.BasicProperties(headers={"x-a": "1"}))
    ctx.get_none(ch, q)


@case("exchange.headers/invalid-x-match-406-PRECONDITION_FAILED", R)
def bad_x_match(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.queue_bind(q, x, "", arguments={"x-match": "some",
                                                                      "a": "1"}), 406)


@case("x-overflow/reject-publish-with-mandatory-not-returned", "ext/length-limits")
def reject_publish_mandatory(ctx: Context) -> None:
    """A message refused by a full reject-publish queue was routed: no basic.return
    (publishers learn about it from a confirm nack)."""
    conn = ctx.connect()
    ch = conn.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    returned: list[object] = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("", q, b"1", mandatory=True)
    ch.basic_publish("", q, b"2", mandatory=True)
    ctx.sync(ch)
    conn.process_data_events(time_limit=0.3)
    eq(returned, [], "returns")
    eq(ctx.bodies(ch, q), [b"1"], "queue")


@case("x-max-length/priority-queue-drops-from-the-head-highest-priority", "ext/priority")
def priority_maxlen(ctx: Context) -> None:
    """With x-max-priority and x-max-length, drop-head removes the message at the head of
    the queue, which is the highest-priority one (RabbitMQ 3.10)."""
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-priority": 5, "x-max-length": 2})
    for p in (5, 1, 3):
        ch.basic_publish("", q, b"%d" % p, pika.BasicProperties(priority=p))
    eq(ctx.bodies(ch, q), [b"3", b"1"], "remaining, in delivery order")


@case("basic.publish/empty-routing-key-is-not-the-last-declared-queue", "basic")
def publish_empty_key(ctx: Context) -> None:
    """The "last declared queue" shorthand applies to queue names, not to routing keys:
    a publish to "" with key "" reaches no queue and a mandatory one is returned."""
    rc = _opened(ctx)
    r = rc.rpc(C.Queue.Declare(queue="", exclusive=True), 1, (C.Queue.DeclareOk,))
    rc.publish(1, "", "", b"y", mandatory=True)
    f = rc.read_until((C.Basic.Return,))
    eq(f.value.reply_code, 312, "basic.return code")
    got = rc.rpc(C.Basic.Get(queue=r.queue, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(got, C.Basic.GetEmpty), "the declared queue stays empty", got)


@case("basic.ack/multiple-with-unknown-tag-406-PRECONDITION_FAILED", "basic")
def ack_multiple_unknown(ctx: Context) -> None:
    """multiple=true still needs the tag itself to be outstanding."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(2):
        ch.basic_publish("", q, b"%d" % i)
    for _ in range(2):
        ctx.must_get(ch, q, auto_ack=False)
    ctx.channel_error(ch, lambda: ch.basic_ack(5, multiple=True), 406)


@case("basic.ack/tag-zero-without-multiple-406-PRECONDITION_FAILED", "basic")
def ack_zero_single(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    ctx.must_get(ch, q, auto_ack=False)
    ctx.channel_error(ch, lambda: ch.basic_ack(0, multiple=False), 406)


@case("basic.nack/multiple-with-tag-zero-requeues-all", "basic")
def nack_zero_multiple(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    for _ in range(3):
        ctx.must_get(ch, q, auto_ack=False)
    ch.basic_nack(0, multiple=True, requeue=True)
    eq([m.body for m in ctx.drain(ch, q)], [b"0", b"1", b"2"], "requeued in order")


@case("basic.reject/tag-zero-406-PRECONDITION_FAILED", "basic")
def reject_zero(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    ctx.must_get(ch, q, auto_ack=False)
    ctx.channel_error(ch, lambda: ch.basic_reject(0), 406)


# -- queue and consumer argument validation (table-driven) ---------------------------------

_BAD_QUEUE_ARGS: list[tuple[str, dict[str, object]]] = [
    ("x-queue-mode-unknown", {"x-queue-mode": "bogus"}),
    ("x-dead-letter-exchange-not-a-string", {"x-dead-letter-exchange": 5}),
    ("x-max-in-memory-length-on-classic-queue", {"x-max-in-memory-length": 5}),
    ("x-delivery-limit-on-classic-queue", {"x-delivery-limit": 3}),
    ("x-max-priority-string", {"x-max-priority": "high"}),
    ("x-expires-string", {"x-expires": "1000"}),
    ("x-message-ttl-too-large", {"x-message-ttl": 2**40}),
    ("x-queue-version-unknown", {"x-queue-version": 3}),
]

for _label, _args in _BAD_QUEUE_ARGS:

    def _bad(ctx: Context, args: dict[str, object] = _args) -> None:
        ch = ctx.channel()
        q = ctx.name()
        ctx.track_queue(q)
        ctx.channel_error(ch, lambda: ch.queue_declare(q, arguments=args), 406)

    case(f"queue.declare/invalid-argument-{_label}-406-PRECONDITION_FAILED", "queue")(_bad)

_GOOD_QUEUE_ARGS: list[tuple[str, dict[str, object]]] = [
    ("x-queue-mode-lazy", {"x-queue-mode": "lazy"}),
    ("x-queue-version-2", {"x-queue-version": 2}),
    ("x-overflow-reject-publish-dlx", {"x-overflow": "reject-publish-dlx"}),
]

for _label, _args in _GOOD_QUEUE_ARGS:

    def _ok(ctx: Context, args: dict[str, object] = _args) -> None:
        ctx.queue(ctx.channel(), arguments=args)

    case(f"queue.declare/argument-{_label}-accepted", "queue")(_ok)


@case("basic.consume/x-priority-not-an-integer-406-PRECONDITION_FAILED", "ext/consumer-priority")
def consume_priority_str(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_consume(q, lambda *a: None,
                                                   arguments={"x-priority": "high"}), 406)


@case("basic.consume/stream-offset-on-classic-queue-406-PRECONDITION_FAILED", "basic")
def consume_stream_offset(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ctx.channel_error(ch, lambda: ch.basic_consume(q, lambda *a: None,
                                                   arguments={"x-stream-offset": "first"}), 406)
