"""The node's HTTP front (amqpd/workers/http_front.py) over two stand-in workers.

Each stand-in is a small aiohttp app on a loopback port that answers as a worker's
private API would for the few paths a test asks about, and records what reached it; the
front runs before them as the supervisor runs it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from amqpd.http.core import PEER_HEADER, list_options
from amqpd.workers.http_front import (
    Backend,
    HttpFront,
    as_node,
    merge_prometheus,
    sum_sample_blocks,
    sum_stats,
)

NODE = "amqpd@host"


class Stand:
    """One stand-in worker: ``routes`` maps (method, path) to (status, JSON body)."""

    def __init__(self, name: str, routes: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.name = name
        # compared decoded: a client may spell ``:`` as ``%3A`` or not
        self.routes = {(m, unquote(p)): v for (m, p), v in routes.items()}
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.bodies: list[bytes] = []  # the requests' bodies, in order

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.raw_path, dict(request.headers)))
        if request.can_read_body:
            self.bodies.append(await request.read())
        path = unquote(request.raw_path.split("?", 1)[0])
        status, body = self.routes.get((request.method, path), (404, {
            "error": "Object Not Found", "reason": "Not Found"}))
        if body is None:
            return web.Response(status=status)
        if isinstance(body, str):  # Prometheus text
            return web.Response(status=status, text=body, content_type="text/plain")
        return web.json_response(body, status=status)


@asynccontextmanager
async def front(*stands: Stand, ports: list[int] | None = None,
                listeners: list[tuple[str, str, int]] | None = None,
                ) -> AsyncIterator[tuple[str, HttpFront]]:
    runners, backends = [], []
    for i, s in enumerate(stands):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", s.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        runners.append(runner)
        backends.append(Backend(i, port, s.name))
    f = HttpFront(NODE, lambda: backends, lambda: ports or [5672, 15672],
                  lambda: [{"index": b.index} for b in backends],
                  None if listeners is None else (lambda: listeners))
    runner = web.AppRunner(f.app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", f
    finally:
        await runner.cleanup()
        for r in runners:
            await r.cleanup()


async def call(url: str, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(
            method, url + path, data=None if body is None else json.dumps(body),
            headers={"Content-Type": "application/json", **(headers or {})}) as r:
        raw = await r.read()
        return r.status, json.loads(raw) if raw else None


def queue(name: str, node: str, messages: int = 0) -> dict[str, Any]:
    return {"name": name, "vhost": "/", "node": node, "messages": messages}


async def test_a_queue_request_goes_to_its_owner() -> None:
    # worker 0 has not heard of the queue yet; worker 1 owns it
    w0 = Stand("n-w0", {})
    w1 = Stand("n-w1", {("GET", "/api/queues/%2F/q1"): (200, queue("q1", "n-w1", 3)),
                        ("DELETE", "/api/queues/%2F/q1"): (204, None)})
    async with front(w0, w1) as (url, _f):
        assert await call(url, "DELETE", "/api/queues/%2F/q1") == (204, None)
        status, view = await call(url, "GET", "/api/queues/%2F/q1")
        assert (status, view["node"], view["messages"]) == (200, NODE, 3)
    assert ("DELETE", "/api/queues/%2F/q1") in [(m, p) for m, p, _h in w1.seen]
    assert "DELETE" not in [m for m, _p, _h in w0.seen]


async def test_a_missing_queue_is_a_404_and_nothing_else_is_sent() -> None:
    w0, w1 = Stand("n-w0", {}), Stand("n-w1", {})
    async with front(w0, w1) as (url, _f):
        status, _ = await call(url, "DELETE", "/api/queues/%2F/nope")
        assert status == 404


async def test_connections_concatenated_then_paged_here() -> None:
    conns = [{"name": f"c{i}"} for i in range(5)]
    w0 = Stand("n-w0", {("GET", "/api/connections"): (200, conns[:3])})
    w1 = Stand("n-w1", {("GET", "/api/connections"): (200, conns[3:])})
    async with front(w0, w1) as (url, _f):
        status, body = await call(
            url, "GET", "/api/connections?page=2&page_size=2&sort=name&sort_reverse=true")
    assert status == 200
    assert (body["total_count"], body["page_count"], [i["name"] for i in body["items"]]) == (
        5, 3, ["c2", "c1"])
    # the list options are the front's: the workers were asked for their whole lists
    assert [p for _m, p, _h in w0.seen] == ["/api/connections"]


async def test_a_connection_is_closed_on_the_worker_that_has_it() -> None:
    path = "/api/connections/127.0.0.1%3A5000%20-%3E%20127.0.0.1%3A5672"
    w0 = Stand("n-w0", {})
    w1 = Stand("n-w1", {("GET", path): (200, {"name": "x"}), ("DELETE", path): (204, None)})
    async with front(w0, w1) as (url, _f):
        assert (await call(url, "DELETE", path, headers={"X-Reason": "r"}))[0] == 204
    deletes = [h for m, _p, h in w1.seen if m == "DELETE"]
    assert deletes and deletes[0].get("X-Reason") == "r"


async def test_exchange_message_stats_summed() -> None:
    x0 = {"name": "x", "vhost": "/", "message_stats": {
        "publish_in": 2, "publish_in_details": {"rate": 0.5}}}
    x1 = {"name": "x", "vhost": "/", "message_stats": {
        "publish_in": 3, "publish_out": 3, "publish_in_details": {"rate": 1.0}}}
    idle = {"name": "idle", "vhost": "/"}
    w0 = Stand("n-w0", {("GET", "/api/exchanges/%2F/x"): (200, x0),
                        ("GET", "/api/exchanges"): (200, [x0, idle])})
    w1 = Stand("n-w1", {("GET", "/api/exchanges/%2F/x"): (200, x1),
                        ("GET", "/api/exchanges"): (200, [x1, idle])})
    async with front(w0, w1) as (url, _f):
        _, one = await call(url, "GET", "/api/exchanges/%2F/x")
        _, listed = await call(url, "GET", "/api/exchanges")
    assert one["message_stats"] == {"publish_in": 5, "publish_out": 3,
                                    "publish_in_details": {"rate": 1.5}}
    assert [x.get("message_stats") for x in listed] == [one["message_stats"], None]


async def test_health_checks_answer_for_the_node() -> None:
    ok = (200, {"status": "ok", "port": 40000})
    w0 = Stand("n-w0", {
        ("GET", "/api/health/checks/port-listener/5672"): (503, {"status": "failed"}),
        ("GET", "/api/health/checks/port-listener/40000"): ok,
        ("GET", "/api/health/checks/node-is-quorum-critical"): (503, {"status": "failed"}),
        ("GET", "/api/health/checks/port-listener/x"): (400, {"error": "bad_request"})})
    async with front(w0, Stand("n-w1", {})) as (url, _f):
        assert await call(url, "GET", "/api/health/checks/port-listener/5672") == (
            200, {"status": "ok", "port": 5672})
        status, body = await call(url, "GET", "/api/health/checks/port-listener/40000")
        assert (status, body["missing"], body["ports"]) == (503, 40000, [5672, 15672])
        assert (await call(url, "GET", "/api/health/checks/port-listener/x"))[0] == 400
        assert await call(url, "GET", "/api/health/checks/node-is-quorum-critical") == (
            200, {"status": "ok", "reason": "single node cluster"})


async def test_the_clients_address_is_forwarded_not_trusted() -> None:
    w0 = Stand("n-w0", {("GET", "/api/overview"): (200, {"node": "n-w0"})})
    async with front(w0, Stand("n-w1", {})) as (url, _f):
        status, body = await call(url, "GET", "/api/overview",
                                  headers={PEER_HEADER: "192.0.2.1"})
    assert (status, body) == (200, {"node": NODE})
    assert w0.seen[0][2][PEER_HEADER] == "127.0.0.1"


async def test_the_nodes_name_in_a_path_is_the_workers() -> None:
    w0 = Stand("n-w0", {("GET", "/api/nodes/n-w0"): (200, {"name": "n-w0"}),
                        ("GET", "/api/nodes/n-w0/memory"): (200, {"memory": {"x": 1}})})
    async with front(w0, Stand("n-w1", {})) as (url, _f):
        status, body = await call(url, "GET", "/api/nodes/amqpd%40host")
        assert (status, body["name"]) == (200, NODE)
        assert await call(url, "GET", "/api/nodes/amqpd%40host/memory") == (
            200, {"memory": {"x": 1}})


def test_member_names_become_the_nodes_once() -> None:
    members = {"n-w0", "n-w1"}
    body = {"leader": "n-w1", "members": ["n-w1", "n-w0"], "name": "q",
            "nodes": [{"name": "n-w0", "x": 1}, {"name": "n-w1", "x": 2}],
            "other": ["a", "a"]}
    assert as_node(body, members, NODE) == {
        "leader": NODE, "members": [NODE], "name": "q", "nodes": [{"name": NODE, "x": 1}],
        "other": ["a", "a"]}


def test_sum_stats_adds_numbers_and_keeps_the_rest() -> None:
    into: dict[str, Any] = {"a": 1, "d": {"rate": 0.5}, "s": "x", "b": True}
    sum_stats(into, {"a": 2, "d": {"rate": 1.0}, "s": "y", "b": True, "new": 4})
    assert into == {"a": 3, "d": {"rate": 1.5}, "s": "x", "b": True, "new": 4}


def test_list_options_over_a_merged_list() -> None:
    items = [{"name": n, "v": i} for i, n in enumerate(["b", "a", "ab", "c"])]
    assert list_options(items, {"name": "a", "sort": "name", "columns": "name"}) == [
        {"name": "a"}, {"name": "ab"}]


async def test_consumers_listed_from_every_worker() -> None:
    c0 = {"consumer_tag": "a", "queue": {"name": "q1", "vhost": "/"}}
    c1 = {"consumer_tag": "b", "queue": {"name": "q0", "vhost": "/"}}
    w0 = Stand("n-w0", {("GET", "/api/consumers"): (200, [c0]),
                        ("GET", "/api/consumers/%2F"): (200, [c0])})
    w1 = Stand("n-w1", {("GET", "/api/consumers"): (200, [c1]),
                        ("GET", "/api/consumers/%2F"): (200, [c1])})
    async with front(w0, w1) as (url, _f):
        for path in ("/api/consumers", "/api/consumers/%2F"):
            status, items = await call(url, "GET", path)
            assert (status, sorted(c["consumer_tag"] for c in items)) == (200, ["a", "b"])


async def test_overview_sums_the_figures_of_each_workers_own_queues() -> None:
    """Each worker is asked for the queues it owns only (``amqpd_led_only``); the node's
    overview adds their totals, message_stats and queue_totals, samples point by
    point, and keeps the first worker's exchange count (each has every exchange)."""
    def details(rate: float, samples: list[tuple[int, int]]) -> dict[str, Any]:
        return {"rate": rate, "samples": [{"sample": v, "timestamp": t} for t, v in samples],
                "avg": 0.0, "avg_rate": 0.0}

    def overview(conns: int, queues: int, published: list[tuple[int, int]],
                 ready: int) -> dict[str, Any]:
        return {"node": "n-w0", "object_totals": {
            "connections": conns, "channels": conns, "exchanges": 7, "queues": queues,
            "consumers": queues}, "message_stats": {
            "publish": published[0][1], "publish_details": details(1.0, published)},
            "queue_totals": {"messages_ready": ready,
                             "messages_ready_details": details(0.0, [(10_000, ready)])}}

    w0 = Stand("n-w0", {("GET", "/api/overview"): (200, overview(
        1, 1, [(10_000, 30), (5_000, 10)], 2))})
    w1 = Stand("n-w1", {("GET", "/api/overview"): (200, overview(
        2, 2, [(10_003, 12), (5_002, 2), (1, 0)], 10))})
    async with front(w0, w1) as (url, _f):
        status, body = await call(url, "GET", "/api/overview?msg_rates_age=60")
    assert status == 200
    for stand in (w0, w1):
        assert "amqpd_led_only=true" in stand.seen[-1][1]
        assert "msg_rates_age=60" in stand.seen[-1][1]
    assert body["object_totals"] == {"connections": 3, "channels": 3, "exchanges": 7,
                                     "queues": 3, "consumers": 3}
    stats = body["message_stats"]
    assert stats["publish"] == 42
    assert stats["publish_details"] == {
        "rate": 2.0, "samples": [{"sample": 42, "timestamp": 10_000},
                                 {"sample": 12, "timestamp": 5_000}],
        "avg": 27.0, "avg_rate": 6.0}
    assert body["queue_totals"]["messages_ready"] == 12
    assert body["queue_totals"]["messages_ready_details"]["samples"] == [
        {"sample": 12, "timestamp": 10_000}]


