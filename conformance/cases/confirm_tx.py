"""Confirm and Tx classes: publisher confirms and transactions."""

from __future__ import annotations

import time
from typing import Any

import pika
from pamqp import commands as C
from pika.adapters.blocking_connection import BlockingChannel

from conformance.framework import CaseFailure, Context, case, check, eq
from conformance.rawclient import RawClient, marshal_body, marshal_header, marshal_method

CF = "confirm"
TX = "tx"


def _raw(ctx: Context) -> RawClient:
    rc = ctx.raw()
    rc.handshake(user=ctx.user, password=ctx.password, vhost=ctx.vhost)
    rc.open_channel(1)
    return rc


def _pub(rc: RawClient, q: str, body: bytes = b"c", exchange: str = "",
         mandatory: bool = False, props: C.Basic.Properties | None = None) -> None:
    rc.send(marshal_method(C.Basic.Publish(exchange=exchange, routing_key=q,
                                           mandatory=mandatory), 1)
            + marshal_header(1, len(body), props) + marshal_body(1, body))


def acks_until(rc: RawClient, n: int, timeout: float = 5.0) -> list[tuple[str, int, bool]]:
    """Collect basic.ack/nack until tags up to *n* are settled."""
    out: list[tuple[str, int, bool]] = []
    settled = 0
    deadline = time.monotonic() + timeout
    while settled < n:
        f = rc.read_frame(max(0.01, deadline - time.monotonic()))
        v = f.value
        if isinstance(v, (C.Basic.Ack, C.Basic.Nack)):
            out.append((type(v).__name__, v.delivery_tag, v.multiple))
            settled = max(settled, v.delivery_tag)
        elif isinstance(v, (C.Channel.Close, C.Connection.Close)):
            raise CaseFailure("acks", f"{v.name} {v.reply_code} {v.reply_text}")
    return out


@case("confirm.select/select-ok", CF)
def select_ok(ctx: Context) -> None:
    rc = _raw(ctx)
    r = rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    check(isinstance(r, C.Confirm.SelectOk), "confirm.select-ok", r)


@case("confirm.select/nowait-then-publishes-are-acked", CF)
def select_nowait(ctx: Context) -> None:
    q = ctx.queue()
    rc = _raw(ctx)
    rc.send_method(C.Confirm.Select(nowait=True), 1)
    _pub(rc, q)
    acks = acks_until(rc, 1)
    eq(acks[0][:2], ("Ack", 1), "first confirm")


