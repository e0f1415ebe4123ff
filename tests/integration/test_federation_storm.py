"""Issue 29: a federation link whose local publish is refused by one queue of its route.

The storm as found: a queue on the federated exchange's route refused the link's
republish (a quorum queue electing a leader), the delivery went straight back upstream
and came back at once, tens of thousands of times a second, and every try put one more
copy into the healthy queue of the same route. Here the refusing queue is a real one:
a policy limits ``orders`` to one message with ``overflow: reject-publish`` and it is
kept full, so every publish into it is nacked, until the test lifts the policy.
"""

from __future__ import annotations

import time
from typing import Any

import pika

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
from tests.support.brokerproc import BrokerProcess

N = 40


def _queue(proc: BrokerProcess, name: str) -> dict[str, Any]:
    r = api(proc).request("GET", f"/api/queues/%2F/{q(name)}")
    assert r.status == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def _get_all(ch: Any, queue: str) -> list[tuple[Any, Any, bytes]]:
    out = []
    for _ in range(10 * N):
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append((method, props, body))
    return out


def test_refused_local_publish_backs_off_and_never_duplicates(two_sites) -> None:
    up, down = two_sites
    with channel(up.url) as uch:
        uch.exchange_declare("storm.x", "fanout", durable=True)
    with channel(down.url) as dch:
        dch.exchange_declare("storm.x", "fanout", durable=True)
        for name in ("healthy", "orders"):
            dch.queue_declare(name, durable=True)
            dch.queue_bind(name, "storm.x")
        # orders refuses every publish while this policy applies and it holds a message
        set_policy(down, "full", "^orders$", {"max-length": 1, "overflow": "reject-publish"},
                   apply_to="queues")
        dch.basic_publish("", "orders", b"filler")
        wait_for(lambda: _queue(down, "orders")["messages"] == 1, what="orders full")
    set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1})
    set_policy(down, "fed", "^storm\\.", {"federation-upstream-set": "all"})
    wait_running(down)
    log_start = down.log_path.stat().st_size

    with channel(up.url) as uch:
        uch.confirm_delivery()
        for i in range(N):
            uch.basic_publish("storm.x", "", f"m{i}".encode(),
                              pika.BasicProperties(delivery_mode=2, message_id=f"id-{i}"))

    # orders refuses: the link says so, and retries with backoff; what arrived after the
    # first refusal waits behind it (order kept), so healthy holds what was in flight
    watch_from = time.monotonic()
    item = wait_for(lambda: next((i for i in links(down) if i["status"] == "error"), None),
                    what="the link's status to show the refusals")
    assert "'orders'" in item["error"] and "retrying in" in item["error"], item
    time.sleep(3.0)  # retries keep going meanwhile: none may reach healthy again
    watched = time.monotonic() - watch_from
    in_flight = _queue(down, "healthy")["messages"]
    assert 1 <= in_flight <= N
    log_text = down.log_path.read_bytes()[log_start:].decode(errors="replace")
    warnings = log_text.count("local publish to")
    # one warning per retry round, rounds at least 25 ms apart and doubling: a handful
    # (the storm of issue 29 logged 42,505 in 5 s)
    assert 1 <= warnings <= 12 + watched / 0.5, (warnings, watched)
    # the upstream still holds every message: nothing was acked before orders took it
    upstream_queue = next(x["name"] for x in api(up).request("GET", "/api/queues").json()
                          if x["name"].startswith("federation: storm.x"))
    assert _queue(up, upstream_queue)["messages"] == N

    # orders recovers: every message goes in once, the healthy queue gets nothing more
    with channel(down.url) as dch:
        r = api(down).request("DELETE", "/api/policies/%2F/full")
        assert r.status == 204, r.text
        wait_for(lambda: _queue(down, "orders")["messages"] == N + 1, timeout=30,
                 what="orders to get every message")
        wait_for(lambda: links(down)[0]["status"] == "running", what="link running again")
        healthy = _get_all(dch, "healthy")
        orders = _get_all(dch, "orders")
    assert sorted(p.message_id for _m, p, _b in healthy) == sorted(f"id-{i}" for i in range(N))
    fed = [p.message_id for _m, p, b in orders if b != b"filler"]
    assert sorted(fed) == sorted(f"id-{i}" for i in range(N))
    assert all(not m.redelivered for m, _p, _b in healthy)
    # a copy published again after a refusal says it may be a repeat (a refusal does not
    # prove the queue lacks it); the healthy queue's, published once, do not
    assert any(p.headers["x-received-from"][0]["redelivered"] for _m, p, b in orders
               if b != b"filler")
    assert not any(p.headers["x-received-from"][0]["redelivered"] for _m, p, _b in healthy)
