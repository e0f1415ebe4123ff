"""The node's one HTTP port with ``workers = 2`` answers as one node (docs/workers.md,
"The HTTP port"): queues reached on their owner, connections of both workers listed and
closed, exchange statistics summed, health checks about the node's own ports, the
workers' member names shown as the node's name, per-worker figures in /api/workers.

Each object is made on a chosen worker (a connection forced onto it, as
tests/integration/workers_support.py does) and asked about through the node's port.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from tests.integration.workers_support import (
    connect_on,
    read_ready,
    wait_for,
    worker_api,
    workers_node,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(240)


def api(node: BrokerProcess, method: str, path: str, body: Any = None,
        headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A request to the node's HTTP port as guest: (status, JSON body or None)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{node.http_port}{path}", data=data,
                                 method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None


def closed(conn: pika.BlockingConnection) -> bool:
    """True once the broker closed ``conn`` (pumping its events meanwhile)."""
    try:
        conn.process_data_events(0.1)
    except pika.exceptions.AMQPConnectionError:
        return True
    return not conn.is_open


def known(node: BrokerProcess, index: int, path: str) -> Any:
    """Worker ``index``'s own answer to ``path``, None while it answers 404."""
    try:
        return worker_api(node, index, path)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return None


def node_name(node: BrokerProcess) -> str:
    return str(api(node, "GET", "/api/overview")[1]["node"])


