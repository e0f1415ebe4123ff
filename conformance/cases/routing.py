"""Routing rules of the four standard exchange types (table-driven, one case per rule)."""

from __future__ import annotations

from typing import Any

import pika

from conformance.framework import Context, case, eq

A = "routing"


def _routes(ctx: Context, xtype: str, binding_key: str, routing_key: str,
            bind_args: dict[str, Any] | None = None,
            headers: dict[str, Any] | None = None, expect_none: bool = False) -> bool:
    ch = ctx.channel()
    x = ctx.exchange(ch, xtype)
    q = ctx.bound_queue(ch, x, binding_key, arguments=bind_args)
    ch.basic_publish(x, routing_key, b"r", pika.BasicProperties(headers=headers))
    ctx.sync(ch)
    # A routed message may take a moment to reach the queue; an unrouted one never comes.
    return ctx.get(ch, q, timeout=0.3 if expect_none else 3.0) is not None


_DIRECT = [
    ("exact-key-routes", "orders", "orders", True),
    ("other-key-not-routed", "orders", "order", False),
    ("key-is-case-sensitive", "Orders", "orders", False),
    ("empty-key-matches-empty", "", "", True),
    ("dots-have-no-meaning", "a.b", "a.*", False),
]
_TOPIC = [
    ("star-matches-one-word", "a.*.c", "a.b.c", True),
    ("star-does-not-match-two-words", "a.*.c", "a.b.x.c", False),
    ("star-does-not-match-zero-words", "a.*.c", "a.c", False),
    ("hash-matches-zero-words", "a.#", "a", True),
    ("hash-matches-many-words", "a.#", "a.b.c.d", True),
    ("hash-alone-matches-everything", "#", "any.thing.at.all", True),
    ("hash-alone-matches-empty-key", "#", "", True),
    ("hash-in-middle", "a.#.z", "a.b.c.z", True),
    ("hash-in-middle-zero-words", "a.#.z", "a.z", True),
    ("leading-hash", "#.z", "x.y.z", True),
    ("star-alone-needs-one-word", "*", "one", True),
    ("star-alone-not-two-words", "*", "one.two", False),
    ("literal-words-exact", "a.b", "a.b", True),
    ("literal-prefix-not-enough", "a.b", "a.b.c", False),
    ("empty-word-matched-by-star", "a.*.c", "a..c", True),
    ("star-then-hash", "*.#", "x", True),
    ("hash-then-star-needs-a-word", "#.*", "", False),
    ("words-are-case-sensitive", "A.b", "a.b", False),
]
_HEADERS: list[tuple[str, dict[str, Any], dict[str, Any] | None, bool]] = [
    ("all-matches-when-all-present", {"x-match": "all", "a": "1", "b": "2"},
     {"a": "1", "b": "2", "c": "3"}, True),
    ("all-fails-when-one-missing", {"x-match": "all", "a": "1", "b": "2"}, {"a": "1"}, False),
    ("all-fails-on-value-mismatch", {"x-match": "all", "a": "1"}, {"a": "2"}, False),
    ("any-matches-one", {"x-match": "any", "a": "1", "b": "2"}, {"b": "2"}, True),
    ("any-fails-when-none", {"x-match": "any", "a": "1"}, {"z": "1"}, False),
    ("default-is-all", {"a": "1", "b": "2"}, {"a": "1"}, False),
    ("no-match-args-matches-everything", {"x-match": "all"}, {"q": "1"}, True),
    ("no-headers-message-with-empty-binding", {}, None, True),
    ("int-value-matches", {"x-match": "all", "n": 5}, {"n": 5}, True),
    ("routing-key-ignored", {"x-match": "all", "a": "1"}, {"a": "1"}, True),
    ("x-prefixed-binding-keys-ignored", {"x-match": "all", "x-foo": "bar", "a": "1"},
     {"a": "1"}, True),
]

for _name, _bk, _rk, _want in _DIRECT:

    def _direct(ctx: Context, bk: str = _bk, rk: str = _rk, want: bool = _want) -> None:
        eq(_routes(ctx, "direct", bk, rk, expect_none=not want), want,
           f"routed (binding {bk!r}, key {rk!r})")

    case(f"exchange.direct/{_name}", A)(_direct)

