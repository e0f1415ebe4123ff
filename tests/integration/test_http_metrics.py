"""Prometheus /metrics names and message rates in message_stats."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from amqpd.http.metrics_objects import DETAILED_FAMILIES, PER_OBJECT
from devtools.rabbitmq import RabbitInfo
from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess
from tests.support.targets import private_rabbitmq


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in metrics")


def test_metrics_names_and_rates(fresh_broker: BrokerProcess) -> None:
    fresh_broker.env["AMQPD_STATS_INTERVAL"] = "0.2"
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    api.put("/api/queues/%2F/m", {"durable": True})
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for _ in range(20):
        ch.basic_publish("", "m", b"x" * 10, pika.BasicProperties(delivery_mode=2))
    for _ in range(5):
        method, _, _ = ch.basic_get("m")
        ch.basic_ack(method.delivery_tag)
    text = api.as_user(None).get("/metrics").text
    assert _value(text, "rabbitmq_connections") == 1
    assert _value(text, "rabbitmq_channels") == 1
    assert _value(text, "rabbitmq_queues") == 1
    assert _value(text, "rabbitmq_queue_messages_ready") == 15
    assert _value(text, "rabbitmq_global_messages_received_total") == 20
    assert _value(text, "rabbitmq_global_messages_delivered_total") == 5
    assert _value(text, "rabbitmq_global_messages_acknowledged_total") == 5
    for name in ("rabbitmq_process_resident_memory_bytes", "rabbitmq_io_sync_ops_total",
                 "rabbitmq_io_sync_time_seconds_total", "amqpd_store_log_bytes",
                 "amqpd_store_fsync_last_seconds", "rabbitmq_alarms_memory_used_watermark",
                 "rabbitmq_alarms_free_disk_space_watermark", "amqpd_message_publish_rate"):
        _value(text, name)
    assert _value(text, "amqpd_store_log_bytes") > 0
    per_object = api.as_user(None).get("/metrics/per-object").text
    assert 'rabbitmq_queue_messages_ready{vhost="/",queue="m"} 15' in per_object
    # rates: publish continuously for a while, then read publish_details.rate
    deadline = time.monotonic() + 10
    rate = 0.0
    while time.monotonic() < deadline and rate <= 0:
        for _ in range(20):
            ch.basic_publish("", "m", b"y")
        time.sleep(0.25)
        stats = api.get("/api/queues/%2F/m").json()["message_stats"]
        rate = stats["publish_details"]["rate"]
    assert rate > 0
    assert api.get("/api/overview").json()["message_stats"]["publish"] >= 40
    conn.close()


def _families(text: str) -> dict[str, Any]:
    """Parse with prometheus_client's own parser: each family must come once, typed."""
    names: list[str] = []
    families: dict[str, Any] = {}
    untyped = {line.split()[2] for line in text.splitlines()
               if line.startswith("# TYPE ") and line.split()[3] == "untyped"}
    for family in text_string_to_metric_families(text):
        names.append(family.name)
        families[family.name] = family
        # the parser says "unknown" for lines it met outside their family's TYPE header
        # (and for a family declared untyped, as the build and identity info are)
        assert family.type != "unknown" or family.name in untyped, family.name
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    return families


def _samples(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples
            if not s.name.endswith("_created")}


def _two_queues_and_a_consumer(url: str) -> pika.BlockingConnection:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for name, count in (("po-a", 3), ("po-b", 2)):
        ch.queue_declare(name, exclusive=True)
        for _ in range(count):
            ch.basic_publish("", name, b"x")
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("po-b", lambda *_a: None)
    conn.process_data_events(time_limit=0.2)
    return conn


def test_per_object_families_are_whole_and_use_rabbitmq_names(broker: BrokerProcess) -> None:
    """Issue 33: with two queues the per-queue lines interleaved and prometheus_client
    reported each family twice. RabbitMQ's /metrics/per-object uses the aggregated names
    with labels."""
    conn = _two_queues_and_a_consumer(broker.url)
    try:
        api = Api(broker.http_url).as_user(None)
        families = _families(api.get("/metrics/per-object").text)
        # prometheus_client drops a counter's _total suffix from the family name
        ready = _samples(families["rabbitmq_queue_messages_ready"])
        assert ready[(("queue", "po-a"), ("vhost", "/"))] == 3
        assert ready[(("queue", "po-b"), ("vhost", "/"))] == 1  # one delivered, unacked
        assert () not in ready  # no node-wide total in the per-queue family
        unacked = _samples(families["rabbitmq_queue_messages_unacked"])
        assert unacked[(("queue", "po-b"), ("vhost", "/"))] == 1
        consumers = _samples(families["rabbitmq_queue_consumers"])
        assert consumers[(("queue", "po-b"), ("vhost", "/"))] == 1
        published = _samples(families["amqpd_queue_messages_published"])
        assert published[(("queue", "po-a"), ("vhost", "/"))] == 3
        channels = _samples(families["rabbitmq_connection_channels"])
        assert list(channels.values()) == [1]
        incoming = _samples(families["rabbitmq_connection_incoming_bytes"])
        assert len(incoming) == 1 and min(incoming.values()) > 0
        assert list(_samples(families["rabbitmq_consumer_prefetch"]).values()) == [1]
        assert "rabbitmq_queues" in families and "rabbitmq_connections" in families
        # the aggregated endpoint parses the same way
        aggregated = _families(api.get("/metrics").text)
        assert _samples(aggregated["rabbitmq_queue_messages_ready"]) == {(): 4}
    finally:
        conn.close()


