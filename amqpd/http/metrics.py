"""Prometheus text exposition at /metrics (aggregated), /metrics/per-object and
/metrics/detailed (amqpd/http/metrics_objects.py has the per-object series).

Names follow RabbitMQ's ``rabbitmq_prometheus`` plugin wherever it has the metric
(``rabbitmq_connections``, ``rabbitmq_queue_messages_ready``,
``rabbitmq_global_messages_received_total``, ``rabbitmq_io_sync_time_seconds_total``...),
so existing Grafana dashboards keep working. amqpd-only metrics are ``amqpd_*``. Like the
plugin, these endpoints need no credentials.

``?amqpd_led_only=true`` (amqpd's own, :attr:`Ctx.led_only`) counts only the queues
this node leads, leaving out its copies of queues another node leads (which repeat the
leader's figures, and count again what they forward or pass on): the workers' HTTP front
(amqpd/workers/http_front.py) asks each worker so, then sums.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

import amqpd
from amqpd.broker.api import BrokerAPI
from amqpd.http import metrics_objects
from amqpd.http.core import Ctx, Router
from amqpd.http.overview import fd_counts, memory_used

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Exposition:
    """The text exposition, one family at a time: every sample of a family is written
    under its one TYPE/HELP header, whatever order they were added in. (Added in turn,
    per queue, the families' lines interleaved, and parsers such as prometheus_client's
    then reported a family twice, the second time as ``unknown``.)"""

    def __init__(self) -> None:
        # name -> (TYPE/HELP header lines, sample lines), in first-added order
        self._families: dict[str, tuple[list[str], list[str]]] = {}

    def add(self, name: str, kind: str, help_: str, value: float,
            labels: dict[str, str] | None = None) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = ([f"# TYPE {name} {kind}",
                                              f"# HELP {name} {help_}"], [])
        label = ""
        if labels:
            label = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"
        family[1].append(f"{name}{label} {_num(value)}")

    def declare(self, name: str, kind: str, help_: str) -> None:
        """A family with no sample yet (RabbitMQ lists one with no connection open too)."""
        if name not in self._families:
            self._families[name] = ([f"# TYPE {name} {kind}", f"# HELP {name} {help_}"], [])

    def text(self) -> str:
        lines = [line for header, samples in self._families.values()
                 for line in (*header, *samples)]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _identity(api: BrokerAPI, e: Exposition) -> None:
    status = api.node_status()
    e.add("rabbitmq_build_info", "untyped", "amqpd version and the RabbitMQ API it follows", 1,
          {"rabbitmq_version": "3.10.8", "product_version": amqpd.__version__,
           "product_name": "amqpd"})
    e.add("rabbitmq_identity_info", "untyped", "Node and cluster identity", 1,
          {"rabbitmq_node": status.name, "rabbitmq_cluster": status.cluster_name})


def collect(ctx: Ctx, per_object: bool = False) -> str:
    """The node's series; ``per_object`` (/metrics/per-object) replaces the queue totals
    with one series per queue under the same names, and adds connections and channels,
    as RabbitMQ's plugin does (amqpd/http/metrics_objects.py)."""
    api = ctx.api
    status = api.node_status()
    e = Exposition()
    _identity(api, e)
    sessions = [x for x in api.sessions() if x.vhost is not None]
    led = ctx.led_only
    queues = [q for vh in api.vhosts() for q in api.queues(vh)
              if not (led and q.forwards_publish)]
    e.add("rabbitmq_connections", "gauge", "Connections currently open", len(sessions))
    e.add("rabbitmq_channels", "gauge", "Channels currently open",
          sum(len(x.channels) for x in sessions))
    e.add("rabbitmq_consumers", "gauge", "Consumers currently connected",
          sum(len(q.consumers) for q in queues))
    e.add("rabbitmq_queues", "gauge", "Queues available", len(queues))
    if per_object:
        metrics_objects.per_object(e, api, led)
    else:
        e.add("rabbitmq_queue_messages_ready", "gauge", "Messages ready to be delivered",
              sum(q.message_count for q in queues))
        e.add("rabbitmq_queue_messages_unacked", "gauge", "Messages delivered but not acked",
              sum(q.unacked_count for q in queues))
        e.add("rabbitmq_queue_messages", "gauge", "Ready and unacknowledged messages",
              sum(q.message_count + q.unacked_count for q in queues))
        e.add("rabbitmq_queue_messages_ready_bytes", "gauge", "Size of ready message bodies",
              sum(q.ready_bytes for q in queues))
    sampler = ctx.request.app["sampler"]
    totals = sampler.node_totals(led)
    e.add("rabbitmq_global_messages_received_total", "counter",
          "Messages enqueued into queues", totals["stat_publish"])
    e.add("rabbitmq_global_messages_delivered_total", "counter",
          "Messages delivered to consumers and basic.get", totals["stat_deliver"])
    e.add("rabbitmq_global_messages_acknowledged_total", "counter",
          "Messages acknowledged by consumers", totals["stat_ack"])
    e.add("rabbitmq_global_messages_redelivered_total", "counter",
          "Messages redelivered", totals["stat_redeliver"])
    for counter, name in (("stat_publish", "publish"), ("stat_deliver", "deliver"),
                          ("stat_ack", "ack")):
        e.add(f"amqpd_message_{name}_rate", "gauge",
              f"Messages per second ({name}), averaged over the last sample interval",
              round((sampler.led_rates if led else sampler.node_rates).get(counter, 0.0),
                    3))
    e.add("rabbitmq_process_resident_memory_bytes", "gauge", "Resident memory", memory_used())
    fd_used, fd_total = fd_counts()
    e.add("rabbitmq_process_open_fds", "gauge", "Open file descriptors", fd_used)
    e.add("rabbitmq_process_max_fds", "gauge", "File descriptor limit", fd_total)
    e.add("rabbitmq_erlang_uptime_seconds", "gauge", "Node uptime",
          round(time.time() - status.started_at, 3))
    alarms = set(status.alarms)
    e.add("rabbitmq_alarms_memory_used_watermark", "gauge",
          "1 if the memory alarm is in effect", int("memory" in alarms))
    e.add("rabbitmq_alarms_free_disk_space_watermark", "gauge",
          "1 if the disk alarm is in effect", int("disk" in alarms))
    e.add("rabbitmq_alarms_file_descriptor_limit", "gauge",
          "1 if the file descriptor alarm is in effect", int("fd" in alarms))
    _store_metrics(api, e)
    _warren_metrics(api, e)
    _stream_metrics(api, [q for q in queues if q.type_name == "stream"], e)
    _dedup_metrics(api, e)
    _replication(api, e)
    for source in ctx.request.app["router"].metric_sources:  # amqpd_stream_protocol_*
        source(e)
    return e.text()


