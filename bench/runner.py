"""Coordinates generator processes against one broker and turns what they observed into
metrics. Each function returns a ``Run``: metrics plus the reasons it is invalid (if any).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import statistics
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.brokers import Broker, Sampler, disk_used, rss_bytes
from bench.loadgen import (
    Conn,
    ConsumerResult,
    ConsumerSpec,
    ProtocolError,
    PublisherResult,
    PublisherSpec,
    Target,
    encode_publish,
    raise_nofile,
    run_consumers,
    run_publisher,
    sink_server,
    source_server,
)

CTX = mp.get_context("fork")
SETUP_TIMEOUT = 300.0


@dataclass
class Run:
    metrics: dict[str, float] = field(default_factory=dict)
    invalid: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.invalid


def _pub_worker(url: str, spec: PublisherSpec, ready: Any, go: Any, out: Any) -> None:
    try:
        res = run_publisher(url, spec, go=go, ready=ready)
    except BaseException as exc:  # report, and do not leave the others at the barrier
        with contextlib.suppress(Exception):
            ready.abort()
        res = PublisherResult(spec.pubid, error=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    out.put(("pub", spec.pubid, res))


def _cons_worker(url: str, specs: list[ConsumerSpec], slot: int, ready: Any, stop: Any,
                 progress: Any, out: Any) -> None:
    class _Ready:
        def wait(self) -> None:
            ready.wait()

    try:
        res = run_consumers(url, specs, stop, progress, slot, ready=_Ready())
    except BaseException as exc:
        with contextlib.suppress(Exception):
            ready.abort()
        res = ConsumerResult(error=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    out.put(("cons", slot, res))


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100.0 * (len(s) - 1))))
    return s[k]


def run_flow(broker: Broker, publishers: list[PublisherSpec],
             consumers: list[list[ConsumerSpec]], fanout: int = 1,
             idle_timeout: float = 30.0, expected: int | None = None) -> Run:
    """Start consumers, then publishers (all at once); wait for every expected delivery."""
    run = Run()
    ready = CTX.Barrier(len(publishers) + len(consumers) + 1)
    go = CTX.Event()
    stop = CTX.Event()
    progress = CTX.RawArray("q", max(1, len(consumers)))
    out: Any = CTX.Queue()
    procs = []
    for spec in publishers:
        procs.append(CTX.Process(target=_pub_worker, args=(broker.url, spec, ready, go, out),
                                 daemon=True))
    for i, specs in enumerate(consumers):
        procs.append(CTX.Process(target=_cons_worker,
                                 args=(broker.url, specs, i, ready, stop, progress, out),
                                 daemon=True))
    for p in procs:
        p.start()
    pubs: dict[int, PublisherResult] = {}
    cons: dict[int, ConsumerResult] = {}

    def collect(block_until: float, want_pubs: bool) -> None:
        while (len(pubs) < len(publishers) if want_pubs
               else len(cons) < len(consumers)):
            try:
                kind, idx, res = out.get(timeout=max(0.05, block_until - time.monotonic()))
            except queue_mod.Empty:
                return
            (pubs if kind == "pub" else cons)[idx] = res

    try:
        try:
            ready.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            run.invalid.append("setup failed (a worker could not connect or subscribe)")
            stop.set()
            go.set()
            collect(time.monotonic() + 30, True)
            collect(time.monotonic() + 30, False)
            _errors(run, pubs, cons)
            return run
        with Sampler(broker.pid) as sampler:
            t_go = time.monotonic()
            go.set()
            longest = max((s.duration + s.count / 1000 for s in publishers), default=0)
            collect(t_go + longest + SETUP_TIMEOUT + 600, True)
            during = sum(progress) if consumers else 0
            t_during = time.monotonic()
            published = sum(r.published for r in pubs.values())
            if expected is None:
                expected = published * fanout
            t_pub_end = max((r.t_end for r in pubs.values()), default=t_go)
            last, last_change = -1, time.monotonic()
            while consumers:
                got = sum(progress)
                if got >= expected:
                    break
                now = time.monotonic()
                if got != last:
                    last, last_change = got, now
                elif now - last_change > idle_timeout:
                    run.invalid.append(f"stalled: {got} of {expected} deliveries after "
                                       f"{idle_timeout:.0f} s without progress")
                    break
                if any(not p.is_alive() for p in procs[len(publishers):]):
                    if len(cons) < len(consumers):
                        collect(time.monotonic() + 0.2, False)
                    if cons and any(c.error for c in cons.values()):
                        break
                time.sleep(0.01)
            stop.set()
            collect(time.monotonic() + 60, False)
        for p in procs:
            p.join(10)
    finally:
        stop.set()
        go.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    _errors(run, pubs, cons)
    if len(pubs) < len(publishers):
        run.invalid.append("a publisher did not report")
    if len(cons) < len(consumers):
        run.invalid.append("a consumer did not report")
    _flow_metrics(run, publishers, pubs, cons, bool(consumers), expected or 0, t_go,
                  t_pub_end, sampler)
    if consumers and publishers and t_during > t_go:
        # how far consumers kept up while publishers were running
        run.metrics["deliver_rate_during_publish"] = during / (t_during - t_go)
    return run


def _flow_metrics(run: Run, publishers: list[PublisherSpec], pubs: dict[int, PublisherResult],
                  cons: dict[int, ConsumerResult], consuming: bool, expected: int,
                  t_go: float, t_pub_end: float, sampler: Sampler) -> None:
    m = run.metrics
    published = sum(r.published for r in pubs.values())
    if published:
        m["publish_rate"] = published / max(1e-9, t_pub_end - t_go)
    m["published"] = published
    if any(s.confirm_window for s in publishers):
        confirmed = sum(r.confirmed for r in pubs.values())
        nacked = sum(r.nacked for r in pubs.values())
        m["confirmed"] = confirmed
        if nacked:
            run.invalid.append(f"{nacked} publishes nacked")
        if confirmed != published:
            run.invalid.append(f"confirmed {confirmed} != published {published}")
    for s in publishers:
        r = pubs.get(s.pubid)
        if (s.sync_queue is not None and r is not None and r.queue_count is not None
                and r.queue_count != r.published):
            run.invalid.append(f"queue {s.sync_queue} holds {r.queue_count} messages, "
                               f"published {r.published}")
    gen_cpu = sum(r.cpu for r in pubs.values()) + sum(c.cpu for c in cons.values())
    if consuming:
        received = sum(c.received for c in cons.values())
        gaps = sum(c.gaps for c in cons.values())
        disorder = sum(c.disorder for c in cons.values())
        redelivered = sum(c.redelivered for c in cons.values())
        t_last = max((c.t_last for c in cons.values()), default=0.0)
        m["delivered"] = received
        if received and t_last > t_go:
            m["deliver_rate"] = received / (t_last - t_go)
        if received != expected:
            run.invalid.append(f"delivered {received} != expected {expected}")
        if gaps:
            run.invalid.append(f"{gaps} sequence numbers missing")
        if disorder:
            run.invalid.append(f"{disorder} duplicate or out-of-order deliveries")
        if redelivered:
            run.notes.append(f"{redelivered} redelivered")
        lat = [x for c in cons.values() for x in c.latencies_us]
        if lat:
            m["lat_p50_ms"] = percentile(lat, 50) / 1000.0
            m["lat_p99_ms"] = percentile(lat, 99) / 1000.0
            m["lat_max_ms"] = max(lat) / 1000.0
    window = sampler.t1 - sampler.t0
    if sampler.cpu_percent is not None:
        m["broker_cpu_pct"] = sampler.cpu_percent
        m["peak_rss_mb"] = sampler.peak / 2**20
        # what one message costs the broker, whatever the rate it reached: its CPU time
        # over the window divided by the messages it moved (the larger of published and
        # delivered: a fanout-10 publish counts as its 10 deliveries)
        moved = max(published, int(m.get("delivered", 0)))
        if moved:
            m["broker_cpu_us_per_msg"] = 1e6 * (sampler.cpu1 - sampler.cpu0) / moved
    if window > 0:
        m["gen_cpu_pct"] = 100.0 * gen_cpu / window
    if sampler.host_percent is not None:
        m["host_cpu_pct"] = sampler.host_percent
        if "broker_cpu_pct" in m and "gen_cpu_pct" in m:
            m["other_cpu_pct"] = max(0.0, m["host_cpu_pct"] - m["broker_cpu_pct"]
                                     - m["gen_cpu_pct"])


def _errors(run: Run, pubs: dict[int, PublisherResult],
            cons: dict[int, ConsumerResult]) -> None:
    for i, r in sorted(pubs.items()):
        if r.error:
            run.invalid.append(f"publisher {i}: {r.error}")
    for i, c in sorted(cons.items()):
        if c.error:
            run.invalid.append(f"consumer {i}: {c.error}")


# --------------------------------------------------------------------------------------
# Setup helpers
# --------------------------------------------------------------------------------------

def declare(broker: Broker, queues: list[str], durable: bool = False,
            exchange: tuple[str, str] | None = None,
            arguments: dict[str, Any] | None = None,
            exchange_args: dict[str, Any] | None = None) -> None:
    conn = Conn(broker.url)
    try:
        ch = conn.open_channel(1)
        if exchange:
            conn.declare_exchange(ch, exchange[0], exchange[1], durable=durable,
                                  arguments=exchange_args)
        for q in queues:
            conn.declare_queue(ch, q, durable=durable, arguments=arguments)
            if exchange:
                conn.bind(ch, q, exchange[0], q)
    finally:
        conn.close()


def cleanup(broker: Broker, queues: list[str], exchange: str | None = None) -> None:
    with contextlib.suppress(OSError, ProtocolError):
        conn = Conn(broker.url, timeout=120)
        try:
            ch = conn.open_channel(1)
            for q in queues:
                conn.delete_queue(ch, q)
            if exchange:
                conn.delete_exchange(ch, exchange)
        finally:
            conn.close()


def split(items: list[Any], n: int) -> list[list[Any]]:
    n = max(1, min(n, len(items)))
    return [items[i::n] for i in range(n)]


# --------------------------------------------------------------------------------------
# Generator ceilings
# --------------------------------------------------------------------------------------

def _listener() -> tuple[socket.socket, str]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s, f"amqp://guest:guest@127.0.0.1:{s.getsockname()[1]}/%2F"


def ceiling_publish(duration: float, nproc: int = 1, body_size: int = 16) -> Run:
    """Publishers against a sink that completes the handshake and discards bytes."""
    run = Run()
    lst, url = _listener()
    out: Any = CTX.Queue()
    sink = CTX.Process(target=sink_server, args=(lst, nproc, out), daemon=True)
    sink.start()
    lst.close()
    pubq: Any = CTX.Queue()
    ready = CTX.Barrier(nproc + 1)
    go = CTX.Event()
    specs = [PublisherSpec(pubid=i + 1, targets=[Target("", "sink")], body_size=body_size,
                           duration=duration, close_after=False) for i in range(nproc)]
    procs = [CTX.Process(target=_pub_worker, args=(url, s, ready, go, pubq), daemon=True)
             for s in specs]
    for p in procs:
        p.start()
    ready.wait(timeout=60)
    t_go = time.monotonic()
    go.set()
    results = [pubq.get(timeout=duration + 60)[2] for _ in procs]
    total_bytes = out.get(timeout=60)
    for p in [*procs, sink]:
        p.join(10)
    published = sum(r.published for r in results)
    trip = len(encode_publish(Target("", "sink"), body_size, False)[0])
    t_end = max(r.t_sent for r in results)
    run.metrics["publish_rate"] = published / (t_end - t_go)
    run.metrics["published"] = published
    run.metrics["gen_cpu_pct"] = 100 * sum(r.cpu for r in results) / (t_end - t_go)
    if total_bytes != published * trip:
        run.invalid.append(f"sink got {total_bytes} bytes, expected {published * trip}")
    for r in results:
        if r.error:
            run.invalid.append(r.error)
    return run


def ceiling_consume(duration: float, body_size: int = 16) -> Run:
    """One consumer process against a source that floods pre-encoded deliveries."""
    run = Run()
    lst, url = _listener()
    out: Any = CTX.Queue()
    stop_src = CTX.Event()
    src = CTX.Process(target=source_server, args=(lst, stop_src, out, body_size), daemon=True)
    src.start()
    lst.close()
    stop = CTX.Event()
    progress = CTX.RawArray("q", 1)
    ready = CTX.Barrier(2)
    cq: Any = CTX.Queue()
    cons = CTX.Process(target=_cons_worker,
                       args=(url, [ConsumerSpec(["q"], prefetch=1000)], 0, ready, stop,
                             progress, cq), daemon=True)
    cons.start()
    ready.wait(timeout=60)
    t_go = time.monotonic()
    time.sleep(duration)
    stop.set()
    res: ConsumerResult = cq.get(timeout=60)[2]
    stop_src.set()
    with contextlib.suppress(queue_mod.Empty):
        out.get(timeout=10)
    for p in (cons, src):
        p.join(10)
        if p.is_alive():
            p.kill()
    if res.error:
        run.invalid.append(res.error)
    if res.gaps or res.disorder:
        run.invalid.append(f"gaps {res.gaps}, disorder {res.disorder}")
    run.metrics["deliver_rate"] = res.received / max(1e-9, res.t_last - t_go)
    run.metrics["delivered"] = res.received
    run.metrics["gen_cpu_pct"] = 100 * res.cpu / max(1e-9, res.t_last - t_go)
    return run


# --------------------------------------------------------------------------------------
# Idle connections
# --------------------------------------------------------------------------------------

def _idle_worker(url: str, n: int, opened: Any, stop: Any, out: Any) -> None:
    raise_nofile(n + 1024)
    conns = []
    err = None
    t0 = time.monotonic()
    try:
        for _ in range(n):
            c = Conn(url, timeout=60)
            c.open_channel(1)
            conns.append(c)
    except (OSError, ProtocolError) as exc:
        err = f"{type(exc).__name__}: {exc} after {len(conns)} connections"
    out.put((len(conns), time.monotonic() - t0, err))
    opened.set()
    stop.wait(600)
    for c in conns:
        with contextlib.suppress(OSError):
            c.sock.close()


def _rss_median(pid: int, samples: int = 11, interval: float = 0.2) -> int:
    """Median of a few RSS samples: a garbage-collected VM's RSS wobbles."""
    values = []
    for _ in range(samples):
        values.append(rss_bytes(pid))
        time.sleep(interval)
    return int(statistics.median(values))


