"""Details a client switching from RabbitMQ 3.10.8 notices (issue 17): unbinding what is
gone, QoS with both limits, zero TTL and zero length limits with a waiting consumer,
basic.get counts, frame order when deleting a consumed queue, channel reuse after an
error, exclusive queues at a server-initiated close, channel_max, delivery modes.
Each was observed on RabbitMQ 3.10.8 first; the case states what it answered."""

from __future__ import annotations

import struct
import time

from pamqp import commands as C

from conformance.framework import CaseFailure, Context, case, check, eq
from conformance.rawclient import RawClient, RawTimeout, raw_frame


def _opened(ctx: Context, **kw: object) -> RawClient:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost, **kw)  # type: ignore[arg-type]
    rc.open_channel(1)
    return rc


def _exclusive_queue(rc: RawClient, name: str = "", **kw: object) -> str:
    ok = rc.rpc(C.Queue.Declare(queue=name, exclusive=True, **kw), 1,  # type: ignore[arg-type]
                (C.Queue.DeclareOk,))
    check(isinstance(ok, C.Queue.DeclareOk), "queue.declare-ok", ok)
    return str(ok.queue)


def _frames(rc: RawClient, quiet: float = 0.4) -> list[object]:
    """Every frame value until the broker is quiet for *quiet* seconds (heartbeats too)."""
    out: list[object] = []
    while True:
        try:
            out.append(rc.read_frame(quiet).value)
        except RawTimeout:
            return out


# ---------------------------------------------------------------- unbinding what is gone
@case("queue.unbind/missing-queue-exchange-or-binding-unbind-ok", "queue")
def unbind_missing_queue_side(ctx: Context) -> None:
    """RabbitMQ 3.10.8 answers queue.unbind with unbind-ok when the queue, the exchange or
    the binding does not exist (aio-pika's cleanups rely on it)."""
    rc = _opened(ctx)
    q = _exclusive_queue(rc)
    for queue, exchange in ((ctx.name("gone"), "amq.direct"), (q, ctx.name("gone-x")),
                            (q, "amq.direct"), (ctx.name("gone"), ctx.name("gone-x"))):
        r = rc.rpc(C.Queue.Unbind(queue=queue, exchange=exchange, routing_key="k"), 1,
                   (C.Queue.UnbindOk,))
        check(isinstance(r, C.Queue.UnbindOk), "queue.unbind-ok", r)


@case("exchange.unbind/missing-source-or-destination-unbind-ok", "exchange")
def unbind_missing_exchange_side(ctx: Context) -> None:
    rc = _opened(ctx)
    for destination, source in ((ctx.name("gone-x"), "amq.direct"),
                                ("amq.fanout", ctx.name("gone-x"))):
        r = rc.rpc(C.Exchange.Unbind(destination=destination, source=source, routing_key="k"),
                   1, (C.Exchange.UnbindOk,))
        check(isinstance(r, C.Exchange.UnbindOk), "exchange.unbind-ok", r)


# ---------------------------------------------------------------- QoS with both limits
def _prefetch_deliveries(ctx: Context, order: str) -> dict[str, int]:
    """10 ready messages, basic.qos global 5 and per-consumer 2 (in *order*), three
    consumers on the channel: deliveries per consumer tag."""
    rc = _opened(ctx)
    q = _exclusive_queue(rc)
    for i in range(10):
        rc.publish(1, "", q, b"%d" % i)
    rc.rpc(C.Queue.Declare(queue=q, passive=True), 1, (C.Queue.DeclareOk,))
    qos = {"g": C.Basic.Qos(prefetch_count=5, global_=True),
           "p": C.Basic.Qos(prefetch_count=2, global_=False)}
    for key in order:
        rc.rpc(qos[key], 1, (C.Basic.QosOk,))
    # sent together: an rpc() per consumer would swallow the deliveries in between
    rc.send(b"".join(raw_frame_method(C.Basic.Consume(queue=q, consumer_tag=f"c{n}"))
                     for n in range(3)))
    got: dict[str, int] = {}
    for value in _frames(rc, 0.6):
        if isinstance(value, C.Basic.Deliver):
            tag = str(value.consumer_tag)
            got[tag] = got.get(tag, 0) + 1
    return dict(sorted(got.items()))


