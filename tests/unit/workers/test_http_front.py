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
from amqpd.workers.http_front import Backend, HttpFront, as_node, sum_stats

NODE = "amqpd@host"


class Stand:
    """One stand-in worker: ``routes`` maps (method, path) to (status, JSON body)."""

    def __init__(self, name: str, routes: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.name = name
        # compared decoded: a client may spell ``:`` as ``%3A`` or not
        self.routes = {(m, unquote(p)): v for (m, p), v in routes.items()}
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.raw_path, dict(request.headers)))
        path = unquote(request.raw_path.split("?", 1)[0])
        status, body = self.routes.get((request.method, path), (404, {
            "error": "Object Not Found", "reason": "Not Found"}))
        if body is None:
            return web.Response(status=status)
        return web.json_response(body, status=status)


@asynccontextmanager
async def front(*stands: Stand, ports: list[int] | None = None,
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
                  lambda: [{"index": b.index} for b in backends])
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
    w0 = Stand("n-w0", {("GET", "/api/nodes/n-w0"): (200, {"name": "n-w0"})})
    async with front(w0, Stand("n-w1", {})) as (url, _f):
        assert await call(url, "GET", "/api/nodes/amqpd%40host") == (200, {"name": NODE})


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