def run_idle_connections(broker: Broker, n: int, settle: float = 3.0) -> Run:
    run = Run()
    if not broker.pid:
        run.invalid.append("broker PID unknown: cannot measure RSS")
        return run
    time.sleep(settle)
    before = _rss_median(broker.pid)
    opened = CTX.Event()
    stop = CTX.Event()
    out: Any = CTX.Queue()
    p = CTX.Process(target=_idle_worker, args=(broker.url, n, opened, stop, out), daemon=True)
    p.start()
    try:
        count, secs, err = out.get(timeout=600)
        opened.wait(60)
        time.sleep(settle)
        with Sampler(broker.pid) as s:
            time.sleep(settle)
        after = _rss_median(broker.pid)
    finally:
        stop.set()
        p.join(30)
        if p.is_alive():
            p.kill()
    if err:
        run.invalid.append(err)
    m = run.metrics
    m["connections"] = count
    m["open_rate"] = count / secs if secs else 0.0
    m["rss_before_mb"] = before / 2**20
    m["rss_after_mb"] = after / 2**20
    if count:
        m["rss_per_conn_kb"] = (after - before) / count / 1024
    if s.cpu_percent is not None:
        m["idle_cpu_pct"] = s.cpu_percent
    return run


# --------------------------------------------------------------------------------------
# Backlog: N persistent messages, restart, drain
# --------------------------------------------------------------------------------------

