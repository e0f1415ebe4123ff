"""Where a synchronous standby's cost goes: CPU per confirm on each node, and profiles.

    python -m bench.sync_profile [--mode pair|alone] [--duration 10] [--pyspy DIR]
        [--native] [--amqpd-src DIR] [--standby-ack fsync|write] [--trace]
        [--standby-on-tmpfs]

Starts a node alone or a static sync pair (``min_insync_standbys = 1``, as
``bench.replication --ratio-runs``), runs the same confirming publisher (100-byte
persistent messages, 1000 confirms in flight) for ``--duration`` seconds and reports,
per 1,000 confirmed messages, the CPU seconds each broker process used (user + system,
all threads, from ``/proc/<pid>/stat``) and the wall time, and per thread its CPU and
context switches (``/proc/<pid>/task``: how often the event loop was woken or
preempted). A busy machine changes the
rate a lot and the CPU per confirm much less, so the CPU figures compare builds on a
shared box where the rates cannot.

With ``--pyspy DIR`` both processes are also recorded with ``py-spy record --format raw``
(``--native`` adds the compiled hot path's C frames) and the top functions of each are
printed (``bench.profile.summarize``); the raw stacks stay in DIR.

With ``--trace`` (pair mode) both brokers record the timestamps of each synchronous
confirm's steps (``amqpd/replication/trace.py``) and the run adds ``trace``: for every
group commit, the time from the active's write of its records to each later step on
either node (the machine's one monotonic clock), as median / p90 / mean in ms, and the
same for the group commits that waited for the standby's ACK past their local fsync.
"""

from __future__ import annotations

import argparse
import bisect
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
from tests.integration.warren_support import api, node, replication_addr, status, wait_for
from tests.support.brokerproc import BrokerProcess

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15)