def test_a_queue_of_either_worker_is_reached_through_the_node(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        name = node_name(node)
        assert not name.endswith(("-w0", "-w1"))  # the node's name, not a worker's
        for index in (0, 1):
            conn = connect_on(node, index)
            ch = conn.channel()
            q = f"q-on-w{index}"
            ch.queue_declare(q)
            ch.confirm_delivery()
            ch.basic_publish("", q, b"one")
            ch.basic_publish("", q, b"two")
            path = f"/api/queues/%2F/{q}"
            # asked at once: the owner answers, even before the other worker knows it
            status, view = api(node, "GET", path)
            assert (status, view["node"]) == (200, name)
            status, got = api(node, "POST", f"{path}/get", {
                "count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
            assert (status, [m["payload"] for m in got]) == (200, ["one"])
            # through the default exchange: the routing key's queue, on its owner
            status, routed = api(node, "POST", "/api/exchanges/%2F/amq.default/publish", {
                "properties": {}, "routing_key": q, "payload": "three",
                "payload_encoding": "string"})
            assert (status, routed) == (200, {"routed": True})
            assert api(node, "DELETE", f"{path}/contents")[0] == 204
            assert ch.queue_declare(q, passive=True).method.message_count == 0
            assert api(node, "DELETE", path)[0] == 204
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
                conn.channel().queue_declare(q, passive=True)
            assert exc.value.reply_code == 404
            conn.close()


def test_bindings_to_a_queue_of_the_other_worker(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        conn = connect_on(node, 1)
        ch = conn.channel()
        ch.exchange_declare("x.b", "direct")
        ch.queue_declare("q.b")
        ch.queue_bind("q.b", "x.b", "rk.b")
        status, found = api(node, "GET", "/api/bindings/%2F/e/x.b/q/q.b")
        assert (status, [b["routing_key"] for b in found]) == (200, ["rk.b"])
        # RabbitMQ names the missing exchange (the queue exists)
        status, body = api(node, "POST", "/api/bindings/%2F/e/x.missing/q/q.b",
                           {"routing_key": "k"})
        assert (status, body) == (404, {"error": "not_found",
                                        "reason": "no exchange 'x.missing' in vhost '/'"})
        conn.close()


def test_connections_of_both_workers_listed_and_closed(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        conns = [connect_on(node, 0), connect_on(node, 1)]

        def listed() -> list[dict[str, Any]] | None:
            items = api(node, "GET", "/api/connections")[1]
            return items if len(items) == 2 else None

        items = wait_for(listed, 10, "both connections listed")
        paged = api(node, "GET", "/api/connections?page=1&page_size=1&sort=name")[1]
        assert (paged["total_count"], paged["item_count"], paged["page_count"]) == (2, 1, 2)
        assert paged["items"][0]["name"] == min(i["name"] for i in items)
        for item in items:
            name = quote(item["name"], safe="")
            assert api(node, "GET", f"/api/connections/{name}")[0] == 200
            status, _ = api(node, "DELETE", f"/api/connections/{name}",
                            headers={"X-Reason": "by the test"})
            assert status == 204
        for conn in conns:
            wait_for(lambda c=conn: closed(c), 10, "the connection closed by the broker")
        overview = wait_for(lambda: (o := api(node, "GET", "/api/overview")[1])
                            ["object_totals"]["connections"] == 0 and o, 10, "no connections")
        assert overview["node"] == node_name(node)


def test_exchange_statistics_summed_over_the_workers(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        conns = [connect_on(node, 0), connect_on(node, 1)]
        chans = [c.channel() for c in conns]
        chans[0].exchange_declare("x.stats", "fanout")
        chans[0].queue_declare("q.stats")
        chans[0].queue_bind("q.stats", "x.stats")
        # worker 1 routes by the binding once it has heard of it (asynchronously)
        wait_for(lambda: known(node, 1, "/api/bindings/%2F/e/x.stats/q/q.stats"), 10,
                 "the binding known to worker 1")
        for ch, count in zip(chans, (2, 3), strict=True):
            ch.confirm_delivery()
            for _ in range(count):
                ch.basic_publish("x.stats", "", b"m")

        def summed() -> dict[str, Any] | None:
            stats = api(node, "GET", "/api/exchanges/%2F/x.stats")[1].get("message_stats")
            return stats if stats and stats.get("publish_in") == 5 else None

        stats = wait_for(summed, 30, "publish_in of both workers")
        assert stats["publish_out"] == 5
        listed = {x["name"]: x for x in api(node, "GET", "/api/exchanges/%2F")[1]}
        assert listed["x.stats"]["message_stats"]["publish_in"] == 5
        for c in conns:
            c.close()


def test_health_checks_and_per_worker_figures_are_the_nodes(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        ready = read_ready(node)
        for port in (node.port, node.http_port):
            assert api(node, "GET", f"/api/health/checks/port-listener/{port}") == (
                200, {"status": "ok", "port": port})
        private = ready["workers"][0]["amqp_port"]
        status, body = api(node, "GET", f"/api/health/checks/port-listener/{private}")
        assert (status, body["missing"], sorted(body["ports"])) == (
            503, private, sorted({node.port, node.http_port}))
        # a quorum queue has a member on each worker: still one node
        ch = connect_on(node, 1).channel()
        ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        assert api(node, "GET", "/api/health/checks/node-is-quorum-critical") == (
            200, {"status": "ok", "reason": "single node cluster"})
        status, qq = api(node, "GET", "/api/queues/%2F/qq")
        name = node_name(node)
        assert (qq["leader"], qq["members"], qq["online"]) == (name, [name], [name])
        assert [n["name"] for n in api(node, "GET", "/api/nodes")[1]] == [name]
        status, workers = api(node, "GET", "/api/workers")
        assert status == 200
        assert [(w["index"], w["pid"], w["http_port"]) for w in workers] == [
            (w["index"], w["pid"], w["http_port"]) for w in ready["workers"]]
        # per-worker figures stay on each worker's private API
        assert worker_api(node, 1, "/api/overview")["node"].endswith("-w1")
        # the memory watermark is the node's: each worker gets its half
        status, body = api(node, "PUT", f"/api/nodes/{quote(name)}/memory-high-watermark",
                           {"absolute": 2_000_000_000})
        assert status == 200
        shares = [worker_api(node, w["index"], f"/api/nodes/{quote(w['node'])}")["mem_limit"]
                  for w in ready["workers"]]
        assert shares == [1_000_000_000, 1_000_000_000]
        assert body["memory_limit"] == 2_000_000_000
        assert api(node, "GET", "/api/workers",
                   headers={"Authorization": "Basic bm9wZTpub3Bl"})[0] == 401


def test_a_loopback_only_user_is_refused_from_elsewhere(tmp_path: Path) -> None:
    """The front forwards the client's address: guest (loopback only) is refused when
    the client is not on this host, though the worker sees the front's loopback
    address (simulated with the header itself: the front overwrites what a client
    sends, and a worker honours it only to take loopback away)."""
    with workers_node(tmp_path / "node") as node:
        port = read_ready(node)["workers"][0]["http_port"]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/overview")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        req.add_header("X-Amqpd-Peer", "192.0.2.7")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=5)
        assert exc.value.code == 401
        # through the node's port from loopback, the header a client sent is replaced
        assert api(node, "GET", "/api/overview", headers={"X-Amqpd-Peer": "192.0.2.7"}
                   )[0] == 200


def metric(text: str, series: str) -> float | None:
    """The value of ``series`` (name and labels as written) in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def scrape(node: BrokerProcess, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}{path}",
                                timeout=10) as resp:
        return str(resp.read().decode())


def test_consumers_totals_nodes_and_metrics_are_the_whole_nodes(tmp_path: Path) -> None:
    """A queue, a consumer and a connection on each worker: the node's consumers list,
    overview totals, /api/nodes figures and /metrics count both workers', each queue
    once (worker 1 knows worker 0's queue as a copy, and the reverse)."""
    with workers_node(tmp_path / "node") as node:
        conns = [connect_on(node, 0), connect_on(node, 1)]
        for index, conn in enumerate(conns):
            ch = conn.channel()
            q = f"q.tot{index}"
            ch.queue_declare(q)
            ch.confirm_delivery()
            for _ in range(index + 2):  # 2 on worker 0's queue, 3 on worker 1's
                ch.basic_publish("", q, b"m")
            conn.channel().basic_consume(q, lambda *_a: None)  # prefetch-less, no ack
        for q in ("q.tot0", "q.tot1"):  # each worker has heard of the other's queue
            for index in (0, 1):
                wait_for(lambda i=index, q=q: known(node, i, f"/api/queues/%2F/{q}"), 10,
                         f"{q} known to worker {index}")

        def consumers() -> list[dict[str, Any]] | None:
            for conn in conns:
                conn.process_data_events(0)
            items = api(node, "GET", "/api/consumers")[1]
            return items if len(items) == 2 else None

        listed = wait_for(consumers, 10, "both workers' consumers")
        assert sorted(c["queue"]["name"] for c in listed) == ["q.tot0", "q.tot1"]
        assert len(api(node, "GET", "/api/consumers/%2F")[1]) == 2

        def overview() -> dict[str, Any] | None:
            for conn in conns:
                conn.process_data_events(0)
            body = api(node, "GET", "/api/overview")[1]
            t = body["object_totals"]
            ok = (t["queues"], t["consumers"], t["connections"],
                  body["queue_totals"]["messages_unacknowledged"]) == (2, 2, 2, 5)
            return body if ok else None

        body = wait_for(overview, 30, "the overview's totals over both workers")
        assert body["queue_totals"]["messages"] == 5

        ready = read_ready(node)
        own = [worker_api(node, w["index"], f"/api/nodes/{quote(w['node'])}")
               for w in ready["workers"]]
        status, entry = api(node, "GET", f"/api/nodes/{quote(node_name(node))}")
        assert status == 200
        for key in ("mem_limit", "fd_total", "sockets_total"):
            assert entry[key] == sum(o[key] for o in own), key
        assert entry["mem_used"] > max(o["mem_used"] for o in own) // 2
        assert api(node, "GET", "/api/nodes")[1][0]["fd_total"] == entry["fd_total"]

        def metrics() -> str | None:
            for conn in conns:
                conn.process_data_events(0)
            text = scrape(node, "/metrics")
            wanted = {"rabbitmq_connections": 2, "rabbitmq_queues": 2,
                      "rabbitmq_consumers": 2, "rabbitmq_queue_messages_unacked": 5}
            return text if all(metric(text, k) == v for k, v in wanted.items()) else None

        text = wait_for(metrics, 30, "/metrics over both workers, each queue once")
        assert text.count("# TYPE rabbitmq_connections gauge") == 1
        assert f'rabbitmq_node="{node_name(node)}"' in text
        per_object = scrape(node, "/metrics/per-object")
        for index, count in ((0, 2), (1, 3)):
            assert metric(per_object, f'rabbitmq_queue_messages{{vhost="/",'
                                      f'queue="q.tot{index}"}}') == count
        per_worker = scrape(node, "/metrics/per-worker")
        assert metric(per_worker, 'rabbitmq_connections{worker="0"}') == 1
        assert metric(per_worker, 'rabbitmq_connections{worker="1"}') == 1
        for conn in conns:
            conn.close()
