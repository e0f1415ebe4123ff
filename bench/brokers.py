"""The brokers under test: amqpd and RabbitMQ, started on free ports with their own dirs.

Each broker exposes ``url``, ``pid`` (the process whose RSS and CPU are sampled: the
``python -m amqpd`` process, RabbitMQ's ``beam.smp``), ``data_dir`` (for disk use),
``start()``, ``stop()`` and ``restart()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.loadgen import Conn, ProtocolError

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# Brokers made of several processes (an amqpd node with ``workers`` above 1: the
# supervisor and its worker processes): the figures of these pids are their own plus
# their descendants'. A broker registers its pid here when it starts (AmqpdBroker);
# RabbitMQ's beam.smp is measured alone as before (its children, erl_child_setup and
# inet_gethost, are helpers, not the broker's work).
WITH_CHILDREN: set[int] = set()


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, theirs, and so on (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 4096:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def _family(pid: int) -> list[int]:
    return [pid, *descendants(pid)] if pid in WITH_CHILDREN else [pid]


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (with its descendants': :data:`WITH_CHILDREN`)."""
    total = 0
    for p in _family(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (with its descendants': :data:`WITH_CHILDREN`), in
    seconds. A descendant that ended meanwhile takes its figures with it."""
    total = 0.0
    for p in _family(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, ValueError, IndexError):
            pass
    return total


def disk_used(path: str | os.PathLike[str]) -> int:
    """Bytes allocated on disk under path (like du -s)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return float(total - idle), float(total)


class Sampler:
    """Samples a process's RSS in a thread; records peak RSS and CPU used in between."""

    def __init__(self, pid: int | None, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu0 = self.cpu1 = 0.0
        self.t0 = self.t1 = 0.0

    def __enter__(self) -> Sampler:
        self.host0 = host_cpu()
        if self.pid:
            self.cpu0 = cpu_seconds(self.pid)
            self.peak = rss_bytes(self.pid)
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        self.t0 = time.monotonic()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes(self.pid or 0))

    def __exit__(self, *exc: Any) -> None:
        self.t1 = time.monotonic()
        self.host1 = host_cpu()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.pid:
            self.cpu1 = cpu_seconds(self.pid)
            self.peak = max(self.peak, rss_bytes(self.pid))

    @property
    def host_percent(self) -> float | None:
        """CPU busy on the whole machine, 100 % = one core (everything: broker, load
        generator and any other process)."""
        busy = self.host1[0] - self.host0[0]
        total = self.host1[1] - self.host0[1]
        if total <= 0:
            return None
        return 100.0 * (os.cpu_count() or 1) * busy / total

    @property
    def cpu_percent(self) -> float | None:
        if not self.pid or self.t1 <= self.t0:
            return None
        return 100.0 * (self.cpu1 - self.cpu0) / (self.t1 - self.t0)


class Broker:
    name = "broker"
    url = ""
    pid: int | None = None
    data_dir: Path | None = None
    can_restart = True

    def start(self) -> float:
        """Start; return seconds until it accepted an AMQP connection."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> float:
        self.stop()
        return self.start()

    def wait_amqp(self, deadline: float) -> None:
        while True:
            try:
                Conn(self.url, timeout=5.0).close()
                return
            except (OSError, ProtocolError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class AmqpdBroker(Broker):
    name = "amqpd"

    def __init__(self, workdir: Path, extra_args: list[str] | None = None) -> None:
        from tests.support.brokerproc import BrokerProcess

        self.data_dir = workdir / "amqpd-data"
        self.proc = BrokerProcess(self.data_dir, extra_args=list(extra_args or []),
                                  env={"AMQPD_HTTP_PORT": "0"})

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc.port = 0
        self.proc.start(timeout=600.0)
        self.url = self.proc.url
        assert self.proc.proc is not None
        self.pid = self.proc.proc.pid
        WITH_CHILDREN.add(self.pid)  # with --workers, the node is several processes
        self.wait_amqp(time.monotonic() + 600)
        return time.monotonic() - t0

    def stop(self) -> None:
        self.proc.stop(timeout=300.0)

    def version(self) -> str:
        try:
            out = subprocess.run([sys.executable, "-m", "amqpd", "--version"],
                                 capture_output=True, text=True, timeout=30)
            return out.stdout.strip() or out.stderr.strip()
        except (OSError, subprocess.SubprocessError):
            return "amqpd"


class RabbitBroker(Broker):
    name = "rabbitmq"

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "rabbitmq"
        self.data_dir = self.dir / "mnesia"
        self.nodename: str | None = None
        self.info: Any = None

    def start(self) -> float:
        from devtools import rabbitmq as rmq

        t0 = time.monotonic()
        # a restart keeps the node name: Mnesia's directory is named after the node
        self.info = rmq.start(self.dir, nodename=self.nodename)
        self.nodename = self.info.nodename
        self.url = self.info.amqp_url
        self.pid = self._beam_pid()
        return time.monotonic() - t0

    def _beam_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.dir / "rabbitmq.pid").read_text().strip())
        # fall back: a beam.smp whose ancestor is the wrapper script
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                with contextlib.suppress(OSError):
                    if (p / "comm").read_text().strip() == "beam.smp" and \
                            self.nodename and self.nodename.encode() in \
                            (p / "cmdline").read_bytes():
                        return int(p.name)
        return None

    def stop(self) -> None:
        from devtools import rabbitmq as rmq

        rmq.stop(self.dir)

    def version(self) -> str:
        ctl = shutil.which("rabbitmqctl") or "/usr/lib/rabbitmq/bin/rabbitmqctl"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([ctl, "version"], capture_output=True, text=True,
                                 timeout=30)
            if out.stdout.strip():
                return "RabbitMQ " + out.stdout.strip()
        return "RabbitMQ"


class ExternalBroker(Broker):
    """A broker given by URL: not started or stopped here, so no RSS/CPU/restart."""

    can_restart = False

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url

    def start(self) -> float:
        self.wait_amqp(time.monotonic() + 30)
        return 0.0

    def stop(self) -> None:
        pass

    def version(self) -> str:
        return f"{self.name} at {self.url.split('@')[-1]}"
