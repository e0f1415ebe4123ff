"""Profile amqpd under a benchmark scenario with py-spy and print the top functions.

    python -m bench.profile [--scenario pubsub-16] [--seconds 15] [--raw stacks.txt]

Starts a private amqpd, runs the scenario for a little longer than the recording, and
records the broker with ``py-spy record --format raw`` (collapsed stacks). Prints the
functions with the most samples on top of the stack (self) and anywhere in the stack
(inclusive). Needs ``pip install py-spy`` (and root or ptrace permission).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.brokers import AmqpdBroker
from bench.cli import SCENARIOS, Options


def summarize(raw: Path, top: int = 25) -> str:
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    lines_c: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        frames = [f for f in stack.split(";") if f]
        # drop the thread name py-spy puts first
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        lines_c[_short(frames[-1])] += count
        self_c[_short(frames[-1], line=False)] += count
        for f in {_short(f, line=False) for f in frames}:
            incl[f] += count
    if not total:
        return "no samples"
    out = [f"{total} samples", "", "self time by function (top of stack):"]
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in self_c.most_common(top)]
    out += ["", "inclusive time by function:"]
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in incl.most_common(top)]
    out += ["", "hottest lines (self):"]
    out += [f"  {100 * c / total:5.1f}%  {f}" for f, c in lines_c.most_common(top)]
    return "\n".join(out)


def _short(frame: str, line: bool = True) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path, _, lineno = where.rpartition(":")
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if parts else where
    if not line:
        return f"{name} ({short})"
    return f"{name} ({short}:{lineno})" if lineno else name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="pubsub-16", choices=sorted(SCENARIOS))
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--raw", help="keep the collapsed stacks here")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--run-seconds", type=float,
                   help="scenario duration (default: --seconds + 3)")
    p.add_argument("--delay", type=float, default=0.0,
                   help="start recording this many seconds into the run (e.g. to profile "
                   "the drain after a short publish phase)")
    p.add_argument("--native", action="store_true",
                   help="also sample native frames: the mypyc-compiled hot path shows up "
                   "as its C functions (CPyDef_<module>___<Class>___<method>)")
    args = p.parse_args(argv)
    if not shutil.which("py-spy"):
        print("py-spy not found: pip install py-spy", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="amqpd-prof-") as tmp:
        broker = AmqpdBroker(Path(tmp))
        broker.start()
        try:
            o = Options(backlog_count=200_000)
            run_s = args.run_seconds or args.seconds + 3
            result: dict[str, object] = {}
            t = threading.Thread(target=lambda: result.setdefault(
                "run", SCENARIOS[args.scenario](broker, o, run_s)))
            t.start()
            time.sleep(args.delay)
            raw = Path(args.raw or Path(tmp) / "stacks.txt")
            subprocess.run(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw",
                            "--rate", str(args.rate), "--duration", str(int(args.seconds)),
                            "--output", str(raw),
                            *(["--native"] if args.native else ["--nonblocking"])],
                           check=False, stdout=subprocess.DEVNULL)
            t.join()
            print(f"scenario {args.scenario}: {result.get('run')}")
            print(summarize(raw, args.top))
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
