"""Frame-level rules, checked with the raw client: what a broker does with bad input."""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands as C

from conformance.framework import CaseFailure, Context, case, check, eq
from conformance.rawclient import (
    PROTOCOL_HEADER,
    RawClient,
    marshal_body,
    marshal_header,
    marshal_method,
    raw_frame,
)

A = "errors/frames"


def _closed_with(rc: RawClient, code: int, text: str | None = None) -> None:
    close = rc.expect_close()
    if close is None:
        raise CaseFailure(f"connection.close {code}", "socket closed without connection.close")
    check(close.reply_code == code, f"connection.close {code}",
          f"{close.reply_code} {close.reply_text}")
    if text is not None:
        check(text in close.reply_text, f"text containing {text!r}", close.reply_text)


def _opened(ctx: Context, frame_max: int | None = None) -> RawClient:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost, frame_max=frame_max)
    rc.open_channel(1)
    return rc


def _header_reply(ctx: Context, data: bytes) -> None:
    rc = ctx.raw()
    rc.send(data)
    got = rc.read_bytes(8)
    eq(got, PROTOCOL_HEADER, "protocol header sent back")
    check(rc.wait_eof(3), "socket closed after the header", "socket open")


@case("protocol-header/wrong-version-answered-with-0-9-1-header", A)
def bad_version(ctx: Context) -> None:
    _header_reply(ctx, b"AMQP\x00\x00\x08\x00")


@case("protocol-header/amqp-1-0-header-answered-with-0-9-1-header", A)
def amqp10_header(ctx: Context) -> None:
    """AMQP 1.0 (protocol id 0) is not spoken on this port without the 1.0 plugin;
    RabbitMQ answers with its 0-9-1 header and closes."""
    rc = ctx.raw()
    rc.send(b"AMQP\x00\x01\x00\x00")
    got = rc.read_bytes(8)
    if got[:4] == b"AMQP" and got != PROTOCOL_HEADER:
        return  # a broker that speaks 1.0 here answers with a 1.0 header: fine too
    eq(got, PROTOCOL_HEADER, "reply header")


@case("protocol-header/garbage-answered-with-0-9-1-header", A)
def garbage_header(ctx: Context) -> None:
    _header_reply(ctx, b"GET / HTTP/1.1\r\n\r\n")


@case("protocol-header/method-frame-before-header-refused", A)
def frame_before_header(ctx: Context) -> None:
    """A client that starts with a frame instead of the protocol header gets the
    header back and is disconnected."""
    _header_reply(ctx, marshal_method(C.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US")))


@case("frame/bad-frame-end-octet-501-FRAME_ERROR", A)
def bad_frame_end(ctx: Context) -> None:
    rc = _opened(ctx)
    b = bytearray(marshal_method(C.Queue.Declare(queue="", exclusive=True), 1))
    b[-1] = 0x00
    rc.send(bytes(b))
    _closed_with(rc, 501)


@case("frame/unknown-frame-type-501-FRAME_ERROR", A)
def unknown_frame_type(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(raw_frame(9, 0, b"abc"))
    _closed_with(rc, 501)


@case("frame/body-frame-larger-than-frame-max-501-FRAME_ERROR", A)
def oversize_frame(ctx: Context) -> None:
    rc = _opened(ctx, frame_max=4096)
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key="nowhere"), 1)
            + marshal_header(1, 10000) + marshal_body(1, b"x" * 10000))
    _closed_with(rc, 501)


@case("frame/method-frame-larger-than-frame-max-501-FRAME_ERROR", A)
def oversize_method(ctx: Context) -> None:
    rc = _opened(ctx, frame_max=4096)
    args: Any = {f"k{i}": "v" * 100 for i in range(60)}  # ~6.5 kB of arguments
    rc.send(marshal_method(C.Queue.Declare(queue="", exclusive=True, arguments=args), 1))
    _closed_with(rc, 501)


