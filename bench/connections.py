"""Many connections on one node: memory per connection, probe latency, and churn.

    python -m bench.connections [--connections 10000] [--hold 60] [--heartbeat 10]
                                [--churn-rate 1000] [--churn-seconds 60]
                                [--churn-rounds 2] [--workers 2] [--max-inflight 2000]
                                [--broker amqpd|rabbitmq] [--only hold|churn] [--json]

One amqpd is started on free ports (its own data dir). The load generators speak raw
AMQP frames (a client library per connection would be the bottleneck): each connection
does the real handshake (protocol header, start-ok with PLAIN, tune-ok with the
heartbeat, connection.open) and opens one channel.

**Churn** (first, on the fresh broker): connections that open a channel and close
(connection.close / close-ok, then the socket) are started at ``--churn-rate`` a second
for ``--churn-seconds``, at most ``--max-inflight`` in flight, by ``--workers``
generator processes sharing the rate (bench/churngen.py: one epoll loop over
non-blocking sockets each, no asyncio). The achieved rate counts completed connections
over the whole round (the last ones' drain included). The broker's RSS and open fds are
read after a 5 s warm-up of the same churn (so one-time allocations are not counted as
growth) and again after each of ``--churn-rounds`` rounds, once the fd count has
settled: RSS that grows every round is a leak, RSS that grows in the first round only
is the high-water mark of connections in flight (bench/churn_memory.py looks inside).
``--broker rabbitmq`` runs the same churn against a private RabbitMQ 3.10 instead.

**Hold**: ``--connections`` connections are opened (256 at a time) and held for ``--hold``
seconds with heartbeats on (both sides send one every heartbeat/2 s when idle; a
connection the broker drops is counted). RSS per connection = (RSS while held - RSS
before the ramp) / connections. Meanwhile a probe in a separate process (pika) publishes
one message to its own queue and waits for its delivery, every 100 ms: round-trip
latency percentiles, compared with the same probe on the idle broker before the ramp.

File descriptors: RLIMIT_NOFILE is raised to the hard limit in this process before the
broker is started, so the broker child inherits it too; both figures are reported.
Connections come from source addresses 127.0.0.2-127.0.0.251 (the broker listens on
127.0.0.1), so neither the ephemeral port range nor TIME_WAIT limits the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pamqp import commands as spec
from pamqp import common
from pamqp import frame as pframe

from bench.brokers import cpu_seconds, host_cpu, rss_bytes

_FRAME = struct.Struct(">BHI")
_IDS = struct.Struct(">HH")
HB = b"\x08\x00\x00\x00\x00\x00\x00\xce"
HEADER = b"AMQP\x00\x00\x09\x01"
START, TUNE, OPEN_OK, CLOSE, CLOSE_OK = (10, 10), (10, 30), (10, 41), (10, 50), (10, 51)
CH_OPEN_OK = (20, 11)


def _frames(heartbeat: int) -> dict[str, bytes]:
    caps: common.FieldTable = {"publisher_confirms": True, "consumer_cancel_notify": True,
                               "connection.blocked": True, "basic.nack": True}
    return {
        "start_ok": pframe.marshal(spec.Connection.StartOk(
            client_properties={"product": "amqpd-bench-connections", "capabilities": caps},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"), 0),
        "tune_ok_open": pframe.marshal(spec.Connection.TuneOk(
            channel_max=16, frame_max=131072, heartbeat=heartbeat), 0)
        + pframe.marshal(spec.Connection.Open(virtual_host="/"), 0),
        "channel_open": pframe.marshal(spec.Channel.Open(), 1),
        "close": pframe.marshal(spec.Connection.Close(
            reply_code=200, reply_text="bye", class_id=0, method_id=0), 0),
        "close_ok": pframe.marshal(spec.Connection.CloseOk(), 0),
    }


class Client(asyncio.Protocol):
    """One connection: the handshake as a small state machine over raw frames."""

    def __init__(self, frames: dict[str, bytes], stats: dict[str, int]) -> None:
        self.frames = frames
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.closing = False
        self.error = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(HEADER)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.stats["dropped"] += 1
            self.error = self.error or f"connection lost: {exc}"
        for fut in (self.ready, self.closed):
            if not fut.done():
                fut.set_exception(ConnectionError(self.error or "connection lost"))
                fut.exception()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 8:
            ftype, _channel, size = _FRAME.unpack_from(buf, pos)
            end = pos + 7 + size
            if len(buf) < end + 1:
                break
            if ftype == 8:
                self.stats["heartbeats_in"] += 1
            elif ftype == 1:
                self._method(_IDS.unpack_from(buf, pos + 7))
            pos = end + 1
        del buf[:pos]

    def _method(self, ids: tuple[int, int]) -> None:
        t = self.transport
        assert t is not None
        if ids == START:
            t.write(self.frames["start_ok"])
        elif ids == TUNE:
            t.write(self.frames["tune_ok_open"])
        elif ids == OPEN_OK:
            t.write(self.frames["channel_open"])
        elif ids == CH_OPEN_OK:
            if not self.ready.done():
                self.ready.set_result(None)
        elif ids == CLOSE_OK:
            self.closing = True
            t.close()
            if not self.closed.done():
                self.closed.set_result(None)
        elif ids == CLOSE:  # the broker closed us: say so, answer, and go
            self.error = "closed by the broker"
            t.write(self.frames["close_ok"])
            t.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.frames["close"])

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def heartbeat(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(HB)


def raise_nofile() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _source(i: int) -> tuple[str, int]:
    return (f"127.0.0.{2 + i % 250}", 0)


async def open_client(host: str, port: int, i: int, frames: dict[str, bytes],
                      stats: dict[str, int], timeout: float = 60.0) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(loop.create_connection(
        lambda: Client(frames, stats), host, port, local_addr=_source(i)), timeout)
    try:
        await asyncio.wait_for(client.ready, timeout)
    except BaseException:
        client.abort()  # given up on: the socket goes too (no leak on our side)
        raise
    return client


# ---------------------------------------------------------------------- probe
def probe(url: str, seconds: float, interval: float = 0.1) -> list[float]:
    """Round trips (s) of a message published to its own queue and delivered back."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    got: list[float] = []
    ch.basic_consume(queue, lambda *_a: got.append(time.perf_counter()), auto_ack=True)
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n = len(got)
        t0 = time.perf_counter()
        ch.basic_publish("", queue, b"probe")
        deadline = time.monotonic() + 30
        while len(got) == n and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.5)
        if len(got) > n:
            out.append(got[-1] - t0)
        time.sleep(interval)
    conn.close()
    return out


