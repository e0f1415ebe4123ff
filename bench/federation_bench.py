"""Federation link throughput beside a shovel's, and beside RabbitMQ's federation plugin.

    python -m bench.federation_bench [--messages 100000] [--size 256]
                                     [--ack-mode on-confirm] [--prefetch 1000]
                                     [--only amqpd|shovel|rabbitmq] [--json]

One run measures, on loopback, three systems moving N persistent messages between two
brokers of their kind:

- **amqpd federation**: an exchange link, site "down" federating ``fb.x`` from site "up".
  N messages are preloaded into the link's upstream queue (``federation: fb.x -> down``,
  declared beforehand exactly as the link declares it), then the upstream and the policy
  are set on "down"; the link drains the queue into ``fb.x`` -> ``fb.sink`` there.
- **amqpd shovel**: bench/shovel_bench.py's scenario (N preloaded on A, a dynamic shovel
  to B's queue), same size, ack-mode and prefetch.
- **RabbitMQ federation**: the federation scenario with two private RabbitMQ 3.10 nodes
  (devtools/rabbitmq.py), ``rabbitmq_federation`` enabled on the downstream, whose
  cluster name is set to "down" so that the upstream queue has the same name.

Rates: for federation, N / seconds from the first message's arrival in the sink to the
N-th (excluding the link's start-up, which is reported separately as ``setup_s``); the
shovel's figure is bench/shovel_bench.py's (from the parameter PUT to N at B). Each run
is verified by counting: the sink must hold N messages and the upstream queue none.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pika

from bench.loadgen import PublisherSpec, Target, run_publisher

EXCHANGE = "fb.x"
SINK = "fb.sink"
CLUSTER = "down"
UPSTREAM_QUEUE = f"federation: {EXCHANGE} -> {CLUSTER}"


def _channel(url: str) -> tuple[Any, Any]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    return conn, conn.channel()


def depth(url: str, queue: str) -> int:
    conn, ch = _channel(url)
    try:
        return int(ch.queue_declare(queue, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if conn.is_open:
            conn.close()


def prepare(up_url: str, down_url: str, n: int, size: int) -> None:
    conn, ch = _channel(up_url)
    ch.exchange_declare(EXCHANGE, "fanout", durable=True)
    # as the link declares it (RabbitMQ 3.10 and amqpd alike, no expires/message-ttl)
    ch.queue_declare(UPSTREAM_QUEUE, durable=True,
                     arguments={"x-internal-purpose": "federation"})
    conn.close()
    conn, ch = _channel(down_url)
    ch.exchange_declare(EXCHANGE, "fanout", durable=True)
    ch.queue_declare(SINK, durable=True)
    ch.queue_bind(SINK, EXCHANGE)
    conn.close()
    spec = PublisherSpec(pubid=1, targets=[Target("", UPSTREAM_QUEUE)], body_size=size,
                         persistent=True, confirm_window=2000, count=n)
    res = run_publisher(up_url, spec)
    if res.error or res.confirmed < n:
        raise RuntimeError(f"preload failed: {res.error} ({res.confirmed}/{n} confirmed)")
    if depth(up_url, UPSTREAM_QUEUE) != n:
        raise RuntimeError("preload: the upstream queue does not hold N messages")


def measure(up_url: str, down_url: str, n: int, t_start: float, timeout: float
            ) -> dict[str, Any]:
    first = None
    deadline = time.monotonic() + timeout
    at_first = 0
    while time.monotonic() < deadline:
        got = depth(down_url, SINK)
        now = time.monotonic()
        if first is None and got > 0:
            first, at_first = now, got
        if got >= n:
            break
        time.sleep(0.02)
    else:
        raise TimeoutError(f"{SINK} has {depth(down_url, SINK)} of {n} after {timeout}s")
    end = time.monotonic()
    assert first is not None
    # verified by counting: all N arrived, once, and nothing is left upstream
    time.sleep(1.0)
    sink, left = depth(down_url, SINK), depth(up_url, UPSTREAM_QUEUE)
    return {"messages": n, "setup_s": round(first - t_start, 2),
            "seconds": round(end - first, 2),
            "msgs_per_s": round((n - at_first) / max(end - first, 1e-6)),
            "sink_count": sink, "upstream_left": left, "verified": sink == n and left == 0}


def run_amqpd(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.brokerproc import BrokerProcess

    up = BrokerProcess(work / "up").start()
    down = BrokerProcess(work / "down", env={"AMQPD_PLUGINS": "federation",
                                             "AMQPD_CLUSTER_NAME": CLUSTER}).start()
    try:
        prepare(up.url, down.url, args.messages, args.size)
        t0 = time.monotonic()
        _put(down.http_url, "/api/parameters/federation-upstream/%2F/up", {"value": {
            "uri": up.url, "ack-mode": args.ack_mode, "prefetch-count": args.prefetch}})
        _put(down.http_url, "/api/policies/%2F/fb", {
            "pattern": "^fb\\.x$", "definition": {"federation-upstream": "up"},
            "apply-to": "exchanges"})
        return {"system": "amqpd federation", **measure(up.url, down.url, args.messages, t0,
                                                        args.timeout)}
    finally:
        down.stop()
        up.stop()


def run_rabbitmq(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from devtools import rabbitmq as rmq

    try:
        up = rmq.start(work / "rmq-up")
    except rmq.RabbitMQNotInstalled as exc:
        return {"system": "RabbitMQ federation", "skipped": str(exc)}
    try:
        down = rmq.start(work / "rmq-down", plugins=("rabbitmq_federation",))
        try:
            rmq.ctl(down, "set_cluster_name", CLUSTER)
            prepare(up.amqp_url, down.amqp_url, args.messages, args.size)
            t0 = time.monotonic()
            rmq.ctl(down, "set_parameter", "federation-upstream", "up", json.dumps({
                "uri": up.amqp_url, "ack-mode": args.ack_mode,
                "prefetch-count": args.prefetch}))
            rmq.ctl(down, "set_policy", "--apply-to", "exchanges", "fb", "^fb\\.x$",
                    json.dumps({"federation-upstream": "up"}))
            return {"system": "RabbitMQ federation",
                    **measure(up.amqp_url, down.amqp_url, args.messages, t0, args.timeout)}
        finally:
            rmq.stop(work / "rmq-down")
    finally:
        rmq.stop(work / "rmq-up")


def run_shovel(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from bench import shovel_bench

    res = shovel_bench.run_amqpd(work / "shovel", args)
    return {"system": "amqpd shovel", "messages": res["messages"], "seconds": res["seconds"],
            "msgs_per_s": res["msgs_per_s"], "sink_count": res["dest_count"],
            "upstream_left": res["source_left"],
            "verified": res["dest_count"] == res["messages"] and res["source_left"] == 0}


def _put(base: str, path: str, body: Any) -> None:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    urllib.request.urlopen(req, timeout=10).read()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.federation_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=256, help="body bytes")
    p.add_argument("--ack-mode", default="on-confirm",
                   choices=["on-confirm", "on-publish", "no-ack"])
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--only", choices=["amqpd", "shovel", "rabbitmq"])
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="federation-bench-") as tmp:
        work = Path(tmp)
        for name, run in (("amqpd", run_amqpd), ("shovel", run_shovel),
                          ("rabbitmq", run_rabbitmq)):
            if args.only in (None, name):
                results.append(run(work, args))
                print(json.dumps(results[-1]), flush=True)
    rates = {r["system"]: r.get("msgs_per_s") for r in results}
    fed = rates.get("amqpd federation")
    ratios = {}
    if fed and rates.get("amqpd shovel"):
        ratios["amqpd federation / amqpd shovel"] = round(fed / rates["amqpd shovel"], 2)
    if fed and rates.get("RabbitMQ federation"):
        ratios["amqpd federation / RabbitMQ federation"] = round(
            fed / rates["RabbitMQ federation"], 2)
    if args.json:
        json.dump({"results": results, "ratios": ratios}, sys.stdout, indent=1)
        print()
    else:
        for r in results:
            print(f"{r['system']:22s} {r.get('msgs_per_s', '-'):>8} msg/s  {r}")
        for k, v in ratios.items():
            print(f"{k}: {v}")
    return 0 if all(r.get("verified", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
