"""``python -m bench``: the same scenarios against amqpd and RabbitMQ, alternating.

Writes a side-by-side table of medians and amqpd/RabbitMQ ratios to bench/RESULTS.md
(and the raw runs to a JSON file next to it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.brokers import AmqpdBroker, Broker, ExternalBroker, RabbitBroker
from bench.loadgen import ConsumerSpec, PublisherSpec, Target, raise_nofile
from bench.runner import (
    Run,
    ceiling_consume,
    ceiling_publish,
    cleanup,
    declare,
    host_info,
    median,
    run_backlog,
    run_flow,
    run_idle_connections,
    split,
)


@dataclass
class Options:
    duration: float = 10.0
    warmup: float = 2.0
    repeat: int = 3
    publishers: int = 1
    backlog_count: int = 1_000_000
    idle_conns: int = 1000
    latency_rate: float = 1000.0
    delayed_count: int = 100_000
    delayed_spread: float = 60.0
    sustained_rate: float = 20000.0


# (metric key, label, higher is better)
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "publish": [("publish_rate", "publish msg/s", True),
                ("broker_cpu_pct", "broker CPU %", False),
                ("peak_rss_mb", "broker peak RSS MiB", False)],
    "pubsub-16": [("publish_rate", "publish msg/s", True),
                  ("deliver_rate", "deliver msg/s", True),
                  ("deliver_rate_during_publish", "deliver msg/s while publishing", True),
                  ("broker_cpu_pct", "broker CPU %", False)],
    "pubsub-1k": [("publish_rate", "publish msg/s", True),
                  ("deliver_rate", "deliver msg/s", True),
                  ("deliver_rate_during_publish", "deliver msg/s while publishing", True),
                  ("broker_cpu_pct", "broker CPU %", False)],
    "confirms": [("publish_rate", "confirmed msg/s", True),
                 ("deliver_rate", "deliver msg/s", True),
                 ("deliver_rate_during_publish", "deliver msg/s while publishing", True),
                 ("broker_cpu_pct", "broker CPU %", False)],
    "fanout-10": [("publish_rate", "publish msg/s", True),
                  ("deliver_rate", "deliveries msg/s (all 10 queues)", True),
                  ("deliver_rate_during_publish", "deliveries msg/s while publishing", True),
                  ("broker_cpu_pct", "broker CPU %", False)],
    "queues-1000": [("publish_rate", "publish msg/s", True),
                    ("deliver_rate", "deliver msg/s", True),
                    ("deliver_rate_during_publish", "deliver msg/s while publishing", True),
                    ("broker_cpu_pct", "broker CPU %", False),
                    ("peak_rss_mb", "broker peak RSS MiB", False)],
    "latency": [("lat_p50_ms", "latency p50 ms", False),
                ("lat_p99_ms", "latency p99 ms", False),
                ("lat_max_ms", "latency max ms", False),
                ("broker_cpu_pct", "broker CPU %", False)],
    "sustained": [("deliver_rate", "deliver msg/s", True),
                  ("lat_p50_ms", "latency p50 ms", False),
                  ("lat_p99_ms", "latency p99 ms", False),
                  ("lat_max_ms", "latency max ms", False),
                  ("broker_cpu_pct", "broker CPU %", False)],
    "backlog": [("publish_rate", "publish msg/s (persistent, confirms)", True),
                ("drain_rate", "drain msg/s", True),
                ("publish_cpu_us_per_msg", "broker CPU µs/msg publishing", False),
                ("drain_cpu_us_per_msg", "broker CPU µs/msg draining", False),
                ("peak_rss_mb", "broker peak RSS MiB", False),
                ("rss_backlog_mb", "RSS with backlog MiB", False),
                ("disk_mb", "disk used MiB", False),
                ("restart_s", "restart until backlog visible s", False),
                ("stop_s", "stop s", False),
                ("rss_after_restart_mb", "RSS after restart MiB", False)],
    "idle-conns": [("rss_per_conn_kb", "RSS per connection KiB", False),
                   ("open_rate", "connections opened /s", True),
                   ("idle_cpu_pct", "broker CPU % while idle", False)],
    "delayed": [("publish_rate", "publish msg/s", True),
                ("deliver_rate", "deliver msg/s", True),
                ("lat_p50_ms", "lateness p50 ms (receive - send - x-delay)", False),
                ("lat_p99_ms", "lateness p99 ms", False),
                ("lat_max_ms", "lateness max ms", False)],
}

NOISE = ("other_cpu_pct", "other processes' CPU % (noise)", False)
# broker CPU time over the run / messages moved (the larger of published and delivered)
CPU_PER_MSG = ("broker_cpu_us_per_msg", "broker CPU µs/msg", False)
for _scen in ("publish", "pubsub-16", "pubsub-1k", "confirms", "fanout-10", "queues-1000",
              "latency", "sustained"):
    _at = next(i for i, (k, _l, _h) in enumerate(METRICS[_scen]) if k == "broker_cpu_pct")
    METRICS[_scen].insert(_at + 1, CPU_PER_MSG)
    METRICS[_scen].append(("gen_cpu_pct", "load generator CPU %", False))
    METRICS[_scen].append(NOISE)
NO_RATIO = {"other_cpu_pct", "gen_cpu_pct"}

DEFAULT_SCENARIOS = ["publish", "pubsub-16", "pubsub-1k", "confirms", "fanout-10",
                     "queues-1000", "latency", "sustained", "backlog",
                     "idle-conns"]
ALL_SCENARIOS = [*DEFAULT_SCENARIOS, "delayed"]
AMQPD_ONLY = {"delayed"}


def _uid() -> str:
    return f"{int(time.time() * 1000) % 10**9}"


def scen_publish(b: Broker, o: Options, d: float) -> Run:
    q = f"bench.publish.{_uid()}"
    declare(b, [q])
    try:
        pubs = [PublisherSpec(i + 1, [Target("", q)], duration=d,
                              sync_queue=q if i == 0 else None)
                for i in range(o.publishers)]
        run = run_flow(b, pubs, [])
        if o.publishers > 1:
            run.notes.append("only publisher 1 checks the queue count")
        return run
    finally:
        cleanup(b, [q])


def _pubsub(b: Broker, o: Options, d: float, body: int, name: str,
            persistent: bool = False, window: int = 0) -> Run:
    q = f"bench.{name}.{_uid()}"
    declare(b, [q], durable=persistent)
    try:
        pubs = [PublisherSpec(i + 1, [Target("", q)], body_size=body, duration=d,
                              persistent=persistent, confirm_window=window)
                for i in range(o.publishers)]
        return run_flow(b, pubs, [[ConsumerSpec([q], prefetch=1000)]])
    finally:
        cleanup(b, [q])


def scen_pubsub16(b: Broker, o: Options, d: float) -> Run:
    return _pubsub(b, o, d, 16, "pubsub16")


def scen_pubsub1k(b: Broker, o: Options, d: float) -> Run:
    return _pubsub(b, o, d, 1024, "pubsub1k")


def scen_confirms(b: Broker, o: Options, d: float) -> Run:
    return _pubsub(b, o, d, 16, "confirms", persistent=True, window=1000)


def scen_fanout(b: Broker, o: Options, d: float) -> Run:
    uid = _uid()
    ex = f"bench.fanout.{uid}"
    qs = [f"bench.fanout.{uid}.{i}" for i in range(10)]
    declare(b, qs, exchange=(ex, "fanout"))
    try:
        pubs = [PublisherSpec(i + 1, [Target(ex, "")], duration=d)
                for i in range(o.publishers)]
        cons = [[ConsumerSpec([q], prefetch=1000) for q in group] for group in split(qs, 2)]
        return run_flow(b, pubs, cons, fanout=10)
    finally:
        cleanup(b, qs, ex)


def scen_queues1000(b: Broker, o: Options, d: float) -> Run:
    uid = _uid()
    qs = [f"bench.q1000.{uid}.{i}" for i in range(1000)]
    declare(b, qs)
    try:
        pubs = [PublisherSpec(p + 1, [Target("", q, i) for i, q in enumerate(qs)],
                              duration=d, batch=1000) for p in range(o.publishers)]
        # 2 processes x 2 connections x 250 consumers
        cons = [[ConsumerSpec(g, prefetch=1000) for g in split(half, 2)]
                for half in split(qs, 2)]
        return run_flow(b, pubs, cons)
    finally:
        cleanup(b, qs)


def scen_latency(b: Broker, o: Options, d: float) -> Run:
    q = f"bench.latency.{_uid()}"
    declare(b, [q])
    try:
        pubs = [PublisherSpec(1, [Target("", q)], duration=d, rate=o.latency_rate)]
        return run_flow(b, pubs, [[ConsumerSpec([q], prefetch=1000, ack_every=1,
                                                latency=True)]])
    finally:
        cleanup(b, [q])


def scen_sustained(b: Broker, o: Options, d: float) -> Run:
    """A fixed, moderate publish rate: does the consumer keep up, at what latency?"""
    q = f"bench.sustained.{_uid()}"
    declare(b, [q])
    try:
        pubs = [PublisherSpec(1, [Target("", q)], duration=d, rate=o.sustained_rate)]
        return run_flow(b, pubs, [[ConsumerSpec([q], prefetch=1000, latency=True)]])
    finally:
        cleanup(b, [q])


def scen_backlog(b: Broker, o: Options, d: float) -> Run:
    del d
    return run_backlog(b, f"bench.backlog.{_uid()}", o.backlog_count)


def scen_idle(b: Broker, o: Options, d: float) -> Run:
    """On a freshly restarted broker: memory freed by earlier scenarios would otherwise
    absorb the new connections and hide their cost."""
    del d
    if b.can_restart:
        b.restart()
    return run_idle_connections(b, o.idle_conns)


def scen_delayed(b: Broker, o: Options, d: float) -> Run:
    """x-delayed-message: N messages, random delays in [0, spread) s; lateness measured.

    The body timestamp is the send time; lateness = receive time - (send time + delay).
    """
    import random

    uid = _uid()
    ex = f"bench.delayed.{uid}"
    q = f"bench.delayed.{uid}.q"
    declare(b, [q], exchange=(ex, "x-delayed-message"),
            exchange_args={"x-delayed-type": "direct"})
    try:
        rng = random.Random(1)
        ndelays = 1000
        delays = [int(rng.random() * o.delayed_spread * 1000) for _ in range(ndelays)]
        targets = [Target(ex, q, i) for i in range(ndelays)]

        def headers(t: Target) -> dict[str, Any]:
            return {"x-delay": delays[t.stream]}

        pubs = [PublisherSpec(1, targets, count=o.delayed_count, batch=1000,
                              headers_fn=headers)]
        spec = ConsumerSpec([q], prefetch=1000, latency=True,
                            offsets_us=[d * 1000.0 for d in delays])
        run = run_flow(b, pubs, [[spec]], idle_timeout=o.delayed_spread + 60)
        run.notes.append("per-stream order is checked; streams are delay values")
        return run
    finally:
        cleanup(b, [q], ex)


SCENARIOS: dict[str, Callable[[Broker, Options, float], Run]] = {
    "publish": scen_publish,
    "pubsub-16": scen_pubsub16,
    "pubsub-1k": scen_pubsub1k,
    "confirms": scen_confirms,
    "fanout-10": scen_fanout,
    "queues-1000": scen_queues1000,
    "latency": scen_latency,
    "sustained": scen_sustained,
    "backlog": scen_backlog,
    "idle-conns": scen_idle,
    "delayed": scen_delayed,
}
NO_WARMUP = {"backlog", "idle-conns", "delayed", "latency", "sustained"}
ONCE = {"backlog", "delayed"}   # expensive: one repetition unless --repeat-backlog


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    a = abs(v)
    if a >= 10000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ratio(a: float | None, r: float | None) -> str:
    if a is None or r is None or math.isnan(a) or math.isnan(r) or r == 0:
        return "—"
    return f"{a / r:.2f}"


def _med(runs: list[Run], key: str) -> float | None:
    vals = [r.metrics[key] for r in runs if r.valid and key in r.metrics]
    return median(vals) if vals else None


def render(results: dict[str, dict[str, list[Run]]], brokers: list[Broker],
           ceilings: dict[str, Run], meta: dict[str, Any]) -> str:
    names = [b.name for b in brokers]
    lines = ["# amqpd benchmark results", "",
             f"Generated {meta['when']} by `{meta['command']}`.", "",
             "## Machine", ""]
    for k, v in meta["host"].items():
        lines.append(f"- {k}: {v}")
    lines += [f"- python: {platform.python_version()}",
              f"- amqpd commit: {meta.get('commit', '?')}"]
    for b in brokers:
        lines.append(f"- {b.name}: {meta['versions'].get(b.name, '')}")
    lines += ["", "Broker and load generator share the machine's cores: the broker CPU "
              "column (100 % = one core) says how much of them the broker used; "
              "`host CPU %` (in the JSON) is the whole machine's, of 200 %. Other "
              "processes on the machine (other developers' brokers and tests) were not "
              "stopped: see the load note below.", "",
              f"Settings: duration {meta['duration']} s per run, warm-up "
              f"{meta['warmup']} s, {meta['repeat']} repetitions (backlog: 1), "
              f"{meta['publishers']} publisher process(es), backlog "
              f"{meta['backlog_count']:,} messages, {meta['idle_conns']} idle connections. "
              "Brokers alternate within each repetition (order flipped every repetition). "
              f"The suite ran at nice {meta.get('nice', 0)}.",
              "", "## Side by side (medians of valid runs)", ""]
    head = "| scenario | metric | " + " | ".join(names)
    if len(names) == 2:
        head += f" | {names[0]}/{names[1]} | better"
    lines += [head + " | valid runs |",
              "|" + "---|" * (len(names) + (4 if len(names) == 2 else 2) + 1)]
    for scen, per in results.items():
        valid = ", ".join(f"{n} {sum(r.valid for r in per.get(n, []))}/"
                          f"{len(per.get(n, []))}" for n in names)
        for key, label, higher in METRICS[scen]:
            meds = [_med(per.get(n, []), key) for n in names]
            if all(m is None for m in meds):
                continue
            row = f"| {scen} | {label} | " + " | ".join(_fmt(m) for m in meds)
            if len(names) == 2:
                if key in NO_RATIO:
                    row += " | | "
                else:
                    row += (f" | {_ratio(meds[0], meds[1])} | "
                            f"{'higher' if higher else 'lower'}")
            lines.append(row + f" | {valid} |")
    lines += ["", "## Load generator ceiling (no broker)", "",
              "Publishers write to a sink that completes the AMQP handshake and then "
              "discards bytes (byte count checked against what was sent); the consumer "
              "reads from a source that floods pre-encoded deliveries (sequence numbers "
              "checked).", ""]
    if ceilings:
        lines += ["| generator | msg/s | generator CPU % | valid |", "|---|---|---|---|"]
        for name, run in ceilings.items():
            rate = run.metrics.get("publish_rate") or run.metrics.get("deliver_rate")
            lines.append(f"| {name} | {_fmt(rate)} | "
                         f"{_fmt(run.metrics.get('gen_cpu_pct'))} | "
                         f"{'yes' if run.valid else '; '.join(run.invalid)} |")
    else:
        lines.append("(not measured in this run)")
    lines += ["", "## Invalid runs and notes", ""]
    any_note = False
    for scen, per in results.items():
        for n, runs in per.items():
            for i, r in enumerate(runs):
                if r.invalid or r.notes:
                    any_note = True
                    what = "; ".join(r.invalid) if r.invalid else "valid"
                    extra = f" ({'; '.join(r.notes)})" if r.notes else ""
                    lines.append(f"- {scen} / {n} / run {i + 1}: {what}{extra}")
    if not any_note:
        lines.append("- none")
    lines += ["", "## All runs", "", "Raw metrics of every run are in "
              f"`{meta['json']}`.", ""]
    notes = Path(__file__).with_name("notes.md")
    if notes.exists():
        lines += ["", notes.read_text().rstrip(), ""]
    return "\n".join(lines)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def rerender(json_path: Path, out: Path) -> None:
    """Rewrite RESULTS.md from a results JSON (after editing bench/notes.md)."""
    raw = json.loads(json_path.read_text())
    meta = raw["meta"]
    results = {s: {n: [Run(r["metrics"], r["invalid"], r.get("notes", [])) for r in runs]
                   for n, runs in per.items()} for s, per in raw["results"].items()}
    ceilings = {k: Run(v["metrics"], v["invalid"]) for k, v in raw["ceilings"].items()}
    names = list(meta["versions"])
    out.write_text(render(results, [_Named(n) for n in names],  # type: ignore[misc]
                          ceilings, meta))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                   help=f"comma-separated, from: {', '.join(ALL_SCENARIOS)}")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds, discarded")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--publishers", type=int, default=1, help="publisher processes")
    p.add_argument("--backlog-count", type=int, default=1_000_000)
    p.add_argument("--idle-conns", type=int, default=1000)
    p.add_argument("--delayed-count", type=int, default=100_000)
    p.add_argument("--delayed-spread", type=float, default=60.0,
                   help="delays are uniform in [0, this) seconds")
    p.add_argument("--sustained-rate", type=float, default=20000.0,
                   help="msg/s of the sustained scenario")
    p.add_argument("--merge", metavar="JSON",
                   help="start from the results in this JSON: scenarios run now replace "
                   "theirs, the rest are kept (re-run one scenario, keep the table)")
    p.add_argument("--rabbit-url", help="use this RabbitMQ instead of starting one "
                   "(no RSS/CPU/restart figures then)")
    p.add_argument("--amqpd-url", help="use this amqpd instead of starting one")
    p.add_argument("--amqpd-workers", type=int, default=1,
                   help="the amqpd node's workers (issue 35; 1: one process, as before); "
                        "its CPU and RSS are summed over the supervisor and the workers")
    p.add_argument("--only-amqpd", action="store_true")
    p.add_argument("--no-ceiling", action="store_true", help="skip the generator ceiling")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: 1.5 s runs, 1 repetition, no warm-up, small backlog")
    p.add_argument("--out", default="bench/RESULTS.md")
    p.add_argument("--workdir", help="broker data dirs (default: a temp dir)")
    p.add_argument("--render", metavar="JSON",
                   help="only rewrite --out from a results JSON written by an earlier run")
    p.add_argument("--nice", type=int, default=-10,
                   help="scheduling niceness for the suite, its brokers and generators "
                   "(default -10 when allowed: this machine is shared)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        rerender(Path(args.render), Path(args.out))
        return 0
    raise_nofile()
    # stop cleanly (brokers included) on SIGTERM, and on SIGINT even when started in the
    # background by a shell (which ignores SIGINT for background jobs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    o = Options(duration=args.duration, warmup=args.warmup, repeat=args.repeat,
                publishers=args.publishers, backlog_count=args.backlog_count,
                idle_conns=args.idle_conns, delayed_count=args.delayed_count,
                delayed_spread=args.delayed_spread, sustained_rate=args.sustained_rate)
    if args.quick:
        o.duration, o.warmup, o.repeat = 1.5, 0.0, 1
        o.backlog_count = min(o.backlog_count, 20_000)
        o.idle_conns = min(o.idle_conns, 200)
        o.delayed_count = min(o.delayed_count, 5000)
        o.delayed_spread = min(o.delayed_spread, 3.0)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in scenarios:
        if s not in SCENARIOS:
            print(f"unknown scenario {s!r}; choose from {', '.join(ALL_SCENARIOS)}",
                  file=sys.stderr)
            return 2
    tmp = tempfile.TemporaryDirectory(prefix="amqpd-bench-")
    work = Path(args.workdir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    brokers: list[Broker] = [ExternalBroker("amqpd", args.amqpd_url) if args.amqpd_url
                             else AmqpdBroker(work, ["--workers", str(args.amqpd_workers)])]
    if not args.only_amqpd:
        brokers.append(ExternalBroker("rabbitmq", args.rabbit_url) if args.rabbit_url
                       else RabbitBroker(work))
    versions = {b.name: b.version() for b in brokers}  # type: ignore[attr-defined]
    ceilings: dict[str, Run] = {}
    results: dict[str, dict[str, list[Run]]] = {s: {} for s in scenarios}
    out = Path(args.out)
    json_path = out.with_suffix(".json")
    meta = {"when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench " + " ".join(argv if argv is not None
                                                       else sys.argv[1:]),
            "host": host_info(), "versions": versions, "commit": git_rev(),
            "duration": o.duration,
            "warmup": o.warmup, "repeat": o.repeat, "publishers": o.publishers,
            "backlog_count": o.backlog_count, "idle_conns": o.idle_conns,
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "json": str(json_path)}
    if args.merge:
        old = json.loads(Path(args.merge).read_text())
        kept = {sc: {n: [Run(r["metrics"], r["invalid"], r.get("notes", [])) for r in runs]
                     for n, runs in per.items()}
                for sc, per in old["results"].items() if sc not in results}
        results = {**kept, **results}
        if args.no_ceiling:
            ceilings = {k: Run(v["metrics"], v["invalid"]) for k, v in old["ceilings"].items()}
        meta["command"] = old["meta"]["command"] + "; then " + meta["command"]
        meta["commit"] = (f"{old['meta'].get('commit', '?')}; {', '.join(scenarios)} "
                          f"re-run at {meta['commit']}")
    started: list[Broker] = []
    try:
        if not args.no_ceiling:
            d = o.duration
            _log("ceiling: publish loop -> sink (1 process)")
            ceilings["publish, 1 process, 16 B"] = ceiling_publish(d, 1)
            _log(f"  {ceilings['publish, 1 process, 16 B'].metrics}")
            ceilings["publish, 2 processes, 16 B"] = ceiling_publish(d, 2)
            _log(f"  {ceilings['publish, 2 processes, 16 B'].metrics}")
            ceilings["consume, 1 process, 16 B"] = ceiling_consume(d)
            _log(f"  {ceilings['consume, 1 process, 16 B'].metrics}")
            ceilings["consume, 1 process, 1 KiB"] = ceiling_consume(d, 1024)
            _log(f"  {ceilings['consume, 1 process, 1 KiB'].metrics}")
        for b in brokers:
            _log(f"starting {b.name}")
            secs = b.start()
            started.append(b)
            _log(f"  {b.name} up in {secs:.1f} s at {b.url} (pid {b.pid})")
        for scen in scenarios:
            fn = SCENARIOS[scen]
            reps = 1 if scen in ONCE else o.repeat
            for b in brokers:
                results[scen][b.name] = []
                if o.warmup and scen not in NO_WARMUP and \
                        not (scen in AMQPD_ONLY and b.name != "amqpd"):
                    _log(f"{scen}: warm-up on {b.name}")
                    fn(b, o, o.warmup)
            for rep in range(reps):
                order = brokers if rep % 2 == 0 else brokers[::-1]
                for b in order:
                    if scen in AMQPD_ONLY and b.name != "amqpd":
                        continue
                    _log(f"{scen}: run {rep + 1}/{reps} on {b.name}")
                    try:
                        run = fn(b, o, o.duration)
                    except Exception as exc:  # a crash is an invalid run, not the end
                        run = Run(invalid=[f"{type(exc).__name__}: {exc}"])
                    results[scen][b.name].append(run)
                    _log(f"  {'ok' if run.valid else 'INVALID'} "
                         f"{ {k: round(v, 2) for k, v in run.metrics.items()} } "
                         f"{'; '.join(run.invalid)}")
            _write(out, json_path, results, brokers, ceilings, meta)
    finally:
        for b in started:
            with contextlib.suppress(Exception):
                b.stop()
        with contextlib.suppress(OSError):
            tmp.cleanup()
    _write(out, json_path, results, brokers, ceilings, meta)
    _log(f"wrote {out}")
    return 0


def _write(out: Path, json_path: Path, results: dict[str, dict[str, list[Run]]],
           brokers: list[Broker], ceilings: dict[str, Run], meta: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, brokers, ceilings, meta))
    raw = {"meta": meta,
           "ceilings": {k: {"metrics": v.metrics, "invalid": v.invalid}
                        for k, v in ceilings.items()},
           "results": {s: {n: [{"metrics": r.metrics, "invalid": r.invalid,
                                "notes": r.notes} for r in runs]
                           for n, runs in per.items()} for s, per in results.items()}}
    json_path.write_text(json.dumps(raw, indent=1, default=str) + "\n")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def git_rev() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                "amqpd"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return rev + (" (amqpd/ has uncommitted changes)" if dirty else "")
    return "?"
