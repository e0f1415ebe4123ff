"""Many connections on one node: memory per connection, probe latency, and churn.

    python -m bench.connections [--connections 10000] [--hold 60] [--heartbeat 10]
                                [--churn-rate 1000] [--churn-seconds 60]
                                [--only hold|churn] [--json]

One amqpd is started on free ports (its own data dir). The load generator is one asyncio
process speaking raw AMQP frames (a client library per connection would be the
bottleneck): each connection does the real handshake (protocol header, start-ok with
PLAIN, tune-ok with the heartbeat, connection.open) and opens one channel.

**Churn** (first, on the fresh broker): connections that open a channel and close
(connection.close / close-ok, then the socket) are started at ``--churn-rate`` a second
for ``--churn-seconds``, at most 2,000 in flight; the achieved rate is reported. The
broker's RSS and open fds are read after a 5 s warm-up of the same churn (so one-time
allocations are not counted as growth) and again after each of ``--churn-rounds``
rounds, once the fd count has settled: RSS that grows every round is a leak, RSS that
grows in the first round only is the high-water mark of connections in flight.

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
from pathlib import Path
from typing import Any

from pamqp import commands as spec
from pamqp import frame as pframe

from bench.brokers import cpu_seconds, host_cpu, rss_bytes

_FRAME = struct.Struct(">BHI")
_IDS = struct.Struct(">HH")
HB = b"\x08\x00\x00\x00\x00\x00\x00\xce"
HEADER = b"AMQP\x00\x00\x09\x01"
START, TUNE, OPEN_OK, CLOSE, CLOSE_OK = (10, 10), (10, 30), (10, 41), (10, 50), (10, 51)
CH_OPEN_OK = (20, 11)


def _frames(heartbeat: int) -> dict[str, bytes]:
    caps = {"publisher_confirms": True, "consumer_cancel_notify": True,
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


async def churn(host: str, port: int, pid: int, rate: float, seconds: float,
                rounds: int = 1) -> dict[str, Any]:
    frames = _frames(0)
    stats = {"dropped": 0, "heartbeats_in": 0}
    done = {"ok": 0, "failed": 0}
    errors: list[str] = []
    inflight: set[asyncio.Task[None]] = set()
    counter = [0]

    async def one() -> None:
        i = counter[0]
        counter[0] += 1
        c: Client | None = None
        try:
            c = await open_client(host, port, i, frames, stats, timeout=30)
            c.close()
            await asyncio.wait_for(c.closed, 30)
            done["ok"] += 1
        except Exception as exc:
            if c is not None:
                c.abort()
            done["failed"] += 1
            if len(errors) < 5:
                errors.append(f"{type(exc).__name__}: {exc}")

    async def run(duration: float) -> tuple[int, float]:
        start_ok = done["ok"]
        t0 = time.monotonic()
        period = 1.0 / rate
        nxt = t0
        while time.monotonic() - t0 < duration:
            # start what is due now (bounded in flight: a slow broker is not buried)
            now = time.monotonic()
            while nxt <= now and len(inflight) < 2000:
                t = asyncio.ensure_future(one())
                inflight.add(t)
                t.add_done_callback(inflight.discard)
                nxt += period
            if nxt < now - 1:
                nxt = now  # fell behind by a second: that rate is not reachable
            await asyncio.sleep(0.001)
        if inflight:
            await asyncio.wait(set(inflight), timeout=60)
        return done["ok"] - start_ok, time.monotonic() - t0

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
    await run(5.0)  # warm-up
    fds0 = await settled_fds()
    rss0 = rss_bytes(pid)
    out: dict[str, Any] = {
        "target_per_s": rate, "seconds": seconds, "rounds": [],
        "rss_fresh_mib": round(rss_fresh / 2**20, 1), "fds_fresh": fds_fresh,
        "rss_before_mib": round(rss0 / 2**20, 1), "fds_before": fds0}
    # several rounds tell a leak (RSS grows every round) from a high-water mark (the
    # first round's peak of half-open connections, reused by the next rounds)
    for _ in range(rounds):
        failed0 = done["failed"]
        cpu0, own0, host0 = cpu_seconds(pid), time.process_time(), host_cpu()
        n, elapsed = await run(seconds)
        cpu, own, host1 = cpu_seconds(pid) - cpu0, time.process_time() - own0, host_cpu()
        fds1 = await settled_fds()
        busy = (host1[0] - host0[0]) / max(host1[1] - host0[1], 1)
        out["rounds"].append({
            "completed": n, "achieved_per_s": round(n / elapsed, 1),
            "failed": done["failed"] - failed0, "broker_cpu_s": round(cpu, 1),
            "loadgen_cpu_s": round(own, 1), "wall_s": round(elapsed, 1),
            "host_cpu_busy": round(busy, 2),
            "rss_after_mib": round(rss_bytes(pid) / 2**20, 1), "fds_after": fds1})
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
    p.add_argument("--only", choices=["hold", "churn"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--probe-seconds", type=float, default=10, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.probe_seconds)))
        return 0
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
                result["churn"] = asyncio.run(churn(broker.bind, broker.port, pid,
                                                    args.churn_rate, args.churn_seconds,
                                                    args.churn_rounds))
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


if __name__ == "__main__":
    sys.exit(main())