def test_sample_blocks_of_a_worker_with_no_samples_or_a_shorter_history() -> None:
    block = {"rate": 0.5, "samples": [], "avg": 0.0, "avg_rate": 0.0}
    other = {"rate": 1.0, "samples": [{"sample": 4, "timestamp": 2000},
                                      {"sample": 2, "timestamp": 1000}],
             "avg": 3.0, "avg_rate": 2.0}
    sum_sample_blocks(block, other)  # the first has none yet: the other's, as they are
    assert block == {**other, "rate": 1.5}
    longer: dict[str, Any] = {"rate": 0.0, "samples": [{"sample": 9, "timestamp": t}
                                                   for t in (3000, 2000, 1000, 0)],
                              "avg": 9.0, "avg_rate": 0.0}
    sum_sample_blocks(longer, {"rate": 0.0, "samples": [{"sample": 1, "timestamp": 3000}],
                               "avg": 1.0, "avg_rate": 0.0})
    assert [p["sample"] for p in longer["samples"]] == [10, 10, 10, 10]


async def test_overview_listeners_are_the_nodes_ports() -> None:
    """The first worker lists its private loopback ports; the node's answer lists the
    node's (amqps and https included, as the supervisor bound them)."""
    private = [{"node": "n-w0", "protocol": p, "ip_address": "127.0.0.1", "port": port,
                "socket_opts": {}} for p, port in (("amqp", 40001), ("amqps", 40002),
                                                   ("https", 40003))]
    w0 = Stand("n-w0", {("GET", "/api/overview"): (200, {"node": "n-w0",
                                                         "listeners": private})})
    node = [("amqp", "0.0.0.0", 5672), ("amqps", "0.0.0.0", 5671),
            ("https", "0.0.0.0", 15671)]
    async with front(w0, listeners=node) as (url, _f):
        status, body = await call(url, "GET", "/api/overview")
    assert status == 200 and body["node"] == NODE
    assert body["listeners"] == [{"node": NODE, "protocol": p, "ip_address": h, "port": port,
                                  "socket_opts": {}} for p, h, port in node]