@case("frame/truncated-method-arguments-501-FRAME_ERROR", A)
def truncated_args(ctx: Context) -> None:
    """Arguments that end early cannot be decoded (RabbitMQ: 501, not 502)."""
    rc = _opened(ctx)
    payload = marshal_method(C.Queue.Declare(queue="abc"), 1)[7:-1]
    rc.send(raw_frame(1, 1, payload[:7]))
    _closed_with(rc, 501)


@case("frame/content-header-without-method-505-UNEXPECTED_FRAME", A)
def header_without_method(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(marshal_header(1, 5))
    _closed_with(rc, 505)


@case("frame/content-body-without-method-505-UNEXPECTED_FRAME", A)
def body_without_method(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(marshal_body(1, b"hello"))
    _closed_with(rc, 505)


@case("frame/method-instead-of-content-header-505-UNEXPECTED_FRAME", A)
def method_before_header(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key="x"), 1)
            + marshal_method(C.Basic.Qos(), 1))
    _closed_with(rc, 505)


@case("frame/method-instead-of-content-body-505-UNEXPECTED_FRAME", A)
def method_mid_body(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key="x"), 1)
            + marshal_header(1, 10) + marshal_method(C.Basic.Qos(), 1))
    _closed_with(rc, 505)


@case("frame/content-header-after-non-content-method-505-UNEXPECTED_FRAME", A)
def header_after_declare(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(marshal_method(C.Queue.Declare(queue="", exclusive=True), 1) + marshal_header(1, 3))
    _closed_with(rc, 505)


@case("frame/heartbeat-on-nonzero-channel-505-UNEXPECTED_FRAME", A)
def heartbeat_on_channel(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(raw_frame(8, 1, b""))
    _closed_with(rc, 505)


@case("frame/unknown-method-id-terminates-connection", A)
def unknown_method(ctx: Context) -> None:
    """Spec: 540 NOT_IMPLEMENTED or 503. RabbitMQ 3.10.8 drops the TCP connection with no
    connection.close; either answer passes, a connection left open fails."""
    rc = _opened(ctx)
    rc.send(raw_frame(1, 1, struct.pack(">HH", 60, 999)))
    close = rc.expect_close()
    if close is not None:
        check(close.reply_code in (503, 540), "connection.close 503/540", close.reply_code)
    check(rc.wait_eof(3), "connection terminated", "still open")


@case("frame/unknown-class-id-terminates-connection", A)
def unknown_class(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send(raw_frame(1, 1, struct.pack(">HH", 99, 10)))
    close = rc.expect_close()
    if close is not None:
        check(close.reply_code in (503, 540), "connection.close 503/540", close.reply_code)
    check(rc.wait_eof(3), "connection terminated", "still open")


@case("frame/bad-field-table-type-terminates-connection", A)
def bad_field_table(ctx: Context) -> None:
    """A field table with an unknown value type ('Z') cannot be decoded. RabbitMQ 3.10.8
    drops the TCP connection (its parser crashes); 501/502 would also be acceptable."""
    rc = _opened(ctx)
    table = b"\x01k" + b"Z" + b"abc"
    payload = (struct.pack(">HHH", 50, 10, 0) + bytes([3]) + b"abc" + bytes([0])
               + struct.pack(">I", len(table)) + table)
    rc.send(raw_frame(1, 1, payload))
    close = rc.expect_close()
    if close is not None:
        check(close.reply_code in (501, 502), "connection.close 501/502", close.reply_code)
    check(rc.wait_eof(3), "connection terminated", "still open")


@case("channel/method-on-unopened-channel-504-CHANNEL_ERROR", A)
def unopened_channel(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Queue.Declare(queue="", exclusive=True), 5)
    _closed_with(rc, 504, "CHANNEL_ERROR")


@case("channel/channel-class-method-on-channel-0-504-CHANNEL_ERROR", A)
def channel_open_on_zero(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Channel.Open(), 0)
    _closed_with(rc, 504)


@case("channel/basic-method-on-channel-0-504-CHANNEL_ERROR", A)
def basic_on_zero(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Basic.Qos(), 0)
    _closed_with(rc, 504)


@case("channel/connection-method-on-channel-1-503-COMMAND_INVALID", A)
def connection_method_on_channel(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Connection.Tune(), 1)
    _closed_with(rc, 503)


@case("channel.open/second-open-on-same-channel-504-CHANNEL_ERROR", A)
def double_open(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Channel.Open(), 1)
    _closed_with(rc, 504, "CHANNEL_ERROR")


@case("channel-max/opening-more-channels-than-negotiated-530-NOT_ALLOWED", A)
def channel_max_exceeded(ctx: Context) -> None:
    """channel_max limits how many channels are open at once. RabbitMQ counts open
    channels (it accepts any channel number) and refuses the (max+1)th with 530."""
    rc = ctx.raw()
    rc.handshake(channel_max=3)
    for n in (1, 2, 3):
        rc.open_channel(n)
    rc.send_method(C.Channel.Open(), 4)
    _closed_with(rc, 530, "NOT_ALLOWED")


@case("channel-max/closed-channels-free-their-slot", A)
def channel_max_reuse(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(channel_max=2)
    rc.open_channel(1)
    rc.open_channel(2)
    r = rc.rpc(C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 2,
               (C.Channel.CloseOk,))
    check(isinstance(r, C.Channel.CloseOk), "channel.close-ok", r)
    rc.open_channel(2)


@case("basic.publish/immediate-true-540-NOT_IMPLEMENTED", A)
def immediate(ctx: Context) -> None:
    """RabbitMQ dropped 'immediate' in 3.0: a connection error 540."""
    rc = _opened(ctx)
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key="x", immediate=True), 1)
            + marshal_header(1, 0))
    _closed_with(rc, 540, "NOT_IMPLEMENTED")


@case("basic.qos/prefetch-size-nonzero-540-NOT_IMPLEMENTED", A)
def qos_size(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Basic.Qos(prefetch_size=1000), 1)
    _closed_with(rc, 540, "NOT_IMPLEMENTED")


@case("basic.recover/requeue-false-540-NOT_IMPLEMENTED", A)
def recover_false(ctx: Context) -> None:
    rc = _opened(ctx)
    rc.send_method(C.Basic.Recover(requeue=False), 1)
    _closed_with(rc, 540, "NOT_IMPLEMENTED")


@case("channel.flow/active-false-540-NOT_IMPLEMENTED", A)
def flow_false(ctx: Context) -> None:
    """RabbitMQ does not let consumers stop the flow with channel.flow; use basic.qos."""
    rc = _opened(ctx)
    rc.send_method(C.Channel.Flow(active=False), 1)
    _closed_with(rc, 540, "NOT_IMPLEMENTED")


@case("channel.close/frames-after-server-close-discarded-until-close-ok", A)
def discard_after_close(ctx: Context) -> None:
    """After the broker sends channel.close it ignores that channel's frames until
    close-ok; then the channel number can be opened again."""
    rc = _opened(ctx)
    r = rc.rpc(C.Queue.Declare(queue=ctx.name(), passive=True), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Channel.Close), "channel.close", r)
    eq(r.reply_code, 404, "channel.close code")
    rc.send_method(C.Queue.Declare(queue=ctx.name(), passive=True), 1)  # discarded
    rc.send_method(C.Channel.CloseOk(), 1)
    rc.open_channel(1)
    r = rc.rpc(C.Basic.Qos(prefetch_count=1), 1, (C.Basic.QosOk,))
    check(isinstance(r, C.Basic.QosOk), "basic.qos-ok on the reopened channel", r)


