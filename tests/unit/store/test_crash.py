"""kill -9 a publishing process at random moments; every committed message survives.

The child (crash_child.py) prints a position only after its commit callback fired, so
what the parent read from the pipe before the kill is exactly what was confirmed.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

from amqpd.store.log import SharedLog

from .crash_child import QUEUE, body

ROOT = Path(__file__).resolve().parents[3]


def _run_until(directory: Path, start: int, lines_wanted: int) -> list[str]:
    """Start the child, SIGKILL it once it confirmed ``lines_wanted`` lines."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.store.crash_child", str(directory), str(start)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    seen: list[str] = []
    try:
        while len(seen) < lines_wanted:
            assert time.monotonic() < deadline, "child made no progress"
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"child exited with {proc.wait()}")
            seen.append(line.decode())
    finally:
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()  # what it confirmed between our last read and the kill
        proc.wait(10)
        proc.stdout.close()
    text = "".join(seen) + rest.decode(errors="replace")
    complete = text.split("\n")[:-1]  # a line cut by the kill is not a confirmation
    return complete


def test_kill_9_loses_nothing_committed(tmp_path: Path) -> None:
    rng = random.Random(4242)
    directory = tmp_path / "log"
    committed: dict[int, int] = {}  # position -> i
    settled: set[int] = set()
    start = 0
    for _ in range(5):
        lines = _run_until(directory, start, rng.randrange(50, 3000))
        for line in lines:
            kind, *args = line.split()
            if kind == "C":
                committed[int(args[0])] = int(args[1])
            else:
                settled.add(int(args[0]))
        store = SharedLog(directory)
        state = store.open()
        try:
            q = state.queues.get(QUEUE)
            positions = list(q.positions) if q is not None else []
            assert positions == sorted(set(positions)), "in order, each once"
            got = set(positions)
            must = {p for p in committed if p not in settled and committed[p] % 3 != 0}
            assert must <= got, f"lost {len(must - got)} committed messages"
            assert not (settled & got), "a committed settle was undone"
            for p in positions:  # nothing half-written: every body is whole and consistent
                b = store.read(p).body
                (n,) = struct.unpack_from("<Q", b)
                assert b == body(n)
                if p in committed:
                    assert n == committed[p]
            start = max(committed.values(), default=0) + 10_000_000
        finally:
            store.close()