async def test_shovels_listed_once_each_from_the_worker_that_runs_it() -> None:
    """Worker 0 runs the static shovel and lists what worker 1 shared of its dynamic
    one a moment ago (still starting); worker 1 runs it now and has not yet heard of a
    shovel worker 0 just started: the node lists each once, as its runner reports it."""
    s0 = {"vhost": "/", "name": "s", "type": "static", "node": "n-w0", "state": "running"}
    new0 = {"vhost": "/", "name": "new", "type": "dynamic", "node": "n-w0",
            "state": "running"}
    stale = {"vhost": "/", "name": "d", "type": "dynamic", "node": "n-w1",
             "state": "starting"}  # what worker 1 shared before it ran
    d1 = {"vhost": "/", "name": "d", "type": "dynamic", "node": "n-w1", "state": "running"}
    w0 = Stand("n-w0", {("GET", "/api/shovels"): (200, [stale, new0, s0]),
                        ("GET", "/api/shovels/vhost/%2F/d"): (200, stale)})
    w1 = Stand("n-w1", {("GET", "/api/shovels"): (200, [d1, s0]),
                        ("GET", "/api/shovels/vhost/%2F/d"): (200, d1)})
    async with front(w0, w1) as (url, _f):
        status, body = await call(url, "GET", "/api/shovels")
        assert status == 200
        assert [(s["name"], s["node"], s["state"]) for s in body] == [
            ("d", NODE, "running"), ("new", NODE, "running"), ("s", NODE, "running")]
        status, body = await call(url, "GET", "/api/shovels?columns=name")
        assert status == 200 and body == [{"name": "d"}, {"name": "new"}, {"name": "s"}]
        status, one = await call(url, "GET", "/api/shovels/vhost/%2F/d")
        assert status == 200 and one["state"] == "running"  # worker 1's, which runs it