@case("basic.qos/global-then-per-consumer-lifts-the-global-limit", "basic")
def qos_global_then_consumer(ctx: Context) -> None:
    """RabbitMQ 3.10.8: basic.qos global=false also lifts the channel-wide limit, so
    global 5 followed by per-consumer 2 with three consumers delivers 2+2+2 = 6."""
    eq(_prefetch_deliveries(ctx, "gp"), {"c0": 2, "c1": 2, "c2": 2}, "deliveries")


@case("basic.qos/per-consumer-then-global-keeps-both-limits", "basic")
def qos_consumer_then_global(ctx: Context) -> None:
    """In the other order both limits hold: 2+2+1 = 5 (the global 5 stops the third)."""
    eq(_prefetch_deliveries(ctx, "pg"), {"c0": 2, "c1": 2, "c2": 1}, "deliveries")


# ---------------------------------------------------------------- TTL 0, length 0
@case("expiration/zero-expires-at-once-unless-a-consumer-takes-it", "ext/ttl")
def ttl_zero(ctx: Context) -> None:
    """expiration "0": a message no consumer can take at once expires at once, even for a
    basic.get sent in the same write; a waiting consumer gets it."""
    rc = _opened(ctx)
    q = _exclusive_queue(rc)
    zero = C.Basic.Properties(expiration="0")
    rc.send(b"".join([
        _publish_bytes(q, b"gone", zero),
        raw_frame_method(C.Basic.Get(queue=q, no_ack=True)),
    ]))
    r = rc.read_until((C.Basic.GetOk, C.Basic.GetEmpty, C.Channel.Close))
    check(isinstance(r.value, C.Basic.GetEmpty), "basic.get-empty", r)
    rc.publish(1, "", q, b"first")  # waits in the queue
    rc.publish(1, "", q, b"gone too", zero)  # behind it: expires before it is reached
    got = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(got, C.Basic.GetOk), "basic.get-ok (first)", got)
    rc.read_frame()  # header
    eq(getattr(rc.read_frame().value, "value", None), b"first", "body")
    r2 = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
    check(isinstance(r2, C.Basic.GetEmpty), "basic.get-empty (TTL 0 message expired)", r2)
    rc.rpc(C.Basic.Consume(queue=q, consumer_tag="c", no_ack=True), 1, (C.Basic.ConsumeOk,))
    rc.publish(1, "", q, b"taken", zero)
    bodies = [getattr(v, "value", None) for v in _frames(rc)
              if type(v).__name__ == "ContentBody"]
    eq(bodies, [b"taken"], "delivered to the waiting consumer")


def raw_frame_method(method: object, channel: int = 1) -> bytes:
    from conformance.rawclient import marshal_method

    return marshal_method(method, channel)


def _publish_bytes(queue: str, body: bytes, props: C.Basic.Properties) -> bytes:
    from conformance.rawclient import marshal_body, marshal_header

    return (raw_frame_method(C.Basic.Publish(exchange="", routing_key=queue))
            + marshal_header(1, len(body), props) + marshal_body(1, body))


@case("x-max-length/zero-hands-the-message-to-a-waiting-consumer", "ext/limits")
def max_length_zero_consumer(ctx: Context) -> None:
    """x-max-length 0 (and x-max-length-bytes 0) keep nothing, but RabbitMQ offers a new
    message to a waiting consumer before queueing it, so the consumer gets it."""
    rc = _opened(ctx)
    for args in ({"x-max-length": 0}, {"x-max-length-bytes": 0}):
        q = _exclusive_queue(rc, arguments=args)
        tag = f"c-{next(iter(args))}"
        rc.rpc(C.Basic.Consume(queue=q, consumer_tag=tag, no_ack=True), 1,
               (C.Basic.ConsumeOk,))
        rc.publish(1, "", q, b"m")
        bodies = [getattr(v, "value", None) for v in _frames(rc)
              if type(v).__name__ == "ContentBody"]
        eq(bodies, [b"m"], f"delivered with {args}")
        rc.rpc(C.Basic.Cancel(consumer_tag=tag), 1, (C.Basic.CancelOk,))
        rc.publish(1, "", q, b"dropped")
        r = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
        check(isinstance(r, C.Basic.GetEmpty), f"nothing kept with {args}", r)