@case("confirm.select/select-twice-ok", CF)
def select_twice(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    r = rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    check(isinstance(r, C.Confirm.SelectOk), "confirm.select-ok again", r)


@case("basic.ack/confirm-tags-start-at-1-one-per-publish", CF)
def confirm_tags(ctx: Context) -> None:
    q = ctx.queue()
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    for _ in range(10):
        _pub(rc, q)
    acks = acks_until(rc, 10)
    check(all(kind == "Ack" for kind, _, _ in acks), "only acks", acks)
    covered: set[int] = set()
    last = 0
    for _, tag, multiple in acks:
        covered.update(range(last + 1, tag + 1) if multiple else [tag])
        last = max(last, tag)
    eq(covered, set(range(1, 11)), "confirmed tags")


@case("basic.ack/confirm-unroutable-is-acked", CF)
def confirm_unroutable(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    _pub(rc, "nobody", exchange=x)
    eq(acks_until(rc, 1)[0][:2], ("Ack", 1), "confirm")


@case("basic.return/mandatory-return-sent-before-ack", CF)
def return_before_ack(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    _pub(rc, "nobody", exchange=x, mandatory=True)
    seen = []
    while True:
        f = rc.read_frame()
        if isinstance(f.value, C.Basic.Return):
            seen.append("return")
        elif isinstance(f.value, C.Basic.Ack):
            seen.append("ack")
            break
    eq(seen, ["return", "ack"], "order")


@case("basic.ack/confirms-with-pika-blocking-publish", CF)
def pika_confirms(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i)
    eq(ch.queue_declare(q, passive=True).method.message_count, 20, "confirmed and queued")


@case("basic.publish/confirm-mode-unroutable-mandatory-raises-in-pika", CF)
def pika_unroutable(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    ch.confirm_delivery()
    try:
        ch.basic_publish(x, "nobody", b"x", mandatory=True)
    except pika.exceptions.UnroutableError:
        return
    raise CaseFailure("UnroutableError (basic.return before ack)", "no error")


@case("confirm.select/on-transactional-channel-406-PRECONDITION_FAILED", CF)
def confirm_on_tx(ctx: Context) -> None:
    ch = ctx.channel()
    ch.tx_select()
    ctx.channel_error(ch, ch.confirm_delivery, 406)


@case("basic.ack/persistent-to-durable-queue-acked", CF)
def confirm_persistent(ctx: Context) -> None:
    q = ctx.queue(durable=True)
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    for _ in range(5):
        _pub(rc, q, props=C.Basic.Properties(delivery_mode=2))
    acks = acks_until(rc, 5)
    check(all(k == "Ack" for k, _, _ in acks), "acks", acks)


@case("basic.ack/fanout-to-many-queues-acked-once", CF)
def confirm_fanout(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    for _ in range(5):
        ctx.bound_queue(ch, x)
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    _pub(rc, "", exchange=x)
    _pub(rc, "", exchange=x)
    acks = acks_until(rc, 2)
    tags = [t for _, t, _ in acks]
    check(tags in ([1, 2], [2]), "one confirm per publish", acks)


@case("basic.nack/confirm-mode-reject-publish-overflow-nacks", CF)
def confirm_nack(ctx: Context) -> None:
    q = ctx.queue(arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    _pub(rc, q, b"1")
    _pub(rc, q, b"2")
    acks = acks_until(rc, 2)
    eq(acks[-1][:2], ("Nack", 2), "second publish")


@case("basic.publish/confirm-mode-missing-exchange-closes-channel-404", CF)
def confirm_missing_exchange(ctx: Context) -> None:
    rc = _raw(ctx)
    rc.rpc(C.Confirm.Select(), 1, (C.Confirm.SelectOk,))
    _pub(rc, "k", exchange=ctx.name("x"))
    f = rc.read_until((C.Channel.Close,))
    eq(f.value.reply_code, 404, "channel.close code")


# -- tx ------------------------------------------------------------------------------


@case("tx.select/select-ok", TX)
def tx_select(ctx: Context) -> None:
    ch = ctx.channel()
    ch.tx_select()


@case("tx.commit/publish-invisible-until-commit", TX)
def tx_commit(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tx = ctx.channel()
    tx.tx_select()
    tx.basic_publish("", q, b"t")
    ctx.get_none(ch, q)
    tx.tx_commit()
    eq(ctx.must_get(ch, q).body, b"t", "after commit")


@case("tx.rollback/discards-publishes", TX)
def tx_rollback(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tx = ctx.channel()
    tx.tx_select()
    tx.basic_publish("", q, b"t")
    tx.tx_rollback()
    tx.tx_commit()
    ctx.get_none(ch, q)


def _acked_in_tx(ctx: Context, ch: BlockingChannel, q: str) -> BlockingChannel:
    """A message published to ``q`` (on ``ch``), then got on a new channel in tx mode
    and acked there, not yet committed: that channel."""
    ch.basic_publish("", q, b"a")
    tx = ctx.channel()
    tx.tx_select()
    m = ctx.must_get(tx, q, auto_ack=False)
    tx.basic_ack(m.method.delivery_tag)
    return tx


@case("tx.commit/acks-applied-at-commit", TX)
def tx_acks(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tx = _acked_in_tx(ctx, ch, q)
    tx.tx_commit()
    tx.close()
    ctx.get_none(ch, q)


@case("tx.rollback/rolled-back-ack-leaves-message-unacked", TX)
def tx_ack_rollback(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tx = _acked_in_tx(ctx, ch, q)
    tx.tx_rollback()
    tx.close()  # still unacked, so closing requeues it
    eq(ctx.must_get(ch, q).method.redelivered, True, "requeued after rollback and close")


@case("tx.commit/reject-publish-refusal-406-partial-tx-completion", TX)
def tx_commit_refused(ctx: Context) -> None:
    """RabbitMQ 3.10.8, asked 2026-12-02: a transaction whose publishes a
    reject-publish queue partly refused commits the rest and answers tx.commit with
    channel.close 406 PRECONDITION_FAILED "partial tx completion"."""
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    tx = ctx.channel()
    tx.tx_select()
    for body in (b"1", b"2", b"3"):
        tx.basic_publish("", q, body)
    ctx.channel_error(tx, tx.tx_commit, 406, "partial tx completion")
    eq(ctx.must_get(ch, q).body, b"1", "the publish the queue took is committed")
    ctx.get_none(ch, q)


@case("tx.commit/without-select-406-PRECONDITION_FAILED", TX)
def commit_no_select(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, ch.tx_commit, 406)


@case("tx.rollback/without-select-406-PRECONDITION_FAILED", TX)
def rollback_no_select(ctx: Context) -> None:
    ch = ctx.channel()
    ctx.channel_error(ch, ch.tx_rollback, 406)


@case("tx.select/on-confirm-channel-406-PRECONDITION_FAILED", TX)
def tx_on_confirm(ctx: Context) -> None:
    ch = ctx.channel()
    ch.confirm_delivery()
    ctx.channel_error(ch, ch.tx_select, 406)


@case("tx.select/select-twice-ok", TX)
def tx_twice(ctx: Context) -> None:
    ch = ctx.channel()
    ch.tx_select()
    ch.tx_select()


@case("tx.commit/commit-order-preserved", TX)
def tx_order(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tx = ctx.channel()
    tx.tx_select()
    for i in range(10):
        tx.basic_publish("", q, b"%d" % i)
    tx.tx_commit()
    eq(ctx.bodies(ch, q), [b"%d" % i for i in range(10)], "order")


@case("tx.commit/empty-commit-ok", TX)
def tx_empty(ctx: Context) -> None:
    ch = ctx.channel()
    ch.tx_select()
    ch.tx_commit()
    ch.tx_rollback()


@case("tx.commit/channel-stays-transactional-after-commit", TX)
def tx_stays(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    tx = ctx.channel()
    tx.tx_select()
    tx.basic_publish("", q, b"1")
    tx.tx_commit()
    tx.basic_publish("", q, b"2")
    ctx.sync(tx)
    eq(ctx.bodies(ch, q), [b"1"], "second publish still pending")
    tx.tx_rollback()


@case("tx.commit/mandatory-unroutable-returned-at-commit", TX)
def tx_return(ctx: Context) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    x = ctx.exchange(ch, "direct")
    returned: list[Any] = []
    ch.add_on_return_callback(lambda _c, m, _p, _b: returned.append(m))
    ch.tx_select()
    ch.basic_publish(x, "nobody", b"r", mandatory=True)
    ch.tx_commit()
    ctx.pump(conn, lambda: bool(returned), 2)
    check(bool(returned) and returned[0].reply_code == 312, "basic.return 312", returned)


@case("tx.rollback/rolled-back-nack-keeps-message-unacked", TX)
def tx_nack_rollback(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    ch.basic_publish("", q, b"n")
    tx = ctx.channel()
    tx.tx_select()
    m = ctx.must_get(tx, q, auto_ack=False)
    tx.basic_nack(m.method.delivery_tag, requeue=False)
    tx.tx_rollback()
    tx.basic_ack(m.method.delivery_tag)
    tx.tx_commit()
    tx.close()
    ctx.get_none(ch, q)