async def test_a_watermark_of_one_byte_is_a_byte_for_every_worker() -> None:
    """The node's absolute watermark is shared out, but never down to 0 (a worker's "no
    limit"): 1 byte, which must raise the alarm, is 1 byte for each worker."""
    answer = {"memory_limit": 1, "alarms": ["memory"]}
    w0 = Stand("n-w0", {("PUT", "/api/nodes/n-w0/memory-high-watermark"): (200, answer)})
    w1 = Stand("n-w1", {("PUT", "/api/nodes/n-w1/memory-high-watermark"): (200, answer)})
    async with front(w0, w1) as (url, _f):
        status, body = await call(url, "PUT", f"/api/nodes/{NODE}/memory-high-watermark",
                                  {"absolute": 1})
        assert status == 200 and body["alarms"] == ["memory"]
        await call(url, "PUT", f"/api/nodes/{NODE}/memory-high-watermark", {"absolute": 0})
        await call(url, "PUT", f"/api/nodes/{NODE}/memory-high-watermark", {"absolute": 5})
    sent = []
    for stand in (w0, w1):
        sent.append([json.loads(b) for b in stand.bodies])
    assert sent == [[{"absolute": 1}, {"absolute": 0}, {"absolute": 2}]] * 2


async def test_the_nodes_figures_are_every_workers() -> None:
    def entry(name: str, mem: int, fds: int, uptime: int, alarm: bool) -> dict[str, Any]:
        return {"name": name, "mem_used": mem, "mem_limit": 1000, "fd_used": fds,
                "fd_total": 1024, "sockets_used": 1, "sockets_total": 1024,
                "proc_used": 2, "uptime": uptime, "mem_alarm": alarm,
                "disk_free": 5000 + fds, "processors": 2, "os_pid": "1"}

    e0, e1 = entry("n-w0", 100, 10, 7000, False), entry("n-w1", 50, 5, 9000, True)
    w0 = Stand("n-w0", {("GET", "/api/nodes/n-w0"): (200, e0),
                        ("GET", "/api/nodes"): (200, [e0, {"name": "n-w1"}])})
    w1 = Stand("n-w1", {("GET", "/api/nodes/n-w1"): (200, e1)})
    async with front(w0, w1) as (url, _f):
        status, one = await call(url, "GET", "/api/nodes/amqpd%40host")
        _, listed = await call(url, "GET", "/api/nodes")
    assert status == 200
    assert {k: one[k] for k in e0} == {
        "name": NODE, "mem_used": 150, "mem_limit": 2000, "fd_used": 15, "fd_total": 2048,
        "sockets_used": 2, "sockets_total": 2048, "proc_used": 4, "uptime": 9000,
        "mem_alarm": True, "disk_free": 5010, "processors": 2, "os_pid": one["os_pid"]}
    assert one["os_pid"] != "1"  # the supervisor's
    assert listed == [one]