def _stream_metrics(api: BrokerAPI, streams: list[Any], e: Exposition) -> None:
    """``amqpd_stream_*``: each stream's log (size on disk, segments, first and last
    offset) and each of its consumers' next offset; streams are few, so these come
    per stream without ``/metrics/per-object``. One family at a time (the text format
    wants a family's samples together)."""
    rows = [({"vhost": q.vhost.name, "queue": q.name},
             api.queue_type_info(q).get("stream") or {}) for q in streams]
    for name, kind, help_, key in (
            ("amqpd_stream_size_bytes", "gauge", "Bytes of a stream's segment files",
             "size_bytes"),
            ("amqpd_stream_segments", "gauge", "Segment files of a stream", "segments"),
            ("amqpd_stream_first_offset", "gauge", "Oldest offset a stream keeps",
             "first_offset"),
            ("amqpd_stream_last_offset", "gauge", "Newest offset of a stream (-1: empty)",
             "last_offset"),
            ("amqpd_stream_segments_deleted_total", "counter",
             "Segments retention deleted from a stream", "segments_deleted")):
        for labels, stats in rows:
            e.add(name, kind, help_, stats.get(key, 0), labels)
    for labels, stats in rows:
        for c in stats.get("consumers", []):
            e.add("amqpd_stream_consumer_offset", "gauge",
                  "Next offset a stream consumer reads",
                  c["offset"], {**labels, "consumer_tag": c["consumer_tag"]})