# ---------------------------------------------------------------- basic.get count
@case("basic.get/message-count-leaves-out-expired-messages", "basic")
def get_count_expired(ctx: Context) -> None:
    """basic.get-ok message-count: messages that expired and now sit at the head are not
    counted (RabbitMQ drops them right after the fetch); one behind a live one is."""
    rc = _opened(ctx)
    q = _exclusive_queue(rc)
    short = C.Basic.Properties(expiration="50")
    rc.publish(1, "", q, b"keep1")
    rc.publish(1, "", q, b"exp1", short)
    rc.publish(1, "", q, b"exp2", short)
    rc.publish(1, "", q, b"keep2")
    rc.publish(1, "", q, b"exp3", short)  # behind keep2: still counted
    rc.publish(1, "", q, b"keep3")
    rc.rpc(C.Queue.Declare(queue=q, passive=True), 1, (C.Queue.DeclareOk,))
    time.sleep(0.3)
    counts = []
    for _ in range(2):
        ok = rc.rpc(C.Basic.Get(queue=q, no_ack=True), 1, (C.Basic.GetOk, C.Basic.GetEmpty))
        check(isinstance(ok, C.Basic.GetOk), "basic.get-ok", ok)
        counts.append(ok.message_count)
        rc.read_frame()
        rc.read_frame()
    eq(counts, [3, 1], "message-count after keep1 and after keep2")


# ---------------------------------------------------------------- deleting a consumed queue
@case("queue.delete/consumed-queue-delete-ok-then-basic-cancel", "queue")
def delete_consumed(ctx: Context) -> None:
    """A channel that deletes the queue it consumes from gets queue.delete-ok first, then
    basic.cancel (py-amqp/kombu wait for delete-ok and fail on a cancel before it); a
    consumer on another channel of the connection gets its cancel too. RabbitMQ sends
    these cancels with nowait=true."""
    rc = _opened(ctx)
    rc.open_channel(2)
    q = _exclusive_queue(rc)
    rc.rpc(C.Basic.Consume(queue=q, consumer_tag="own"), 1, (C.Basic.ConsumeOk,))
    rc.rpc(C.Basic.Consume(queue=q, consumer_tag="other"), 2, (C.Basic.ConsumeOk,))
    rc.send_method(C.Queue.Delete(queue=q), 1)
    seen: list[tuple[int, str]] = []
    while True:
        try:
            f = rc.read_frame(0.4)
        except RawTimeout:
            break
        if isinstance(f.value, C.Basic.Cancel):
            # nowait=true: the client must not answer (RabbitMQ closes on a cancel-ok)
            seen.append((f.channel, f"cancel {f.value.consumer_tag} nowait={f.value.nowait}"))
        elif f.type != 8:
            seen.append((f.channel, f.name))
    # the order across channels is not defined (RabbitMQ's channels are processes)
    eq([x for ch, x in seen if ch == 1], ["Queue.DeleteOk", "cancel own nowait=True"],
       "channel 1")
    eq([x for ch, x in seen if ch == 2], ["cancel other nowait=True"], "channel 2")


# ---------------------------------------------------------------- channel reuse
@case("channel.open/reopened-after-channel-error-404-again", "channel")
def reopen_after_error(ctx: Context) -> None:
    """After the broker closes channel 1 (404 on a passive declare) and the client reopens
    it at once, the next passive declare of a missing queue closes it with 404 again."""
    rc = _opened(ctx)
    missing = ctx.name("missing")
    for attempt in range(3):
        r = rc.rpc(C.Queue.Declare(queue=missing, passive=True), 1, (C.Queue.DeclareOk,))
        check(isinstance(r, C.Channel.Close) and r.reply_code == 404,
              f"channel.close 404 (attempt {attempt + 1})", r)
        rc.send(raw_frame_method(C.Channel.CloseOk()) + raw_frame_method(C.Channel.Open()))
        rc.read_until((C.Channel.OpenOk,))