for _name, _bk, _rk, _want in _TOPIC:

    def _topic(ctx: Context, bk: str = _bk, rk: str = _rk, want: bool = _want) -> None:
        eq(_routes(ctx, "topic", bk, rk, expect_none=not want), want,
           f"routed (binding {bk!r}, key {rk!r})")

    case(f"exchange.topic/{_name}", A)(_topic)

for _name, _args, _hdrs, _want in _HEADERS:

    def _headers(ctx: Context, args: dict[str, Any] = _args, hdrs: Any = _hdrs,
                 want: bool = _want) -> None:
        eq(_routes(ctx, "headers", "ignored-key", "other-key", args, hdrs, not want), want,
           f"routed (binding {args}, headers {hdrs})")

    case(f"exchange.headers/{_name}", A)(_headers)


@case("exchange.fanout/ignores-routing-key", A)
def fanout_key(ctx: Context) -> None:
    eq(_routes(ctx, "fanout", "bound-key", "another-key"), True, "routed")


@case("exchange.fanout/copies-to-every-bound-queue", A)
def fanout_all(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "fanout")
    qs = [ctx.bound_queue(ch, x) for _ in range(3)]
    ch.basic_publish(x, "", b"f")
    for q in qs:
        eq(ctx.must_get(ch, q).body, b"f", f"copy in {q}")


@case("exchange.direct/same-key-delivers-to-every-bound-queue", A)
def direct_all(ctx: Context) -> None:
    """All queues bound with the matching key get a copy (not only the first)."""
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    qs = [ctx.bound_queue(ch, x, "k") for _ in range(3)]
    ch.basic_publish(x, "k", b"d")
    for q in qs:
        eq(ctx.must_get(ch, q).body, b"d", f"copy in {q}")


@case("exchange.direct/queue-bound-with-two-keys-gets-one-copy-each-publish", A)
def direct_two_keys(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "direct")
    q = ctx.bound_queue(ch, x, "k1")
    ch.queue_bind(q, x, "k2")
    ch.basic_publish(x, "k1", b"1")
    ch.basic_publish(x, "k2", b"2")
    eq(ctx.bodies(ch, q), [b"1", b"2"], "bodies")


@case("exchange.topic/overlapping-bindings-deliver-once-per-queue", A)
def topic_dedup(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    q = ctx.bound_queue(ch, x, "a.*")
    ch.queue_bind(q, x, "#")
    ch.queue_bind(q, x, "a.b")
    ch.basic_publish(x, "a.b", b"once")
    eq(ctx.bodies(ch, q), [b"once"], "copies")


@case("exchange.headers/two-bindings-same-queue-deliver-once", A)
def headers_dedup(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    q = ctx.bound_queue(ch, x, "", arguments={"x-match": "any", "a": "1"})
    ch.queue_bind(q, x, "other", arguments={"x-match": "any", "b": "2"})
    ch.basic_publish(x, "", b"h", pika.BasicProperties(headers={"a": "1", "b": "2"}))
    eq(ctx.bodies(ch, q), [b"h"], "copies")


@case("exchange.headers/unbind-with-same-arguments-removes-binding", A)
def headers_unbind(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "headers")
    args = {"x-match": "all", "a": "1"}
    q = ctx.bound_queue(ch, x, "", arguments=args)
    ch.queue_unbind(q, x, "", arguments=args)
    ch.basic_publish(x, "", b"h", pika.BasicProperties(headers={"a": "1"}))
    ctx.get_none(ch, q)


@case("exchange.topic/unbind-one-pattern-keeps-others", A)
def topic_unbind(ctx: Context) -> None:
    ch = ctx.channel()
    x = ctx.exchange(ch, "topic")
    q = ctx.bound_queue(ch, x, "a.*")
    ch.queue_bind(q, x, "*.b")
    ch.queue_unbind(q, x, "a.*")
    ch.basic_publish(x, "a.c", b"no")
    ch.basic_publish(x, "z.b", b"yes")
    eq(ctx.bodies(ch, q), [b"yes"], "bodies")
