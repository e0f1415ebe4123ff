"""/api/overview, /api/nodes, /api/whoami, /api/cluster-name, /api/extensions."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import time
from typing import Any

import amqpd
from amqpd.broker.api import EXCHANGE_TYPES, BrokerAPI
from amqpd.http.core import Ctx, Router, bad_request, json_response, no_content, not_found
from amqpd.http.query_windows import sample_window

# The management API version amqpd's paths and JSON shapes follow (rabbitmqadmin and
# dashboards read ``rabbitmq_version``); ``product_version`` is amqpd's own.
COMPAT_VERSION = "3.10.8"


def memory_used() -> int:
    """Resident set size in bytes (Linux /proc, else the peak RSS)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fd_counts() -> tuple[int, int]:
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 0
    return used, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def node_info(ctx: Ctx) -> dict[str, Any]:
    api = ctx.api
    status = api.node_status()
    fd_used, fd_total = fd_counts()
    try:
        disk_free = shutil.disk_usage(status.data_dir).free
    except OSError:
        disk_free = 0
    alarms = set(status.alarms)
    return {
        "name": status.name,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "mem_used": memory_used(),
        "mem_limit": status.memory_limit,
        "mem_alarm": "memory" in alarms,
        "disk_free": disk_free,
        "disk_free_limit": status.disk_free_limit,
        "disk_free_alarm": "disk" in alarms,
        "fd_used": fd_used,
        "fd_total": fd_total,
        "sockets_used": api.socket_count(),
        "sockets_total": fd_total,
        "proc_used": len(api.sessions()),
        "proc_total": 1048576,
        "processors": os.cpu_count() or 1,
        "uptime": int((time.time() - status.started_at) * 1000),
        "run_queue": 0,
        "partitions": [],
        "applications": [{"name": "amqpd", "description": "amqpd",
                          "version": amqpd.__version__}],
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "being_drained": False,
        # the warren: role, epoch, standbys' lag (None on a single node)
        "replication": api.replication_status(),
    }


def _role(api: BrokerAPI) -> str | None:
    warren = api.warren()
    return warren.role if warren is not None else None


def replication_summary(api: BrokerAPI) -> dict[str, Any] | None:
    """amqpd's own, for the web UI's standby banner (every user sees it): this node's
    warren role and which node is active, with the active's HTTP address when known (an
    etcd warren records it; a static pair knows only the active's replication address).
    None on a node without replication."""
    status = api.replication_status()
    warren = api.warren()
    if status is None and warren is None:
        return None
    out: dict[str, Any] = {"role": None, "active_node": None, "active_http": None,
                           "active_replication": None}
    if status is not None:
        out.update(role=status.get("role"), active_node=status.get("active_name"),
                   active_replication=status.get("active"))
    if warren is not None:
        leader = warren.node_fields().get("amqpd_leader")
        out.update(role=warren.role, active_node=leader or out["active_node"])
        for peer in warren.peer_nodes():
            if peer.get("name") == leader:
                out["active_http"] = (peer.get("amqpd_addresses") or {}).get("http") or None
    if out["role"] == "active":
        out.update(active_node=api.node_name(), active_replication=None)
    return out


def alarm_set(api: BrokerAPI) -> set[str]:
    """The names of the resource alarms in effect ("memory", "disk", "store")."""
    return set(api.alarms())


def listeners(ctx: Ctx) -> list[dict[str, Any]]:
    node = ctx.api.node_name()
    out = [{"node": node, "protocol": proto, "ip_address": host, "port": port,
            "socket_opts": {}} for proto, host, port in ctx.api.listeners()]
    http = ctx.request.app["listener"]  # this HTTP listener, once bound
    if http["port"]:
        out.append({"node": node, "protocol": "https" if http["tls"] else "http",
                    "ip_address": http["host"], "port": http["port"], "socket_opts": {}})
    return out