@case("channel.open/before-close-ok-504-CHANNEL_ERROR", "channel")
def reopen_before_close_ok(ctx: Context) -> None:
    """channel.open on a channel the broker closed, before the client's close-ok: the
    number is still taken. RabbitMQ: connection.close 504 "second 'channel.open' seen"."""
    rc = _opened(ctx)
    r = rc.rpc(C.Queue.Declare(queue=ctx.name("missing"), passive=True), 1,
               (C.Queue.DeclareOk,))
    check(isinstance(r, C.Channel.Close), "channel.close 404", r)
    rc.send_method(C.Channel.Open(), 1)
    close = rc.expect_close()
    if close is None:
        raise CaseFailure("connection.close 504", "socket closed without close")
    eq((close.reply_code, close.class_id, close.method_id), (504, 20, 10), "close")


# ---------------------------------------------------------------- exclusive queues at close
@case("queue.declare/exclusive-queue-gone-when-the-broker-closes-the-connection", "queue")
def exclusive_gone_at_server_close(ctx: Context) -> None:
    """When the broker closes a connection (here 505 for a heartbeat on channel 1), its
    exclusive queues are deleted before connection.close is sent: another connection may
    declare the name again at once, before the old one's close-ok."""
    name = ctx.name("excl")
    a = _opened(ctx)
    _exclusive_queue(a, name)
    b = _opened(ctx)
    a.send(raw_frame(8, 1, b""))
    close = a.read_until((C.Connection.Close,)).value  # not answered yet
    eq(close.reply_code, 505, "connection.close")
    ok = b.rpc(C.Queue.Declare(queue=name, exclusive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(ok, C.Queue.DeclareOk), "queue.declare-ok from another connection", ok)
    a.send_method(C.Connection.CloseOk())


@case("queue.declare/exclusive-queue-gone-at-close-ok", "queue")
def exclusive_gone_at_close_ok(ctx: Context) -> None:
    name = ctx.name("excl")
    a = _opened(ctx)
    _exclusive_queue(a, name)
    b = _opened(ctx)
    a.rpc(C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0,
          (C.Connection.CloseOk,))
    ok = b.rpc(C.Queue.Declare(queue=name, exclusive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(ok, C.Queue.DeclareOk), "queue.declare-ok from another connection", ok)


# ---------------------------------------------------------------- limits and properties
@case("channel-max/exceeded-close-carries-class-and-method-0-0", "errors/frames")
def channel_max_ids(ctx: Context) -> None:
    """RabbitMQ 3.10.8 reports channel_max exceeded with class and method 0/0."""
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost, channel_max=1)
    rc.open_channel(1)
    rc.send_method(C.Channel.Open(), 2)
    close = rc.expect_close()
    if close is None:
        raise CaseFailure("connection.close 530", "socket closed without close")
    eq((close.reply_code, close.class_id, close.method_id), (530, 0, 0), "close")


@case("basic.publish/delivery-mode-other-than-1-or-2-406", "basic")
def delivery_mode_unknown(ctx: Context) -> None:
    """RabbitMQ 3.10.8 refuses delivery-mode 0 or 3..255: channel.close 406
    "invalid message: {delivery_mode_unknown,N}" for basic.publish (60/40)."""
    rc = _opened(ctx)
    q = _exclusive_queue(rc)
    for mode in (0, 3, 255):
        # raw property bytes (pamqp refuses to encode these modes): flags + the octet
        header = struct.pack(">HHQH", 60, 0, 1, 0x1000) + bytes((mode,))
        rc.send(raw_frame_method(C.Basic.Publish(exchange="", routing_key=q))
                + raw_frame(2, 1, header) + raw_frame(3, 1, b"m"))
        r = rc.read_until((C.Channel.Close,))
        eq((r.value.reply_code, r.value.class_id, r.value.method_id), (406, 60, 40), "close")
        check(f"delivery_mode_unknown,{mode}" in r.value.reply_text, "the mode named",
              r.value.reply_text)
        rc.send(raw_frame_method(C.Channel.CloseOk()) + raw_frame_method(C.Channel.Open()))
        rc.read_until((C.Channel.OpenOk,))
        q = _exclusive_queue(rc)
