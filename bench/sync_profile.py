"""Where a synchronous standby's cost goes: CPU per confirm on each node, and profiles.

    python -m bench.sync_profile [--mode pair|alone] [--duration 10] [--pyspy DIR]
        [--native] [--amqpd-src DIR]

Starts a node alone or a static sync pair (``min_insync_standbys = 1``, as
``bench.replication --ratio-runs``), runs the same confirming publisher (100-byte
persistent messages, 1000 confirms in flight) for ``--duration`` seconds and reports,
per 1,000 confirmed messages, the CPU seconds each broker process used (user + system,
all threads, from ``/proc/<pid>/stat``) and the wall time. A busy machine changes the
rate a lot and the CPU per confirm much less, so the CPU figures compare builds on a
shared box where the rates cannot.

With ``--pyspy DIR`` both processes are also recorded with ``py-spy record --format raw``
(``--native`` adds the compiled hot path's C frames) and the top functions of each are
printed (``bench.profile.summarize``); the raw stacks stay in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.profile import summarize
from bench.replication import _declare, _publish, _rate
from tests.integration.warren_support import node, replication_addr, status, wait_for
from tests.support.brokerproc import BrokerProcess

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


def _record(pid: int, seconds: int, out: Path, native: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw",
                             "--rate", "200", "--duration", str(seconds), "--output",
                             str(out), *(["--native"] if native else ["--nonblocking"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(root: Path, mode: str, duration: float, pyspy: Path | None,
            native: bool) -> dict[str, Any]:
    procs: dict[str, BrokerProcess] = {}
    try:
        if mode == "alone":
            procs["active"] = BrokerProcess(root / "alone").start()
        else:
            procs["active"] = node(root / "sa", "bench-a", "active",
                                   min_insync_standbys=1).start()
            procs["standby"] = node(root / "sb", "bench-b", "standby",
                                    replication_addr(procs["active"]),
                                    min_insync_standbys=1).start()
            wait_for(lambda: status(procs["active"])["insync_count"] == 1, 60,
                     "the standby in sync")
        url = procs["active"].url
        _declare(url, "rb.prof")
        pids = {name: p.proc.pid for name, p in procs.items() if p.proc is not None}
        gate0 = status(procs["active"]) if mode == "pair" else {}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        recorders: list[subprocess.Popen[bytes]] = []
        if pyspy is not None:
            # start a second in (the publisher's connection set up), stop a second early
            def start_recorders() -> None:
                time.sleep(1.0)
                for name, pid in pids.items():
                    recorders.append(_record(pid, max(1, int(duration) - 2),
                                             pyspy / f"{mode}-{name}.txt", native))
            threading.Thread(target=start_recorders, daemon=True).start()
        res = _publish(url, "rb.prof", 100, duration)
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        gate1 = status(procs["active"]) if mode == "pair" else {}
        for r in recorders:
            r.wait(60)
        k = max(res.confirmed, 1) / 1000
        out: dict[str, Any] = {"mode": mode, "confirmed": res.confirmed,
                               "nacked": res.nacked, "rate": round(_rate(res)),
                               "wall_ms_per_1k": round((res.t_end - res.t_start) * 1e3 / k, 2)}
        for name in pids:
            out[f"{name}_cpu_ms_per_1k"] = round((after[name] - before[name]) * 1e3 / k, 2)
        # builds before issue 34's cheaper sync do not report these
        if "lane_frames_total" in gate1:
            out["lane_frames"] = gate1["lane_frames_total"] - gate0["lane_frames_total"]
        if "commits_ahead_total" in gate1:
            ahead = gate1["commits_ahead_total"] - gate0["commits_ahead_total"]
            waited = gate1["commits_waited_total"] - gate0["commits_waited_total"]
            wait_s = (gate1["commits_waited_seconds_total"]
                      - gate0["commits_waited_seconds_total"])
            # group commits the standby already held when our fsync ended, and how long
            # the others waited for its ACK past our fsync
            out["commits_ahead"] = ahead
            out["commits_waited"] = waited
            out["wait_ms_past_local_fsync"] = round(wait_s * 1e3 / max(waited, 1), 3)
        return out
    finally:
        for p in reversed(list(procs.values())):
            p.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sync_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("pair", "alone"), default="pair")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pyspy", default="", help="record both nodes with py-spy into DIR")
    p.add_argument("--native", action="store_true", help="py-spy --native")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--amqpd-src", default="",
                   help="run the brokers from this checkout's amqpd (PYTHONPATH)")
    a = p.parse_args(argv)
    if a.amqpd_src:
        os.environ["PYTHONPATH"] = str(Path(a.amqpd_src).resolve())
    pyspy = Path(a.pyspy).resolve() if a.pyspy else None
    if pyspy is not None:
        if not shutil.which("py-spy"):
            print("py-spy not found: pip install py-spy", file=sys.stderr)
            return 3
        pyspy.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="amqpd-bench-syncprof-") as tmp:
            results.append(measure(Path(tmp), a.mode, a.duration,
                                   pyspy if i == 0 else None, a.native))
        print(json.dumps(results[-1]), flush=True)
    if pyspy is not None:
        for raw in sorted(pyspy.glob(f"{a.mode}-*.txt")):
            print(f"\n== {raw.name}\n{summarize(raw, a.top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
