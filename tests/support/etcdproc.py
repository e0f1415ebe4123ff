"""A private etcd for tests: Debian's etcd-server on free loopback ports, temp data dir.

Started with timings lowered (heartbeat 50 ms, election 250 ms) so that short leases
(1-2 s) are allowed: etcd refuses a TTL below 1.5 election timeouts. Ready is polled
with a deadline (the v3 gateway answers a range); the process is ended by its own PID.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devtools.rabbitmq import free_ports

ETCD_CANDIDATES = ("etcd", "/usr/bin/etcd")


def find_etcd() -> str | None:
    for name in ETCD_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


SKIP_REASON = ("etcd is not installed (Debian's etcd-server: `make system-deps` installs it "
               "when run as root)")


@dataclass
class EtcdProcess:
    data_dir: Path
    binary: str = field(default_factory=lambda: find_etcd() or "etcd")
    client_port: int = 0
    peer_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    def start(self, timeout: float = 20.0) -> EtcdProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.client_port:
            self.client_port, self.peer_port = free_ports(2)
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [self.binary, "--name", "test", "--data-dir", str(self.data_dir / "data"),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}", "--heartbeat-interval", "50",
                "--election-timeout", "250", "--log-level", "warn"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.tail()}")
            if self.ready():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not answer in {timeout}s:\n{self.tail()}")

    def ready(self) -> bool:
        req = urllib.request.Request(f"{self.url}/v3/kv/range", data=json.dumps(
            {"key": "AA=="}).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=1.0) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
