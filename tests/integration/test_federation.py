"""Federation between amqpd sites (separate processes, unique cluster names)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

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


@pytest.fixture
def two_sites(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    up, down = site(tmp_path, "site-up"), site(tmp_path, "site-down")
    up.start()
    down.start()
    yield up, down
    down.stop()
    up.stop()


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