def test_detailed_families(broker: BrokerProcess) -> None:
    conn = _two_queues_and_a_consumer(broker.url)
    try:
        api = Api(broker.http_url).as_user(None)
        r = api.get("/metrics/detailed?family=queue_coarse_metrics"
                    "&family=connection_coarse_metrics&family=queue_consumer_count"
                    "&family=queue_metrics")
        assert r.status == 200
        families = _families(r.text)
        assert set(families) == {
            "rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_messages_unacked",
            "rabbitmq_detailed_queue_messages", "rabbitmq_detailed_connection_incoming_bytes",
            "rabbitmq_detailed_connection_outgoing_bytes", "rabbitmq_detailed_queue_consumers",
            "rabbitmq_detailed_queue_messages_ready_bytes", "rabbitmq_build_info",
            "rabbitmq_identity_info"}
        depth = _samples(families["rabbitmq_detailed_queue_messages"])
        assert depth[(("queue", "po-a"), ("vhost", "/"))] == 3
        assert depth[(("queue", "po-b"), ("vhost", "/"))] == 2
        # a vhost filter, and a family amqpd does not have: 200 and no series, as RabbitMQ
        r = api.get("/metrics/detailed?family=queue_coarse_metrics&vhost=nope")
        assert _samples(_families(r.text)["rabbitmq_detailed_queue_messages"]) == {}
        r = api.get("/metrics/detailed?family=no_such_family")
        assert r.status == 200
        assert set(_families(r.text)) == {"rabbitmq_build_info", "rabbitmq_identity_info"}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def rabbit_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitInfo]:
    with private_rabbitmq(tmp_path_factory, ("rabbitmq_prometheus",)) as info:
        yield info


def _label_names(family: Any) -> set[str]:
    return {k for s in family.samples for k in s.labels}


def _scrape(base: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return _families(resp.read().decode())


def test_names_and_labels_match_rabbitmqs_plugin(broker: BrokerProcess,
                                                 rabbit_prometheus: RabbitInfo) -> None:
    """Every per-object and detailed family amqpd serves, RabbitMQ 3.10.8's plugin serves
    too, with the same type and label names, for the same two queues and consumer
    (RabbitMQ's per-object figures wait for its stats emission: polled)."""
    rabbit = f"http://127.0.0.1:{rabbit_prometheus.plugin_ports['rabbitmq_prometheus']}"
    ours = Api(broker.http_url).as_user(None)
    names = [f"rabbitmq_{s.name}" for _kind, series in PER_OBJECT for s in series]
    query = "&".join(f"family={f}" for f in DETAILED_FAMILIES)
    theirs_conn = _two_queues_and_a_consumer(rabbit_prometheus.amqp_url)
    our_conn = _two_queues_and_a_consumer(broker.url)
    try:
        deadline = time.monotonic() + 30
        while True:
            theirs = _scrape(rabbit, "/metrics/per-object")
            if theirs.get("rabbitmq_connection_channels") is not None and \
                    theirs["rabbitmq_connection_channels"].samples:
                break
            assert time.monotonic() < deadline, "RabbitMQ never listed the connection"
            time.sleep(0.5)
        theirs_detailed = _scrape(rabbit, f"/metrics/detailed?{query}")
        ours_po = _families(ours.get("/metrics/per-object").text)
        ours_detailed = _families(ours.get(f"/metrics/detailed?{query}").text)
    finally:
        theirs_conn.close()
        our_conn.close()
    checked = 0
    for mine, reference in ((ours_po, theirs), (ours_detailed, theirs_detailed)):
        for name, family in mine.items():
            base = name.removesuffix("_total")
            if not any(n.removesuffix("_total") == base for n in names) and \
                    not name.startswith("rabbitmq_detailed_"):
                continue  # node-wide series: not what this test is about
            assert name in reference, f"{name}: RabbitMQ has no such family"
            assert family.type == reference[name].type, name
            if family.samples and reference[name].samples:
                assert _label_names(family) == _label_names(reference[name]), name
                checked += 1
    assert checked >= 12