def _replication(api: BrokerAPI, e: Exposition) -> None:
    """``amqpd_replication_*``: the warren's role, epoch, in-sync set and lag."""
    r = api.replication_status()
    if r is None:
        return
    for role in ("active", "standby", "fenced", "starting"):
        e.add("amqpd_replication_role", "gauge", "1 for this node's current warren role",
              r["role"] == role, {"role": role})
    e.add("amqpd_replication_epoch", "gauge", "Leadership epoch this node knows", r["epoch"])
    e.add("amqpd_replication_last_sequence", "gauge",
          "Last log sequence written (active) or durably received (standby)",
          r.get("last_seq", 0))
    if "standbys" in r:
        e.add("amqpd_replication_insync_standbys", "gauge", "Standbys in the in-sync set",
              r["insync_count"])
        e.add("amqpd_replication_min_insync_standbys", "gauge",
              "In-sync standbys a confirm waits for", r["min_insync_standbys"])
        e.add("amqpd_replication_left_insync_total", "counter",
              "Times a standby left the in-sync set (lag past max_lag)",
              r["left_insync_total"])
        e.add("amqpd_replication_nacked_commits_total", "counter",
              "Group commits nacked for want of in-sync standbys", r["nacked_total"])
        e.add("amqpd_replication_auth_failures_total", "counter",
              "Replication connections refused by authentication", r["auth_failures_total"])
        e.add("amqpd_replication_lane_frames_total", "counter",
              "DATA frames the log writer sent to standbys itself, before its fsync",
              r["lane_frames_total"])
        for sb in r["standbys"]:
            labels = {"standby": sb["name"], "address": sb["address"]}
            e.add("amqpd_replication_standby_lag_records", "gauge",
                  "Records the standby has not acknowledged", sb["lag_records"], labels)
            e.add("amqpd_replication_standby_lag_bytes", "gauge",
                  "Log bytes the standby has not acknowledged", sb["lag_bytes"], labels)
            e.add("amqpd_replication_standby_lag_seconds", "gauge",
                  "Age of the oldest record the standby has not acknowledged",
                  sb["lag_seconds"], labels)
            e.add("amqpd_replication_standby_in_sync", "gauge",
                  "1 while the standby is in the in-sync set", sb["in_sync"], labels)
    if "connected" in r:
        e.add("amqpd_replication_follower_connected", "gauge",
              "1 while this standby is connected to the active", r["connected"])
        e.add("amqpd_replication_follower_lag_records", "gauge",
              "Records the active announced that are not durable here", r["lag_records"])
        e.add("amqpd_replication_follower_lag_seconds", "gauge",
              "Seconds since this standby last held everything announced",
              r["lag_seconds"])


def _dedup_metrics(api: BrokerAPI, e: Exposition) -> None:
    """``amqpd_dedup_*``: each deduplication cache's bound, entries and refusals (one
    family after another, as the text format wants)."""
    caches: list[tuple[dict[str, str], dict[str, Any]]] = []
    for vh in api.vhosts():
        for ex in api.exchanges(vh):
            if ex.type_name == "x-message-deduplication":
                caches.append(({"vhost": vh.name, "exchange": ex.name},
                               ex.info()["deduplication"]))
        for q in api.queues(vh):
            if q.dedup is not None:
                caches.append(({"vhost": vh.name, "queue": q.name}, q.dedup.info()))
    for labels, d in caches:
        e.add("amqpd_dedup_cache_entries", "gauge", "Values in a deduplication cache",
              d["cache_entries"], labels)
    for labels, d in caches:
        if d.get("cache_size") is not None:
            e.add("amqpd_dedup_cache_size", "gauge",
                  "A deduplication cache's bound (x-cache-size)", d["cache_size"], labels)
    for labels, d in caches:
        e.add("amqpd_dedup_duplicates_total", "counter", "Messages refused as duplicates",
              d["duplicates"], labels)