def start_probe(url: str, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.connections", "--probe", url,
                             "--probe-seconds", str(seconds)], stdout=subprocess.PIPE,
                            text=True)


def probe_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, float]:
    out, _ = proc.communicate(timeout=timeout)
    lat = sorted(json.loads(out.strip().splitlines()[-1]))
    if not lat:
        return {"n": 0}

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, round(p / 100 * (len(lat) - 1)))] * 1000, 2)

    return {"n": len(lat), "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99),
            "max_ms": round(lat[-1] * 1000, 2), "mean_ms": round(statistics.mean(lat) * 1000, 2)}


# ---------------------------------------------------------------------- phases
async def hold(host: str, port: int, url: str, pid: int, n: int, seconds: float,
               heartbeat: int) -> dict[str, Any]:
    frames = _frames(heartbeat)
    stats = {"dropped": 0, "heartbeats_in": 0, "failed": 0}
    idle = await asyncio.to_thread(lambda: probe_result(start_probe(url, 5), 60))
    rss0, fds0 = rss_bytes(pid), open_fds(pid)
    clients: list[Client] = []
    sem = asyncio.Semaphore(256)
    errors: list[str] = []

    async def one(i: int) -> None:
        async with sem:
            try:
                clients.append(await open_client(host, port, i, frames, stats))
            except Exception as exc:
                stats["failed"] += 1
                if len(errors) < 5:
                    errors.append(f"{type(exc).__name__}: {exc}")

    async def beat() -> None:
        while True:
            await asyncio.sleep(heartbeat / 2)
            for c in clients:
                c.heartbeat()

    # beating from the start: a slow ramp must not let the first connections time out
    beater = asyncio.ensure_future(beat())
    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    ramp = time.monotonic() - t0
    print(f"hold: {len(clients)} connections open in {ramp:.1f} s "
          f"({stats['failed']} failed {errors[:2]})", flush=True)

    prober = start_probe(url, max(seconds - 5, 5))
    samples = []
    cpu0 = cpu_seconds(pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(min(5.0, max(0.0, end - time.monotonic())))
        samples.append({"t": round(seconds - (end - time.monotonic()), 1),
                        "rss_mib": round(rss_bytes(pid) / 2**20, 1), "fds": open_fds(pid),
                        "dropped": stats["dropped"]})
        print(f"  hold {samples[-1]}", flush=True)
    cpu = cpu_seconds(pid) - cpu0
    loaded = await asyncio.to_thread(probe_result, prober, 120)
    beater.cancel()
    rss1, fds1 = rss_bytes(pid), open_fds(pid)
    alive = sum(1 for c in clients if not c.closed.done() and not c.error)
    for c in clients:
        c.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*(c.closed for c in clients),
                                              return_exceptions=True), 60)
    return {
        "connections": n, "opened": len(clients), "failed": stats["failed"],
        "errors": errors, "ramp_s": round(ramp, 1), "held_s": seconds,
        "heartbeat_s": heartbeat, "alive_at_end": alive, "dropped": stats["dropped"],
        "heartbeats_from_broker": stats["heartbeats_in"],
        "broker_cpu_s_while_held": round(cpu, 1),
        "rss_before_mib": round(rss0 / 2**20, 1), "rss_held_mib": round(rss1 / 2**20, 1),
        "rss_per_connection_kib": round((rss1 - rss0) / max(len(clients), 1) / 1024, 1),
        "fds_before": fds0, "fds_held": fds1,
        "probe_idle": idle, "probe_held": loaded, "samples": samples,
    }


