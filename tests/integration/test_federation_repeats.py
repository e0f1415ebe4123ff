"""Issue 29: every failure of a federation link used to add one more copy of what it held
to every queue of its route.

test_multisite saw a queue take a message three times (hq's active killed, then the
branch node running the link killed; a refused publish held past a cut): each time the
upstream redelivered what the link had not acked, and the link published it into the
whole route again, also into the queues that had it. Here the same thing happens
deterministically and at a fraction of the cost: two single nodes, a TCP proxy the test
controls between the link and the upstream, and a route of two queues, ``healthy`` and
``orders``, where ``orders`` refuses every publish (a policy: one message, ``overflow:
reject-publish``, kept full) so that the link holds every message unacked. The test
resets the link's connection twice; the upstream redelivers each time.

A message with a ``message_id`` reaches ``healthy`` once however many times it comes
back (the link remembers which queues took it, plugins/common/taken.py). One without an
id cannot be told from a second message alike, so it is published again, flagged: it is
in ``healthy`` once per pass, which the test measures too (the documented limit).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.integration._http import q
from tests.integration.fed_support import (
    amqp_uri,
    api,
    channel,
    links,
    set_policy,
    set_upstream,
    wait_for,
    wait_running,
)
from tests.integration.test_federation_storm import _queue
from tests.support.brokerproc import BrokerProcess
from tests.support.tcpproxy import TcpProxy

N = 20  # messages with a message_id, and as many without one


def _holds(proc: BrokerProcess, name: str, n: int) -> bool:
    return bool(_queue(proc, name)["messages"] == n)


def _bound(proc: BrokerProcess, exchange: str) -> bool:
    r = api(proc).request("GET", f"/api/exchanges/%2F/{q(exchange)}/bindings/source")
    return r.status == 200 and bool(r.json())


def _get_all(ch: Any, queue: str) -> list[tuple[Any, bytes]]:
    out = []
    for _ in range(20 * N):  # bounded: far more than the queue may hold
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append((props, body))
    return out


@pytest.fixture
def proxy(two_sites: tuple[BrokerProcess, BrokerProcess]) -> Iterator[TcpProxy]:
    up, _down = two_sites
    wan = TcpProxy("127.0.0.1", up.port).start()
    try:
        yield wan
    finally:
        wan.stop()


def _first_refusals(down: BrokerProcess) -> int:
    """How many times a link's attempt had its first publish into orders refused (one
    log line each: the round of the first retry)."""
    return down.log_path.read_bytes().count(b"failed 1 time(s)")


def _route(ch: Any, kind: str) -> None:
    ch.exchange_declare(f"rep.{kind}", "fanout", durable=True)
    for name in (f"healthy.{kind}", f"orders.{kind}"):
        ch.queue_declare(name, durable=True)
        ch.queue_bind(name, f"rep.{kind}")


def test_a_message_comes_back_twice_and_reaches_a_queue_that_had_it_once(
        two_sites: tuple[BrokerProcess, BrokerProcess], proxy: TcpProxy) -> None:
    up, down = two_sites
    with channel(up.url) as uch:
        for kind in ("id", "plain"):
            uch.exchange_declare(f"rep.{kind}", "fanout", durable=True)
    with channel(down.url) as dch:
        for kind in ("id", "plain"):
            _route(dch, kind)
        set_policy(down, "full", "^orders\\.", {"max-length": 1, "overflow": "reject-publish"},
                   apply_to="queues")
        for kind in ("id", "plain"):
            dch.basic_publish("", f"orders.{kind}", b"filler")
            wait_for(functools.partial(_holds, down, f"orders.{kind}", 1), what="orders full")
    set_upstream(down, "up", {"uri": amqp_uri(proxy.port), "reconnect-delay": 1})
    set_policy(down, "fed", "^rep\\.", {"federation-upstream": "up"})
    wait_running(down, 2)

    def link_queues() -> list[str]:
        return [x["name"] for x in api(up).request("GET", "/api/queues").json()
                if x["name"].startswith("federation: rep.")]
    wait_for(lambda: len(link_queues()) == 2, what="the links' queues upstream")
    for kind in ("id", "plain"):
        wait_for(functools.partial(_bound, up, f"rep.{kind}"), what=f"rep.{kind} bound upstream")

    with channel(up.url) as uch:
        uch.confirm_delivery()
        for i in range(N):
            uch.basic_publish("rep.id", "", f"id {i}".encode(),
                              pika.BasicProperties(delivery_mode=2, message_id=f"id-{i}"))
            uch.basic_publish("rep.plain", "", f"plain {i}".encode(),
                              pika.BasicProperties(delivery_mode=2))
    # each link holds its messages (orders refuses the first; the rest wait behind it)
    wait_for(lambda: _first_refusals(down) >= 2, timeout=30, what="both links refused")
    for _round in (1, 2):
        before = _first_refusals(down)
        proxy.reset_all()  # the upstream requeues all and delivers them again
        def refused_again(before: int = before) -> bool:
            return _first_refusals(down) >= before + 2
        wait_for(refused_again, timeout=30,
                 what=lambda: f"both links back and refused again: {links(down)}")
    for name in link_queues():  # nothing acked yet
        assert _queue(up, name)["messages"] == N, name

    r = api(down).request("DELETE", "/api/policies/%2F/full")
    assert r.status == 204, r.text
    for name in link_queues():
        wait_for(functools.partial(_holds, up, name, 0), timeout=30,
                 what="the upstream to get every ack")
    got: dict[str, list[tuple[Any, bytes]]] = {}
    with channel(down.url) as dch:
        for kind in ("id", "plain"):
            for name in (f"healthy.{kind}", f"orders.{kind}"):
                got[name] = [(p, b) for p, b in _get_all(dch, name) if b != b"filler"]

    def copies(name: str) -> Counter[bytes]:
        return Counter(b for _p, b in got[name])

    # with an id: once in each queue, however many passes it made
    with_id = [f"id {i}".encode() for i in range(N)]
    assert copies("healthy.id") == dict.fromkeys(with_id, 1), copies("healthy.id")
    assert copies("orders.id") == dict.fromkeys(with_id, 1), copies("orders.id")
    # without: the head of the queue reached healthy on each of its three passes, every
    # copy after the first flagged; orders refused until the end, so it has each once
    plain = [f"plain {i}".encode() for i in range(N)]
    in_healthy = copies("healthy.plain")
    assert in_healthy[b"plain 0"] == 3 and set(in_healthy) == set(plain), in_healthy
    seen: set[bytes] = set()
    for props, body in got["healthy.plain"]:
        # (a first copy may carry the flag too: the upstream redelivered it)
        assert body not in seen or props.headers["x-received-from"][0]["redelivered"], body
        seen.add(body)
    assert copies("orders.plain") == dict.fromkeys(plain, 1), copies("orders.plain")