@case("frame/multi-frame-body-reassembled", A)
def multi_frame_body(ctx: Context) -> None:
    rc = _opened(ctx, frame_max=4096)
    q = ctx.name()
    ctx.track_queue(q)
    r = rc.rpc(C.Queue.Declare(queue=q), 1, (C.Queue.DeclareOk,))
    check(isinstance(r, C.Queue.DeclareOk), "queue.declare-ok", r)
    body = bytes(i % 251 for i in range(20000))
    rc.publish(1, "", q, body)
    ch = ctx.channel()
    eq(ctx.must_get(ch, q).body, body, "body")


@case("frame/zero-size-body-needs-no-body-frame", A)
def zero_body(ctx: Context) -> None:
    """A message with body-size 0 is complete after its content header."""
    rc = _opened(ctx)
    q = ctx.name()
    ctx.track_queue(q)
    rc.rpc(C.Queue.Declare(queue=q), 1, (C.Queue.DeclareOk,))
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1)
            + marshal_header(1, 0))
    ch = ctx.channel()
    eq(ctx.must_get(ch, q).body, b"", "body")


@case("frame/heartbeat-frames-accepted-any-time-on-channel-0", A)
def heartbeat_mid_content(ctx: Context) -> None:
    """Heartbeat frames may arrive between the frames of a message."""
    rc = _opened(ctx)
    q = ctx.name()
    ctx.track_queue(q)
    rc.rpc(C.Queue.Declare(queue=q), 1, (C.Queue.DeclareOk,))
    hb = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1) + hb
            + marshal_header(1, 3) + hb + marshal_body(1, b"abc"))
    ch = ctx.channel()
    eq(ctx.must_get(ch, q).body, b"abc", "body")


