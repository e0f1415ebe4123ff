"""Start real amqpd processes for integration tests: free loopback ports, temp data dirs.

The broker writes its listener ports to a ready file once it listens; we poll for that
file with a deadline instead of sleeping. Processes are ended by their own PID only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.rabbitmq import free_ports


@dataclass
class BrokerProcess:
    data_dir: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    bind: str = "127.0.0.1"
    # prepended to the command line, e.g. ``ip netns exec <ns>`` to run in a namespace
    command_prefix: list[str] = field(default_factory=list)
    http_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.bind}:{self.port}/%2F"

    @property
    def http_url(self) -> str:
        return f"http://{self.bind}:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "amqpd.log"

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        """Start the broker and wait for its ready file.

        Without a port given, one is chosen outside the kernel's ephemeral range
        (:func:`devtools.rabbitmq.free_ports`): ``restart()`` keeps the port, and an
        ephemeral one could become another process's (a bind(0), the local end of a
        connection) while the broker is down."""
        if self.port == 0:
            (self.port,) = free_ports(1)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ready = self.data_dir / "ready.json"
        if ready.exists():
            ready.unlink()
        args = [*self.command_prefix, sys.executable, "-m", "amqpd", "--bind", self.bind,
                "--port", str(self.port), "--data-dir", str(self.data_dir),
                "--ready-file", str(ready), *self.extra_args]
        env = dict(os.environ)
        env.setdefault("AMQPD_HTTP_PORT", "0")
        env.update(self.env)
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready.exists():
                self.info = json.loads(ready.read_text())
                self.port = int(self.info["amqp_port"])
                self.http_port = int(self.info.get("http_port") or 0)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"amqpd exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"amqpd did not become ready in {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (graceful shutdown)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, keep_port: bool = True, timeout: float = 20.0) -> BrokerProcess:
        if not keep_port:
            self.port = 0
        return self.start(timeout)
