"""Federation interop with a real RabbitMQ 3.10 (Debian's package, rabbitmq_federation).

Both directions, on one private RabbitMQ node started by the module on free ports:
RabbitMQ downstream of amqpd (amqpd serves the ``x-federation-upstream`` exchange
RabbitMQ declares) and amqpd downstream of RabbitMQ (amqpd declares what RabbitMQ's own
plugin would). Skipped when rabbitmq-server is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from devtools.rabbitmq import RabbitInfo, RabbitMQNotInstalled, ctl, find_server, running_rabbitmq
from tests.integration.fed_support import (
    amqp_uri,
    api,
    channel,
    drain,
    set_policy,
    set_upstream,
    settle,
    site,
    wait_for,
    wait_running,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.slow

RABBIT_CLUSTER = "rabbit-site"


def _installed() -> bool:
    try:
        find_server()
    except RabbitMQNotInstalled:
        return False
    return True


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitInfo]:
    if not _installed():
        pytest.skip("rabbitmq-server is not installed")
    with running_rabbitmq(tmp_path_factory.mktemp("rabbitmq"),
                          plugins=("rabbitmq_federation",)) as info:
        ctl(info, "set_cluster_name", RABBIT_CLUSTER)
        yield info


@pytest.fixture
def amqpd_site(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = site(tmp_path, "amqpd-site")
    proc.start()
    yield proc
    proc.stop()


def _rabbit_links(info: RabbitInfo) -> list[dict[str, Any]]:
    out = ctl(info, "eval", "io:format(\"~p\", [rabbit_federation_status:status()]).")
    return [{"raw": out}] if "running" in out else []


def test_rabbitmq_downstream_of_amqpd(rabbit: RabbitInfo, amqpd_site: BrokerProcess) -> None:
    with channel(amqpd_site.url) as ach:
        ach.exchange_declare("to.rabbit", "topic", durable=True)
    with channel(rabbit.amqp_url) as rch:
        rch.exchange_declare("to.rabbit", "topic", durable=True)
        rch.queue_declare("from.amqpd")
        rch.queue_bind("from.amqpd", "to.rabbit", "a.*")
        ctl(rabbit, "set_parameter", "federation-upstream", "amqpd",
            json.dumps({"uri": amqp_uri(amqpd_site.port), "reconnect-delay": 1}))
        ctl(rabbit, "set_policy", "--apply-to", "exchanges", "fed-from-amqpd", "^to\\.rabbit$",
            json.dumps({"federation-upstream": "amqpd"}))
        wait_for(lambda: _rabbit_links(rabbit), 30, what="RabbitMQ link running")

        def upstream_side() -> list[dict[str, Any]]:
            r = api(amqpd_site).request("GET", "/api/exchanges/%2F")
            return [x for x in r.json() if x["type"] == "x-federation-upstream"]
        xs = wait_for(upstream_side, 20, what="RabbitMQ declared x-federation-upstream")
        assert xs[0]["arguments"]["x-downstream-name"] == RABBIT_CLUSTER
        assert xs[0]["internal"] and xs[0]["durable"] and xs[0]["auto_delete"]
        assert xs[0]["name"].startswith(f"federation: to.rabbit -> {RABBIT_CLUSTER}")
        wait_for(lambda: any(b["routing_key"] == "a.*" for b in api(amqpd_site).request(
            "GET", "/api/exchanges/%2F/to.rabbit/bindings/source").json()),
            20, what="binding mirrored onto amqpd")
        with channel(amqpd_site.url) as ach:
            ach.basic_publish("to.rabbit", "a.b", b"hello-rabbit")
            ach.basic_publish("to.rabbit", "z.b", b"not-bound")
        got = drain(rch, "from.amqpd", 1, timeout=20)
        assert [b for _p, b in got] == [b"hello-rabbit"]
        hop = got[0][0].headers["x-received-from"][0]
        assert hop["cluster-name"] == "amqpd-site" and hop["exchange"] == "to.rabbit"
        assert settle(rch, "from.amqpd", 0.5) == []
        ctl(rabbit, "clear_policy", "fed-from-amqpd")


def test_amqpd_downstream_of_rabbitmq(rabbit: RabbitInfo, amqpd_site: BrokerProcess) -> None:
    with channel(rabbit.amqp_url) as rch:
        rch.exchange_declare("to.amqpd", "direct", durable=True)
    set_upstream(amqpd_site, "rabbit", {"uri": rabbit.amqp_url, "reconnect-delay": 1})
    set_policy(amqpd_site, "fed-from-rabbit", "^to\\.amqpd$", {"federation-upstream": "rabbit"})
    with channel(amqpd_site.url) as ach:
        ach.exchange_declare("to.amqpd", "direct", durable=True)
        ach.queue_declare("from.rabbit")
        ach.queue_bind("from.rabbit", "to.amqpd", "k1")
        items = wait_running(amqpd_site, timeout=30)
        assert "guest" not in items[0]["uri"]
        with channel(rabbit.amqp_url) as rch:
            def bound() -> bool:
                out = ctl(rabbit, "list_bindings", "source_name", "routing_key")
                return any(line.split("\t")[:2] == ["to.amqpd", "k1"]
                           for line in out.splitlines())
            wait_for(bound, 20, what="binding mirrored onto RabbitMQ")
            out = ctl(rabbit, "list_exchanges", "name", "type")
            assert "x-federation-upstream" in out  # RabbitMQ's own type, no fanout fallback
            rch.basic_publish("to.amqpd", "k1", b"hello-amqpd",
                              pika.BasicProperties(delivery_mode=2))
            rch.basic_publish("to.amqpd", "k2", b"not-bound")
        got = drain(ach, "from.rabbit", 1, timeout=20)
        assert [b for _p, b in got] == [b"hello-amqpd"]
        hop = got[0][0].headers["x-received-from"][0]
        assert hop["cluster-name"] == RABBIT_CLUSTER and hop["exchange"] == "to.amqpd"
        assert settle(ach, "from.rabbit", 0.5) == []


def test_amqpd_queue_federation_from_rabbitmq(rabbit: RabbitInfo,
                                              amqpd_site: BrokerProcess) -> None:
    with channel(rabbit.amqp_url) as rch:
        rch.queue_declare("shared.work", durable=True)
        for i in range(10):
            rch.basic_publish("", "shared.work", f"w{i}".encode())
    set_upstream(amqpd_site, "rabbitq", {"uri": rabbit.amqp_url, "reconnect-delay": 1})
    set_policy(amqpd_site, "fedq", "^shared\\.", {"federation-upstream": "rabbitq"},
               apply_to="queues")
    with channel(amqpd_site.url) as ach:
        ach.queue_declare("shared.work", durable=True)
        wait_running(amqpd_site, timeout=30)
        assert settle(ach, "shared.work", 0.5) == []  # no consumer: nothing pulled
        got: list[bytes] = []
        ach.basic_qos(prefetch_count=3)
        def take_and_ack(ch: BlockingChannel, m: pika.spec.Basic.Deliver,
                         _p: pika.BasicProperties, b: bytes) -> None:
            got.append(b)
            ch.basic_ack(m.delivery_tag)
        ach.basic_consume("shared.work", take_and_ack)
        wait_for(lambda: ach.connection.process_data_events(0.1) or len(got) >= 10, 20,
                 what="10 messages pulled from RabbitMQ")
        assert sorted(got) == sorted(f"w{i}".encode() for i in range(10))


def test_rabbitmq_queue_federation_from_amqpd(rabbit: RabbitInfo,
                                              amqpd_site: BrokerProcess) -> None:
    with channel(amqpd_site.url) as ach:
        ach.queue_declare("jobs.shared", durable=True)
        for i in range(10):
            ach.basic_publish("", "jobs.shared", f"j{i}".encode())
    with channel(rabbit.amqp_url) as rch:
        rch.queue_declare("jobs.shared", durable=True)
        ctl(rabbit, "set_parameter", "federation-upstream", "amqpdq",
            json.dumps({"uri": amqp_uri(amqpd_site.port), "reconnect-delay": 1}))
        ctl(rabbit, "set_policy", "--apply-to", "queues", "fedq-from-amqpd", "^jobs\\.",
            json.dumps({"federation-upstream": "amqpdq"}))
        got: list[tuple[Any, bytes]] = []
        rch.basic_qos(prefetch_count=3)
        def keep_and_ack(ch: BlockingChannel, m: pika.spec.Basic.Deliver,
                         p: pika.BasicProperties, b: bytes) -> None:
            got.append((p, b))
            ch.basic_ack(m.delivery_tag)
        rch.basic_consume("jobs.shared", keep_and_ack)
        wait_for(lambda: rch.connection.process_data_events(0.1) or len(got) >= 10, 30,
                 what="RabbitMQ pulled 10 messages from amqpd")
        assert sorted(b for _p, b in got) == sorted(f"j{i}".encode() for i in range(10))
        hop = got[0][0].headers["x-received-from"][0]
        assert hop["queue"] == "jobs.shared" and hop["visit-count"] == 1
        ctl(rabbit, "clear_policy", "fedq-from-amqpd")


def test_mutual_federation_amqpd_and_rabbitmq_no_loop(rabbit: RabbitInfo,
                                                      amqpd_site: BrokerProcess) -> None:
    """Each federates the other's exchange, max-hops 10: a message published on either
    side reaches the other once and never comes back (cycle detection across brokers)."""
    with channel(rabbit.amqp_url) as rch, channel(amqpd_site.url) as ach:
        for ch in (rch, ach):
            ch.exchange_declare("mesh", "fanout", durable=True)
            ch.queue_declare("mesh.q")
            ch.queue_bind("mesh.q", "mesh")
        ctl(rabbit, "set_parameter", "federation-upstream", "amqpd-mesh",
            json.dumps({"uri": amqp_uri(amqpd_site.port), "reconnect-delay": 1,
                        "max-hops": 10}))
        ctl(rabbit, "set_policy", "--apply-to", "exchanges", "mesh", "^mesh$",
            json.dumps({"federation-upstream": "amqpd-mesh"}))
        set_upstream(amqpd_site, "rabbit-mesh", {"uri": rabbit.amqp_url, "reconnect-delay": 1,
                                                 "max-hops": 10})
        set_policy(amqpd_site, "mesh", "^mesh$", {"federation-upstream": "rabbit-mesh"})
        wait_running(amqpd_site, timeout=30)

        def both_bound() -> bool:
            up_side = api(amqpd_site).request("GET", "/api/exchanges/%2F/mesh/bindings/source")
            rabbit_side = ctl(rabbit, "list_bindings", "source_name", "destination_name")
            return any(b["destination"].startswith("federation: mesh -> " + RABBIT_CLUSTER)
                       for b in up_side.json()) and \
                "federation: mesh -> amqpd-site" in rabbit_side
        wait_for(both_bound, 30, what="both links bound")
        ach.basic_publish("mesh", "", b"from-amqpd")
        rch.basic_publish("mesh", "", b"from-rabbit")
        got_r = drain(rch, "mesh.q", 2, timeout=20)
        got_a = drain(ach, "mesh.q", 2, timeout=20)
        assert sorted(b for _p, b in got_r) == [b"from-amqpd", b"from-rabbit"]
        assert sorted(b for _p, b in got_a) == [b"from-amqpd", b"from-rabbit"]
        assert settle(rch, "mesh.q", 1.5) == []
        assert settle(ach, "mesh.q", 0.2) == []
        ctl(rabbit, "clear_policy", "mesh")
