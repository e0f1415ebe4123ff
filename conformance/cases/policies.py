"""Policies (set through the management API; skipped without --http-url).

Each case creates a policy whose pattern matches only its own uniquely named objects and
deletes it afterwards. A policy takes effect asynchronously; cases allow it 0.3 s.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import quote

from conformance.framework import Context, case, check, eq

A = "ext/policies"


def _vh(ctx: Context) -> str:
    return quote(ctx.vhost, safe="")


def _policy(ctx: Context, pattern: str, definition: dict[str, Any], apply_to: str = "queues",
            priority: int = 0) -> str:
    name = ctx.name("policy")
    status, body = ctx.http("PUT", f"/api/policies/{_vh(ctx)}/{name}",
                            {"pattern": pattern, "definition": definition,
                             "apply-to": apply_to, "priority": priority})
    check(status in (201, 204), "policy created (201/204)", f"{status} {body}")
    ctx.on_cleanup(lambda: ctx.http("DELETE", f"/api/policies/{_vh(ctx)}/{name}"))
    return name


def _wait_policy(ctx: Context, kind: str, name: str, policy: str | None,
                 settle: float = 0.3) -> None:
    """Give the broker time to apply (or remove) *policy* on the object.

    The management API's "policy" field of a queue comes from statistics, which lag by
    the stats interval (5 s in RabbitMQ), so it cannot be polled; a policy change itself
    reaches the queue within milliseconds.
    """
    del kind, name, policy
    time.sleep(settle)


def _exact(name: str) -> str:
    return "^" + re.escape(name) + "$"


@case("policy/max-length-applies-to-matching-queue", A)
def max_length(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    p = _policy(ctx, _exact(q), {"max-length": 2})
    _wait_policy(ctx, "queues", q, p)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    eq(ctx.bodies(ch, q), [b"3", b"4"], "remaining")


@case("policy/does-not-apply-to-non-matching-queue", A)
def non_matching(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    other = ctx.queue(ch)
    p = _policy(ctx, _exact(q), {"max-length": 1})
    _wait_policy(ctx, "queues", q, p)
    for i in range(3):
        ch.basic_publish("", other, b"%d" % i)
    eq(len(ctx.drain(ch, other)), 3, "messages in the non-matching queue")


@case("policy/message-ttl-applies", A)
def message_ttl(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    p = _policy(ctx, _exact(q), {"message-ttl": 50})
    _wait_policy(ctx, "queues", q, p)
    ch.basic_publish("", q, b"x")
    time.sleep(0.3)
    ctx.get_none(ch, q, settle=0)


@case("policy/dead-letter-exchange-applies", A)
def dlx(ctx: Context) -> None:
    ch = ctx.channel()
    dlx_x = ctx.exchange(ch, "fanout")
    dlq = ctx.bound_queue(ch, dlx_x)
    q = ctx.queue(ch)
    p = _policy(ctx, _exact(q), {"dead-letter-exchange": dlx_x})
    _wait_policy(ctx, "queues", q, p)
    ch.basic_publish("", q, b"x")
    m = ctx.must_get(ch, q, auto_ack=False)
    ch.basic_reject(m.method.delivery_tag, requeue=False)
    eq(ctx.must_get(ch, dlq).body, b"x", "dead-lettered body")


@case("policy/alternate-exchange-applies-to-exchange", A)
def alternate(ctx: Context) -> None:
    ch = ctx.channel()
    ae = ctx.exchange(ch, "fanout")
    aq = ctx.bound_queue(ch, ae)
    x = ctx.exchange(ch, "direct")
    p = _policy(ctx, _exact(x), {"alternate-exchange": ae}, apply_to="exchanges")
    _wait_policy(ctx, "exchanges", x, p)
    ch.basic_publish(x, "nobody", b"via-policy-ae")
    eq(ctx.must_get(ch, aq).body, b"via-policy-ae", "body")


@case("policy/lower-of-argument-and-policy-max-length-wins", A)
def lower_wins(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch, arguments={"x-max-length": 3})
    p = _policy(ctx, _exact(q), {"max-length": 10})
    _wait_policy(ctx, "queues", q, p)
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    eq(len(ctx.drain(ch, q)), 3, "messages kept (x-max-length 3 < policy 10)")


@case("policy/deleting-policy-removes-its-effect", A)
def delete_policy(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    p = _policy(ctx, _exact(q), {"max-length": 1})
    _wait_policy(ctx, "queues", q, p)
    status, _ = ctx.http("DELETE", f"/api/policies/{_vh(ctx)}/{p}")
    eq(status, 204, "DELETE status")
    _wait_policy(ctx, "queues", q, None)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    eq(len(ctx.drain(ch, q)), 3, "messages kept after the policy is gone")


@case("policy/higher-priority-policy-wins", A)
def priority(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    _policy(ctx, _exact(q), {"max-length": 4}, priority=1)
    high = _policy(ctx, _exact(q), {"max-length": 1}, priority=5)
    _wait_policy(ctx, "queues", q, high)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    eq(ctx.bodies(ch, q), [b"2"], "remaining under the priority-5 policy")


@case("policy/apply-to-exchanges-does-not-touch-queues", A)
def apply_to(ctx: Context) -> None:
    ch = ctx.channel()
    q = ctx.queue(ch)
    _policy(ctx, _exact(q), {"alternate-exchange": "x"}, apply_to="exchanges")
    time.sleep(0.2)
    status, body = ctx.http("GET", f"/api/queues/{_vh(ctx)}/{quote(q, safe='')}")
    eq((status, body.get("policy") or None), (200, None), "policy on the queue")


@case("policy/invalid-definition-rejected-400", A)
def invalid(ctx: Context) -> None:
    name = ctx.name("policy")
    status, _ = ctx.http("PUT", f"/api/policies/{_vh(ctx)}/{name}",
                         {"pattern": "^nothing$", "definition": {"max-length": "many"},
                          "apply-to": "queues"})
    if status in (201, 204):
        ctx.http("DELETE", f"/api/policies/{_vh(ctx)}/{name}")
    eq(status, 400, "HTTP status")


@case("policy/listed-by-api", A)
def listed(ctx: Context) -> None:
    name = _policy(ctx, "^conf-never-matches-" + ctx.name() + "$", {"max-length": 9})
    status, body = ctx.http("GET", f"/api/policies/{_vh(ctx)}/{name}")
    eq(status, 200, "HTTP status")
    eq((body.get("name"), body.get("definition"), body.get("apply-to")),
       (name, {"max-length": 9}, "queues"), "policy fields")
