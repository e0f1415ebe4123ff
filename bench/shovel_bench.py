"""Throughput of one shovel between two local brokers: amqpd's shovel beside RabbitMQ's.

    python -m bench.shovel_bench [--messages 100000] [--size 256] [--ack-mode on-confirm]
                                 [--prefetch 1000] [--only amqpd|rabbitmq] [--json]

For each system two brokers of that kind run on loopback (site A with the shovel, site B
the destination); N persistent messages are preloaded into a durable queue on A, then a
dynamic shovel ``src-uri: amqp://`` (A itself) -> ``dest-uri: B`` is declared and the
clock runs until B's queue holds N messages (polled with passive declares). The figure is
N / elapsed seconds. RabbitMQ is Debian's 3.10 package with its ``rabbitmq_shovel``
plugin (skipped, with a note, where it is not installed).
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

from bench.loadgen import Conn, PublisherSpec, Target, run_publisher

QUEUE_A = "shovel-bench-src"
QUEUE_B = "shovel-bench-dest"


def preload(url: str, n: int, size: int) -> None:
    c = Conn(url)
    ch = c.open_channel(1)
    c.declare_queue(ch, QUEUE_A, durable=True)
    c.close()
    spec = PublisherSpec(pubid=1, targets=[Target("", QUEUE_A)], body_size=size,
                         persistent=True, confirm_window=2000, count=n)
    res = run_publisher(url, spec)
    if res.error or res.confirmed < n:
        raise RuntimeError(f"preload failed: {res.error} ({res.confirmed}/{n} confirmed)")


def queue_len(url: str, name: str) -> int:
    c = Conn(url)
    try:
        ch = c.open_channel(1)
        try:
            return c.message_count(ch, name)
        except Exception:
            return 0
    finally:
        c.close()


def wait_count(url: str, name: str, n: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if queue_len(url, name) >= n:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"{name} did not reach {n} messages in {timeout}s "
                       f"(has {queue_len(url, name)})")


def shovel_value(dest_url: str, args: argparse.Namespace) -> dict[str, Any]:
    return {"src-uri": "amqp://", "src-queue": QUEUE_A, "dest-uri": dest_url,
            "dest-queue": QUEUE_B, "ack-mode": args.ack_mode,
            "src-prefetch-count": args.prefetch}


def run_amqpd(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.brokerproc import BrokerProcess

    a = BrokerProcess(work / "a", env={"AMQPD_PLUGINS": "shovel"}).start()
    b = BrokerProcess(work / "b").start()
    try:
        preload(a.url, args.messages, args.size)
        body = json.dumps({"value": shovel_value(b.url, args)}).encode()
        req = urllib.request.Request(f"{a.http_url}/api/parameters/shovel/%2F/bench",
                                     data=body, method="PUT",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        t0 = time.monotonic()
        urllib.request.urlopen(req, timeout=10).read()
        t1 = wait_count(b.url, QUEUE_B, args.messages, args.timeout)
        out = _result("amqpd", args, t1 - t0)
        time.sleep(1.0)  # then count: all N at B, once, nothing ready at A
        out["dest_count"], out["source_left"] = queue_len(b.url, QUEUE_B), queue_len(a.url,
                                                                                     QUEUE_A)
        return out
    finally:
        a.stop()
        b.stop()


def run_rabbitmq(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from devtools import rabbitmq as rmq

    try:
        a = rmq.start(work / "rmq-a", plugins=("rabbitmq_shovel",))
    except rmq.RabbitMQNotInstalled as exc:
        return {"system": "rabbitmq", "skipped": str(exc)}
    try:
        b = rmq.start(work / "rmq-b")
        try:
            preload(a.amqp_url, args.messages, args.size)
            t0 = time.monotonic()
            rmq.ctl(a, "set_parameter", "shovel", "bench",
                    json.dumps(shovel_value(b.amqp_url, args)))
            t1 = wait_count(b.amqp_url, QUEUE_B, args.messages, args.timeout)
            return _result("rabbitmq", args, t1 - t0)
        finally:
            rmq.stop(work / "rmq-b")
    finally:
        rmq.stop(work / "rmq-a")


def _result(system: str, args: argparse.Namespace, elapsed: float) -> dict[str, Any]:
    return {"system": system, "messages": args.messages, "size": args.size,
            "ack_mode": args.ack_mode, "prefetch": args.prefetch,
            "seconds": round(elapsed, 2), "msgs_per_s": round(args.messages / elapsed)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shovel_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=256, help="body bytes")
    p.add_argument("--ack-mode", default="on-confirm",
                   choices=["on-confirm", "on-publish", "no-ack"])
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--only", choices=["amqpd", "rabbitmq"])
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="shovel-bench-") as tmp:
        work = Path(tmp)
        if args.only in (None, "amqpd"):
            results.append(run_amqpd(work, args))
        if args.only in (None, "rabbitmq"):
            results.append(run_rabbitmq(work, args))
    if args.json:
        json.dump(results, sys.stdout)
        sys.stdout.write("\n")
    else:
        for r in results:
            if "skipped" in r:
                print(f"{r['system']:9} skipped: {r['skipped']}")
            else:
                print(f"{r['system']:9} {r['messages']} x {r['size']} B, {r['ack_mode']}, "
                      f"prefetch {r['prefetch']}: {r['seconds']:.2f} s, "
                      f"{r['msgs_per_s']} msg/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
