"""Federation between amqpd sites (separate processes, unique cluster names)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.fed_support import (
    amqp_uri,
    api,
    channel,
    drain,
    links,
    set_policy,
    set_upstream,
    settle,
    site,
    wait_for,
    wait_running,
)
from tests.support.brokerproc import BrokerProcess


def test_exchange_federation_topic_bindings(two_sites) -> None:
    up, down = two_sites
    with channel(up.url) as uch:
        uch.exchange_declare("fed.topic", "topic", durable=True)
    with channel(down.url) as dch:
        dch.exchange_declare("fed.topic", "topic", durable=True)
        dch.queue_declare("eu.orders")
        dch.queue_bind("eu.orders", "fed.topic", "orders.eu.*")
        set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1})
        set_policy(down, "fed", "^fed\\.", {"federation-upstream-set": "all"})
        items = wait_running(down)
        assert items[0]["exchange"] == "fed.topic"
        assert items[0]["upstream"] == "up"
        assert items[0]["type"] == "exchange"
        assert "guest" not in items[0]["uri"]
        # the link mirrored the binding on the upstream
        with channel(up.url) as uch:
            def bound() -> bool:
                r = api(up).request("GET", "/api/exchanges/%2F/fed.topic/bindings/source")
                return any(b["routing_key"] == "orders.eu.*" for b in r.json())
            wait_for(bound, what="binding mirrored upstream")
            for key in ("orders.eu.fr", "orders.us.ny", "orders.eu.de"):
                uch.basic_publish("fed.topic", key, key.encode(),
                                  pika.BasicProperties(headers={"h": 1}))
        got = drain(dch, "eu.orders", 2)
        assert sorted(b for _p, b in got) == [b"orders.eu.de", b"orders.eu.fr"]
        props = got[0][0]
        hop = props.headers["x-received-from"][0]
        assert hop["exchange"] == "fed.topic"
        assert hop["cluster-name"] == "site-up"
        assert hop["vhost"] == "/"
        assert hop["redelivered"] is False
        assert "guest" not in hop["uri"]
        assert props.headers["h"] == 1
        assert settle(dch, "eu.orders", 0.5) == []
        # follow a binding change: a new binding brings more, an unbind stops the old
        dch.queue_bind("eu.orders", "fed.topic", "orders.us.#")
        dch.queue_unbind("eu.orders", "fed.topic", "orders.eu.*")

        def rebound() -> bool:
            r = api(up).request("GET", "/api/exchanges/%2F/fed.topic/bindings/source")
            keys = {b["routing_key"] for b in r.json()}
            return "orders.us.#" in keys and "orders.eu.*" not in keys
        wait_for(rebound, what="bindings followed upstream")
        with channel(up.url) as uch:
            uch.basic_publish("fed.topic", "orders.eu.fr", b"eu-2")
            uch.basic_publish("fed.topic", "orders.us.ny", b"us-2")
        got = drain(dch, "eu.orders", 1)
        assert [b for _p, b in got] == [b"us-2"]
        assert settle(dch, "eu.orders", 0.5) == []
    assert links(down)[0]["status"] == "running"


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    sites = [site(tmp_path, f"ring-{n}") for n in "abc"]
    for proc in sites:
        proc.start()
    yield sites
    for proc in sites:
        proc.stop()


def _ring_upstreams(sites: list[BrokerProcess], max_hops: int) -> None:
    # a <- c, b <- a, c <- b: every site's upstream is the one before it
    for i, proc in enumerate(sites):
        prev = sites[i - 1]
        set_upstream(proc, "prev", {"uri": amqp_uri(prev.port), "max-hops": max_hops,
                                    "reconnect-delay": 1})


def _wait_links_with(sites: list[BrokerProcess], max_hops: int) -> None:
    """Every site's link runs, and runs with this max-hops (on the upstream's exchange)."""
    for i, proc in enumerate(sites):
        wait_running(proc)
        prev = sites[i - 1]

        def declared(prev: BrokerProcess = prev, down: str = f"ring-{'abc'[i]}") -> bool:
            r = api(prev).request("GET", "/api/exchanges/%2F")
            return any(x["type"] == "x-federation-upstream"
                       and x["arguments"].get("x-max-hops") == max_hops
                       and x["arguments"].get("x-downstream-name") == down
                       for x in r.json())
        wait_for(declared, what=f"upstream exchange with max-hops {max_hops}")


@pytest.mark.slow
def test_ring_of_three_max_hops_and_no_loops(ring) -> None:
    _ring_upstreams(ring, 1)
    chans = []
    conns = []
    for proc in ring:
        conn = pika.BlockingConnection(pika.URLParameters(proc.url))
        ch = conn.channel()
        ch.exchange_declare("ring", "fanout", durable=True)
        ch.queue_declare("ring.q")
        ch.queue_bind("ring.q", "ring")
        conns.append(conn)
        chans.append(ch)
        set_policy(proc, "fed-ring", "^ring$", {"federation-upstream": "prev"})
    try:
        _wait_links_with(ring, 1)
        chans[0].basic_publish("ring", "", b"from-a")
        # max-hops 1: a's own queue and b (a's downstream) only
        assert [b for _p, b in drain(chans[1], "ring.q", 1)] == [b"from-a"]
        assert [b for _p, b in drain(chans[0], "ring.q", 1)] == [b"from-a"]
        assert settle(chans[2], "ring.q", 1.0) == []
        assert settle(chans[0], "ring.q", 0.1) == []
        assert settle(chans[1], "ring.q", 0.1) == []

        # max-hops 2: a -> b -> c, and c's copy (2 hops) does not go back to a
        _ring_upstreams(ring, 2)
        _wait_links_with(ring, 2)
        chans[0].basic_publish("ring", "", b"hops-2")
        got_c = drain(chans[2], "ring.q", 1)
        assert [b for _p, b in got_c] == [b"hops-2"]
        hops = got_c[0][0].headers["x-received-from"]
        assert [h["cluster-name"] for h in hops] == ["ring-b", "ring-a"]
        assert [b for _p, b in drain(chans[1], "ring.q", 1)] == [b"hops-2"]
        assert [b for _p, b in drain(chans[0], "ring.q", 1)] == [b"hops-2"]
        assert settle(chans[0], "ring.q", 1.0) == []

        # max-hops 10: only loop detection stops it, after one turn of the ring
        _ring_upstreams(ring, 10)
        _wait_links_with(ring, 10)
        chans[1].basic_publish("ring", "", b"loop?")
        for ch in chans:
            assert [b for _p, b in drain(ch, "ring.q", 1)] == [b"loop?"]
        for ch in chans:
            assert settle(ch, "ring.q", 1.0 if ch is chans[0] else 0.1) == []
    finally:
        for conn in conns:
            conn.close()


def test_queue_federation_pulls_only_with_consumers(two_sites) -> None:
    up, down = two_sites
    with channel(up.url) as uch:
        uch.queue_declare("work", durable=True)
        for i in range(20):
            uch.basic_publish("", "work", f"job-{i}".encode(),
                              pika.BasicProperties(delivery_mode=2, headers={"CC": ["x"]}
                                                   if i == 0 else None))
    set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1,
                              "prefetch-count": 5})
    set_policy(down, "fedq", "^work$", {"federation-upstream": "up"}, apply_to="queues")
    with channel(down.url) as dch:
        dch.queue_declare("work", durable=True)
        items = wait_running(down)
        assert items[0]["type"] == "queue" and items[0]["queue"] == "work"
        # no consumers downstream: nothing moves
        with channel(up.url) as uch:
            assert settle(dch, "work", 1.0) == []
            assert uch.queue_declare("work", passive=True).method.message_count == 20
        got: list[tuple[pika.BasicProperties, bytes]] = []

        def on_message(ch: BlockingChannel, method: pika.spec.Basic.Deliver,
                       props: pika.BasicProperties, body: bytes) -> None:
            got.append((props, body))
            ch.basic_ack(method.delivery_tag)

        dch.basic_qos(prefetch_count=2)
        tag = dch.basic_consume("work", on_message)
        deadline = time.monotonic() + 15
        while len(got) < 20 and time.monotonic() < deadline:
            dch.connection.process_data_events(time_limit=0.1)
        dch.basic_cancel(tag)
        assert sorted(b for _p, b in got) == sorted(f"job-{i}".encode() for i in range(20))
        first = next(p for p, b in got if b == b"job-0")
        hop = first.headers["x-received-from"][0]
        assert hop["queue"] == "work" and hop["visit-count"] == 1 and "guest" not in hop["uri"]
        assert first.headers["x-original-routing-key"] == "work"
        assert first.headers["x-original-exchange"] == ""
        assert first.headers["x-original-cc"] == ["x"] and "CC" not in first.headers
    with channel(up.url) as uch:
        assert uch.queue_declare("work", passive=True).method.message_count == 0


@pytest.mark.slow
def test_upstream_killed_and_restarted_mid_stream(two_sites) -> None:
    up, down = two_sites
    with channel(up.url) as uch:
        uch.exchange_declare("fed.durable", "direct", durable=True)
    with channel(down.url) as dch:
        dch.exchange_declare("fed.durable", "direct", durable=True)
        dch.queue_declare("sink", durable=True)
        dch.queue_bind("sink", "fed.durable", "k")
    set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1,
                              "prefetch-count": 50})
    set_policy(down, "fed", "^fed\\.", {"federation-upstream": "up"})
    wait_running(down)
    wait_for(lambda: any(b["routing_key"] == "k" for b in api(up).request(
        "GET", "/api/exchanges/%2F/fed.durable/bindings/source").json()),
        what="binding mirrored")

    total = 3000
    confirmed: list[int] = []

    def publisher() -> None:
        """Publish with confirms, riding out the upstream's death: what was confirmed
        must reach the downstream; an unconfirmed message is simply published again."""
        i = 0
        deadline = time.monotonic() + 60
        while i < total and time.monotonic() < deadline:
            try:
                with channel(up.url) as uch:
                    uch.confirm_delivery()
                    while i < total:
                        uch.basic_publish("fed.durable", "k", str(i).encode(),
                                          pika.BasicProperties(delivery_mode=2))
                        confirmed.append(i)
                        i += 1
            except Exception:  # the upstream is down: retry
                time.sleep(0.1)

    thread = threading.Thread(target=publisher)
    thread.start()
    wait_for(lambda: len(confirmed) >= 1000, 30, what="1000 confirmed publishes")
    up.kill()  # mid-stream: publishing, and the link moving the backlog
    up.restart(keep_port=True)
    thread.join(90)
    assert len(confirmed) == total
    wait_running(down)
    with channel(down.url) as dch:
        got = drain(dch, "sink", total, timeout=40)
        bodies = {int(b) for _p, b in got}
        bodies.update(int(b) for b in settle(dch, "sink", 0.5))
    assert bodies >= set(confirmed)  # nothing confirmed is lost (duplicates may occur)


def _ctl(proc: BrokerProcess, *args: str) -> str:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "amqpd.ctl", "--url", proc.http_url, "-u", "guest",
           "--password", "guest", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_configured_by_amqpctl_and_definitions_status_and_errors(two_sites) -> None:
    import json

    up, down = two_sites
    # amqpctl set_parameter + set_policy, exactly as with rabbitmqctl
    _ctl(down, "set_parameter", "federation-upstream", "good",
         json.dumps({"uri": amqp_uri(up.port), "reconnect-delay": 1}))
    _ctl(down, "set_policy", "--apply-to", "exchanges", "fed-ctl", "^ctl\\.",
         json.dumps({"federation-upstream": "good"}))
    # definitions import: an upstream that cannot be reached, an upstream set and a policy
    defs = {
        "parameters": [
            {"component": "federation-upstream", "vhost": "/", "name": "nowhere",
             "value": {"uri": "amqp://guest:guest@127.0.0.1:1", "reconnect-delay": 1}},
            {"component": "federation-upstream-set", "vhost": "/", "name": "both",
             "value": [{"upstream": "good", "max-hops": 2}, {"upstream": "nowhere"}]},
        ],
        "policies": [{"vhost": "/", "name": "fed-set", "pattern": "^set\\.",
                      "apply-to": "exchanges", "definition": {
                          "federation-upstream-set": "both"}, "priority": 1}],
    }
    r = api(down).request("POST", "/api/definitions", defs)
    assert r.status in (200, 201, 204), r.text
    # invalid values are refused with RabbitMQ's validation
    bad = api(down).request("PUT", "/api/parameters/federation-upstream/%2F/bad",
                            {"value": {"uri": "amqp://x", "ack-mode": "sometimes"}})
    assert bad.status == 400
    bad = api(down).request("PUT", "/api/parameters/federation-upstream/%2F/bad",
                            {"value": {"exchange": "x"}})
    assert bad.status == 400
    with channel(down.url) as dch:
        dch.exchange_declare("ctl.x", "fanout")
        dch.exchange_declare("set.x", "fanout")
    wait_running(down, 2)

    def all_links() -> list[dict[str, Any]] | None:
        items = links(down)
        return items if len(items) == 3 else None
    items = wait_for(all_links, what="three links")
    by = {(i["exchange"], i["upstream"]): i for i in items}
    assert by[("ctl.x", "good")]["status"] == "running"
    assert by[("set.x", "good")]["status"] == "running"
    failing = wait_for(lambda: next((i for i in links(down) if i["upstream"] == "nowhere"
                                     and i["status"] == "error"), None),
                       what="an error status for the unreachable upstream")
    assert failing["error"] and failing["uri"] == "amqp://127.0.0.1:1"
    # max-hops from the set member reached the upstream's exchange
    wait_for(lambda: any(x["type"] == "x-federation-upstream"
                         and x["arguments"]["x-max-hops"] == 2
                         for x in api(up).request("GET", "/api/exchanges/%2F").json()),
             what="set member override applied")
    out = _ctl(down, "federation_status")
    assert "ctl.x" in out and "running" in out and "error" in out
    down_only = json.loads(_ctl(down, "federation_status", "--only-down", "--json"))
    assert [row["upstream"] for row in down_only] == ["nowhere"]
    per_vhost = api(down).request("GET", "/api/federation-links/%2F").json()
    assert len(per_vhost) == 3
    # restart one link by id (rabbitmqctl restart_federation_link)
    link = by[("ctl.x", "good")]
    out = _ctl(down, "restart_federation_link", link["id"])
    assert "Restarting" in out
    wait_for(lambda: next(i for i in links(down) if i["id"] == link["id"])["status"]
             == "running", what="restarted link running")
    r = api(down).request("DELETE", f"/api/federation-links/vhost/%2F/nope/{link['node']}"
                          "/restart")
    assert r.status == 404
    # clearing the policy stops the links
    _ctl(down, "clear_policy", "fed-ctl")
    wait_for(lambda: len(links(down)) == 2, what="link stopped with its policy")
    # ... and removes what the link declared on the upstream
    def cleaned() -> bool:
        names = {x["name"] for x in api(up).request("GET", "/api/queues/%2F").json()}
        return "federation: ctl.x -> site-down" not in names
    wait_for(cleaned, what="upstream queue deleted after the policy went")


def test_upstream_without_federation_plugin_falls_back_to_fanout(tmp_path: Path) -> None:
    up = BrokerProcess(tmp_path / "plain", env={"AMQPD_CLUSTER_NAME": "plain"})
    down = site(tmp_path, "fb-down")
    up.start()
    down.start()
    try:
        with channel(up.url) as uch:
            uch.exchange_declare("fb.x", "direct")
        with channel(down.url) as dch:
            dch.exchange_declare("fb.x", "direct")
            dch.queue_declare("fb.q")
            dch.queue_bind("fb.q", "fb.x", "k")
            set_upstream(down, "plain", {"uri": amqp_uri(up.port), "reconnect-delay": 1})
            set_policy(down, "fb", "^fb\\.", {"federation-upstream": "plain"})
            wait_running(down)
            xs = api(up).request("GET", "/api/exchanges/%2F").json()
            internal = [x for x in xs if x["name"].startswith("federation: fb.x -> fb-down")]
            assert [x["type"] for x in internal] == ["fanout"]
            wait_for(lambda: any(b["routing_key"] == "k" for b in api(up).request(
                "GET", "/api/exchanges/%2F/fb.x/bindings/source").json()), what="binding")
            with channel(up.url) as uch:
                uch.basic_publish("fb.x", "k", b"via-fanout")
                uch.basic_publish("fb.x", "other", b"unbound")
            assert [b for _p, b in drain(dch, "fb.q", 1)] == [b"via-fanout"]
            assert settle(dch, "fb.q", 0.5) == []
    finally:
        down.stop()
        up.stop()


@pytest.mark.slow
def test_downstream_restart_keeps_federation_and_backlog(two_sites) -> None:
    """Upstreams and policies are durable definitions: after the downstream restarts its
    links come back, and what was published upstream meanwhile arrives."""
    up, down = two_sites
    with channel(up.url) as uch:
        uch.exchange_declare("dr.x", "fanout", durable=True)
    with channel(down.url) as dch:
        dch.exchange_declare("dr.x", "fanout", durable=True)
        dch.queue_declare("dr.q", durable=True)
        dch.queue_bind("dr.q", "dr.x")
    set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1,
                              "ack-mode": "on-publish"})
    set_policy(down, "dr", "^dr\\.", {"federation-upstream": "up"})
    wait_running(down)
    wait_for(lambda: any(b["destination"].startswith("federation: dr.x") for b in api(up)
                         .request("GET", "/api/exchanges/%2F/dr.x/bindings/source").json()),
             what="bound")
    down.stop()
    with channel(up.url) as uch:
        uch.confirm_delivery()
        for i in range(50):
            uch.basic_publish("dr.x", "", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    down.restart(keep_port=True)
    wait_running(down)
    with channel(down.url) as dch:
        got = drain(dch, "dr.q", 50)
    assert sorted(int(b) for _p, b in got) == list(range(50))


def test_deleted_internal_exchange_restarts_link(tmp_path: Path) -> None:
    """rabbitmq-federation #60: someone deletes the link's exchange upstream; the periodic
    passive check notices and the link rebuilds it, instead of failing silently."""
    fast = {"AMQPD_FEDERATION_INTERNAL_EXCHANGE_CHECK_INTERVAL": "0.5"}
    up, down = site(tmp_path, "ie-up"), site(tmp_path, "ie-down", fast)
    up.start()
    down.start()
    try:
        with channel(up.url) as uch:
            uch.exchange_declare("ie.x", "fanout")
        with channel(down.url) as dch:
            dch.exchange_declare("ie.x", "fanout")
            dch.queue_declare("ie.q")
            dch.queue_bind("ie.q", "ie.x")
            set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1})
            set_policy(down, "ie", "^ie\\.", {"federation-upstream": "up"})
            wait_running(down)

            def internal() -> list[str]:
                return [x["name"] for x in api(up).request("GET", "/api/exchanges/%2F").json()
                        if x["type"] == "x-federation-upstream"]
            (first,) = wait_for(internal, what="internal exchange")
            with channel(up.url) as uch:
                uch.exchange_delete(first)
            # without the repair nothing would reach the link's queue any more
            (second,) = wait_for(internal, what="internal exchange rebuilt")
            assert second[:-1] == first[:-1]
            wait_running(down)
            with channel(up.url) as uch:
                uch.basic_publish("ie.x", "", b"after-repair")
            assert [b for _p, b in drain(dch, "ie.q", 1)] == [b"after-repair"]
    finally:
        down.stop()
        up.stop()


def test_memory_alarm_pauses_links(two_sites) -> None:
    """A downstream in memory alarm stops consuming upstream (its links are publishers);
    messages wait upstream and arrive once the alarm clears."""
    up, down = two_sites
    node = api(down).request("GET", "/api/overview").json()["node"]

    def watermark(body: dict[str, object]) -> list[str]:
        r = api(down).request("PUT", f"/api/nodes/{node}/memory-high-watermark", body)
        assert r.status == 200, r.text
        return r.json()["alarms"]

    with channel(up.url) as uch:
        uch.exchange_declare("ma.x", "fanout")
    with channel(down.url) as dch:
        dch.exchange_declare("ma.x", "fanout")
        dch.queue_declare("ma.q")
        dch.queue_bind("ma.q", "ma.x")
    set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1})
    set_policy(down, "ma", "^ma\\.", {"federation-upstream": "up"})
    wait_running(down)
    wait_for(lambda: any(b["destination"].startswith("federation: ma.x") for b in api(up)
                         .request("GET", "/api/exchanges/%2F/ma.x/bindings/source").json()),
             what="bound")
    assert "memory" in watermark({"absolute": 1})
    try:
        def consumers_upstream() -> int:
            qs = api(up).request("GET", "/api/queues/%2F").json()
            return sum(q["consumers"] for q in qs if q["name"].startswith("federation: ma.x"))
        wait_for(lambda: consumers_upstream() == 0, what="link consumer cancelled")
        with channel(up.url) as uch:
            for i in range(5):
                uch.basic_publish("ma.x", "", str(i).encode())
        time.sleep(1.0)
        r = api(down).request("GET", "/api/queues/%2F/ma.q")
        assert r.json()["messages"] == 0
    finally:
        watermark({"fraction": 0.4})
    with channel(down.url) as dch:
        assert sorted(int(b) for _p, b in drain(dch, "ma.q", 5)) == list(range(5))


@pytest.mark.slow
def test_chain_propagates_bindings_within_max_hops(ring) -> None:
    """a <- b <- c (c is downstream of b, b of a), max-hops 2: a queue bound only at c
    makes its binding travel to a through b (x-bound-from), so messages published at a
    reach c across two links."""
    a, b, c = ring
    for proc in ring:
        with channel(proc.url) as ch:
            ch.exchange_declare("chain", "direct", durable=True)
    set_upstream(b, "a", {"uri": amqp_uri(a.port), "max-hops": 2, "reconnect-delay": 1})
    set_upstream(c, "b", {"uri": amqp_uri(b.port), "max-hops": 2, "reconnect-delay": 1})
    set_policy(b, "chain", "^chain$", {"federation-upstream": "a"})
    set_policy(c, "chain", "^chain$", {"federation-upstream": "b"})
    wait_running(b)
    wait_running(c)
    with channel(c.url) as cch:
        cch.queue_declare("chain.q")
        cch.queue_bind("chain.q", "chain", "deep")

        def bound_at_a() -> list[dict[str, Any]]:
            bindings = api(a).request("GET", "/api/exchanges/%2F/chain/bindings/source").json()
            return [x for x in bindings if x["routing_key"] == "deep"]
        (binding,) = wait_for(bound_at_a, what="binding propagated to a")
        hops = binding["arguments"]["x-bound-from"]
        assert [h["cluster-name"] for h in hops] == ["ring-b", "ring-c"]
        assert [h["hops"] for h in hops] == [1, 2]
        with channel(a.url) as ach:
            ach.basic_publish("chain", "deep", b"two-hops")
            ach.basic_publish("chain", "shallow", b"unbound")
        got = drain(cch, "chain.q", 1)
        assert [body for _p, body in got] == [b"two-hops"]
        assert [h["cluster-name"] for h in got[0][0].headers["x-received-from"]] == [
            "ring-b", "ring-a"]
        assert settle(cch, "chain.q", 0.5) == []