def run_backlog(broker: Broker, qname: str, count: int, body_size: int = 16,
                restart: bool = True, publishers: int = 1) -> Run:
    run = Run()
    m = run.metrics
    declare(broker, [qname], durable=True)
    per = [count // publishers + (1 if i < count % publishers else 0)
           for i in range(publishers)]
    pubs = [PublisherSpec(pubid=i + 1, targets=[Target("", qname)], body_size=body_size,
                          persistent=True, confirm_window=1000, count=c,
                          duration=0.0) for i, c in enumerate(per)]
    pub_run = run_flow(broker, pubs, [])
    run.invalid += pub_run.invalid
    m["publish_rate"] = pub_run.metrics.get("publish_rate", 0.0)
    if "broker_cpu_pct" in pub_run.metrics:
        m["publish_cpu_pct"] = pub_run.metrics["broker_cpu_pct"]
    if "broker_cpu_us_per_msg" in pub_run.metrics:
        m["publish_cpu_us_per_msg"] = pub_run.metrics["broker_cpu_us_per_msg"]
    peak = pub_run.metrics.get("peak_rss_mb", 0.0)
    try:
        conn = Conn(broker.url)
        held = conn.message_count(conn.open_channel(1), qname)
        conn.close()
    except (OSError, ProtocolError) as exc:
        run.invalid.append(f"count after publish: {exc}")
        return run
    if held != count:
        run.invalid.append(f"queue holds {held} after publishing {count}")
    if broker.data_dir is not None:
        m["disk_mb"] = disk_used(broker.data_dir) / 2**20
    if broker.pid:
        m["rss_backlog_mb"] = rss_bytes(broker.pid) / 2**20
    if restart and broker.can_restart:
        t0 = time.monotonic()
        broker.stop()
        t1 = time.monotonic()
        broker.start()
        deadline = time.monotonic() + 900
        seen = -1
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ProtocolError):
                conn = Conn(broker.url, timeout=600)
                seen = conn.message_count(conn.open_channel(1), qname)
                conn.close()
                if seen == count:
                    break
            time.sleep(0.1)
        m["stop_s"] = t1 - t0
        m["restart_s"] = time.monotonic() - t1
        if seen != count:
            run.invalid.append(f"after restart the queue holds {seen}, expected {count}")
        if broker.pid:
            m["rss_after_restart_mb"] = rss_bytes(broker.pid) / 2**20
    cons = [[ConsumerSpec([qname], prefetch=1000)]]
    drain = run_flow(broker, [], cons, expected=count)
    run.invalid += drain.invalid
    m["drain_rate"] = drain.metrics.get("deliver_rate", 0.0)
    if "broker_cpu_pct" in drain.metrics:
        m["drain_cpu_pct"] = drain.metrics["broker_cpu_pct"]
    if "broker_cpu_us_per_msg" in drain.metrics:
        m["drain_cpu_us_per_msg"] = drain.metrics["broker_cpu_us_per_msg"]
    if broker.pid:
        m["peak_rss_mb"] = max(peak, drain.metrics.get("peak_rss_mb", 0.0))
    cleanup(broker, [qname])
    return run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def host_info() -> dict[str, str]:
    info = {"cpus": str(os.cpu_count())}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem"] = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    info["kernel"] = os.uname().release
    return info