W0_METRICS = """# TYPE rabbitmq_identity_info untyped
# HELP rabbitmq_identity_info Node and cluster identity
rabbitmq_identity_info{rabbitmq_node="n-w0",rabbitmq_cluster="c"} 1
# TYPE rabbitmq_connections gauge
# HELP rabbitmq_connections Connections currently open
rabbitmq_connections 2
# TYPE rabbitmq_queue_messages gauge
# HELP rabbitmq_queue_messages Ready and unacknowledged messages
rabbitmq_queue_messages{vhost="/",queue="q0"} 3
# TYPE rabbitmq_global_messages_received_total counter
# HELP rabbitmq_global_messages_received_total Messages enqueued into queues
rabbitmq_global_messages_received_total 10
# TYPE rabbitmq_erlang_uptime_seconds gauge
# HELP rabbitmq_erlang_uptime_seconds Node uptime
rabbitmq_erlang_uptime_seconds 12.5
"""
W1_METRICS = """# TYPE rabbitmq_identity_info untyped
# HELP rabbitmq_identity_info Node and cluster identity
rabbitmq_identity_info{rabbitmq_node="n-w1",rabbitmq_cluster="c"} 1
# TYPE rabbitmq_connections gauge
# HELP rabbitmq_connections Connections currently open
rabbitmq_connections 1
# TYPE rabbitmq_queue_messages gauge
# HELP rabbitmq_queue_messages Ready and unacknowledged messages
rabbitmq_queue_messages{vhost="/",queue="q1"} 4
# TYPE rabbitmq_global_messages_received_total counter
# HELP rabbitmq_global_messages_received_total Messages enqueued into queues
rabbitmq_global_messages_received_total 5
# TYPE rabbitmq_erlang_uptime_seconds gauge
# HELP rabbitmq_erlang_uptime_seconds Node uptime
rabbitmq_erlang_uptime_seconds 10.25
"""


