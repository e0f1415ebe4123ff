"""``workers = 2`` with plugins (docs/workers.md, "Plugins and shovels"): each shovel runs
once per node, and the plugin's API answers through the node's HTTP port.

A static shovel runs on worker 0 only; a dynamic one on the one worker the private
cluster places it on (as on the nodes of a cluster). A shovel from an exchange binds a
queue of its own, so a second copy of it would move every message twice: the tests
count every message, and the shovel's consumers. Connections are forced onto a chosen
worker as tests/integration/workers_support.py says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration._http import Api
from tests.integration.workers_support import (
    connect_on,
    drain,
    wait_for,
    worker_api,
    workers_node,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(240)

N = 300

CONFIG = """
plugins = ["shovel"]

[[shovels]]
name = "from-exchange"
src-uri = "amqp://"
src-exchange = "amq.topic"
src-exchange-key = "moved.#"
dest-uri = "amqp://"
dest-queue = "moved"

[[shovels]]
name = "from-queue"
src-uri = "amqp://"
src-queue = "outbox"
dest-uri = "amqp://"
dest-queue = "inbox"
reconnect-delay = 0
"""


def publish(ch: Any, exchange: str, key: str, bodies: list[bytes]) -> None:
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, key, body, pika.BasicProperties(delivery_mode=2))


def shovels(node: BrokerProcess) -> list[dict[str, Any]]:
    return list(Api(node.http_url).get("/api/shovels").json())


def test_static_shovels_run_once_on_a_two_worker_node(tmp_path: Path) -> None:
    config = tmp_path / "amqpd.toml"
    config.write_text(CONFIG)
    with workers_node(tmp_path / "node", extra_args=["--config", str(config)]) as node:
        # the node lists each static shovel once, running, as the node's
        running = wait_for(lambda: (lambda s: s if len(s) == 2 and all(
            x["state"] == "running" for x in s) else None)(shovels(node)), 30,
            "both static shovels running")
        assert {(s["name"], s["type"], s["node"]) for s in running} == {
            ("from-exchange", "static", node.info["workers"][0]["node"].rsplit("-w", 1)[0]),
            ("from-queue", "static", node.info["workers"][0]["node"].rsplit("-w", 1)[0])}
        # worker 0 runs them; worker 1 runs none
        assert {s["name"] for s in worker_api(node, 0, "/api/shovels")} == {
            "from-exchange", "from-queue"}
        assert worker_api(node, 1, "/api/shovels") == []
        # its source binding is in place before anything is published
        wait_for(lambda: [b for b in Api(node.http_url).get(
            "/api/exchanges/%2F/amq.topic/bindings/source").json()
            if b["routing_key"] == "moved.#"], 30, "the shovel's binding to amq.topic")
        w0, w1 = connect_on(node, 0), connect_on(node, 1)
        c0, c1 = w0.channel(), w1.channel()
        half = [f"m{i}".encode() for i in range(N // 2)]
        rest = [f"m{i}".encode() for i in range(N // 2, N)]
        publish(c1, "amq.topic", "moved.a", half)  # from either worker
        publish(c0, "amq.topic", "moved.b", rest)
        got = drain(c1, "moved", N, then_silence=2.0)
        assert sorted(got) == sorted(half + rest)  # each once: one copy of the shovel
        # a queue source: one consumer (the shovel's), every message moved once
        wait_for(lambda: Api(node.http_url).get("/api/queues/%2F/outbox").status == 200,
                 30, "the shovel's source queue declared")
        bodies = [f"q{i}".encode() for i in range(N)]
        publish(c1, "", "outbox", bodies)
        got = drain(c0, "inbox", N, then_silence=2.0)
        assert got == bodies  # in order, each once
        outbox = Api(node.http_url).get("/api/queues/%2F/outbox").json()
        assert outbox["consumers"] == 1
        w0.close()
        w1.close()


def test_a_dynamic_shovel_runs_on_one_worker_and_is_managed_through_the_node(
        tmp_path: Path) -> None:
    config = tmp_path / "amqpd.toml"
    config.write_text('plugins = ["shovel"]\n')
    with workers_node(tmp_path / "node", extra_args=["--config", str(config)]) as node:
        api = Api(node.http_url)
        r = api.put("/api/parameters/shovel/%2F/dyn", {"value": {
            "src-uri": "amqp://", "src-exchange": "amq.topic", "src-exchange-key": "dyn",
            "dest-uri": "amqp://", "dest-queue": "dyn-out"}})
        assert r.status in (201, 204), r.text
        wait_for(lambda: [s for s in shovels(node)
                          if s["name"] == "dyn" and s["state"] == "running"], 30,
                 "the dynamic shovel running")
        # one worker runs it (each worker's own list names what it runs)
        runs = [i for i in (0, 1) if any(s.get("name") == "dyn" and s.get("node", "")
                                         .endswith(f"-w{i}")
                                         for s in worker_api(node, i, "/api/shovels"))]
        assert len(runs) == 1, runs
        assert [s["name"] for s in shovels(node)] == ["dyn"]  # listed once by the node
        wait_for(lambda: [b for b in api.get(
            "/api/exchanges/%2F/amq.topic/bindings/source").json()
            if b["routing_key"] == "dyn"], 30, "the shovel's binding to amq.topic")
        w0, w1 = connect_on(node, 0), connect_on(node, 1)
        c0, c1 = w0.channel(), w1.channel()
        bodies = [f"d{i}".encode() for i in range(N)]
        publish(c0, "amq.topic", "dyn", bodies[: N // 2])
        publish(c1, "amq.topic", "dyn", bodies[N // 2:])
        assert sorted(drain(c0, "dyn-out", N, then_silence=2.0)) == sorted(bodies)
        # restarted and deleted through the node's port, as on a single node
        assert api.delete("/api/shovels/vhost/%2F/dyn/restart").status == 204
        assert api.delete("/api/shovels/vhost/%2F/dyn").status == 204
        wait_for(lambda: shovels(node) == [], 30, "the shovel gone")
        w0.close()
        w1.close()


def test_exchange_federation_runs_one_link_for_a_two_worker_downstream(
        tmp_path: Path) -> None:
    """A two-worker node federates an exchange from a single-process upstream: one link
    (on one worker), listed once by the node; its queues on both workers get every
    message once (a link per worker would bring each twice)."""
    from tests.integration.fed_support import (
        amqp_uri,
        set_policy,
        set_upstream,
        site,
        wait_running,
    )

    up = site(tmp_path, "site-up").start()
    try:
        with workers_node(tmp_path / "down", env={"AMQPD_PLUGINS": "federation",
                                                 "AMQPD_CLUSTER_NAME": "site-down"}) as down:
            with pika.BlockingConnection(pika.URLParameters(up.url)) as uconn:
                uconn.channel().exchange_declare("fed.topic", "topic", durable=True)
            w0, w1 = connect_on(down, 0), connect_on(down, 1)
            c0, c1 = w0.channel(), w1.channel()
            c0.exchange_declare("fed.topic", "topic", durable=True)
            c0.queue_declare("fed-w0")  # owned by worker 0
            c0.queue_bind("fed-w0", "fed.topic", "orders.#")
            c1.queue_declare("fed-w1")  # owned by worker 1
            c1.queue_bind("fed-w1", "fed.topic", "orders.#")
            set_upstream(down, "up", {"uri": amqp_uri(up.port), "reconnect-delay": 1})
            set_policy(down, "fed", "^fed\\.", {"federation-upstream-set": "all"})
            items = wait_running(down)
            assert len(items) == 1 and items[0]["exchange"] == "fed.topic", items
            assert items[0]["node"] == read_node_name(down)

            def bound() -> bool:
                r = Api(up.http_url).get("/api/exchanges/%2F/fed.topic/bindings/source")
                return any(b["routing_key"] == "orders.#" for b in r.json())
            wait_for(bound, 30, "the binding mirrored upstream")
            bodies = [f"f{i}".encode() for i in range(N)]
            with pika.BlockingConnection(pika.URLParameters(up.url)) as uconn:
                publish(uconn.channel(), "fed.topic", "orders.eu", bodies)
            assert drain(c0, "fed-w0", N, then_silence=2.0) == bodies  # once each, in order
            assert drain(c1, "fed-w1", N, then_silence=2.0) == bodies
            assert len(Api(down.http_url).get("/api/federation-links").json()) == 1
            w0.close()
            w1.close()
    finally:
        up.stop()


def read_node_name(node: BrokerProcess) -> str:
    """The node's name as its API answers it (the workers' member names become it)."""
    return str(Api(node.http_url).get("/api/overview").json()["node"])
