"""Delivery guarantees under some volume: every message exactly once across competing
consumers, bulk requeue on close, fan-out to many queues, mixed get and consume."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from pika.adapters.blocking_connection import BlockingConnection

from conformance.framework import Context, case, check, eq

A = "delivery-guarantees"


def _publish_confirmed(ctx: Context, queue: str, n: int, exchange: str = "") -> None:
    ch = ctx.connect().channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish(exchange, queue, b"%d" % i)


def _pump_all(conns: list[BlockingConnection], until: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            return False
        for c in conns:
            c.process_data_events(time_limit=0)
        time.sleep(0.001)
    return True


@case("guarantees/competing-consumers-get-each-message-exactly-once", A, slow=True)
def competing(ctx: Context) -> None:
    n = 3000
    q = ctx.queue()
    _publish_confirmed(ctx, q, n)
    got: list[bytes] = []
    redelivered: list[bytes] = []
    conns = [ctx.connect() for _ in range(3)]
    for conn in conns:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)

        def on_msg(c: Any, m: Any, _p: Any, body: bytes) -> None:
            got.append(body)
            if m.redelivered:
                redelivered.append(body)
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(q, on_msg)
    _pump_all(conns, lambda: len(got) >= n, 30)
    dupes = [b for b, k in Counter(got).items() if k > 1]
    eq((len(got), len(set(got)), dupes[:5], redelivered[:5]), (n, n, [], []),
       "deliveries, distinct, duplicates, redelivered")


@case("guarantees/closing-channel-requeues-all-unacked-as-redelivered", A, slow=True)
def bulk_requeue(ctx: Context) -> None:
    n = 1000
    q = ctx.queue()
    _publish_confirmed(ctx, q, n)
    conn = ctx.connect()
    ch = conn.channel()
    _, got = ctx.consume(ch, q, n, timeout=15)
    eq(len(got), n, "deliveries before close")
    ch.close()
    other = ctx.channel()
    deadline = time.monotonic() + 5
    while other.queue_declare(q, passive=True).method.message_count < n:
        check(time.monotonic() < deadline, f"{n} messages back in the queue",
              other.queue_declare(q, passive=True).method.message_count)
        time.sleep(0.05)
    again = ctx.drain(other, q)
    eq((len(again), all(m.method.redelivered for m in again)), (n, True),
       "requeued count, all redelivered")
    eq([int(m.body) for m in again], list(range(n)), "order after requeue")


@case("guarantees/fanout-to-50-queues-each-gets-all-in-order", A, slow=True)
def fanout_many(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    qs = [ctx.bound_queue(ch, x) for _ in range(50)]
    n = 200
    _publish_confirmed(ctx, "", n, exchange=x)
    for q in qs:
        tag, got = ctx.consume(ch, q, n, timeout=10, auto_ack=True)
        ch.basic_cancel(tag)
        eq([int(m.body) for m in got], list(range(n)), f"messages in {q}")


@case("guarantees/get-and-consume-together-deliver-each-message-once", A, slow=True)
def mixed(ctx: Context) -> None:
    n = 2000
    q = ctx.queue()
    _publish_confirmed(ctx, q, n)
    got: list[bytes] = []
    cconn = ctx.connect()
    cch = cconn.channel()
    cch.basic_qos(prefetch_count=20)

    def on_msg(c: Any, m: Any, _p: Any, body: bytes) -> None:
        got.append(body)
        c.basic_ack(m.delivery_tag)

    cch.basic_consume(q, on_msg)
    getters = [ctx.connect().channel() for _ in range(2)]
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        for g in getters:
            method, _, body = g.basic_get(q, auto_ack=True)
            if method is not None:
                got.append(body)
        cconn.process_data_events(time_limit=0)
    eq((len(got), len(set(got))), (n, n), "deliveries, distinct")