def thread_figures(pid: int) -> dict[str, tuple[float, int, int]]:
    """Per thread of a process so far: (CPU seconds, voluntary and involuntary context
    switches), keyed "loop" for the main thread (the event loop) and "tid N" for the
    others (Python 3.11 does not give its threads names the kernel shows)."""
    out: dict[str, tuple[float, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        switches = dict(line.split(":\t") for line in status.splitlines()
                        if line.endswith(tuple("0123456789")) and "ctxt_switches" in line)
        key = "loop" if task.name == str(pid) else f"tid {task.name}"
        out[key] = ((int(fields[11]) + int(fields[12])) / _TICK,
                    int(switches.get("voluntary_ctxt_switches", 0)),
                    int(switches.get("nonvoluntary_ctxt_switches", 0)))
    return out


def fsync_figures(proc: BrokerProcess) -> tuple[float, float]:
    """(fsyncs, seconds in fsync) of a broker's log so far, from its /metrics."""
    found = {"rabbitmq_io_sync_ops_total": 0.0, "rabbitmq_io_sync_time_seconds_total": 0.0}
    for line in api(proc).get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found["rabbitmq_io_sync_ops_total"], found["rabbitmq_io_sync_time_seconds_total"]


def _record(pid: int, seconds: int, out: Path, native: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw",
                             "--rate", "200", "--duration", str(seconds), "--output",
                             str(out), *(["--native"] if native else ["--nonblocking"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# the steps of trace.py in the order a group commit meets them, named for the report
_STEPS = (("l", "active: pushed through the lane"), ("x", "standby: DATA frame arrives"),
          ("p", "standby: written"), ("c", "standby: written and checked"),
          ("s", "standby: its fsync starts"),
          ("e", "standby: its fsync ends"), ("k", "standby: ACK sent"),
          ("a", "active: ACK read"), ("g", "active: local fsync done (loop)"),
          ("r", "active: gate released"))


def _first_at_least(times: list[int], seqs: list[int], seq: int) -> int | None:
    """The time of the first step whose sequence reached ``seq`` (None: never)."""
    i = bisect.bisect_left(seqs, seq)
    return times[i] if i < len(times) else None


def analyse_trace(files: list[Path]) -> dict[str, Any]:
    """Pair the steps of both nodes' trace files by sequence number (module docstring)."""
    by_step: dict[str, list[tuple[int, int]]] = {}
    for f in files:
        for line in f.read_text().splitlines():
            when, name, number = line.split()
            by_step.setdefault(name, []).append((int(when), int(number)))
    # x carries the last checked seq *before* its frame: it belongs to the next c
    for early in ("x", "p"):
        if early in by_step and "c" in by_step:
            xs, cs = sorted(by_step[early]), sorted(by_step["c"])
            by_step[early] = [(tx, sc) for (tx, _), (_, sc) in zip(xs, cs, strict=False)]
    # the standby's fsync rounds name the write generation they cover ("q": the
    # generation each frame's check reported): name them by that frame's last record
    if "q" in by_step and "c" in by_step:
        gens = {g: sc for (_, g), (_, sc) in zip(sorted(by_step["q"]), sorted(by_step["c"]),
                                                 strict=False)}
        for step in ("s", "e"):
            by_step[step] = [(t, gens[g]) for t, g in by_step.get(step, []) if g in gens]
    index: dict[str, tuple[list[int], list[int]]] = {}
    for step, events in by_step.items():
        events.sort()
        times: list[int] = []
        seqs: list[int] = []
        high = -1
        for t, seq in events:
            if seq > high:  # keep the first time each new high was reached
                times.append(t)
                seqs.append(seq)
                high = seq
        index[step] = (times, seqs)
    if "g" not in index or "w" not in index:
        return {"error": "no trace steps recorded"}
    rows: list[dict[str, float]] = []
    for tg, seq in by_step["g"]:
        tw = _first_at_least(*index["w"], seq)
        if tw is None:
            continue
        row: dict[str, float] = {}
        for step, _ in _STEPS:
            at: int | None = tg if step == "g" else (
                _first_at_least(*index[step], seq) if step in index else None)
            if at is not None:
                row[step] = (at - tw) / 1e6
        ta = row.get("a")
        row["wait"] = max(0.0, ta - row["g"]) if ta is not None else float("nan")
        rows.append(row)

    def figures(sel: list[dict[str, float]]) -> dict[str, list[float]]:
        out = {}
        for step, name in (*_STEPS, ("wait", "wait past the local fsync")):
            vals = sorted(r[step] for r in sel if step in r and r[step] == r[step])
            if vals:
                out[name] = [round(vals[len(vals) // 2], 3),
                             round(vals[min(len(vals) - 1, int(len(vals) * 0.9))], 3),
                             round(sum(vals) / len(vals), 3)]
        return out

    waited = [r for r in rows if r.get("wait", 0) > 0]
    return {"group_commits": len(rows), "waited": len(waited),
            "ms_after_write_median_p90_mean": figures(rows),
            "waited_only": figures(waited)}


def format_trace(tr: dict[str, Any]) -> str:
    """The trace breakdown as a table (ms after the active wrote the records)."""
    if "error" in tr:
        return f"trace: {tr['error']}"
    lines = [f"{tr['group_commits']} group commits, {tr['waited']} waited past their local "
             "fsync; ms after the active wrote them, median / p90 / mean",
             f"{'step':<36} {'all':>24}   {'those that waited':>24}"]
    every, waited = tr["ms_after_write_median_p90_mean"], tr["waited_only"]
    for name, vals in every.items():
        other = waited.get(name)
        lines.append(f"{name:<36} {' / '.join(map(str, vals)):>24}   "
                     f"{' / '.join(map(str, other)) if other else '-':>24}")
    return "\n".join(lines)


def measure(root: Path, mode: str, duration: float, pyspy: Path | None,
            native: bool, trace: bool = False, ack: str = "fsync",
            standby_root: Path | None = None) -> dict[str, Any]:
    procs: dict[str, BrokerProcess] = {}
    trace_dir = root / "trace"
    if trace:
        trace_dir.mkdir()
        os.environ["AMQPD_SYNC_TRACE"] = str(trace_dir)
    try:
        if mode == "alone":
            procs["active"] = BrokerProcess(root / "alone").start()
        else:
            procs["active"] = node(root / "sa", "bench-a", "active",
                                   min_insync_standbys=1, standby_ack=ack).start()
            procs["standby"] = node((standby_root or root) / "sb", "bench-b", "standby",
                                    replication_addr(procs["active"]),
                                    min_insync_standbys=1, standby_ack=ack).start()
            wait_for(lambda: status(procs["active"])["insync_count"] == 1, 60,
                     "the standby in sync")
        url = procs["active"].url
        _declare(url, "rb.prof")
        pids = {name: p.proc.pid for name, p in procs.items() if p.proc is not None}
        gate0 = status(procs["active"]) if mode == "pair" else {}
        fsyncs0 = fsync_figures(procs["active"])
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        threads0 = {name: thread_figures(pid) for name, pid in pids.items()}
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
        threads1 = {name: thread_figures(pid) for name, pid in pids.items()}
        gate1 = status(procs["active"]) if mode == "pair" else {}
        fsyncs1 = fsync_figures(procs["active"])
        for r in recorders:
            r.wait(60)
        k = max(res.confirmed, 1) / 1000
        out: dict[str, Any] = {"mode": mode if mode == "alone" else f"pair ({ack})",
                               "confirmed": res.confirmed,
                               "nacked": res.nacked, "rate": round(_rate(res)),
                               "wall_ms_per_1k": round((res.t_end - res.t_start) * 1e3 / k, 2)}
        for name in pids:
            out[f"{name}_cpu_ms_per_1k"] = round((after[name] - before[name]) * 1e3 / k, 2)
        for name in pids:
            # per thread, per 1,000 confirms: CPU ms, voluntary switches (a thread that
            # blocked and was woken: the loop's wake-ups), involuntary ones (preempted)
            per: dict[str, list[float]] = {}
            for thread, (cpu, vol, nonvol) in threads1[name].items():
                cpu0, vol0, nonvol0 = threads0[name].get(thread, (0.0, 0, 0))
                if cpu - cpu0 > 0 or vol - vol0 > 0:
                    per[thread] = [round((cpu - cpu0) * 1e3 / k, 2),
                                   round((vol - vol0) / k, 1), round((nonvol - nonvol0) / k, 1)]
            out[f"{name}_threads_cpu_ms_vol_nonvol_per_1k"] = per
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
        syncs = fsyncs1[0] - fsyncs0[0]
        if syncs > 0:
            out["active_fsyncs"] = syncs
            out["active_fsync_avg_ms"] = round((fsyncs1[1] - fsyncs0[1]) * 1e3 / syncs, 3)
    finally:
        for p in reversed(list(procs.values())):
            p.stop()
        os.environ.pop("AMQPD_SYNC_TRACE", None)
    if trace:
        out["trace"] = analyse_trace(sorted(trace_dir.glob("*.trace")))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sync_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("pair", "alone"), default="pair")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pyspy", default="", help="record both nodes with py-spy into DIR")
    p.add_argument("--native", action="store_true", help="py-spy --native")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--standby-ack", choices=("fsync", "write"), default="fsync",
                   help="the pair's standby_ack setting")
    p.add_argument("--standby-on-tmpfs", action="store_true",
                   help="the standby's data on /dev/shm: its fsync no longer shares the "
                        "active's disk and journal (what separate machines would do)")
    p.add_argument("--trace", action="store_true",
                   help="pair mode: time each group commit's steps on both nodes")
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
        with tempfile.TemporaryDirectory(prefix="amqpd-bench-syncprof-") as tmp, \
                tempfile.TemporaryDirectory(prefix="amqpd-bench-sb-", dir="/dev/shm") as shm:
            results.append(measure(Path(tmp), a.mode, a.duration,
                                   pyspy if i == 0 else None, a.native, a.trace,
                                   a.standby_ack,
                                   Path(shm) if a.standby_on_tmpfs else None))
        print(json.dumps(results[-1]), flush=True)
        if "trace" in results[-1]:
            print(format_trace(results[-1]["trace"]), flush=True)
    if pyspy is not None:
        for raw in sorted(pyspy.glob(f"{a.mode}-*.txt")):
            print(f"\n== {raw.name}\n{summarize(raw, a.top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