@case("frame/interleaved-content-on-two-channels", A)
def interleaved(ctx: Context) -> None:
    """Content frames of different channels may interleave; each channel assembles its own."""
    rc = _opened(ctx)
    rc.open_channel(2)
    q = ctx.name()
    ctx.track_queue(q)
    rc.rpc(C.Queue.Declare(queue=q), 1, (C.Queue.DeclareOk,))
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1)
            + marshal_method(C.Basic.Publish(exchange="", routing_key=q), 2)
            + marshal_header(1, 2) + marshal_header(2, 2)
            + marshal_body(2, b"c2") + marshal_body(1, b"c1"))
    ch = ctx.channel()
    got = sorted(m.body for m in [ctx.must_get(ch, q), ctx.must_get(ch, q)])
    eq(got, [b"c1", b"c2"], "bodies")


@case("basic.publish/body-above-max-message-size-406-PRECONDITION_FAILED", A, slow=True)
def max_message_size(ctx: Context) -> None:
    """A message larger than max_message_size (RabbitMQ default 128 MiB) closes the channel
    with 406 (RabbitMQ never uses 311 CONTENT_TOO_LARGE)."""
    rc = _opened(ctx)
    q = ctx.name()
    ctx.track_queue(q)
    rc.rpc(C.Queue.Declare(queue=q), 1, (C.Queue.DeclareOk,))
    n = 134217728 + 1
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key=q), 1)
            + marshal_header(1, n))
    chunk = b"x" * (rc.frame_max - 8)
    sent = 0
    while sent < n:
        k = min(len(chunk), n - sent)
        rc.send(raw_frame(3, 1, chunk[:k]))
        sent += k
    f = rc.read_until((C.Channel.Close, C.Connection.Close), timeout=20)
    eq((f.value.name, f.value.reply_code), ("Channel.Close", 406), "reply")
    check("max size" in f.value.reply_text, "text mentioning the max size", f.value.reply_text)


@case("frame/body-overrunning-declared-size-then-method-505-or-501", A)
def body_overrun(ctx: Context) -> None:
    """Body frames carrying more than the content header's body-size. RabbitMQ 3.10.8 keeps
    waiting for "the rest" of the body and closes with 505 UNEXPECTED_FRAME when the next
    method arrives; an immediate 501 FRAME_ERROR is accepted too."""
    rc = _opened(ctx)
    rc.send(marshal_method(C.Basic.Publish(exchange="", routing_key="nowhere"), 1)
            + marshal_header(1, 3) + marshal_body(1, b"hello")
            + marshal_method(C.Basic.Qos(prefetch_count=1), 1))
    close = rc.expect_close()
    if close is None:
        raise CaseFailure("connection.close 505 or 501", "socket closed without close")
    check(close.reply_code in (501, 505), "connection.close 505 or 501",
          f"{close.reply_code} {close.reply_text}")
