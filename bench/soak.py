"""Soak: a mixed workload for a long time, sampling the broker's RSS, fds and latency.

    python -m bench.soak [--minutes 30] [--csv soak.csv] [--rate 200] [--url URL --pid PID]

Without ``--url`` an amqpd is started on free ports with its own data dir (and stopped at
the end); with ``--url`` the broker is external and ``--pid`` names the process to sample.

The workload (one asyncio process, aio-pika, each part at a fixed rate):

- **confirms**: a publisher in confirm mode sends persistent messages to ``soak.work``
  (durable, dead-lettering to ``soak.dlx``) at ``--rate`` msg/s; bodies carry the send
  time, and every confirm is awaited in windows of 50;
- **consumers with prefetch**: two consumers on ``soak.work`` (prefetch 50) ack what they
  get and record publish-to-delivery latency; one message in 100 is rejected
  (``requeue=false``) and so dead-lettered;
- **TTL and DLX**: ``soak.ttl`` (``x-message-ttl`` 2 s, nobody consumes) gets rate/4 msg/s;
  everything there expires into ``soak.dlx`` -> ``soak.dead``, which a consumer drains;
- **a slow consumer**: ``soak.slow`` (``x-max-length`` 2,000) gets rate/10 msg/s, read by
  a consumer (prefetch 10) that takes 0.2 s per message: a bounded, permanent backlog;
- **connection churn**: ``--churn`` connections a second open, declare an exclusive queue,
  publish one message to it, and close.

Every 10 s a row goes to the CSV: elapsed seconds, broker RSS (MiB), open fds, messages
published/confirmed/consumed/dead-lettered/slow-consumed in the interval, connections
churned, errors, and delivery latency p50/p95/p99/max (ms) of the interval. The summary
compares RSS at the end of warm-up (the first ``--warmup`` minutes) with RSS at the end.
It is a script, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import functools
import os
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika

from bench.brokers import rss_bytes

STAMP = struct.Struct(">d")
INTERVAL = 10.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


@dataclass
class Counters:
    published: int = 0
    confirmed: int = 0
    consumed: int = 0
    dead: int = 0
    slow: int = 0
    churned: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    last_error: str = ""

    def take(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        row = {"published": self.published, "confirmed": self.confirmed,
               "consumed": self.consumed, "dead_lettered": self.dead,
               "slow_consumed": self.slow, "churned": self.churned, "errors": self.errors,
               "lat_p50_ms": round(percentile(lat, 50) * 1000, 2),
               "lat_p95_ms": round(percentile(lat, 95) * 1000, 2),
               "lat_p99_ms": round(percentile(lat, 99) * 1000, 2),
               "lat_max_ms": round(lat[-1] * 1000, 2) if lat else float("nan")}
        self.published = self.confirmed = self.consumed = self.dead = self.slow = 0
        self.churned = self.errors = 0
        self.latencies = []
        return row


class Soak:
    def __init__(self, url: str, rate: float, churn: float, until: float) -> None:
        self.url = url
        self.rate = rate
        self.churn = churn
        self.until = until
        self.c = Counters()

    def error(self, exc: BaseException) -> None:
        self.c.errors += 1
        self.c.last_error = f"{type(exc).__name__}: {exc}"

    async def setup(self) -> None:
        conn = await aio_pika.connect(self.url)
        async with conn:
            ch = await conn.channel()
            dlx = await ch.declare_exchange("soak.dlx", aio_pika.ExchangeType.FANOUT,
                                            durable=True)
            dead = await ch.declare_queue("soak.dead", durable=True)
            await dead.bind(dlx)
            await ch.declare_queue("soak.work", durable=True,
                                   arguments={"x-dead-letter-exchange": "soak.dlx"})
            await ch.declare_queue("soak.ttl", durable=True,
                                   arguments={"x-message-ttl": 2000,
                                              "x-dead-letter-exchange": "soak.dlx"})
            await ch.declare_queue("soak.slow", durable=True,
                                   arguments={"x-max-length": 2000})

    async def paced(self, rate: float, step: Any) -> None:
        """Call ``step()`` ``rate`` times a second (catching up after stalls, bounded)."""
        period = 1.0 / rate
        nxt = time.monotonic()
        while time.monotonic() < self.until:
            nxt += period
            await step()
            delay = nxt - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -1.0:
                nxt = time.monotonic()  # fell a second behind: do not burst to catch up

    async def confirmed_publisher(self) -> None:
        while time.monotonic() < self.until:
            try:
                conn = await aio_pika.connect(self.url)
                async with conn:
                    ch = await conn.channel(publisher_confirms=True)
                    window: list[Any] = []
                    try:
                        await self.paced(self.rate, functools.partial(
                            self._confirmed_step, ch.default_exchange, window))
                    finally:  # the end (or a failure): collect what is still in flight
                        await asyncio.gather(*window, return_exceptions=True)
            except Exception as exc:  # the broker restarted, a timeout: count, go on
                self.error(exc)
                await asyncio.sleep(1)

    async def _confirmed_step(self, ex: Any, window: list[Any]) -> None:
        body = STAMP.pack(time.time()) + b"x" * 248
        # a task, so the message goes out now, not when the window is awaited
        window.append(asyncio.ensure_future(ex.publish(aio_pika.Message(
            body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "soak.work")))
        self.c.published += 1
        if len(window) >= 50:
            batch = window[:]
            window.clear()
            await asyncio.gather(*batch)
            self.c.confirmed += len(batch)

    async def _side_step(self, ex: Any, n: list[int]) -> None:
        n[0] += 1
        body = STAMP.pack(time.time()) + b"t" * 120
        await ex.publish(aio_pika.Message(body), "soak.ttl")
        if n[0] % 3 == 0:
            await ex.publish(aio_pika.Message(body), "soak.slow")

    async def side_publisher(self) -> None:
        """TTL and slow-consumer traffic, without confirms."""
        while time.monotonic() < self.until:
            try:
                conn = await aio_pika.connect(self.url)
                async with conn:
                    ch = await conn.channel()
                    # rate/4 to the TTL queue, a third of that (about rate/12) to the slow one
                    await self.paced(max(self.rate / 4, 1), functools.partial(
                        self._side_step, ch.default_exchange, [0]))
            except Exception as exc:
                self.error(exc)
                await asyncio.sleep(1)

    async def consumer(self, queue: str, prefetch: int, kind: str) -> None:
        while time.monotonic() < self.until:
            try:
                conn = await aio_pika.connect(self.url)
                async with conn:
                    ch = await conn.channel()
                    await ch.set_qos(prefetch_count=prefetch)
                    q = await ch.get_queue(queue, ensure=False)
                    n = 0
                    async with q.iterator() as it:
                        async for message in it:
                            n += 1
                            if kind == "work":
                                self.c.latencies.append(
                                    time.time() - STAMP.unpack_from(message.body)[0])
                                if n % 100 == 0:
                                    await message.reject(requeue=False)
                                    continue
                                self.c.consumed += 1
                            elif kind == "dead":
                                self.c.dead += 1
                            else:
                                await asyncio.sleep(0.2)
                                self.c.slow += 1
                            await message.ack()
                            if time.monotonic() >= self.until:
                                break
            except Exception as exc:
                self.error(exc)
                await asyncio.sleep(1)

    async def churner(self) -> None:
        async def one() -> None:
            try:
                conn = await aio_pika.connect(self.url)
                async with conn:
                    ch = await conn.channel()
                    q = await ch.declare_queue("", exclusive=True)
                    await ch.default_exchange.publish(aio_pika.Message(b"churn"), q.name)
                self.c.churned += 1
            except Exception as exc:
                self.error(exc)

        tasks: set[asyncio.Task[None]] = set()

        async def step() -> None:
            if len(tasks) < 200:  # bounded: a stalled broker does not pile up clients
                t = asyncio.ensure_future(one())
                tasks.add(t)
                t.add_done_callback(tasks.discard)

        await self.paced(self.churn, step)
        if tasks:
            await asyncio.wait(tasks, timeout=30)


async def run(args: argparse.Namespace, url: str, pid: int) -> list[dict[str, Any]]:
    start = time.monotonic()
    until = start + args.minutes * 60
    soak = Soak(url, args.rate, args.churn, until)
    await soak.setup()
    workers = [soak.confirmed_publisher(), soak.side_publisher(),
               soak.consumer("soak.work", 50, "work"), soak.consumer("soak.work", 50, "work"),
               soak.consumer("soak.dead", 100, "dead"), soak.consumer("soak.slow", 10, "slow")]
    if args.churn > 0:
        workers.append(soak.churner())
    tasks = [asyncio.ensure_future(w) for w in workers]
    rows: list[dict[str, Any]] = []
    with open(args.csv, "w", newline="") as f:
        writer: csv.DictWriter[str] | None = None
        nxt = start + INTERVAL
        while nxt <= until + 0.5:
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            nxt += INTERVAL
            row: dict[str, Any] = {"elapsed_s": round(time.monotonic() - start, 1),
                                   "rss_mib": round(rss_bytes(pid) / 2**20, 1),
                                   "fds": open_fds(pid), **soak.c.take()}
            rows.append(row)
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            f.flush()
            if not args.quiet:
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if soak.c.last_error:
        print(f"last client error: {soak.c.last_error}")
    return rows


def summary(rows: list[dict[str, Any]], warmup_s: float) -> str:
    if not rows:
        return "no samples"
    warm = next((r for r in rows if r["elapsed_s"] >= warmup_s), rows[-1])
    end = rows[-1]
    after = [r for r in rows if r["elapsed_s"] >= warm["elapsed_s"]]
    p99 = sorted(r["lat_p99_ms"] for r in after if r["lat_p99_ms"] == r["lat_p99_ms"])
    totals = {k: sum(r[k] for r in rows) for k in
              ("published", "confirmed", "consumed", "dead_lettered", "slow_consumed",
               "churned", "errors")}
    lines = [
        f"samples: {len(rows)} over {end['elapsed_s']:.0f} s",
        f"RSS: {rows[0]['rss_mib']} MiB at {rows[0]['elapsed_s']} s, "
        f"{warm['rss_mib']} MiB after warm-up ({warm['elapsed_s']} s), "
        f"{end['rss_mib']} MiB at the end ({end['elapsed_s']} s); "
        f"after warm-up min {min(r['rss_mib'] for r in after)} / "
        f"max {max(r['rss_mib'] for r in after)} MiB; "
        f"end - warm-up = {end['rss_mib'] - warm['rss_mib']:+.1f} MiB",
        f"open fds: {rows[0]['fds']} first, {warm['fds']} after warm-up, {end['fds']} at the "
        f"end (max {max(r['fds'] for r in rows)})",
        "per-interval delivery latency p99 after warm-up (ms): "
        + (f"median {p99[len(p99) // 2]}, worst {p99[-1]}" if p99 else "n/a"),
        "p50 after warm-up (ms): median "
        + str(sorted(r["lat_p50_ms"] for r in after)[len(after) // 2]),
        "totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=None,
                   help="minutes of warm-up before RSS is compared (default: a tenth, "
                        "at least 1)")
    p.add_argument("--rate", type=float, default=200.0, help="confirmed msg/s")
    p.add_argument("--churn", type=float, default=10.0, help="connections opened/closed per s")
    p.add_argument("--csv", default="soak.csv")
    p.add_argument("--url", help="an external broker (then --pid is required)")
    p.add_argument("--pid", type=int)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else max(1.0, args.minutes / 10)
    print(f"soak: {args.minutes} min, {args.rate} confirmed msg/s, churn {args.churn}/s, "
          f"csv {args.csv}", flush=True)
    if args.url:
        if not args.pid:
            p.error("--url needs --pid (the process whose RSS and fds are sampled)")
        rows = asyncio.run(run(args, args.url, args.pid))
    else:
        from tests.support.brokerproc import BrokerProcess

        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            broker = BrokerProcess(Path(tmp) / "amqpd").start()
            assert broker.proc is not None
            try:
                rows = asyncio.run(run(args, broker.url, broker.proc.pid))
            finally:
                with contextlib.suppress(Exception):
                    broker.stop()
    print(summary(rows, warmup * 60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
