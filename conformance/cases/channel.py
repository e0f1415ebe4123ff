"""Channel class: open, close, flow, and channel-level error behaviour."""

from __future__ import annotations

from pamqp import commands as C

from conformance.framework import Context, case, check, eq
from conformance.rawclient import RawClient

A = "channel"


def _raw(ctx: Context) -> RawClient:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    return rc


@case("channel.open/open-ok", A)
def open_ok(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.send_method(C.Channel.Open(), 1)
    f = rc.read_until((C.Channel.OpenOk,))
    eq(f.channel, 1, "open-ok channel")


@case("channel.open/highest-channel-number-usable", A)
def open_high(ctx: Context) -> None:
    """Channel numbers up to the negotiated channel-max can be used."""
    rc = _raw(ctx)
    n = rc.channel_max or 2047
    rc.open_channel(n)
    r = rc.rpc(C.Basic.Qos(prefetch_count=1), n, (C.Basic.QosOk,))
    check(isinstance(r, C.Basic.QosOk), "basic.qos-ok", r)


@case("channel.open/many-channels-on-one-connection", A)
def many(ctx: Context) -> None:
    conn = ctx.connect()
    chans = [conn.channel() for _ in range(50)]
    check(all(c.is_open for c in chans), "50 open channels", sum(c.is_open for c in chans))


@case("channel.close/client-close-answered-with-close-ok", A)
def close_ok(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.open_channel(1)
    r = rc.rpc(C.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0), 1,
               (C.Channel.CloseOk,))
    check(isinstance(r, C.Channel.CloseOk), "channel.close-ok", r)


@case("channel.close/channel-number-reusable-after-close", A)
def reuse(ctx: Context) -> None:
    rc = _raw(ctx)
    for _ in range(3):
        rc.open_channel(7)
        r = rc.rpc(C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 7,
                   (C.Channel.CloseOk,))
        check(isinstance(r, C.Channel.CloseOk), "channel.close-ok", r)


@case("channel.close/server-close-carries-class-and-method", A)
def server_close_ids(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.open_channel(1)
    r = rc.rpc(C.Queue.Declare(queue=ctx.name(), passive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Channel.Close), "channel.close", r)
    eq((r.reply_code, r.class_id, r.method_id), (404, 50, 10), "code/class/method")


@case("channel.close-ok/after-server-close-channel-reopens", A)
def close_ok_reopen(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.open_channel(1)
    r = rc.rpc(C.Exchange.Declare(exchange=ctx.name("x"), passive=True), 1,
               (C.Exchange.DeclareOk,))
    check(isinstance(r, C.Channel.Close), "channel.close", r)
    rc.send_method(C.Channel.CloseOk(), 1)
    rc.open_channel(1)


@case("channel.close/client-and-server-close-crossing", A)
def crossing_close(ctx: Context) -> None:
    """If both peers send channel.close at once, each answers the other's with close-ok."""
    rc = _raw(ctx)
    rc.open_channel(1)
    rc.send_method(C.Queue.Declare(queue=ctx.name(), passive=True), 1)
    rc.send_method(C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 1)
    kinds = set()
    for _ in range(2):
        f = rc.read_until((C.Channel.Close, C.Channel.CloseOk))
        kinds.add(type(f.value).__name__)
        if isinstance(f.value, C.Channel.Close):
            rc.send_method(C.Channel.CloseOk(), 1)
        if isinstance(f.value, C.Channel.CloseOk):
            break
    check("CloseOk" in kinds, "channel.close-ok for the client's close", kinds)
    rc.open_channel(1)


@case("channel.flow/active-true-answered-with-flow-ok", A)
def flow_true(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.open_channel(1)
    r = rc.rpc(C.Channel.Flow(active=True), 1, (C.Channel.FlowOk,))
    check(isinstance(r, C.Channel.FlowOk), "channel.flow-ok", r)
    eq(r.active, True, "flow-ok active")


@case("channel.flow-ok/from-client-503-COMMAND_INVALID", A)
def flow_ok(ctx: Context) -> None:
    """RabbitMQ never sends channel.flow, so a client's channel.flow-ok is an
    unimplemented method: connection.close 503 COMMAND_INVALID."""
    rc = _raw(ctx)
    rc.open_channel(1)
    rc.send_method(C.Channel.FlowOk(active=True), 1)
    close = rc.expect_close()
    check(close is not None, "connection.close 503", "socket closed")
    assert close is not None
    eq(close.reply_code, 503, "reply code")


@case("channel/soft-error-closes-only-that-channel", A)
def soft_error(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.open_channel(1)
    rc.open_channel(2)
    r = rc.rpc(C.Queue.Declare(queue=ctx.name(), passive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Channel.Close), "channel.close on channel 1", r)
    rc.send_method(C.Channel.CloseOk(), 1)
    r2 = rc.rpc(C.Basic.Qos(prefetch_count=1), 2, (C.Basic.QosOk,))
    check(isinstance(r2, C.Basic.QosOk), "channel 2 still works", r2)
