"""Issue 29: a shovel whose destination is another amqpd retries a refused publish only
into the queues that did not take it (the ``publish_retry_of`` capability,
amqpd/broker/retry_routes.py, docs/shovel.md).

Before, over AMQP the destination answered one confirm per publish: when its exchange
routed to a healthy queue and to one that refused (max-length with reject-publish), the
shovel's retry went through the exchange again and the healthy queue took one more copy
per retry round.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration._http import q
from tests.integration.cluster_support import private_etcd, three_nodes
from tests.integration.fed_support import (
    amqp_uri,
    api,
    channel,
    get_all,
    set_policy,
    site,
    wait_for,
)
from tests.integration.test_cluster_queues import declare_on, wait_known_everywhere
from tests.integration.test_shovel_helpers import set_shovel, shovel_state
from tests.support import etcdproc
from tests.support.brokerproc import BrokerProcess

N = 12
FULL = 4  # orders' max-length: FULL fillers make it refuse until a consumer drains it
CAPS = {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
        "publish_retry_of": True}


@pytest.fixture
def two_sites(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    src = site(tmp_path, "src", {"AMQPD_PLUGINS": "shovel"})
    dst = site(tmp_path, "dst", {"AMQPD_PLUGINS": "shovel"})
    src.start()
    try:
        dst.start()
        try:
            yield src, dst
        finally:
            dst.stop()
    finally:
        src.stop()


def _depth(proc: BrokerProcess, name: str) -> int:
    r = api(proc).request("GET", f"/api/queues/%2F/{q(name)}")
    assert r.status == 200, r.text
    depth: int = r.json()["messages"]
    return depth


def _route(dst: BrokerProcess, p: str) -> None:
    """{p}.x (fanout) -> {p}.healthy and {p}.orders; orders full (FULL fillers,
    max-length FULL with reject-publish): it refuses every publish until drained."""
    with channel(dst.url) as ch:
        ch.exchange_declare(f"{p}.x", "fanout", durable=True)
        for name in (f"{p}.healthy", f"{p}.orders"):
            ch.queue_declare(name, durable=True)
            ch.queue_bind(name, f"{p}.x")
        set_policy(dst, f"{p}-full", f"^{q(p)}\\.orders$",
                   {"max-length": FULL, "overflow": "reject-publish"}, apply_to="queues")
        for _ in range(FULL):
            ch.basic_publish("", f"{p}.orders", b"filler")
    wait_for(lambda: _depth(dst, f"{p}.orders") == FULL, what="orders full")


def _drain(url: str, queue: str, want: int, timeout: float) -> list[tuple[Any, bytes]]:
    """Consume (basic.get, auto-ack) from ``queue`` until ``want`` messages that are not
    fillers came, or ``timeout``: a consumer that makes room in the full queue."""
    got: list[tuple[Any, bytes]] = []
    deadline = time.monotonic() + timeout
    with channel(url) as ch:
        while time.monotonic() < deadline:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                if len(got) >= want:
                    break
                time.sleep(0.02)
                continue
            if body != b"filler":
                got.append((props, body))
    return got


def _shovel_through_refusals(src: BrokerProcess, dest_port: int, healthy: BrokerProcess,
                             orders: BrokerProcess, p: str) -> None:
    """N messages at src, a shovel src -> the destination (its AMQP port
    ``dest_port``) into {p}.x; ``healthy``/``orders``: the nodes whose API and AMQP port
    count and drain those queues. Through the retry rounds the healthy queue holds each
    message exactly once; the full one, drained by a consumer, gets each message once;
    nothing lost, the retries flagged and without the retry-of header."""
    with channel(src.url) as ch:
        ch.queue_declare(f"{p}.src", durable=True)
        ch.confirm_delivery()
        for i in range(N):
            ch.basic_publish("", f"{p}.src", f"m{i}".encode(), pika.BasicProperties(
                delivery_mode=2, message_id=f"id-{i}"))
    log_start = src.log_path.stat().st_size
    set_shovel(api(src), p, {"src-uri": "amqp://", "src-queue": f"{p}.src",
                             "dest-uri": amqp_uri(dest_port), "dest-exchange": f"{p}.x"})

    def rounds() -> int:
        text = src.log_path.read_bytes()[log_start:].decode(errors="replace")
        return text.count("publishing them again")

    wait_for(lambda: rounds() >= 4, timeout=30, what="four retry rounds")
    assert _depth(healthy, f"{p}.healthy") == N  # the retry rounds added nothing
    assert shovel_state(api(src), p) == "running"
    got = _drain(orders.url, f"{p}.orders", N, timeout=60)
    wait_for(lambda: _depth(src, f"{p}.src") == 0, what="the source settled")
    got += _drain(orders.url, f"{p}.orders", 0, timeout=0.5)  # nothing more came
    kept = get_all(healthy.url, f"{p}.healthy", 20 * N)
    ids = sorted(f"id-{i}" for i in range(N))
    assert sorted(props.message_id for props, _b in kept) == ids  # each exactly once
    assert sorted(props.message_id for props, _b in got) == ids  # each once, none lost
    assert not any("x-shovel-retry" in (props.headers or {}) for props, _b in kept)
    retried = [props for props, _b in got if "x-shovel-retry" in (props.headers or {})]
    assert retried, "the full queue was expected to take retries"
    assert not any("x-publish-retry-of" in (props.headers or {}) for props, _b in got)
    with contextlib.suppress(Exception):
        api(src).request("DELETE", f"/api/parameters/shovel/%2F/{p}")


def test_remote_amqpd_destination_retries_only_into_the_refusing_queue(
        two_sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Shovel src -> dst (another amqpd, over AMQP) into an exchange routing to a
    healthy queue and a full one (max-length with reject-publish, then drained)."""
    src, dst = two_sites
    _route(dst, "rr")
    _shovel_through_refusals(src, dst.port, dst, dst, "rr")


@pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON)
@pytest.mark.timeout(300)
def test_cluster_destination_with_queues_led_by_other_nodes(tmp_path: Path) -> None:
    """The same into a three-node cluster: the shovel connects to node-a, the healthy
    queue is led by node-b and the full one by node-c. node-a forwards each queue's
    publish to its leader and hears each answer, so it knows which queue refused."""
    src = site(tmp_path, "src", {"AMQPD_PLUGINS": "shovel"})
    src.start()
    try:
        with private_etcd(tmp_path) as etcd, three_nodes(tmp_path, etcd.url) as nodes:
            a, b, c = nodes
            declare_on(b, "cr.healthy")
            declare_on(c, "cr.orders", **{"x-max-length": FULL,
                                          "x-overflow": "reject-publish"})
            for name, leader in (("cr.healthy", b), ("cr.orders", c)):
                wait_known_everywhere(nodes, name, leader.name)
            with channel(a.url) as ch:
                ch.exchange_declare("cr.x", "fanout", durable=True)
                for name in ("cr.healthy", "cr.orders"):
                    ch.queue_bind(name, "cr.x")
            with channel(c.url) as ch:
                for _ in range(FULL):
                    ch.basic_publish("", "cr.orders", b"filler")
            pa, pb, pc = a.proc, b.proc, c.proc
            assert pa is not None and pb is not None and pc is not None
            wait_for(lambda: _depth(pc, "cr.orders") == FULL, what="orders full")
            _shovel_through_refusals(src, pa.port, pb, pc, "cr")
    finally:
        src.stop()


def _announcing(url: str, announce: bool = True) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    if announce:
        params.client_properties = {"product": "retry-of test", "capabilities": CAPS}
    return pika.BlockingConnection(params)


def _publish(ch: Any, body: bytes, headers: dict[str, Any] | None = None) -> bool:
    """One confirmed publish to rc.x: acked?"""
    try:
        ch.basic_publish("rc.x", "", body, pika.BasicProperties(headers=headers))
        return True
    except pika.exceptions.NackError:
        return False


