"""Stream queues over AMQP 0-9-1 (``x-queue-type: stream``), as RabbitMQ 3.10.8 answers.

Measured on RabbitMQ 3.10.8 and checked here: the declare refusals and their texts
(non-durable, exclusive, auto-delete, server-named), the arguments only other queue
types take, the checks of the stream arguments (``x-max-age`` units, sizes, cluster
size, leader locator) and redeclare equivalence; consuming needs a per-consumer
prefetch and manual acks; basic.get, queue.purge and nack/reject are refused (540);
every ``x-stream-offset`` form (first, last, next, an offset, a timestamp, an
interval) and the ``x-stream-offset`` header on each delivery; an ack only returns
credit (the messages stay for the next reader); a transient message with a TTL is
kept and delivered; transactions; retention by size drops the oldest segments.

Where RabbitMQ 3.10.8 crashes the connection (541 INTERNAL_ERROR: an unparsable
``x-max-age`` such as "bad", an unknown ``x-stream-offset`` string, basic.recover),
amqpd answers with a clear 406/540 instead; those inputs are not cases here
(docs/streams.md lists the differences).

Every case publishes on a confirm channel: once a publish is confirmed the stream
holds it, on both brokers.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from conformance.framework import Context, Message, case, check, eq

A = "streams"
S = {"x-queue-type": "stream"}
MODULE = "rabbit_stream_queue"
HEADER = "x-stream-offset"


def _stream(ctx: Context, ch: BlockingChannel, **arguments: Any) -> str:
    return ctx.queue(ch, durable=True, arguments={**S, **arguments})


def _publish_n(ctx: Context, q: str, n: int, start: int = 0, size: int = 0) -> None:
    """Publish ``n`` messages, body ``m<i>`` (padded to ``size``), each confirmed."""
    ch = ctx.channel()
    ch.confirm_delivery()
    for i in range(start, start + n):
        ch.basic_publish("", q, f"m{i}".encode().ljust(size, b"."),
                         pika.BasicProperties(headers={"i": i}))
    ch.close()


def _read(ctx: Context, q: str, n: int, offset: Any = None, prefetch: int = 100,
          timeout: float = 3.0, ack: bool = True) -> list[Message]:
    """Consume with ``x-stream-offset: offset`` (none: the default) until ``n``
    deliveries (or the deadline), acking each when ``ack``; then a short settle so
    that a delivery beyond ``n`` would show."""
    ch = ctx.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[Message] = []

    def on_msg(_ch: Any, method: Any, props: Any, body: bytes) -> None:
        got.append(Message(method, props, body))
        if ack:
            ch.basic_ack(method.delivery_tag)

    args = None if offset is None else {HEADER: offset}
    ch.basic_consume(q, on_msg, arguments=args)
    ctx.settle_count(ch.connection, got, n, timeout=timeout, settle=0.4)
    ch.close()
    return got


def _offsets(got: list[Message]) -> list[int]:
    return [int(m.headers[HEADER]) for m in got]


def _bodies(got: list[Message]) -> list[bytes]:
    return [m.body.rstrip(b".") for m in got]


# -- declaring -----------------------------------------------------------------------------

@case("streams/declare-durable-succeeds-and-redeclares", A)
def declare_ok(ctx: Context) -> None:
    ch = ctx.channel()
    q = _stream(ctx, ch, **{"x-max-age": "1D"})
    ok = ch.queue_declare(q, durable=True, arguments={**S, "x-max-age": "1D"})
    eq(ok.method.consumer_count, 0, "declare-ok consumers")
    ch.queue_declare(q, passive=True)


def _refused(ctx: Context, text: str, **declare: Any) -> None:
    ch = ctx.channel()
    name = ctx.name()
    ctx.track_queue(name)
    arguments = {**S, **declare.pop("arguments", {})}
    declare.setdefault("durable", True)
    got = ctx.channel_error(ch, lambda: ch.queue_declare(name, arguments=arguments,
                                                         **declare), 406)
    eq(got.text, f"PRECONDITION_FAILED - {text.format(q=name, vh=ctx.vhost)}", "reply text")


@case("streams/non-durable-406-invalid-property", A)
def non_durable(ctx: Context) -> None:
    _refused(ctx, "invalid property 'non-durable' for queue '{q}' in vhost '{vh}'",
             durable=False)


@case("streams/exclusive-406-invalid-property", A)
def exclusive(ctx: Context) -> None:
    _refused(ctx, "invalid property 'exclusive-owner' for queue '{q}' in vhost '{vh}'",
             exclusive=True)


@case("streams/auto-delete-406-invalid-property", A)
def auto_delete(ctx: Context) -> None:
    _refused(ctx, "invalid property 'auto-delete' for queue '{q}' in vhost '{vh}'",
             auto_delete=True)


@case("streams/server-named-406", A)
def server_named(ctx: Context) -> None:
    ch = ctx.channel()
    got = ctx.channel_error(ch, lambda: ch.queue_declare("", durable=True, arguments=S), 406)
    eq(got.text, f"PRECONDITION_FAILED - Cannot declare a server-named queue for type {MODULE}",
       "reply text")


def _unsupported_case(key: str, value: Any) -> None:
    @case(f"streams/argument-{key}-406-not-supported-by-queue-type", A)
    def unsupported(ctx: Context) -> None:
        _refused(ctx, f"invalid arg '{key}' for queue '{{q}}' in vhost '{{vh}}' of queue "
                 f"type {MODULE}", arguments={key: value})


for _key, _value in (("x-max-length", 10), ("x-message-ttl", 1000),
                     ("x-dead-letter-exchange", "dlx"), ("x-dead-letter-routing-key", "k"),
                     ("x-max-priority", 5), ("x-overflow", "reject-publish"),
                     ("x-expires", 10000), ("x-single-active-consumer", True),
                     ("x-queue-mode", "lazy"), ("x-delivery-limit", 3),
                     ("x-quorum-initial-group-size", 3), ("x-queue-version", 2),
                     ("x-queue-master-locator", "min-masters"),
                     ("x-dead-letter-strategy", "at-least-once")):
    _unsupported_case(_key, _value)


def _bad_value_case(slug: str, key: str, value: Any, why: str) -> None:
    @case(f"streams/argument-{key}-{slug}-406", A)
    def bad_value(ctx: Context) -> None:
        _refused(ctx, f"invalid arg '{key}' for queue '{{q}}' in vhost '{{vh}}': {why}",
                 arguments={key: value})


for _slug, _key, _value, _why in (
        ("no-unit", "x-max-age", "10", "invalid_max_age"),
        ("zero", "x-max-age", "0s", "invalid_max_age"),
        ("lowercase-day", "x-max-age", "1d", "invalid_max_age"),
        ("integer", "x-max-age", 10, "{{unacceptable_type,signedint}}"),
        ("negative", "x-max-length-bytes", -1, "{{value_negative,-1}}"),
        ("string", "x-max-length-bytes", "abc", '"expected integer, got longstr"'),
        ("negative", "x-stream-max-segment-size-bytes", -5, "{{value_negative,-5}}"),
        ("zero", "x-initial-cluster-size", 0, "{{value_zero,0}}"),
        ("negative", "x-initial-cluster-size", -1, "{{value_negative,-1}}"),
        ("unknown", "x-queue-leader-locator", "bogus", "invalid_queue_locator_arg")):
    _bad_value_case(_slug, _key, _value, _why)


@case("streams/stream-arguments-accepted", A)
def accepted(ctx: Context) -> None:
    ch = ctx.channel()
    for age in ("5Y", "3M", "1D", "2h", "7m", "10s"):
        _stream(ctx, ch, **{"x-max-age": age})
    for locator in ("client-local", "balanced", "random", "least-leaders"):
        _stream(ctx, ch, **{"x-queue-leader-locator": locator})
    _stream(ctx, ch, **{"x-max-length-bytes": 1000, "x-stream-max-segment-size-bytes": 1000,
                        "x-initial-cluster-size": 3, "x-unknown-argument": 1})


@case("streams/redeclare-compares-stream-arguments", A)
def redeclare(ctx: Context) -> None:
    ch = ctx.channel()
    q = _stream(ctx, ch, **{"x-max-age": "1D"})
    got = ctx.channel_error(ch, lambda: ch.queue_declare(
        q, durable=True, arguments={**S, "x-max-age": "2D"}), 406)
    eq(got.text, f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue '{q}' in "
       f"vhost '{ctx.vhost}': received '2D' but current is '1D'", "reply text")
    ch = ctx.channel()
    got = ctx.channel_error(ch, lambda: ch.queue_declare(
        q, durable=True, arguments={**S, "x-max-age": "1D",
                                    "x-stream-max-segment-size-bytes": 5000}), 406)
    eq(got.text, f"PRECONDITION_FAILED - inequivalent arg 'x-stream-max-segment-size-bytes' "
       f"for queue '{q}' in vhost '{ctx.vhost}': received the value '5000' of type "
       "'signedint' but current is none", "reply text")


# -- what a stream refuses -------------------------------------------------------------------

@case("streams/consume-without-prefetch-406", A)
def no_prefetch(ctx: Context) -> None:
    ch = ctx.channel()
    q = _stream(ctx, ch)
    got = ctx.channel_error(ch, lambda: ch.basic_consume(q, lambda *a: None), 406)
    eq(got.text, f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{q}' "
       f"in vhost '{ctx.vhost}''", "reply text")
    ch = ctx.channel()  # a global prefetch is not a consumer prefetch
    ch.basic_qos(prefetch_count=10, global_qos=True)
    ctx.channel_error(ch, lambda: ch.basic_consume(q, lambda *a: None), 406)


@case("streams/consume-no-ack-540", A)
def no_ack(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    conn = ctx.connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got = ctx.connection_error(
        conn, lambda: ch.basic_consume(q, lambda *a: None, auto_ack=True), 540)
    eq(got.text, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues "
       f"queue '{q}' in vhost '{ctx.vhost}'", "reply text")


def _not_implemented(ctx: Context, what: str, action: Any, publish: int = 0) -> None:
    """``action(channel, queue)`` on a stream closes the connection with 540
    ``<what> not supported by stream queues queue '...' in vhost '...'``."""
    q = _stream(ctx, ctx.channel())
    if publish:
        _publish_n(ctx, q, publish)
    conn = ctx.connect()
    ch = conn.channel()
    got = ctx.connection_error(conn, lambda: action(ch, q), 540)
    eq(got.text, f"NOT_IMPLEMENTED - {what} not supported by stream queues "
       f"queue '{q}' in vhost '{ctx.vhost}'", "reply text")


@case("streams/basic-get-540", A)
def basic_get(ctx: Context) -> None:
    _not_implemented(ctx, "basic.get", lambda ch, q: ch.basic_get(q), publish=1)


@case("streams/purge-540", A)
def purge(ctx: Context) -> None:
    _not_implemented(ctx, "queue.purge", lambda ch, q: ch.queue_purge(q))


@case("streams/nack-and-reject-540", A)
def nack(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 2)
    for requeue in (True, False):
        _nack_refused(ctx, q, requeue)


def _nack_refused(ctx: Context, q: str, requeue: bool) -> None:
    conn = ctx.connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    _tag, got = ctx.consume(ch, q, 1, arguments={HEADER: "first"})
    check(len(got) >= 1, "a delivery", len(got))
    tag = got[0].method.delivery_tag
    closed = ctx.connection_error(conn, lambda: ch.basic_nack(tag, requeue=requeue), 540)
    eq(closed.text, "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by "
       f"stream queues queue '{q}' in vhost '{ctx.vhost}'", "reply text")


# -- offsets -------------------------------------------------------------------------------

@case("streams/offset-first-reads-everything-with-the-offset-header", A)
def offset_first(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 10)
    got = _read(ctx, q, 10, "first")
    eq(_bodies(got), [f"m{i}".encode() for i in range(10)], "bodies")
    eq(_offsets(got), list(range(10)), "x-stream-offset headers")
    eq([m.headers.get("i") for m in got], list(range(10)), "the publisher's headers kept")
    eq([m.method.redelivered for m in got], [False] * 10, "redelivered flags")


@case("streams/offset-integer-and-its-bounds", A)
def offset_integer(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 10)
    eq(_offsets(_read(ctx, q, 5, 5)), [5, 6, 7, 8, 9], "from offset 5")
    eq(_offsets(_read(ctx, q, 10, -1)), list(range(10)), "a negative offset: first")
    eq(_offsets(_read(ctx, q, 1, 100, timeout=0.5)), [], "beyond the end: only new ones")


@case("streams/offset-last-is-the-last-chunk", A)
def offset_last(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 3)  # each confirmed before the next: a chunk each
    got = _read(ctx, q, 1, "last")
    eq(_offsets(got), [2], "last")


@case("streams/offset-next-is-the-default-and-reads-only-new-messages", A)
def offset_next(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 3)
    for spec in ("next", None):
        _reads_only_new(ctx, q, spec)


def _reads_only_new(ctx: Context, q: str, spec: str | None) -> None:
    ch = ctx.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[Message] = []
    ch.basic_consume(q, lambda _c, m, p, b: got.append(Message(m, p, b)),
                     arguments=None if spec is None else {HEADER: spec})
    ctx.settle_count(ch.connection, got, 0, timeout=0.1, settle=0.4)
    eq(len(got), 0, f"{spec}: nothing old")
    _publish_n(ctx, q, 1, start=100 + len(spec or ""))
    ctx.settle_count(ch.connection, got, 1)
    eq([m.body for m in got], [f"m{100 + len(spec or '')}".encode()], f"{spec}: the new one")
    ch.close()


@case("streams/offset-timestamp", A)
def offset_timestamp(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 3)
    # an AMQP timestamp has whole seconds: wait for the clock to pass the next second
    boundary = int(time.time()) + 1
    deadline = time.monotonic() + 3
    while time.time() < boundary and time.monotonic() < deadline:
        time.sleep(0.05)
    _publish_n(ctx, q, 2, start=3)
    when = datetime.datetime.fromtimestamp(boundary, datetime.UTC).replace(tzinfo=None)
    eq(_bodies(_read(ctx, q, 2, when)), [b"m3", b"m4"], "from the timestamp")
    past = datetime.datetime(2000, 1, 1)
    eq(len(_read(ctx, q, 5, past)), 5, "a timestamp in the past: everything")
    future = datetime.datetime(2100, 1, 1)
    eq(_read(ctx, q, 1, future, timeout=0.5), [], "a timestamp in the future: new ones")


@case("streams/offset-interval", A)
def offset_interval(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 4)
    for spec in ("1h", "30m", "2D", "10Y"):
        eq(_offsets(_read(ctx, q, 4, spec)), [0, 1, 2, 3], f"interval {spec}")


# -- acks, TTL, transactions ----------------------------------------------------------------

@case("streams/acks-return-credit-and-messages-stay", A)
def acks_credit(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    _publish_n(ctx, q, 6)
    eq(_offsets(_read(ctx, q, 6, "first", prefetch=2, ack=False)), [0, 1],
       "unacked: the prefetch bounds deliveries")
    eq(_offsets(_read(ctx, q, 6, "first", prefetch=2)), list(range(6)),
       "acked: credit comes back")
    eq(_offsets(_read(ctx, q, 6, "first", prefetch=2)), list(range(6)),
       "acked messages are still in the stream")


@case("streams/transient-message-with-ttl-is-kept", A)
def transient_ttl(ctx: Context) -> None:
    q = _stream(ctx, ctx.channel())
    ch = ctx.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"t", pika.BasicProperties(delivery_mode=1, expiration="1"))
    ctx.sync(ch)
    eq(_bodies(_read(ctx, q, 1, "first")), [b"t"], "delivered despite its TTL")


@case("streams/publish-in-a-transaction-and-through-an-exchange", A)
def tx_publish(ctx: Context) -> None:
    ch = ctx.channel()
    q = _stream(ctx, ch)
    x = ctx.exchange(ch, "fanout")
    ch.queue_bind(q, x)
    ch.tx_select()
    ch.basic_publish(x, "", b"tx1")
    ch.basic_publish(x, "", b"tx2")
    ch.tx_rollback()
    ch.basic_publish(x, "", b"tx3")
    ch.tx_commit()
    eq(_bodies(_read(ctx, q, 2, "first")), [b"tx3"], "only the committed one")


# -- retention ----------------------------------------------------------------------------

@case("streams/retention-by-size-drops-oldest-segments", A)
def retention_size(ctx: Context) -> None:
    ch = ctx.channel()
    q = _stream(ctx, ch, **{"x-max-length-bytes": 5000,
                            "x-stream-max-segment-size-bytes": 1000})
    _publish_n(ctx, q, 200, size=100)
    got = _read(ctx, q, 200, "first", prefetch=200)
    bodies = _bodies(got)
    check(bool(bodies), "some messages kept", bodies)
    first = int(bodies[0][1:])
    check(first > 0, "the oldest segments deleted (the first message kept is not m0)",
          bodies[:3])
    eq(bodies, [f"m{i}".encode() for i in range(first, 200)],
       "what is kept: every message from the first kept to the last, in order")
    offsets = _offsets(got)
    # RabbitMQ's offsets grow but may skip (osiris starts a segment with a tracking
    # chunk that takes an offset); amqpd's are contiguous
    eq(offsets, sorted(set(offsets)), "offsets increase")
    check(len(bodies) < 150, "at most about max-length-bytes kept", len(bodies))