async def overview(ctx: Ctx) -> Any:
    """The node's overview; with ``amqpd_led_only`` (:attr:`Ctx.led_only`) its queue,
    consumer and message figures and rates are those of the queues it leads."""
    status = ctx.api.node_status()
    vhosts = ctx.visible_vhosts()
    led = ctx.led_only
    queues = [q for vh in vhosts for q in ctx.api.queues(vh)
              if not (led and q.forwards_publish)]
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    sessions = [s for s in ctx.api.sessions() if ctx.is_monitor or s.username == ctx.username]
    sampler = ctx.request.app["sampler"]
    body = {
        "management_version": COMPAT_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400],
                                      "basic": [600, 3600], "detailed": [600]},
        "exchange_types": [{"name": n, "description": "", "enabled": True}
                           for n in sorted(EXCHANGE_TYPES)],
        "product_version": amqpd.__version__,
        "amqpd_hot_path": status.hot_path,
        "product_name": "amqpd",
        "rabbitmq_version": COMPAT_VERSION,
        "cluster_name": status.cluster_name,
        "erlang_version": f"Python {platform.python_version()}",
        "erlang_full_version": f"Python {platform.python_version()}",
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": sampler.overview_stats(
            *sample_window(ctx, "msg_rates_age", "msg_rates_incr"), led_only=led),
        "churn_rates": {},
        "queue_totals": {
            "messages": ready + unacked, "messages_details": {"rate": 0.0},
            "messages_ready": ready, "messages_ready_details": {"rate": 0.0},
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": {"rate": 0.0},
        },
        "object_totals": {
            "channels": sum(len(s.channels) for s in sessions),
            "connections": len(sessions),
            "consumers": sum(len(q.consumers) for q in queues),
            "exchanges": sum(len(ctx.api.exchanges(vh)) for vh in vhosts),
            "queues": len(queues),
        },
        "statistics_db_event_queue": 0,
        # amqpd's own: which plugins run, so a client (the web UI) knows which pages exist
        "amqpd_plugins": list(status.plugins),
        "node": status.name,
        # amqpd's own: this node's part in a warren (active / standby / ...), or None
        "amqpd_role": _role(ctx.api),
        "amqpd_replication": replication_summary(ctx.api),
        "listeners": listeners(ctx),
        "contexts": [{"node": status.name, "description": "RabbitMQ Management",
                      "path": "/", "port": str(ctx.request.app["listener"]["port"])}],
    }
    lengths_age, lengths_incr = sample_window(ctx, "lengths_age", "lengths_incr")
    if lengths_age > 0:
        totals: Any = body["queue_totals"]
        for key, samples in sampler.length_samples(lengths_age, lengths_incr,
                                                      led_only=led).items():
            totals[f"{key}_details"].update(samples)
    return json_response(body)


def _all_nodes(ctx: Ctx) -> list[dict[str, Any]]:
    """This node, then (in a warren) the others as they last recorded themselves in etcd,
    each with amqpd's role, epoch and replication lag fields."""
    info = node_info(ctx)
    cluster = ctx.api.cluster()
    if cluster is not None:
        # every member: this node's full entry, the others' from the cluster's view
        others = [n for n in cluster.node_entries() if n["name"] != info["name"]]
        mine = next((n for n in cluster.node_entries() if n["name"] == info["name"]), {})
        info.update(mine)
        return [info, *others]
    warren = ctx.api.warren()
    if warren is None:
        return [info]
    info.update(warren.node_fields())
    return [info, *warren.peer_nodes()]


async def nodes(ctx: Ctx) -> Any:
    ctx.require_monitor()
    return json_response(_all_nodes(ctx))


async def node(ctx: Ctx) -> Any:
    ctx.require_monitor()
    found = next((n for n in _all_nodes(ctx) if n.get("name") == ctx.params["node"]), None)
    if found is None:
        raise not_found()
    return json_response(found)


async def whoami(ctx: Ctx) -> Any:
    assert ctx.user is not None
    return json_response({"name": ctx.user.name, "tags": list(ctx.user.tags)})


async def cluster_name(ctx: Ctx) -> Any:
    return json_response({"name": ctx.api.cluster_name()})


async def set_cluster_name(ctx: Ctx) -> Any:
    ctx.require_admin()
    body = await ctx.json_object()
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("name must be a non-empty string")
    await ctx.api.set_cluster_name_everywhere(name)
    return no_content()


async def set_memory_watermark(ctx: Ctx) -> Any:
    """amqpd extension: ``PUT /api/nodes/{node}/memory-high-watermark`` with
    ``{"fraction": 0.4}`` or ``{"absolute": bytes}`` (rabbitmqctl's
    set_vm_memory_high_watermark, over HTTP)."""
    ctx.require_admin()
    if ctx.params["node"] != ctx.api.node_name():
        raise not_found()
    body = await ctx.json_object()
    fraction, absolute = body.get("fraction"), body.get("absolute")
    if isinstance(absolute, int) and not isinstance(absolute, bool) and absolute >= 0:
        limit = ctx.api.set_memory_high_watermark(absolute=absolute)
    elif isinstance(fraction, int | float) and not isinstance(fraction, bool) and \
            0 <= fraction <= 1:
        limit = ctx.api.set_memory_high_watermark(fraction=float(fraction))
    else:
        raise bad_request("give 'fraction' (0..1) or 'absolute' (bytes >= 0)")
    return json_response({"memory_limit": limit, "alarms": ctx.api.alarms()})


async def extensions(ctx: Ctx) -> Any:
    return json_response([])


def routes(r: Router) -> None:
    r.get("/api/overview", overview)
    r.get("/api/nodes", nodes)
    r.get("/api/nodes/{node}", node)
    r.put("/api/nodes/{node}/memory-high-watermark", set_memory_watermark)
    r.get("/api/whoami", whoami)
    r.get("/api/cluster-name", cluster_name)
    r.put("/api/cluster-name", set_cluster_name)
    r.get("/api/extensions", extensions)
