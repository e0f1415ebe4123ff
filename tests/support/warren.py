"""Warren nodes for integration tests: amqpd processes with ``role = "auto"`` on fixed,
pre-allocated loopback ports (a node that restarts comes back where HAProxy expects it),
and the small HTTP and etcd probes the tests poll with deadlines.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.rabbitmq import free_ports
from tests.support.brokerproc import BrokerProcess
from tests.support.haproxyproc import HAProxyProcess

SECRET = "warren-test-secret"


@dataclass
class WarrenNode:
    name: str
    data_dir: Path
    etcd_urls: list[str]
    prefix: str
    lease_ttl: float = 2.0
    insync_timeout: float = 30.0
    extra: list[str] = field(default_factory=list)
    advertise: str = ""
    # the other nodes' replication addresses: with any, confirms wait for an in-sync
    # standby (min_insync_standbys); without, the active confirms alone
    peers: list[str] = field(default_factory=list)
    amqp_port: int = 0
    http_port: int = 0
    repl_port: int = 0
    proc: BrokerProcess | None = None

    def __post_init__(self) -> None:
        if not self.amqp_port:
            self.amqp_port, self.http_port, self.repl_port = free_ports(3)

    @property
    def repl_addr(self) -> str:
        return f"127.0.0.1:{self.repl_port}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> WarrenNode:
        args = ["--node-name", self.name, "--http-port", str(self.http_port),
                "--replication-listen", self.repl_addr,
                "--replication-secret", SECRET,
                "--replication-etcd", ",".join(self.etcd_urls),
                "--replication-etcd-prefix", self.prefix,
                "--replication-lease-ttl", str(self.lease_ttl),
                "--replication-insync-timeout", str(self.insync_timeout), *self.extra]
        if self.advertise:
            args += ["--replication-advertise", self.advertise]
        if self.peers:
            args += ["--replication-peers", ",".join(self.peers)]
        self.proc = BrokerProcess(self.data_dir, extra_args=args, port=self.amqp_port,
                                  env={"AMQPD_HTTP_PORT": str(self.http_port)})
        self.proc.start()
        self.proc.port = self.amqp_port  # the ready file says 0 while no AMQP listener
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc is not None \
            and self.proc.proc.poll() is None

    def health(self, check: str, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
        """(status, body) of /health/<check>; (0, {}) when the node does not answer."""
        return http_get(f"{self.http_url}/health/{check}", timeout)

    def api(self, path: str, timeout: float = 2.0) -> Any:
        status, body = http_get(f"{self.http_url}{path}", timeout, auth=("guest", "guest"))
        if status != 200:
            raise AssertionError(f"GET {path} on {self.name}: {status} {body}")
        return body

    def tail(self) -> str:
        return self.proc.tail(60) if self.proc is not None else ""


def http_get(url: str, timeout: float = 1.0,
             auth: tuple[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def etcd_get(url: str, key: str, timeout: float = 1.0) -> Any:
    """The JSON value of ``key`` in etcd (through its v3 gateway), or None."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(f"{url}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


def wait_for(cond: Callable[[], bool], timeout: float, what: str,
             diagnose: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}\n{diagnose()}")
        time.sleep(0.05)


def wait_active(node: WarrenNode, timeout: float = 20.0) -> None:
    wait_for(lambda: node.health("active")[0] == 200, timeout, f"{node.name} active",
             node.tail)


def wait_insync_standby(active: WarrenNode, standby: WarrenNode, etcd_url: str,
                        timeout: float = 30.0) -> None:
    """``standby`` follows ``active`` within max_lag, and the active has published it as
    in-sync in etcd (only then may it take over)."""
    wait_for(lambda: standby.health("standby")[0] == 200, timeout,
             f"{standby.name} in-sync standby", standby.tail)

    def published() -> bool:
        state = etcd_get(etcd_url, f"{active.prefix}/state")
        return bool(state) and state.get("node") == active.name \
            and standby.name in (state.get("insync") or {})

    wait_for(published, timeout, f"{active.name} publishes {standby.name} as in-sync",
             active.tail)


def pair_behind_haproxy(a: WarrenNode, b: WarrenNode, etcd_url: str,
                        work: Path) -> HAProxyProcess:
    """Start ``a`` (active), then ``b`` (its in-sync standby, recorded in etcd), then a
    private HAProxy in front of both; the caller kills all three."""
    a.start()
    wait_active(a)
    b.start()
    wait_insync_standby(a, b, etcd_url)
    return HAProxyProcess(work, [(n.name, n.amqp_port, n.http_port) for n in (a, b)]).start()

