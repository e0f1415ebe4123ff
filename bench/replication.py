"""Warren replication figures, in one run (issue 14):

1. the confirmed persistent publish rate of a node alone;
2. the same with a synchronous standby (mode "sync", min_insync_standbys = 1);
   RabbitMQ 3.10 alone (a private node from devtools, a durable classic queue) with the
   same publisher in the same run, unless ``--no-rabbitmq``: RabbitMQ confirms without
   fsyncing each batch, amqpd confirms after its fsync (and the standby's);
3. catch-up: an active preloaded with ``--messages`` persistent messages (confirmed),
   then a standby starts while a publisher keeps publishing with confirms: the
   catch-up time and speed (log bytes / time until the standby acknowledged everything
   the active held when it started) and the publisher's rate meanwhile. During catch-up
   the active runs with min_insync_standbys = 0 (a standby that is not yet in sync
   cannot hold confirms; with 1, publishers would be nacked until it is, as Kafka
   refuses writes below min.insync.replicas).

Static roles, no etcd; processes and ports as in tests/integration/warren_support.py.
Usage: ``python -m bench.replication [--messages 1000000] [--body 100] [--duration 10]
[--out bench/RESULTS-replication.json]``. Timings are reported, never asserted.

``--ratio-runs N`` measures only the sync cost: N runs of 1. and 2. alternating (alone,
pair, alone, pair, ...), the median rate of each and their ratio (issue 34), and the
median of each run's own pair / alone ratio (``paired_ratio_median``: steadier when the
machine's speed drifts between runs);
``--standby-ack fsync,write`` has a pair of each standby_ack setting in every run.
``--latency-rate R --latency-runs N`` measures the sync cost as latency instead: N runs
of a node alone and a sync pair alternating, each offered R persistent msg/s by one
publisher (bench/confirm_latency.py), the publish -> confirm latency p50/p99 of each run
and their medians. At a rate both configurations keep up with, this moves far less with
the machine's load than a saturating rate does.
``--amqpd-src DIR`` runs the brokers from another checkout's ``amqpd`` (e.g. main, for a
before/after comparison with the same bench code; run it from a directory that holds
no ``amqpd`` package, e.g. ``cd /tmp && PYTHONPATH=/path/to/this/checkout python -m
bench.replication ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import confirm_latency
from bench.loadgen import Conn, PublisherResult, PublisherSpec, Target, run_publisher
from tests.integration.warren_support import node, replication_addr, status, wait_for
from tests.support.brokerproc import BrokerProcess


def _declare(url: str, queue: str) -> None:
    c = Conn(url)
    ch = c.open_channel(1)
    c.declare_queue(ch, queue, durable=True)
    c.close()


def _publish(url: str, queue: str, body: int, duration: float = 0.0, count: int = 0,
             window: int = 1000) -> PublisherResult:
    spec = PublisherSpec(1, [Target("", queue)], body_size=body, persistent=True,
                         confirm_window=window, duration=duration, count=count)
    res = run_publisher(url, spec)
    if res.error:
        raise RuntimeError(f"publisher: {res.error}")
    return res


def _rate(res: PublisherResult) -> float:
    return res.confirmed / max(res.t_end - res.t_start, 1e-9)


def alone(root: Path, body: int, duration: float,
          latency_rate: float = 0.0) -> dict[str, Any]:
    proc = BrokerProcess(root / "alone").start()
    try:
        _declare(proc.url, "rb.alone")
        if latency_rate:
            return confirm_latency.measure(proc.url, "rb.alone", body, latency_rate, duration)
        res = _publish(proc.url, "rb.alone", body, duration)
        return {"confirmed": res.confirmed, "nacked": res.nacked, "rate": round(_rate(res))}
    finally:
        proc.stop()


def rabbitmq_alone(root: Path, body: int, duration: float) -> dict[str, Any]:
    """The same publisher against a private RabbitMQ (None figures when it is missing)."""
    from devtools import rabbitmq as rmq

    try:
        info = rmq.start(root / "rmq")
    except rmq.RabbitMQNotInstalled as exc:
        return {"skipped": str(exc)}
    try:
        _declare(info.amqp_url, "rb.rabbitmq")
        res = _publish(info.amqp_url, "rb.rabbitmq", body, duration)
        return {"confirmed": res.confirmed, "nacked": res.nacked, "rate": round(_rate(res))}
    finally:
        rmq.stop(root / "rmq")


def sync_pair(root: Path, body: int, duration: float,
              standby_root: Path | None = None, latency_rate: float = 0.0,
              **settings: object) -> dict[str, Any]:
    active = node(root / "sa", "bench-a", "active", **settings).start()
    standby = node((standby_root or root) / "sb", "bench-b", "standby",
                   replication_addr(active), **settings).start()
    try:
        wait_for(lambda: status(active)["insync_count"] == 1, 60, "the standby in sync")
        _declare(active.url, "rb.sync")
        if latency_rate:
            return confirm_latency.measure(active.url, "rb.sync", body, latency_rate,
                                           duration)
        res = _publish(active.url, "rb.sync", body, duration)
        return {"confirmed": res.confirmed, "nacked": res.nacked, "rate": round(_rate(res))}
    finally:
        standby.stop()
        active.stop()


def catch_up(root: Path, body: int, messages: int, duration: float) -> dict[str, Any]:
    active = node(root / "ca", "bench-a", "active", min_insync_standbys=0).start()
    standby: BrokerProcess | None = None
    try:
        _declare(active.url, "rb.preload")
        t0 = time.monotonic()
        pre = _publish(active.url, "rb.preload", body, count=messages)
        preload_s = time.monotonic() - t0
        st = status(active)
        target_seq = st["last_seq"]
        log_bytes = sum(p.stat().st_size for p in (root / "ca" / "log").glob("*.log"))
        _declare(active.url, "rb.during")
        during: list[PublisherResult] = []
        pub = threading.Thread(target=lambda: during.append(
            _publish(active.url, "rb.during", body, duration)))
        started = time.monotonic()
        standby = node(root / "cb", "bench-b", "standby", replication_addr(active))
        pub.start()
        standby.start(timeout=60)
        connected = None
        done = None
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            sbs = status(active)["standbys"]
            now = time.monotonic()
            if sbs and connected is None:
                connected = now
            if sbs and sbs[0]["acked_seq"] >= target_seq:
                done = now
                break
            time.sleep(0.05)
        pub.join()
        if done is None or connected is None:
            raise RuntimeError("the standby did not catch up in 30 minutes")
        res = during[0]
        return {"preloaded": pre.confirmed, "preload_rate": round(pre.confirmed / preload_s),
                "log_bytes": log_bytes, "target_seq": target_seq,
                "standby_start_to_caught_up_s": round(done - started, 2),
                "connected_to_caught_up_s": round(done - connected, 2),
                "catch_up_mb_per_s": round(log_bytes / (done - connected) / 1e6, 1),
                "catch_up_records_per_s": round(target_seq / (done - connected)),
                "publish_during_confirmed": res.confirmed,
                "publish_during_rate": round(_rate(res)),
                "publisher_s": round(res.t_end - res.t_start, 2)}
    finally:
        if standby is not None:
            standby.stop()
        active.stop()


def ratio_runs(root: Path, body: int, duration: float, runs: int,
               min_insync: int, acks: tuple[str, ...] = ("fsync",)) -> dict[str, Any]:
    """Alone and sync pair alternately, ``runs`` times each: medians and their ratio.
    With several ``acks`` (standby_ack values) each run has one pair of each, in turn;
    the figures of the first keep their old names, the others are suffixed with it."""
    alone_rates: list[int] = []
    pair_rates: dict[str, list[int]] = {mode: [] for mode in acks}
    for i in range(runs):
        alone_rates.append(alone(root / f"r{i}", body, duration)["rate"])
        for mode in acks:
            pair_rates[mode].append(sync_pair(root / f"r{i}-{mode}", body, duration,
                                              min_insync_standbys=min_insync,
                                              standby_ack=mode)["rate"])
        print(f"run {i}: alone {alone_rates[-1]} msg/s, " + ", ".join(
            f"sync pair ({mode}) {pair_rates[mode][-1]} msg/s" for mode in acks), flush=True)
    a = statistics.median(alone_rates)
    out: dict[str, Any] = {"runs": runs, "min_insync_standbys": min_insync,
                           "alone": alone_rates, "alone_median": a}
    for k, mode in enumerate(acks):
        suffix = "" if k == 0 else f"_{mode}"
        p = statistics.median(pair_rates[mode])
        out[f"standby_ack{suffix}"] = mode
        out[f"sync_pair{suffix}"] = pair_rates[mode]
        out[f"sync_median{suffix}"] = p
        out[f"ratio_of_medians{suffix}"] = round(p / max(a, 1), 3)
        # each pair against the node alone measured just before it: the machine's
        # drift between runs (this shared box's rates wander by a third) cancels out
        paired = [round(r / max(b, 1), 3) for r, b in zip(pair_rates[mode], alone_rates,
                                                          strict=True)]
        out[f"paired_ratios{suffix}"] = paired
        out[f"paired_ratio_median{suffix}"] = statistics.median(paired)
    return out


def latency_runs(root: Path, body: int, duration: float, runs: int, rate: float,
                 min_insync: int, acks: tuple[str, ...] = ("fsync",)) -> dict[str, Any]:
    """Alone and sync pair alternately at a fixed offered rate: the publish -> confirm
    latency of each run (p50, p99 in ms) and the medians of those over the runs."""
    res: dict[str, list[dict[str, Any]]] = {"alone": []}
    res.update({f"pair_{mode}": [] for mode in acks})
    for i in range(runs):
        res["alone"].append(alone(root / f"l{i}", body, duration, latency_rate=rate))
        for mode in acks:
            res[f"pair_{mode}"].append(sync_pair(root / f"l{i}-{mode}", body, duration,
                                                 latency_rate=rate,
                                                 min_insync_standbys=min_insync,
                                                 standby_ack=mode))
        print(f"run {i}: " + ", ".join(
            f"{name} p50 {r[-1]['p50_ms']} ms p99 {r[-1]['p99_ms']} ms"
            for name, r in res.items()), flush=True)
    out: dict[str, Any] = {"runs": runs, "offered_rate": rate,
                           "min_insync_standbys": min_insync, "per_run": res}
    for name, r in res.items():
        out[f"{name}_p50_median_ms"] = round(statistics.median(x["p50_ms"] for x in r), 3)
        out[f"{name}_p99_median_ms"] = round(statistics.median(x["p99_ms"] for x in r), 3)
        out[f"{name}_nacked"] = sum(x["nacked"] for x in r)
    return out


def _emit(out: dict[str, Any], a: argparse.Namespace) -> int:
    """Print a series' summary (and write it to ``--out``) with the settings it ran."""
    out.update(body=a.body, duration=a.duration, amqpd_src=a.amqpd_src or "this")
    print(json.dumps(out, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--out", default="")
    p.add_argument("--no-rabbitmq", action="store_true",
                   help="leave out RabbitMQ 3.10 alone (measured by default, same publisher)")
    p.add_argument("--standby-on-tmpfs", action="store_true",
                   help="also measure the sync pair with the standby's data on /dev/shm "
                        "(on one machine both fsyncs hit the same disk; this shows how "
                        "much of the cost is that)")
    p.add_argument("--ratio-runs", type=int, default=0,
                   help="only the sync cost: this many alternating runs, medians, ratio")
    p.add_argument("--min-insync", type=int, default=1,
                   help="min_insync_standbys of the pair in --ratio-runs (both modes wait "
                        "for the standby while it is in sync)")
    p.add_argument("--standby-ack", default="fsync",
                   help="standby_ack of the pair in --ratio-runs: fsync, write, or both "
                        "as 'fsync,write' (one pair of each per run, in turn)")
    p.add_argument("--latency-rate", type=float, default=0.0,
                   help="only the sync cost as latency: offer this many msg/s to a node "
                        "alone and to a sync pair (--latency-runs of each, alternating)")
    p.add_argument("--latency-runs", type=int, default=5)
    p.add_argument("--amqpd-src", default="",
                   help="run the brokers from this checkout's amqpd (PYTHONPATH)")
    a = p.parse_args(argv)
    if a.amqpd_src:
        os.environ["PYTHONPATH"] = str(Path(a.amqpd_src).resolve())
    if a.latency_rate:
        with tempfile.TemporaryDirectory(prefix="amqpd-bench-latency-") as tmp:
            out = latency_runs(Path(tmp), a.body, a.duration, a.latency_runs,
                               a.latency_rate, a.min_insync,
                               tuple(a.standby_ack.split(",")))
        return _emit(out, a)
    if a.ratio_runs:
        with tempfile.TemporaryDirectory(prefix="amqpd-bench-ratio-") as tmp:
            out = ratio_runs(Path(tmp), a.body, a.duration, a.ratio_runs, a.min_insync,
                             tuple(a.standby_ack.split(",")))
        return _emit(out, a)
    with tempfile.TemporaryDirectory(prefix="amqpd-bench-repl-") as tmp:
        root = Path(tmp)
        result: dict[str, Any] = {"messages": a.messages, "body": a.body,
                                  "duration": a.duration}
        result["alone"] = alone(root, a.body, a.duration)
        print("alone:", result["alone"], flush=True)
        result["sync_standby"] = sync_pair(root, a.body, a.duration)
        print("sync standby:", result["sync_standby"], flush=True)
        result["sync_vs_alone"] = round(result["sync_standby"]["rate"]
                                        / max(result["alone"]["rate"], 1), 2)
        if not a.no_rabbitmq:
            result["rabbitmq_alone"] = rabbitmq_alone(root, a.body, a.duration)
            print("RabbitMQ alone:", result["rabbitmq_alone"], flush=True)
            rmq_rate = result["rabbitmq_alone"].get("rate")
            if rmq_rate:
                result["sync_vs_rabbitmq"] = round(result["sync_standby"]["rate"] / rmq_rate, 2)
                result["alone_vs_rabbitmq"] = round(result["alone"]["rate"] / rmq_rate, 2)
        if a.standby_on_tmpfs:
            with tempfile.TemporaryDirectory(prefix="amqpd-bench-sb-", dir="/dev/shm") as shm:
                result["sync_standby_tmpfs"] = sync_pair(root / "t", a.body, a.duration,
                                                         Path(shm))
            print("sync standby on tmpfs:", result["sync_standby_tmpfs"], flush=True)
        result["catch_up"] = catch_up(root, a.body, a.messages, a.duration)
        print("catch-up:", result["catch_up"], flush=True)
    print(json.dumps(result, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
