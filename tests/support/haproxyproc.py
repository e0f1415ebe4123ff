"""A private HAProxy for tests: Debian's haproxy in the foreground on a free loopback
port, in front of a warren's nodes, routing by the same health check as etc/haproxy.cfg
(``GET /health/active``), with the check timings lowered for tests.

Ready is polled with a deadline (the frontend accepts a connection); the process is
ended by its own PID.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.rabbitmq import free_ports

SKIP_REASON = "haproxy is not installed (Debian's haproxy: `make system-deps` installs it as root)"


def find_haproxy() -> str | None:
    return shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)


def render_config(port: int, servers: list[tuple[str, int, int]], inter_ms: int = 100,
                  fall: int = 2, rise: int = 1) -> str:
    """The test's haproxy.cfg: ``servers`` are (name, amqp_port, http_port) on loopback."""
    lines = [
        "global",
        "    maxconn 1000",
        "defaults",
        "    mode tcp",
        "    timeout connect 2s",
        "    timeout client 60s",
        "    timeout server 60s",
        "frontend amqp",
        f"    bind 127.0.0.1:{port}",
        "    default_backend warren",
        "backend warren",
        "    option httpchk GET /health/active",
        "    http-check expect status 200",
        f"    default-server inter {inter_ms}ms fastinter {inter_ms}ms downinter {inter_ms}ms "
        f"fall {fall} rise {rise} on-marked-down shutdown-sessions",
    ]
    for name, amqp_port, http_port in servers:
        lines.append(f"    server {name} 127.0.0.1:{amqp_port} check port {http_port}")
    return "\n".join(lines) + "\n"


@dataclass
class HAProxyProcess:
    work_dir: Path
    servers: list[tuple[str, int, int]]
    binary: str = field(default_factory=lambda: find_haproxy() or "haproxy")
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "haproxy.log"

    def start(self, timeout: float = 15.0) -> HAProxyProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            (self.port,) = free_ports(1)
        cfg = self.work_dir / "haproxy.cfg"
        cfg.write_text(render_config(self.port, self.servers))
        check = subprocess.run([self.binary, "-c", "-f", str(cfg)], capture_output=True,
                               timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config: {check.stdout!r} {check.stderr!r}")
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([self.binary, "-db", "-f", str(cfg)], stdout=log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text(errors="replace")[-2000:])
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"haproxy did not listen in {timeout}s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
