"""A private HAProxy for tests: Debian's haproxy in the foreground on a free loopback
port, in front of a warren's nodes, routing by the same health check as etc/haproxy.cfg
(``GET /health/active``), with the check timings lowered for tests.

Ready is polled with a deadline (the frontend accepts a connection); the process is
ended by its own PID.
"""

from __future__ import annotations

import re
import resource
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devtools.rabbitmq import free_ports

SKIP_REASON = "haproxy is not installed (Debian's haproxy: `make system-deps` installs it as root)"


def needs_etcd_and_haproxy() -> list[pytest.MarkDecorator]:
    """The skip marks of a warren test with real etcd and HAProxy (each with its reason)."""
    from tests.support import etcdproc

    return [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
            pytest.mark.skipif(find_haproxy() is None, reason=SKIP_REASON)]


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


def rewrite_ports(text: str, port: int, servers: list[tuple[str, int, int]]) -> str:
    """``text`` (etc/haproxy.cfg as shipped) with only its addresses changed: the frontend
    binds loopback ``port`` instead of ``*:5672``, and each ``server`` line takes the next
    of ``servers`` (name, AMQP port, HTTP port). Everything else, maxconn and timings
    included, stays as written; a file that no longer has these lines is an error."""
    text, binds = re.subn(r"(?m)^(\s*bind\s+)\*:5672\b", rf"\g<1>127.0.0.1:{port}", text)
    found = iter(servers)

    def server(m: re.Match[str]) -> str:
        name, amqp_port, http_port = next(found)
        return f"{m.group(1)}{name} 127.0.0.1:{amqp_port} check port {http_port}"

    pattern = r"(?m)^(\s*server\s+)\S+\s+127\.0\.0\.1:\d+\s+check\s+port\s+\d+"
    text, n = re.subn(pattern, server, text)
    if binds != 1 or n != len(servers):
        raise ValueError(f"expected one `bind *:5672` and {len(servers)} server lines, found "
                         f"{binds} and {n}")
    return text


@dataclass
class HAProxyProcess:
    work_dir: Path
    servers: list[tuple[str, int, int]]
    binary: str = field(default_factory=lambda: find_haproxy() or "haproxy")
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    # the config's text, ``{port}`` standing for the frontend's port; "" = render_config
    config: str = ""
    # (soft, hard) RLIMIT_NOFILE HAProxy starts under; None = this process's own
    nofile: tuple[int, int] | None = None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "haproxy.log"

    def start(self, timeout: float = 15.0) -> HAProxyProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            (self.port,) = free_ports(1)
        cfg = self.work_dir / "haproxy.cfg"
        cfg.write_text(rewrite_ports(self.config, self.port, self.servers) if self.config
                       else render_config(self.port, self.servers))
        limit = self._limit if self.nofile is not None else None
        check = subprocess.run([self.binary, "-c", "-f", str(cfg)], capture_output=True,
                               timeout=30, preexec_fn=limit)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config: {check.stdout!r} {check.stderr!r}")
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([self.binary, "-db", "-f", str(cfg)], stdout=log,
                                     stderr=subprocess.STDOUT, preexec_fn=limit)
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

    def _limit(self) -> None:
        """In the child before exec: the open-file limit HAProxy must start under."""
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
