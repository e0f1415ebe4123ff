"""Where does the broker's memory go under overloaded connection churn?

    python -m bench.churn_memory [--rounds 5] [--churn-rate 1500] [--churn-seconds 30]
                                 [--max-inflight 2000] [--workers 2] [--top 12]

amqpd runs under bench/memprobe.py (tracemalloc on, 10 frames). The churn is
bench/connections.py's (full handshake, a channel, connection.close) at a rate the
broker cannot keep up with, so up to ``--max-inflight`` handshakes wait, some time out on
the generator's side (30 s) and some are reset. After the warm-up and after every round,
once the broker's fd count has settled, the probe collects garbage and reports RSS,
RSS after ``malloc_trim(0)``, the bytes tracemalloc traces, and the live objects by type;
the heap snapshot is diffed against the previous round (the lines that grew most).

Reading it: traced bytes and object counts that grow round after round are a leak
(something keeps per-connection objects); flat traced bytes under a growing RSS are
the allocator's high-water mark, which ``malloc_trim`` shows by handing it back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.connections import churn, raise_nofile


def _diff(old: Path, new: Path, top: int) -> list[str]:
    a = tracemalloc.Snapshot.load(str(old))
    b = tracemalloc.Snapshot.load(str(new))
    # the probe's own thread and tracemalloc itself are not the broker
    filters = [tracemalloc.Filter(False, tracemalloc.__file__),
               tracemalloc.Filter(False, "*/bench/memprobe.py")]
    stats = b.filter_traces(filters).compare_to(a.filter_traces(filters), "lineno")
    return [str(s) for s in stats[:top]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.churn_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--churn-rate", type=float, default=1500.0)
    p.add_argument("--churn-seconds", type=float, default=30.0)
    p.add_argument("--max-inflight", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--no-trace", action="store_true",
                   help="tracemalloc off: RSS, RSS after malloc_trim and object counts only "
                        "(the broker at full speed, for many rounds)")
    p.add_argument("--no-trim", action="store_true",
                   help="no malloc_trim between rounds (RSS exactly as the broker leaves it)")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    raise_nofile()
    from tests.support.brokerproc import BrokerProcess

    with tempfile.TemporaryDirectory(prefix="bench-churn-mem-") as tmp:
        probe_dir = Path(tmp) / "probe"
        probe_dir.mkdir()
        broker = BrokerProcess(Path(tmp) / "amqpd",
                               command_prefix=[sys.executable, "-m", "bench.memprobe"],
                               env={"AMQPD_MEMPROBE_DIR": str(probe_dir),
                                    "AMQPD_MEMPROBE_FRAMES": "0" if args.no_trace else "10"},
                               ).start(timeout=180)
        assert broker.proc is not None
        previous: list[dict[str, Any]] = []

        async def snapshot(n: int) -> dict[str, Any]:
            tmp = probe_dir / f"req-{n}.tmp"  # renamed: the probe never reads half of it
            tmp.write_text("" if args.no_trim else "trim\n")
            tmp.rename(probe_dir / f"request-{n}")
            done = probe_dir / f"done-{n}.json"
            deadline = time.monotonic() + 300
            while not done.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the probe did not answer")
                await asyncio.sleep(0.2)
            got = json.loads(done.read_text())
            figures: dict[str, Any] = {
                "rss_before_gc_mib": round(got["rss_before_gc"] / 2**20, 1),
                "gc_unreachable": got["gc_unreachable"],
                "gc_unreachable_types": dict(list(got["gc_unreachable_types"].items())[:8]),
                "probe_rss_mib": round(got["rss"] / 2**20, 1),
                "rss_after_trim_mib": round(got["rss_after_trim"] / 2**20, 1)
                if "rss_after_trim" in got else None,
                "traced_mib": round(got["traced"] / 2**20, 2) if "traced" in got else None,
                "gc_objects": got["gc_objects"]}
            if previous:
                last = previous[-1]["objects"]
                grew = {k: v - last.get(k, 0) for k, v in got["objects"].items()}
                figures["objects_grown"] = dict(sorted(
                    ((k, d) for k, d in grew.items() if d), key=lambda kv: -kv[1])[:10])
                if "traced" in got:
                    figures["top_growth"] = _diff(probe_dir / f"snapshot-{n - 1}.pickle",
                                                  probe_dir / f"snapshot-{n}.pickle",
                                                  args.top)
            previous.append(got)
            print(f"  memory after round {n}: "
                  f"{json.dumps({k: v for k, v in figures.items() if k != 'top_growth'})}",
                  flush=True)
            for line in figures.get("top_growth", []):
                print(f"    {line}", flush=True)
            return figures

        try:
            result = asyncio.run(churn(broker.bind, broker.port, broker.proc.pid,
                                       args.churn_rate, args.churn_seconds, args.rounds,
                                       args.workers, args.max_inflight, args.warmup,
                                       after_round=snapshot))
        finally:
            broker.stop(timeout=120)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