async def test_prometheus_text_merged_and_per_worker() -> None:
    w0 = Stand("n-w0", {("GET", "/metrics"): (200, W0_METRICS),
                        ("GET", "/metrics/per-object"): (200, W0_METRICS)})
    w1 = Stand("n-w1", {("GET", "/metrics"): (200, W1_METRICS),
                        ("GET", "/metrics/per-object"): (200, W1_METRICS)})
    async with front(w0, w1) as (url, _f), aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            merged = (r.status, r.headers["Content-Type"], await r.text())
        async with s.get(url + "/metrics/per-worker") as r:
            per_worker = await r.text()
    assert merged[:2] == (200, "text/plain; version=0.0.4; charset=utf-8")
    samples = [line for line in merged[2].splitlines() if not line.startswith("#")]
    assert samples == [
        f'rabbitmq_identity_info{{rabbitmq_node="{NODE}",rabbitmq_cluster="c"}} 1',
        "rabbitmq_connections 3",
        'rabbitmq_queue_messages{vhost="/",queue="q0"} 3',
        'rabbitmq_queue_messages{vhost="/",queue="q1"} 4',
        "rabbitmq_global_messages_received_total 15",
        "rabbitmq_erlang_uptime_seconds 12.5"]
    assert merged[2].count("# TYPE rabbitmq_connections gauge") == 1
    # each worker is asked for the queues it owns only
    assert [p for _m, p, _h in w0.seen if p.startswith("/metrics")] == [
        "/metrics?amqpd_led_only=true", "/metrics?amqpd_led_only=true"]
    assert 'rabbitmq_connections{worker="0"} 2' in per_worker.splitlines()
    assert 'rabbitmq_connections{worker="1"} 1' in per_worker.splitlines()
    assert (f'rabbitmq_identity_info{{rabbitmq_node="{NODE}",rabbitmq_cluster="c",'
            'worker="1"} 1') in per_worker.splitlines()


def test_merge_prometheus_sums_counters_and_keeps_untyped_once() -> None:
    a = "# TYPE x counter\n# HELP x X\nx{a=\"1 2\"} 1.5\n# TYPE i untyped\ni 1\n"
    b = "# TYPE x counter\n# HELP x X\nx{a=\"1 2\"} 2\nx{a=\"3\"} 1\n# TYPE i untyped\ni 1\n"
    assert merge_prometheus([], [a, b]) == (
        '# TYPE x counter\n# HELP x X\nx{a="1 2"} 3.5\nx{a="3"} 1\n# TYPE i untyped\ni 1\n')
