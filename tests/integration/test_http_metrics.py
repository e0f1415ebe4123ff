"""Prometheus /metrics names and message rates in message_stats."""

from __future__ import annotations

import time

import pika

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


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
    assert 'rabbitmq_detailed_queue_messages_ready{vhost="/",queue="m"} 15' in per_object
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
