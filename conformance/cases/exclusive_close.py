"""Exclusive queues are gone when their owner is gone (issue 33).

A test runner that opens one connection per test, consumes from two exclusive queues
and closes the connection in the test's teardown must be able to declare the same
names, exclusive, on the next test's new connection at once. RabbitMQ 3.10.8 accepts
that redeclare every time, whichever way the first connection ends: a connection.close
answered by close-ok, a close whose close-ok nobody waits for, a dropped socket, or a
channel.close first. Each case keeps consumers (with unacknowledged deliveries) on both
queues of the owner, then redeclares both names from a connection opened after the
close, with no pause in between.
"""

from __future__ import annotations

from collections.abc import Callable

from pamqp import commands as C

from conformance.framework import CaseFailure, Context, case, check
from conformance.rawclient import RawClient, RawClosed, RawTimeout

QUEUES = 2  # the reported client consumed from queue-1 and queue-2
MESSAGES = 3  # delivered, unacknowledged, on each queue when the owner goes


def _owner(ctx: Context, names: list[str], channels: int) -> RawClient:
    """A connection that declares each name exclusive, publishes to it and consumes from
    it with manual acks (queue i on channel 1 + i % channels), then reads every delivery
    so they are all unacknowledged in the broker when the connection goes."""
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    for ch in range(1, channels + 1):
        rc.open_channel(ch)
    for i, name in enumerate(names):
        ch = 1 + i % channels
        ok = rc.rpc(C.Queue.Declare(queue=name, exclusive=True), ch, (C.Queue.DeclareOk,))
        check(isinstance(ok, C.Queue.DeclareOk), "queue.declare-ok", ok, name)
        ok = rc.rpc(C.Basic.Consume(queue=name, consumer_tag=f"ctag-{i}"), ch,
                    (C.Basic.ConsumeOk,))
        check(isinstance(ok, C.Basic.ConsumeOk), "basic.consume-ok", ok, name)
    # published once every consumer is there: rpc() would skip deliveries in between
    for i, name in enumerate(names):
        for n in range(MESSAGES):
            rc.publish(1 + i % channels, "", name, b"m%d" % n)
    delivered = 0
    while delivered < MESSAGES * len(names):
        if isinstance(rc.read_frame().value, C.Basic.Deliver):
            delivered += 1
    return rc


def _redeclare(ctx: Context, names: list[str]) -> None:
    """A new connection declares every name exclusive: declare-ok each time, never 405."""
    rc = ctx.raw()
    try:
        rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
        rc.open_channel(1)
        for name in names:
            r = rc.rpc(C.Queue.Declare(queue=name, exclusive=True), 1, (C.Queue.DeclareOk,))
            if not isinstance(r, C.Queue.DeclareOk):
                raise CaseFailure(f"queue.declare-ok for {name!r} on a new connection",
                                  f"{type(r).__name__} {getattr(r, 'reply_code', '')} "
                                  f"{getattr(r, 'reply_text', '')}")
            check(r.message_count == 0, "a new, empty queue", r.message_count, name)
    finally:
        rc.close()


def _close_ok(rc: RawClient) -> None:
    """Wait for connection.close-ok, skipping what was in flight before it."""
    for _ in range(1000):
        if isinstance(rc.read_frame().value, C.Connection.CloseOk):
            return
    raise CaseFailure("connection.close-ok", "1000 other frames")


def _close(rc: RawClient) -> None:
    rc.send_method(C.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                      method_id=0))


def _close_and_wait(rc: RawClient) -> None:
    _close(rc)
    _close_ok(rc)


def _ends(ctx: Context, channels: int, end: Callable[[RawClient], None]) -> None:
    names = [ctx.name(f"queue-{i + 1}") for i in range(QUEUES)]
    owner = _owner(ctx, names, channels)
    try:
        end(owner)
        _redeclare(ctx, names)
    finally:
        owner.close()


@case("queue.declare/exclusive-consumed-queues-gone-at-connection-close", "queue")
def gone_at_close(ctx: Context) -> None:
    """connection.close, close-ok, then a new connection redeclares both queues."""
    _ends(ctx, 1, _close_and_wait)


@case("queue.declare/exclusive-consumed-queues-gone-at-close-on-two-channels", "queue")
def gone_at_close_two_channels(ctx: Context) -> None:
    """The same with each queue consumed on its own channel."""
    _ends(ctx, 2, _close_and_wait)


@case("queue.declare/exclusive-consumed-queues-gone-close-ok-not-awaited", "queue")
def gone_close_ok_not_awaited(ctx: Context) -> None:
    """connection.close sent, the socket closed without reading close-ok."""
    def end(rc: RawClient) -> None:
        _close(rc)
        rc.close()
    _ends(ctx, 1, end)


@case("queue.declare/exclusive-consumed-queues-gone-at-socket-drop", "queue")
def gone_at_socket_drop(ctx: Context) -> None:
    """The socket closed with no connection.close at all."""
    _ends(ctx, 2, lambda rc: rc.close())


@case("queue.declare/exclusive-consumed-queues-gone-channel-close-then-connection-close",
      "queue")
def gone_channel_close_first(ctx: Context) -> None:
    """channel.close (its consumers cancelled) and then connection.close, each answered,
    as a client's teardown closes its channel before its connection."""
    def end(rc: RawClient) -> None:
        rc.send_method(C.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                       method_id=0), 1)
        for _ in range(1000):
            try:
                if isinstance(rc.read_frame().value, C.Channel.CloseOk):
                    break
            except (RawClosed, RawTimeout) as exc:
                raise CaseFailure("channel.close-ok", repr(exc)) from exc
        _close_and_wait(rc)
    _ends(ctx, 1, end)


@case("queue.declare/exclusive-queues-gone-after-pika-teardown", "clients")
def gone_after_pika_teardown(ctx: Context) -> None:
    """The reported pattern with a real client (pika): one connection consumes from two
    exclusive queues, its teardown closes it, the next connection declares them again."""
    names = [ctx.name(f"queue-{i + 1}") for i in range(QUEUES)]
    for _round in range(3):
        conn = ctx.connect()
        ch = conn.channel()
        for name in names:
            ch.queue_declare(name, exclusive=True)
            ch.basic_publish("", name, b"m")
            ch.basic_consume(name, lambda *_a: None)
        conn.process_data_events(time_limit=0.1)
        conn.close()
