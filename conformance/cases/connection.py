"""Connection class: handshake, SASL, tune, open, close, heartbeats, update-secret."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions as pex
from pamqp import commands as C
from pamqp import encode

from conformance.framework import CaseFailure, Context, case, check, eq
from conformance.rawclient import PROTOCOL_HEADER, RawClosed, RawConnectionClosed, RawTimeout

A = "connection"


def _start(ctx: Context) -> C.Connection.Start:
    rc = ctx.raw()
    rc.send(PROTOCOL_HEADER)
    return rc.read_until((C.Connection.Start,)).value


@case("connection.start/version-0-9", A)
def start_version(ctx: Context) -> None:
    """connection.start carries version-major 0, version-minor 9."""
    s = _start(ctx)
    eq((s.version_major, s.version_minor), (0, 9), "version")


@case("connection.start/mechanisms-include-PLAIN", A)
def start_plain(ctx: Context) -> None:
    s = _start(ctx)
    mechs = str(s.mechanisms).split()
    check("PLAIN" in mechs, "PLAIN among mechanisms", mechs)


@case("connection.start/mechanisms-include-AMQPLAIN", A)
def start_amqplain(ctx: Context) -> None:
    s = _start(ctx)
    mechs = str(s.mechanisms).split()
    check("AMQPLAIN" in mechs, "AMQPLAIN among mechanisms", mechs)


@case("connection.start/locales-include-en_US", A)
def start_locales(ctx: Context) -> None:
    s = _start(ctx)
    check("en_US" in str(s.locales).split(), "en_US among locales", s.locales)


@case("connection.start/server-properties-product-version-platform", A)
def start_props(ctx: Context) -> None:
    s = _start(ctx)
    props = s.server_properties or {}
    for key in ("product", "version", "platform", "capabilities"):
        check(key in props, f"server-properties key {key!r}", sorted(props))


for _cap in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
             "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
             "authentication_failure_close", "per_consumer_qos", "direct_reply_to"):

    def _cap_case(ctx: Context, cap: str = _cap) -> None:
        props: dict[str, Any] = dict(_start(ctx).server_properties or {})
        caps: dict[str, Any] = props.get("capabilities") or {}
        check(caps.get(cap) is True, f"capabilities.{cap} = true", caps.get(cap))

    case(f"connection.start/capability-{_cap}", A)(_cap_case)


@case("connection.start-ok/plain-login-opens", A)
def plain_login(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)


@case("connection.start-ok/amqplain-login-opens", A)
def amqplain_login(ctx: Context) -> None:
    rc = ctx.raw()
    resp = encode.field_table({"LOGIN": ctx.user, "PASSWORD": ctx.password})[4:]
    rc.handshake(mechanism="AMQPLAIN", response=resp, vhost=ctx.vhost)
    rc.open_channel(1)


@case("connection.start-ok/bad-password-403-with-authentication_failure_close", A)
def bad_password(ctx: Context) -> None:
    """With the client capability authentication_failure_close the broker says why:
    connection.close 403 ACCESS_REFUSED (RabbitMQ)."""
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(user=ctx.user, password="wrong-" + ctx.password, vhost=ctx.vhost)
    except RawConnectionClosed as exc:
        eq(exc.close.reply_code, 403, "reply code")
        check("ACCESS_REFUSED" in exc.close.reply_text, "ACCESS_REFUSED text",
              exc.close.reply_text)
        return
    raise CaseFailure("connection.close 403", "the connection opened")


@case("connection.start-ok/bad-password-without-capability-closes-socket", A, slow=True)
def bad_password_nocap(ctx: Context) -> None:
    """Without authentication_failure_close the broker just drops the TCP connection."""
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(password="wrong", capabilities={"authentication_failure_close": False})
    except RawClosed:
        return
    except RawConnectionClosed as exc:
        raise CaseFailure("socket closed", f"connection.close {exc.close.reply_code}")
    raise CaseFailure("socket closed", "the connection opened")


@case("connection.start-ok/unknown-mechanism-refused", A, slow=True)
def bad_mechanism(ctx: Context) -> None:
    """An unknown SASL mechanism never opens a connection (RabbitMQ: socket closed)."""
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(mechanism="NOPE-MECH")
    except (RawClosed, RawConnectionClosed):
        return
    raise CaseFailure("refusal", "the connection opened")


@case("connection.secure/not-sent-for-PLAIN", A)
def no_secure(ctx: Context) -> None:
    """PLAIN is a single-step mechanism: start-ok is answered by tune, never secure."""
    rc = ctx.raw()
    rc.send(PROTOCOL_HEADER)
    rc.read_until((C.Connection.Start,))
    rc.send_method(C.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                        response=f"\0{ctx.user}\0{ctx.password}",
                                        locale="en_US"))
    f = rc.read_frame()
    check(isinstance(f.value, C.Connection.Tune), "connection.tune", f)


@case("connection.tune/defaults-frame-max-131072-channel-max-2047-heartbeat-60", A)
def tune_defaults(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(open_vhost=False)
    t = rc.tune
    assert t is not None
    eq((t.frame_max, t.channel_max, t.heartbeat), (131072, 2047, 60), "tune")


@case("connection.tune-ok/frame-max-below-4096-refused", A, slow=True)
def tune_small_frame_max(ctx: Context) -> None:
    """frame-max below the spec minimum of 4096 is a negotiation failure (socket closed)."""
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(frame_max=1024)
        rc.open_channel(1)
    except (RawClosed, RawConnectionClosed):
        return
    raise CaseFailure("the connection refused", "channel opened with frame_max 1024")


@case("connection.tune-ok/frame-max-above-server-max-refused", A, slow=True)
def tune_big_frame_max(ctx: Context) -> None:
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(frame_max=1_000_000)
        rc.open_channel(1)
    except (RawClosed, RawConnectionClosed):
        return
    raise CaseFailure("the connection refused", "channel opened with frame_max 1000000")


@case("connection.tune-ok/channel-max-above-server-max-refused", A, slow=True)
def tune_big_channel_max(ctx: Context) -> None:
    rc = ctx.raw(timeout=8)
    try:
        rc.handshake(channel_max=65535)
        rc.open_channel(1)
    except (RawClosed, RawConnectionClosed):
        return
    raise CaseFailure("the connection refused", "channel opened with channel_max 65535")


@case("connection.tune-ok/smaller-frame-max-splits-deliveries", A)
def tune_frame_max_respected(ctx: Context) -> None:
    """The broker must not send frames larger than the frame-max the client chose."""
    ch = ctx.channel()
    q = ctx.queue(ch)
    body = bytes(range(256)) * 40  # 10240 bytes
    ch.basic_publish("", q, body)
    rc = ctx.raw()
    rc.handshake(frame_max=4096)
    rc.open_channel(1)
    rc.send_method(C.Basic.Get(queue=q, no_ack=True), 1)
    rc.read_until((C.Basic.GetOk,))
    hdr = rc.read_frame()
    eq(hdr.value.body_size, len(body), "content header body-size")
    got = b""
    while len(got) < len(body):
        f = rc.read_frame()
        check(len(f.payload) + 8 <= 4096, "body frames <= frame_max 4096",
              len(f.payload) + 8)
        got += f.payload
    eq(got, body, "reassembled body")


@case("connection.open/unknown-vhost-530-NOT_ALLOWED", A)
def open_bad_vhost(ctx: Context) -> None:
    rc = ctx.raw()
    try:
        rc.handshake(vhost="/conformance-no-such-vhost")
    except RawConnectionClosed as exc:
        eq(exc.close.reply_code, 530, "reply code")
        return
    raise CaseFailure("connection.close 530", "connection.open-ok")


@case("connection.open/pika-unknown-vhost-raises", A)
def open_bad_vhost_pika(ctx: Context) -> None:
    params = pika.URLParameters(ctx.settings.url)
    params.virtual_host = "conformance-missing-vhost"
    params.connection_attempts = 1
    try:
        conn = pika.BlockingConnection(params)
    except pex.ProbableAccessDeniedError:
        return
    except pex.ConnectionClosedByBroker as exc:
        eq(exc.reply_code, 530, "reply code")
        return
    conn.close()
    raise CaseFailure("a refused connection", "an open connection")


@case("connection.open/second-open-504-CHANNEL_ERROR", A)
def open_twice(ctx: Context) -> None:
    """connection.open after the connection is open is an unexpected method (504)."""
    rc = ctx.raw()
    rc.handshake()
    rc.send_method(C.Connection.Open(virtual_host="/"))
    close = rc.expect_close()
    check(close is not None, "connection.close", "socket closed")
    assert close is not None
    eq(close.reply_code, 504, "reply code")


@case("connection.tune-ok/before-start-ok-refused", A, slow=True)
def tune_before_start_ok(ctx: Context) -> None:
    rc = ctx.raw(timeout=8)
    rc.send(PROTOCOL_HEADER)
    rc.read_until((C.Connection.Start,))
    rc.send_method(C.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0))
    check(rc.wait_eof(8), "the broker to drop the connection", "it stayed open")


@case("connection.open/before-tune-ok-refused", A, slow=True)
def open_before_tune_ok(ctx: Context) -> None:
    rc = ctx.raw(timeout=8)
    rc.send(PROTOCOL_HEADER)
    rc.read_until((C.Connection.Start,))
    rc.send_method(C.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                        response=f"\0{ctx.user}\0{ctx.password}",
                                        locale="en_US"))
    rc.read_until((C.Connection.Tune,))
    rc.send_method(C.Connection.Open(virtual_host=ctx.vhost))
    check(rc.wait_eof(8), "the broker to drop the connection", "it stayed open")


@case("connection.close/client-close-answered-with-close-ok", A)
def client_close(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake()
    r = rc.rpc(C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0,
               (C.Connection.CloseOk,))
    check(isinstance(r, C.Connection.CloseOk), "connection.close-ok", r)
    # The peer that sent close closes the socket (spec 4.2.2); the broker need not.


@case("connection.close/close-with-open-channels-ok", A)
def close_with_channels(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake()
    for n in (1, 2, 3):
        rc.open_channel(n)
    r = rc.rpc(C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0,
               (C.Connection.CloseOk,))
    check(isinstance(r, C.Connection.CloseOk), "connection.close-ok", r)


@case("connection.close-ok/server-close-carries-failing-method-ids", A)
def close_method_ids(ctx: Context) -> None:
    """A connection exception names the class and method that caused it (channel.open)."""
    rc = ctx.raw()
    rc.handshake()
    rc.open_channel(1)
    rc.send_method(C.Channel.Open(), 1)
    close = rc.expect_close()
    assert close is not None, "connection.close"
    eq((close.class_id, close.method_id), (20, 10), "class-id/method-id")


@case("connection.heartbeat/broker-sends-heartbeats", A)
def heartbeat_sent(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(heartbeat=1)
    t0 = time.monotonic()
    f = rc.read_frame(timeout=3)
    eq(f.type, 8, "frame type (heartbeat)")
    eq(f.channel, 0, "heartbeat channel")
    check(time.monotonic() - t0 < 3, "a heartbeat within 3 s", "none")


@case("connection.heartbeat/zero-disables-heartbeats", A)
def heartbeat_off(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(heartbeat=0)
    try:
        f = rc.read_frame(timeout=2.5)
    except RawTimeout:
        return
    raise CaseFailure("silence with heartbeat=0", f)


@case("connection.heartbeat/missed-heartbeats-close-connection", A, slow=True)
def heartbeat_timeout(ctx: Context) -> None:
    """A client that stays silent for two heartbeat intervals is disconnected."""
    rc = ctx.raw(timeout=8)
    rc.handshake(heartbeat=1)
    t0 = time.monotonic()
    check(rc.wait_eof(8), "disconnect within 8 s", "still connected")
    check(time.monotonic() - t0 >= 1.0, "not before one interval", time.monotonic() - t0)


@case("connection.heartbeat/client-heartbeats-keep-connection-alive", A, slow=True)
def heartbeat_alive(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(heartbeat=1)
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        rc.send(b"\x08\x00\x00\x00\x00\x00\x00\xce")
        try:
            rc.read_frame(timeout=0.5)
        except RawTimeout:
            pass
    rc.open_channel(1)


@case("connection.update-secret/answered-with-update-secret-ok", A)
def update_secret(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake()
    r = rc.rpc(C.Connection.UpdateSecret(new_secret=ctx.password, reason="rotate"), 0,
               (C.Connection.UpdateSecretOk,))
    check(isinstance(r, C.Connection.UpdateSecretOk), "connection.update-secret-ok", r)


@case("connection.blocked/client-capability-accepted", A)
def blocked_capability(ctx: Context) -> None:
    """A client announcing connection.blocked gets a working connection (the broker may
    later send connection.blocked/unblocked; nothing is blocked at rest)."""
    conn = ctx.connect()
    blocked: list[object] = []
    conn.add_on_connection_blocked_callback(lambda *_: blocked.append(1))
    ch = conn.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"x")
    ctx.must_get(ch, q)
    eq(blocked, [], "connection.blocked received at rest")


@case("connection/channel-error-leaves-other-channels-working", A)
def channel_isolation(ctx: Context) -> None:
    conn = ctx.connect()
    ch1, ch2 = conn.channel(), conn.channel()
    q = ctx.queue(ch2)
    ctx.channel_error(ch1, lambda: ch1.queue_declare(ctx.name(), passive=True), 404)
    ch2.basic_publish("", q, b"still")
    eq(ctx.must_get(ch2, q).body, b"still", "body on the other channel")


@case("connection/many-connections-in-parallel", A)
def many_connections(ctx: Context) -> None:
    conns = [ctx.connect() for _ in range(10)]
    for c in conns:
        c.channel()
    check(all(c.is_open for c in conns), "10 open connections", [c.is_open for c in conns])


@case("connection.close/closing-connection-deletes-exclusive-queues", A)
def close_deletes_exclusive(ctx: Context) -> None:
    c1 = ctx.connect()
    q = ctx.queue(c1.channel(), exclusive=True)
    c1.close()
    ch = ctx.channel()
    deadline = time.monotonic() + 2
    while True:
        try:
            ch.queue_declare(q, passive=True)
        except pex.ChannelClosedByBroker as exc:
            eq(exc.reply_code, 404, "passive declare after owner closed")
            return
        if time.monotonic() > deadline:
            raise CaseFailure("exclusive queue deleted with its connection", "queue exists")
        time.sleep(0.05)


@case("connection.secure-ok/instead-of-start-ok-refused", A, slow=True)
def secure_ok_unsolicited(ctx: Context) -> None:
    """secure-ok is only valid as the answer to connection.secure; sent instead of
    start-ok it is a handshake violation (RabbitMQ drops the connection)."""
    rc = ctx.raw(timeout=8)
    rc.send(PROTOCOL_HEADER)
    rc.read_until((C.Connection.Start,))
    rc.send_method(C.Connection.SecureOk(response="x"))
    try:
        f = rc.read_frame(timeout=8)
    except RawClosed:
        return
    if isinstance(f.value, C.Connection.Close):
        return
    raise CaseFailure("the connection refused", f)


def _blocked_publisher(ctx: Context) -> tuple[Any, list[str], list[str]]:
    conn = ctx.connect()
    blocked: list[str] = []
    unblocked: list[str] = []
    conn.add_on_connection_blocked_callback(
        lambda _c, m: blocked.append(str(getattr(m.method, "reason", ""))))
    conn.add_on_connection_unblocked_callback(lambda _c, m: unblocked.append("unblocked"))
    return conn, blocked, unblocked


@case("connection.blocked/resource-alarm-blocks-publishing-connection", A, exclusive=True)
def blocked_on_alarm(ctx: Context) -> None:
    """With a resource alarm in effect a publishing connection gets connection.blocked
    (needs --alarm-cmd/--clear-alarm-cmd)."""
    conn, blocked, _ = _blocked_publisher(ctx)
    ch = conn.channel()
    q = ctx.queue(ch)
    ctx.on_cleanup(lambda: ctx.admin("clear_alarm_cmd"))
    ctx.admin("alarm_cmd")
    ch.basic_publish("", q, b"during-alarm")
    ctx.pump(conn, lambda: bool(blocked), 15)
    check(bool(blocked), "connection.blocked", "nothing within 15 s")
    ctx.note(f"Connection.Blocked reason={blocked[0]!r}")


@case("connection.unblocked/sent-when-alarm-clears-and-held-publish-delivered", A,
      exclusive=True)
def unblocked_after_alarm(ctx: Context) -> None:
    conn, blocked, unblocked = _blocked_publisher(ctx)
    ch = conn.channel()
    q = ctx.queue(ch)
    ctx.on_cleanup(lambda: ctx.admin("clear_alarm_cmd"))
    ctx.admin("alarm_cmd")
    ch.basic_publish("", q, b"held")
    ctx.pump(conn, lambda: bool(blocked), 15)
    check(bool(blocked), "connection.blocked", "nothing within 15 s")
    ctx.admin("clear_alarm_cmd")
    ctx.pump(conn, lambda: bool(unblocked), 15)
    check(bool(unblocked), "connection.unblocked", "nothing within 15 s")
    eq(ctx.must_get(ch, q, timeout=5).body, b"held", "the publish held during the alarm")


@case("connection.start-ok/consumer_cancel_notify-false-means-no-basic-cancel", A)
def no_cancel_notify(ctx: Context) -> None:
    """A client that does not announce consumer_cancel_notify gets no basic.cancel when its
    queue is deleted (the consumer just stops receiving)."""
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost,
                 capabilities={"consumer_cancel_notify": False})
    rc.open_channel(1)
    q = ctx.queue(ctx.channel())
    r = rc.rpc(C.Basic.Consume(queue=q, consumer_tag="c1", no_ack=True), 1,
               (C.Basic.ConsumeOk,))
    check(isinstance(r, C.Basic.ConsumeOk), "basic.consume-ok", r)
    ctx.channel().queue_delete(q)
    try:
        f = rc.read_frame(timeout=1.0)
    except RawTimeout:
        return
    raise CaseFailure("no frame (no basic.cancel)", f)


@case("connection.start-ok/consumer_cancel_notify-true-gets-basic-cancel", A)
def cancel_notify(ctx: Context) -> None:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost,
                 capabilities={"consumer_cancel_notify": True})
    rc.open_channel(1)
    q = ctx.queue(ctx.channel())
    rc.rpc(C.Basic.Consume(queue=q, consumer_tag="c1", no_ack=True), 1, (C.Basic.ConsumeOk,))
    ctx.channel().queue_delete(q)
    f = rc.read_until((C.Basic.Cancel,), timeout=3)
    eq(f.value.consumer_tag, "c1", "basic.cancel consumer tag")


@case("connection.close/frames-after-client-close-ignored-until-close-ok", A)
def after_client_close(ctx: Context) -> None:
    """After sending connection.close a peer must discard all but close/close-ok; the
    broker still answers with close-ok."""
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    rc.send_method(C.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                      method_id=0))
    rc.send_method(C.Queue.Declare(queue="", exclusive=True), 1)
    f = rc.read_until((C.Connection.CloseOk, C.Queue.DeclareOk), timeout=3)
    check(isinstance(f.value, C.Connection.CloseOk), "connection.close-ok", f)


@case("connection.start/server-properties-cluster-name-and-information", A)
def start_more_props(ctx: Context) -> None:
    props = _start(ctx).server_properties or {}
    for key in ("cluster_name", "copyright", "information"):
        check(key in props, f"server-properties key {key!r}", sorted(props))


@case("connection.blocked/consumers-keep-consuming-during-alarm", A, exclusive=True)
def consumers_during_alarm(ctx: Context) -> None:
    """An alarm blocks publishers only: a connection that just consumes is not blocked
    and keeps receiving, which is what lets the broker drain."""
    ch0 = ctx.channel()
    q = ctx.queue(ch0)
    ch0.basic_publish("", q, b"queued-before-alarm")
    ctx.sync(ch0)
    consumer, consumer_blocked, _ = _blocked_publisher(ctx)
    cch = consumer.channel()
    publisher, blocked, _ = _blocked_publisher(ctx)
    pch = publisher.channel()
    ctx.on_cleanup(lambda: ctx.admin("clear_alarm_cmd"))
    ctx.admin("alarm_cmd")
    pch.basic_publish("", ctx.name("nowhere"), b"during-alarm")
    ctx.pump(publisher, lambda: bool(blocked), 15)
    check(bool(blocked), "the publisher blocked (alarm in effect)", "nothing within 15 s")
    _, got = ctx.consume(cch, q, 1, timeout=5, auto_ack=True)
    eq([m.body for m in got], [b"queued-before-alarm"], "consumed during the alarm")
    eq(consumer_blocked, [], "connection.blocked sent to the consumer-only connection")
