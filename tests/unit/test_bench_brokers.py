"""bench.brokers' figures of a broker made of several processes (an amqpd node with
workers): a registered pid's RSS and CPU include its descendants', any other pid's are
its own, as before."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from bench.brokers import WITH_CHILDREN, cpu_seconds, descendants, rss_bytes

# a parent that starts a child which burns CPU, then both wait to be killed
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import time\\nend = time.process_time() + 0.3\\n"
    "while time.process_time() < end: pass\\nprint('burnt', flush=True)\\ntime.sleep(60)"],
    stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_registered_pid_counts_its_descendants_and_others_do_not() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "burnt"
        deadline = time.monotonic() + 10
        while child not in descendants(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert descendants(parent.pid) == [child]
        alone_cpu, alone_rss = cpu_seconds(parent.pid), rss_bytes(parent.pid)
        child_cpu, child_rss = cpu_seconds(child), rss_bytes(child)
        assert child_cpu >= 0.25 and child_rss > 0
        WITH_CHILDREN.add(parent.pid)
        try:
            assert cpu_seconds(parent.pid) >= alone_cpu + 0.25
            assert rss_bytes(parent.pid) >= alone_rss + child_rss // 2
        finally:
            WITH_CHILDREN.discard(parent.pid)
        assert cpu_seconds(parent.pid) < alone_cpu + 0.25
    finally:
        for pid in descendants(parent.pid):  # the child this test's parent started
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
