"""Per-object Prometheus series (one per queue, connection or channel), by metric group.

RabbitMQ 3.10's prometheus plugin serves them twice: ``/metrics/per-object`` under the
aggregated endpoint's names (``rabbitmq_queue_messages_ready{vhost,queue}`` in place of
the node-wide ``rabbitmq_queue_messages_ready``), and ``/metrics/detailed?family=NAME``
under ``rabbitmq_detailed_*`` names, one group (``queue_coarse_metrics``,
``connection_coarse_metrics``...) per ``family`` parameter. The groups, names, help
texts and labels below are the ones a RabbitMQ 3.10.8 node answered with (its queues
labelled ``vhost``/``queue``, its connections and channels ``channel``, which RabbitMQ
fills with the Erlang process id and amqpd with the connection's or channel's name);
what only an Erlang node has (process reductions, memory per process) is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.http.metrics import Exposition


@dataclass(frozen=True)
class Series:
    name: str  # after the rabbitmq_ (or rabbitmq_detailed_) prefix
    kind: str
    help: str
    value: Callable[[Any], float]


QUEUE_COARSE = (
    Series("queue_messages_ready", "gauge", "Messages ready to be delivered to consumers",
           lambda q: q.message_count),
    Series("queue_messages_unacked", "gauge",
           "Messages delivered to consumers but not yet acknowledged",
           lambda q: q.unacked_count),
    Series("queue_messages", "gauge",
           "Sum of ready and unacknowledged messages - total queue depth",
           lambda q: q.message_count + q.unacked_count),
)
QUEUE_CONSUMER_COUNT = (
    Series("queue_consumers", "gauge", "Consumers on a queue", lambda q: len(q.consumers)),
)
QUEUE_METRICS = (
    *QUEUE_CONSUMER_COUNT,
    Series("queue_messages_ready_bytes", "gauge", "Size in bytes of ready messages",
           lambda q: q.ready_bytes),
)
# amqpd's own per-queue counters (amqpd_ prefix): RabbitMQ counts publishes per
# channel, exchange and queue (channel_queue_exchange_metrics), which amqpd does not keep
AMQPD_QUEUE = (
    Series("queue_messages_published_total", "counter", "Messages enqueued per queue",
           lambda q: q.stat_publish),
    Series("queue_messages_delivered_total", "counter", "Messages delivered per queue",
           lambda q: q.stat_deliver),
    Series("queue_messages_acked_total", "counter", "Messages acked per queue",
           lambda q: q.stat_ack),
)
CONNECTION_COARSE = (
    Series("connection_incoming_bytes_total", "counter",
           "Total number of bytes received on a connection",
           lambda s: s.conn.received_bytes),
    Series("connection_outgoing_bytes_total", "counter",
           "Total number of bytes sent on a connection", lambda s: s.conn.sent_bytes),
)
CONNECTION_METRICS = (
    Series("connection_channels", "gauge", "Channels on a connection",
           lambda s: len(s.channels)),
)
CHANNEL_METRICS = (
    Series("channel_consumers", "gauge", "Consumers on a channel",
           lambda ch: len(ch.consumers)),
    Series("channel_messages_unacked", "gauge",
           "Delivered but not yet acknowledged messages", lambda ch: len(ch.unacked)),
    Series("consumer_prefetch", "gauge",
           "Limit of unacknowledged messages for each consumer",
           lambda ch: ch.prefetch_consumer),
    Series("channel_prefetch", "gauge",
           "Total limit of unacknowledged messages for all consumers on a channel",
           lambda ch: ch.prefetch_channel),
)

# /metrics/detailed?family=...: the groups amqpd has, each to (object kind, series)
DETAILED_FAMILIES: dict[str, tuple[str, tuple[Series, ...]]] = {
    "queue_coarse_metrics": ("queue", QUEUE_COARSE),
    "queue_consumer_count": ("queue", QUEUE_CONSUMER_COUNT),
    "queue_metrics": ("queue", QUEUE_METRICS),
    "connection_coarse_metrics": ("connection", CONNECTION_COARSE),
    "connection_metrics": ("connection", CONNECTION_METRICS),
    "channel_metrics": ("channel", CHANNEL_METRICS),
}
# /metrics/per-object: every group, each series once, under the aggregated names
PER_OBJECT: tuple[tuple[str, tuple[Series, ...]], ...] = (
    ("queue", (*QUEUE_COARSE, *QUEUE_METRICS)),
    ("connection", (*CONNECTION_COARSE, *CONNECTION_METRICS)),
    ("channel", CHANNEL_METRICS),
)


def _objects(api: BrokerAPI, kind: str, vhosts: set[str] | None, led_only: bool = False,
             ) -> list[tuple[Any, dict[str, str]]]:
    """Every object of ``kind`` (in the vhosts named, or all) with its labels;
    ``led_only``: only the queues this node leads (not another's copies)."""
    if kind == "queue":
        return [(q, {"vhost": vh.name, "queue": q.name}) for vh in api.vhosts()
                if vhosts is None or vh.name in vhosts for q in api.queues(vh)
                if not (led_only and q.forwards_publish)]
    sessions = [s for s in api.sessions() if s.vhost is not None
                and (vhosts is None or s.vhost.name in vhosts)]
    if kind == "connection":
        return [(s, {"channel": s.name}) for s in sessions]
    return [(ch, {"channel": f"{s.name} ({ch.number})"}) for s in sessions
            for ch in s.channels.values()]


def add_series(e: Exposition, api: BrokerAPI, kind: str, series: tuple[Series, ...],
               prefix: str, seen: set[str], vhosts: set[str] | None = None,
               led_only: bool = False) -> None:
    """One family per series, its samples together; a name in ``seen`` (a series two
    groups share, such as queue_consumers) is written once. A family with no object
    still gets its header, as RabbitMQ's does."""
    objects = _objects(api, kind, vhosts, led_only)
    for s in series:
        name = prefix + s.name
        if name in seen:
            continue
        seen.add(name)
        e.declare(name, s.kind, s.help)
        for obj, labels in objects:
            e.add(name, s.kind, s.help, s.value(obj), labels)


def per_object(e: Exposition, api: BrokerAPI, led_only: bool = False) -> None:
    """/metrics/per-object's series, under the aggregated endpoint's names."""
    seen: set[str] = set()
    for kind, series in PER_OBJECT:
        add_series(e, api, kind, series, "rabbitmq_", seen, led_only=led_only)
    add_series(e, api, "queue", AMQPD_QUEUE, "amqpd_", seen, led_only=led_only)


def detailed(e: Exposition, api: BrokerAPI, families: list[str],
             vhosts: set[str] | None, led_only: bool = False) -> None:
    """/metrics/detailed: the groups asked for, under ``rabbitmq_detailed_*`` names. A
    group amqpd does not have adds nothing, as RabbitMQ answers for a name it does not
    know (200, no series)."""
    seen: set[str] = set()
    for family in families:
        if family in DETAILED_FAMILIES:
            kind, series = DETAILED_FAMILIES[family]
            add_series(e, api, kind, series, "rabbitmq_detailed_", seen, vhosts, led_only)