def _worker_main(target: str, rate: float, seconds: float, max_inflight: int, first: int,
                 stride: int) -> dict[str, Any]:
    """One churn generator process (``--churn-worker``): bench/churngen.py's epoll loop
    over raw sockets. Connection ``k`` of this process is number ``first + k * stride``
    overall (its source address), so several processes do not share addresses."""
    from bench.churngen import Generator

    host, _, port = target.rpartition(":")
    return Generator(host, int(port), _frames(0)).run(rate, seconds, max_inflight, first,
                                                     stride)


async def churn(host: str, port: int, pid: int, rate: float, seconds: float,
                rounds: int = 1, workers: int = 1, max_inflight: int = 2000,
                warmup: float = 5.0,
                after_round: Callable[[int], Awaitable[dict[str, Any]]] | None = None,
                ) -> dict[str, Any]:
    """Rounds of churn against one broker; its RSS and fds after a warm-up and after
    each round. ``workers`` generator processes share the rate and the in-flight bound
    (one asyncio process could not start 1,000 connections a second beside a broker on
    two cores). ``after_round(n)`` (n = 0 after the warm-up) may add figures of its own
    to each round's record (bench/churn_memory.py takes heap snapshots there)."""
    errors: list[str] = []

    async def run(duration: float) -> dict[str, Any]:
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.connections", "--churn-worker", f"{host}:{port}",
            "--churn-rate", str(rate / workers), "--churn-seconds", str(duration),
            "--max-inflight", str(max(1, max_inflight // workers)),
            "--worker-index", str(w), "--workers", str(workers),
            stdout=asyncio.subprocess.PIPE) for w in range(workers)]
        outs = [json.loads((await p.communicate())[0].decode().strip().splitlines()[-1])
                for p in procs]
        for o in outs:
            errors.extend(o["errors"][: max(0, 5 - len(errors))])
        return {"ok": sum(o["ok"] for o in outs), "failed": sum(o["failed"] for o in outs),
                "start_window_s": max(o["start_window_s"] for o in outs),
                "wall_s": max(o["wall_s"] for o in outs),
                "loadgen_cpu_s": round(sum(o["cpu_s"] for o in outs), 1),
                "fell_behind": sum(o["fell_behind"] for o in outs)}

    async def settled_fds() -> int:
        last, stable_since = open_fds(pid), time.monotonic()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            now = open_fds(pid)
            if now != last:
                last, stable_since = now, time.monotonic()
            elif time.monotonic() - stable_since >= 2:
                break
        return last

    rss_fresh, fds_fresh = rss_bytes(pid), open_fds(pid)
    if warmup > 0:
        await run(warmup)  # one-time allocations are not growth
    fds0 = await settled_fds()
    rss0 = rss_bytes(pid)
    out: dict[str, Any] = {
        "target_per_s": rate, "seconds": seconds, "workers": workers,
        "max_inflight": max_inflight, "rounds": [],
        "rss_fresh_mib": round(rss_fresh / 2**20, 1), "fds_fresh": fds_fresh,
        "rss_before_mib": round(rss0 / 2**20, 1), "fds_before": fds0}
    if after_round is not None:
        out["before"] = await after_round(0)
    # several rounds tell a leak (RSS grows every round) from a high-water mark (the
    # first round's peak of half-open connections, reused by the next rounds)
    for n_round in range(1, rounds + 1):
        cpu0, host0 = cpu_seconds(pid), host_cpu()
        load0 = os.getloadavg()[0]
        r = await run(seconds)
        cpu, host1 = cpu_seconds(pid) - cpu0, host_cpu()
        fds1 = await settled_fds()
        busy = (host1[0] - host0[0]) / max(host1[1] - host0[1], 1)
        out["rounds"].append({
            # completed over the whole round, the drain of the last ones included
            "completed": r["ok"], "achieved_per_s": round(r["ok"] / r["wall_s"], 1),
            "started_per_s": round((r["ok"] + r["failed"]) / r["start_window_s"], 1),
            "failed": r["failed"], "broker_cpu_s": round(cpu, 1),
            "broker_cpu_us_per_conn": round(cpu / max(r["ok"], 1) * 1e6),
            "loadgen_cpu_s": r["loadgen_cpu_s"], "wall_s": r["wall_s"],
            "start_window_s": r["start_window_s"], "fell_behind": r["fell_behind"],
            "host_cpu_busy": round(busy, 2),
            "loadavg_1m_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "rss_after_mib": round(rss_bytes(pid) / 2**20, 1), "fds_after": fds1})
        if after_round is not None:
            out["rounds"][-1].update(await after_round(n_round))
        print(f"  churn round: {out['rounds'][-1]}", flush=True)
    out["errors"] = errors
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.connections", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--hold", type=float, default=60.0, help="seconds to hold them")
    p.add_argument("--heartbeat", type=int, default=10, help="seconds (negotiated)")
    p.add_argument("--churn-rate", type=float, default=1000.0)
    p.add_argument("--churn-seconds", type=float, default=60.0)
    p.add_argument("--churn-rounds", type=int, default=2,
                   help="churn periods back to back (RSS after each)")
    p.add_argument("--workers", type=int, default=2,
                   help="churn generator processes sharing the rate")
    p.add_argument("--max-inflight", type=int, default=2000,
                   help="churn connections in flight at most (all workers together)")
    p.add_argument("--warmup", type=float, default=5.0, help="churn seconds before 'before'")
    p.add_argument("--broker", choices=["amqpd", "rabbitmq"], default="amqpd",
                   help="churn only: RabbitMQ 3.10 (devtools' private node) with the same "
                        "generator, for a ratio")
    p.add_argument("--only", choices=["hold", "churn"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--probe-seconds", type=float, default=10, help=argparse.SUPPRESS)
    p.add_argument("--churn-worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.probe_seconds)))
        return 0
    if args.churn_worker:
        raise_nofile()
        print(json.dumps(_worker_main(args.churn_worker, args.churn_rate, args.churn_seconds,
                                      args.max_inflight, args.worker_index, args.workers)))
        return 0
    if args.broker == "rabbitmq":
        return _churn_rabbitmq(args)
    # SIGTERM ends the run through the finally clauses (the broker child is stopped)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    soft, hard = raise_nofile()
    print(f"RLIMIT_NOFILE raised to {soft} (hard limit {hard}) for the load generator and "
          f"the broker child", flush=True)
    from tests.support.brokerproc import BrokerProcess

    result: dict[str, Any] = {"rlimit_nofile": [soft, hard],
                              "hot_path": "pure Python" if os.environ.get(
                                  "AMQPD_PURE_PYTHON") else "as installed"}
    with tempfile.TemporaryDirectory(prefix="bench-conns-") as tmp:
        broker = BrokerProcess(Path(tmp) / "amqpd").start(timeout=120)
        assert broker.proc is not None
        pid = broker.proc.pid
        with open(f"/proc/{pid}/limits") as f:
            result["broker_nofile"] = next(line.split()[3:5] for line in f
                                           if line.startswith("Max open files"))
        try:
            if args.only in (None, "churn"):
                result["churn"] = asyncio.run(churn(
                    broker.bind, broker.port, pid, args.churn_rate, args.churn_seconds,
                    args.churn_rounds, args.workers, args.max_inflight, args.warmup))
                print(f"churn: {json.dumps(result['churn'])}", flush=True)
            if args.only in (None, "hold"):
                result["hold"] = asyncio.run(hold(broker.bind, broker.port, broker.url, pid,
                                                  args.connections, args.hold,
                                                  args.heartbeat))
        finally:
            broker.stop(timeout=120)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return 0
    print(json.dumps({k: v for k, v in result.items() if k != "hold"}, indent=1))
    if "hold" in result:
        h = {k: v for k, v in result["hold"].items() if k != "samples"}
        print("hold:", json.dumps(h, indent=1))
    return 0


def _churn_rabbitmq(args: argparse.Namespace) -> int:
    """The same churn against a private RabbitMQ 3.10 (its beam.smp's RSS and fds)."""
    from urllib.parse import urlsplit

    from bench.brokers import RabbitBroker

    raise_nofile()
    with tempfile.TemporaryDirectory(prefix="bench-conns-rmq-") as tmp:
        rmq = RabbitBroker(Path(tmp))
        rmq.start()
        try:
            assert rmq.pid is not None
            where = urlsplit(rmq.url)
            result = {"broker": rmq.version(), "churn": asyncio.run(churn(
                where.hostname or "127.0.0.1", where.port or 5672, rmq.pid,
                args.churn_rate, args.churn_seconds, args.churn_rounds, args.workers,
                args.max_inflight, args.warmup))}
        finally:
            rmq.stop()
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
