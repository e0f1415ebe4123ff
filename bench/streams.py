"""Stream queues over AMQP 0-9-1, amqpd and RabbitMQ 3.10.8 side by side (issue 30).

    python -m bench.streams [--messages 1000000] [--body 1024] [--consumer-procs 2] \\
        [--publish-only] [--out bench/RESULTS-streams]

For each broker (started fresh on free ports, its own data directory) on one stream:

* **publish**: ``--messages`` persistent messages of ``--body`` bytes with publisher
  confirms (a window of 1,000 in flight), one publisher: confirmed messages per second.
* **replay**: one consumer from ``first`` reading the whole stream (prefetch 1,000,
  acks every 250): deliveries per second.
* **fan-out 1 / 5 / 20**: that many consumers, each on its own connection, all from
  ``first``: deliveries per second summed over consumers. The consumers of a fan-out
  and of the 20 spread ones are shared out over ``--consumer-procs`` load-generator
  processes (default 2): one process reading 20 connections kept either broker at
  35-75 % CPU, so it measured itself.
* **RSS**: the broker's resident memory, sampled every 0.1 s, peak while 1 and while 20
  consumers read from offsets spread evenly over the stream (20 consumers: offset
  ``i * N / 20``), and at rest after the publish.

Every delivery is checked by the load generator (bench/loadgen.py): per consumer the
sequence numbers must arrive in order with no gap; a figure is reported only when each
consumer saw exactly what it should.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.brokers import AmqpdBroker, Broker, RabbitBroker, Sampler
from bench.loadgen import (
    ConsumerSpec,
    PublisherSpec,
    Target,
    _ConsumerConn,
    run_consumers,
    run_publisher,
)

STREAM = "bench-stream"


def _declare(broker: Broker) -> None:
    from bench.loadgen import Conn

    conn = Conn(broker.url)
    ch = conn.open_channel(1)
    conn.declare_queue(ch, STREAM, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()


def _per(s: Sampler, n: int) -> float | None:
    """The broker's CPU time (utime + stime, all its threads) per message, in us: on a
    machine shared with other work it moves far less than the rates do."""
    if not s.pid or not n:
        return None
    return round((s.cpu1 - s.cpu0) * 1e6 / n, 2)


def _publish(broker: Broker, n: int, body: int) -> dict[str, Any]:
    spec = PublisherSpec(pubid=1, targets=[Target("", STREAM)], body_size=body,
                         persistent=True, confirm_window=1000, count=n)
    with Sampler(broker.pid) as s:
        res = run_publisher(broker.url, spec)
    if res.error or res.confirmed != n:
        raise RuntimeError(f"publish: {res.error or f'{res.confirmed} of {n} confirmed'}")
    secs = res.t_end - res.t_start
    # the publisher's own CPU: near 100 % of its run would mean it measured itself
    return {"messages": n, "seconds": round(secs, 3), "rate": round(n / secs),
            "broker_cpu_percent": s.cpu_percent, "broker_cpu_us_per_msg": _per(s, n),
            "publisher_cpu_percent": round(100.0 * res.cpu / secs, 1),
            "rss_peak": s.peak}


def _consumer_process(url: str, specs: list[ConsumerSpec], slot: int, progress: Any,
                      stop: Any, go: Any, out: Any) -> None:
    """One load-generator process: its consumers' connections (consuming from setup
    on), then counting deliveries once ``go`` is set, until ``stop``."""
    try:
        conns = [_ConsumerConn(url, s) for s in specs]
    except Exception as exc:  # reported to the coordinator
        out.put((slot, None, f"setup: {exc}"))
        return
    out.put((slot, "ready", None))
    res = run_consumers(url, specs, stop, progress, slot, go, conns)
    out.put((slot, (res.received, res.gaps, res.disorder), res.error))


def _consume(broker: Broker, offsets: list[int], n: int, procs: int = 1) -> dict[str, Any]:
    """Consumers at ``offsets`` (each its own connection, spread over ``procs`` load
    generator processes) until each has read to the end of the stream; every one must
    see its range in order with no gap."""
    specs = [ConsumerSpec(queues=[STREAM], prefetch=1000, ack_every=250,
                          arguments={"x-stream-offset": o}, tag_suffix=f".{i}")
             for i, o in enumerate(offsets)]
    want = sum(n - o for o in offsets)
    procs = max(1, min(procs, len(specs)))
    ctx = multiprocessing.get_context("fork")
    progress = ctx.Array("q", procs)
    stop, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_consumer_process, args=(
        broker.url, specs[i::procs], i, progress, stop, go, out)) for i in range(procs)]
    for w in workers:
        w.start()
    try:
        for _ in workers:
            slot, state, error = out.get(timeout=300)
            if state != "ready":
                raise RuntimeError(f"consumer process {slot}: {error}")
        with Sampler(broker.pid) as s:
            t0 = time.monotonic()
            go.set()
            deadline = t0 + 3600
            while sum(progress[:]) < want and time.monotonic() < deadline and \
                    all(w.is_alive() for w in workers):
                time.sleep(0.01)
            secs = time.monotonic() - t0
            stop.set()
        received = gaps = disorder = 0
        errors = []
        for _ in workers:
            _slot, counts, error = out.get(timeout=300)
            if counts is not None:
                received += counts[0]
                gaps += counts[1]
                disorder += counts[2]
            if error:
                errors.append(error)
    finally:
        stop.set()
        for w in workers:
            w.join(60)
    # a consumer starting at offset o first sees sequence number about o + 1: the
    # generator counts that start as a gap of o, and nothing else may be one
    # (RabbitMQ's offsets can skip a number at a segment start: a few more deliveries)
    if errors or received < want or gaps > sum(offsets) or disorder:
        raise RuntimeError(f"consume {len(offsets)}: received {received} of {want}, "
                           f"gaps {gaps}, disorder {disorder}, {errors}")
    return {"consumers": len(offsets), "processes": procs, "deliveries": want,
            "seconds": round(secs, 3), "rate": round(want / secs),
            "broker_cpu_percent": s.cpu_percent, "broker_cpu_us_per_msg": _per(s, want),
            "rss_peak": s.peak}


def run_broker(broker: Broker, n: int, body: int, procs: int = 1,
               publish_only: bool = False) -> dict[str, Any]:
    broker.start()
    try:
        _declare(broker)
        out: dict[str, Any] = {"publish": _publish(broker, n, body)}
        if publish_only:
            return out
        with Sampler(broker.pid, interval=0.1) as rest:
            time.sleep(1.0)  # a measurement window, not synchronisation
        out["rss_at_rest"] = rest.peak
        out["replay"] = _consume(broker, [0], n)
        for k in (1, 5, 20):
            out[f"fanout_{k}"] = _consume(broker, [0] * k, n, procs)
        out["spread_1"] = _consume(broker, [n // 2], n)
        out["spread_20"] = _consume(broker, [i * n // 20 for i in range(20)], n, procs)
        return out
    finally:
        broker.stop()


def _mb(x: int) -> str:
    return f"{x / 1e6:.0f} MB"


def report(results: dict[str, dict[str, Any]], n: int, body: int, command: str) -> str:
    a, r = results.get("amqpd", {}), results.get("rabbitmq", {})
    lines = [f"## Streams over AMQP 0-9-1 ({n:,} messages of {body} B)", "",
             f"Command: `{command}`", "",
             "| measure | amqpd | RabbitMQ 3.10.8 | amqpd / RabbitMQ |", "|---|---|---|---|"]

    def row(label: str, key: str, field: str = "rate", fmt: Any = "{:,}") -> None:
        va = a.get(key, {}).get(field) if key else a.get(field)
        vr = r.get(key, {}).get(field) if key else r.get(field)
        ratio = f"{va / vr:.2f}x" if va and vr else "-"
        show = (lambda v: "-" if v is None else fmt(v)) if callable(fmt) else \
            (lambda v: "-" if v is None else fmt.format(v))
        lines.append(f"| {label} | {show(va)} | {show(vr)} | {ratio} |")

    row("publish with confirms, msg/s", "publish")
    row("replay from first, 1 consumer, deliveries/s", "replay")
    for k in (1, 5, 20):
        row(f"fan-out to {k} consumer(s), deliveries/s", f"fanout_{k}")
    row("20 consumers at spread offsets (i * N / 20), deliveries/s", "spread_20")
    for label, key in (("publish", "publish"), ("replay", "replay"),
                       ("fan-out 1", "fanout_1"), ("fan-out 5", "fanout_5"),
                       ("fan-out 20", "fanout_20"), ("20 spread", "spread_20")):
        row(f"broker CPU per message, {label}, us", key, "broker_cpu_us_per_msg", "{:.2f}")
    row("publisher (load generator) CPU while publishing, %", "publish",
        "publisher_cpu_percent", "{:.0f}")
    row("broker CPU while publishing, %", "publish", "broker_cpu_percent", "{:.0f}")
    row("broker RSS at rest after publish", "", "rss_at_rest", _mb)
    row("broker RSS peak, 1 consumer from the middle", "spread_1", "rss_peak", _mb)
    row("broker RSS peak, 20 consumers at spread offsets", "spread_20", "rss_peak", _mb)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--body", type=int, default=1024)
    p.add_argument("--brokers", default="amqpd,rabbitmq")
    p.add_argument("--consumer-procs", type=int, default=2,
                   help="load-generator processes the consumers of one measure are "
                        "spread over (one process could not keep up with either broker)")
    p.add_argument("--publish-only", action="store_true",
                   help="only the publish with confirms (the consumers' measures need "
                        "the published stream and take most of the time)")
    p.add_argument("--out", default="")
    p.add_argument("--from-json", default="", help="render a saved run's table again")
    a = p.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    if a.from_json:
        saved = json.loads(Path(a.from_json).read_text())
        print(report(saved["results"], saved["messages"], saved["body"], saved["command"]))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:
        for name in a.brokers.split(","):
            broker: Broker = AmqpdBroker(Path(tmp) / name) if name == "amqpd" \
                else RabbitBroker(Path(tmp) / name)
            print(f"{name}: running", file=sys.stderr)
            results[name] = run_broker(broker, a.messages, a.body, a.consumer_procs,
                                       a.publish_only)
            print(json.dumps(results[name]), file=sys.stderr)
    command = "python -m bench.streams " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(results, a.messages, a.body, command)
    print(text)
    if a.out:
        Path(a.out + ".json").write_text(json.dumps(
            {"command": command, "messages": a.messages, "body": a.body,
             "results": results}, indent=1))
        Path(a.out + ".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