def test_the_capability_at_the_protocol_level(
        two_sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """What any client announcing ``publish_retry_of`` gets: the server offers it; a
    nacked publish's retry (header = its sequence number) skips the queues that took
    it and is acked at once when none remain; another body under the header goes to
    the whole route; a bad value closes the channel with 406; a connection that did not
    announce it keeps the header as an ordinary one."""
    _src, dst = two_sites
    _route(dst, "rc")
    conn = _announcing(dst.url)
    try:
        offered = conn._impl.server_capabilities
        assert offered.get("publish_retry_of") is True, offered
        ch = conn.channel()
        ch.confirm_delivery()
        assert not _publish(ch, b"one")  # seq 1: healthy took it, orders refused
        assert _depth(dst, "rc.healthy") == 1
        assert not _publish(ch, b"one", {"x-publish-retry-of": 1})  # seq 2: orders only
        assert _depth(dst, "rc.healthy") == 1
        assert get_all(dst.url, "rc.orders", 1)[0][1] == b"filler"  # room for one
        assert _publish(ch, b"one", {"x-publish-retry-of": 1, "keep": "me"})  # seq 3
        assert _depth(dst, "rc.healthy") == 1
        assert _depth(dst, "rc.orders") == FULL
        got = get_all(dst.url, "rc.orders", 2 * FULL)
        ours = [p for p, b in got if b == b"one"]
        assert len(ours) == 1 and ours[0].headers == {"keep": "me"}, ours  # header gone
        # orders is empty now: refill it, so that it refuses again
        with channel(dst.url) as filler:
            for _ in range(FULL):
                filler.basic_publish("", "rc.orders", b"filler")
        assert not _publish(ch, b"two")  # seq 4: healthy took it, orders refused
        assert _depth(dst, "rc.healthy") == 2
        # seq 5 names seq 4 with another body: no retry of it, the whole route
        assert not _publish(ch, b"other", {"x-publish-retry-of": 4})
        assert _depth(dst, "rc.healthy") == 3
        # orders leaves the route: every queue of it has "two", acked without a publish
        ch.queue_unbind("rc.orders", "rc.x")
        assert _publish(ch, b"two", {"x-publish-retry-of": 4})  # seq 6
        assert _depth(dst, "rc.healthy") == 3
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("rc.x", "", b"bad", pika.BasicProperties(
                headers={"x-publish-retry-of": 99}))  # later than this publish
        assert err.value.reply_code == 406
        assert "x-publish-retry-of" in err.value.reply_text
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    plain = _announcing(dst.url, announce=False)
    try:
        ch = plain.channel()
        ch.confirm_delivery()
        _publish(ch, b"three", {"x-publish-retry-of": 99})  # an ordinary header here
    finally:
        with contextlib.suppress(Exception):
            plain.close()
    got = get_all(dst.url, "rc.healthy", 10)
    assert sorted(b for _p, b in got) == [b"one", b"other", b"three", b"two"]
    assert [p.headers for p, b in got if b == b"three"] == [{"x-publish-retry-of": 99}]
    assert "header x-publish-retry-of must be" in dst.log_path.read_text(errors="replace")

    def exchange_stats() -> tuple[int, int] | None:
        r = api(dst).request("GET", "/api/exchanges/%2F/rc.x")
        stats = r.json().get("message_stats") or {}
        counts = (stats.get("publish_in"), stats.get("publish_out"))
        return counts if counts == (7, 9) else None

    # one publish_in per publish, as RabbitMQ counts (the refused one not), per queue
    # publish_out: 2 + 1 + 1 (one, its retries) + 2 + 2 (two, other) + 0 (two's retry,
    # stored nowhere) + 1 (three)
    wait_for(exchange_stats, timeout=15, what="rc.x's publish_in 7 and publish_out 9")