def _store_metrics(api: BrokerAPI, e: Exposition) -> None:
    try:
        stats = api.store_stats()
    except Exception:  # metrics are best effort: a failing store still gets scraped
        stats = {}
    fsyncs = int(stats.get("fsyncs", 0))
    e.add("rabbitmq_io_sync_ops_total", "counter", "fsync calls by the message log", fsyncs)
    e.add("rabbitmq_io_sync_time_seconds_total", "counter", "Time spent in fsync",
          fsyncs * int(stats.get("fsync_avg_us", 0)) / 1e6)
    e.add("amqpd_store_fsync_last_seconds", "gauge", "Latency of the last fsync",
          int(stats.get("fsync_last_us", 0)) / 1e6)
    e.add("amqpd_store_log_bytes", "gauge", "Size of the message log segments on disk",
          int(stats.get("bytes_on_disk", 0)))
    e.add("amqpd_store_segments", "gauge", "Message log segments", int(stats.get("segments", 0)))


def _warren_metrics(api: BrokerAPI, e: Exposition) -> None:
    """The warren's election: role, epoch, lease, fencing (absent on a single node; the
    replication lag figures are amqpd_replication_*). Roles: 0 candidate, 1 active,
    2 standby, 3 promoting, 4 fenced, 5 stopped."""
    warren = api.warren()
    if warren is None:
        return
    e.add("amqpd_warren_role", "gauge", "This node's warren role (1 active, 2 standby, "
          "0 candidate, 3 promoting, 4 fenced, 5 stopped)", warren.role_code())
    e.add("amqpd_warren_epoch", "gauge", "Leadership epoch this node leads or follows",
          warren.epoch)
    e.add("amqpd_warren_lease_held", "gauge", "1 while this node holds the leader lease",
          int(warren.holds_lease()))
    e.add("amqpd_warren_accepting_publishes", "gauge",
          "1 on the node clients belong on (what /health/active says)",
          int(warren.accepting_publishes()))
    e.add("amqpd_warren_in_sync", "gauge", "1 on a standby within max_lag of its active",
          int(warren.in_sync()))
    figures = warren.election_figures()
    if figures is not None:
        e.add("amqpd_warren_lease_remaining_seconds", "gauge",
              "Seconds before this active fences itself unless it renews its lease",
              figures["lease_remaining_seconds"])
        e.add("amqpd_warren_takeovers_total", "counter",
              "Times this node took the leader key", figures["takeovers"])
        e.add("amqpd_warren_fences_total", "counter",
              "Times this node fenced itself (lease not renewed in time, or lost)",
              figures["fences"])


async def metrics(ctx: Ctx) -> Any:
    return web.Response(text=collect(ctx), headers={"Content-Type": CONTENT_TYPE})


async def metrics_per_object(ctx: Ctx) -> Any:
    return web.Response(text=collect(ctx, per_object=True),
                        headers={"Content-Type": CONTENT_TYPE})


async def metrics_detailed(ctx: Ctx) -> Any:
    """``/metrics/detailed?family=queue_coarse_metrics&family=...[&vhost=...]``: only the
    groups asked for (and the build and identity info), as RabbitMQ 3.10 serves it."""
    query = ctx.request.query
    vhosts = set(query.getall("vhost")) if "vhost" in query else None
    e = Exposition()
    metrics_objects.detailed(e, ctx.api, query.getall("family", []), vhosts, ctx.led_only)
    _identity(ctx.api, e)
    return web.Response(text=e.text(), headers={"Content-Type": CONTENT_TYPE})


def routes(r: Router) -> None:
    r.get("/metrics", metrics, auth=False)
    r.get("/metrics/per-object", metrics_per_object, auth=False)
    r.get("/metrics/detailed", metrics_detailed, auth=False)
