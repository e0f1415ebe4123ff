"""Chaos against links: a confirmed publisher, and faults injected through a TcpProxy.

Shared by tests/integration/test_link_chaos.py (which asserts that nothing confirmed is
lost and that every link recovers) and bench/link_chaos.py (which measures how long the
recovery takes). A link here is a shovel or a federation link whose connections run
through :class:`~tests.support.tcpproxy.TcpProxy` instances; what a fault does is the
proxy's business, what "recovered" means is the caller's (a status back to ``running``
and messages flowing again).
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika

from tests.support.brokerproc import BrokerProcess
from tests.support.tcpproxy import TcpProxy


def link_uri(port: int, heartbeat: int = 1, connect_timeout_ms: int = 3000,
             vhost: str = "%2F") -> str:
    """A link's URI through a proxy: short heartbeats, so a blackhole is noticed soon."""
    return (f"amqp://guest:guest@127.0.0.1:{port}/{vhost}?heartbeat={heartbeat}"
            f"&connection_timeout={connect_timeout_ms}")


def poll(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    """pred's first truthy value, polled until the deadline (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} "
                                 f"(last: {last!r})")
        time.sleep(step)


def queue_depth(url: str, queue: str) -> int:
    """Ready messages in queue (a passive declare; 0 when it does not exist yet)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        try:
            ok = conn.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return 0
        return int(ok.method.message_count)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def drain_all(url: str, queue: str, timeout: float = 60.0, quiet: float = 1.0) -> list[bytes]:
    """Every message in queue (acked), until it stayed empty for ``quiet`` seconds."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    bodies: list[bytes] = []
    try:
        ch = conn.channel()
        deadline = time.monotonic() + timeout
        empty_since: float | None = None
        while time.monotonic() < deadline:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                now = time.monotonic()
                empty_since = empty_since or now
                if now - empty_since >= quiet:
                    return bodies
                time.sleep(0.05)
                continue
            empty_since = None
            bodies.append(body)
        raise AssertionError(f"{queue} still not empty after {timeout}s ({len(bodies)} read)")
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@dataclass
class ConfirmedPublisher:
    """A thread publishing persistent messages (bodies "0", "1", ...) with confirms, at
    most ``rate`` a second; ``confirmed`` holds the numbers the broker confirmed."""

    url: str
    exchange: str
    routing_key: str
    rate: float = 300.0
    confirmed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ConfirmedPublisher:
        self._thread = threading.Thread(target=self._run, daemon=True, name="publisher")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        props = pika.BasicProperties(delivery_mode=2)
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            i = 0
            period = 1.0 / self.rate
            nxt = time.monotonic()
            while not self._stop.is_set():
                try:
                    ch.basic_publish(self.exchange, self.routing_key, str(i).encode(), props)
                    self.confirmed.append(i)
                except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                    self.failed.append(i)
                i += 1
                nxt += period
                delay = nxt - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
        except Exception as exc:  # reported by the caller (a test fails on it)
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                conn.close()


@dataclass
class Fault:
    """One fault on one proxy: ``kind`` is delay, reset or blackhole."""

    kind: str
    proxy: TcpProxy
    side: str  # which connection runs through the proxy ("source", "upstream"...)
    seconds: float = 3.0  # how long a delay or blackhole lasts
    delay_ms: float = 300.0

    def __str__(self) -> str:
        extra = f" {self.delay_ms:.0f} ms" if self.kind == "delay" else ""
        return f"{self.kind}{extra} on the {self.side} link"


def standard_faults(proxies: list[tuple[TcpProxy, str]], blackhole_s: float = 4.0
                    ) -> list[Fault]:
    """For every proxy: a delay, a reset of every connection, a blackhole."""
    out: list[Fault] = []
    for proxy, side in proxies:
        out += [Fault("delay", proxy, side, 3.0), Fault("reset", proxy, side),
                Fault("blackhole", proxy, side, blackhole_s)]
    return out


@dataclass
class Recovery:
    fault: str
    noticed: bool  # the link left "running" (always for a blackhole)
    seconds: float  # from the end of the fault until running and flowing again


def inject(fault: Fault, status: Callable[[], str], delivered: Callable[[], int],
           timeout: float = 60.0) -> Recovery:
    """Apply fault, end it, and wait until the link is ``running`` and carries messages
    again (``delivered()`` grew past its value at the end of the fault)."""
    proxy = fault.proxy
    noticed = False
    if fault.kind == "delay":
        proxy.delay(fault.delay_ms)
        before = delivered()
        # messages keep arriving through a slow link (a delay is not an outage)
        poll(lambda: delivered() > before, timeout, f"messages flowing during {fault}")
        end = time.monotonic() + fault.seconds
        while time.monotonic() < end:
            noticed = noticed or status() != "running"
            time.sleep(0.1)
        proxy.delay(0)
        t0 = time.monotonic()
    elif fault.kind == "reset":
        accepted = proxy.accepted
        proxy.reset_all()
        t0 = time.monotonic()
        # the link reconnects through the proxy (a new connection is accepted)
        poll(lambda: proxy.accepted > accepted, timeout, f"a reconnect after {fault}")
        noticed = True
    elif fault.kind == "blackhole":
        proxy.cut("blackhole")
        end = time.monotonic() + fault.seconds
        try:
            # heartbeats tell the link its peer is silent
            poll(lambda: status() != "running", timeout, f"the link noticing {fault}",
                 step=0.1)
            noticed = True
            while time.monotonic() < end:
                time.sleep(0.1)
        finally:
            proxy.restore()
            t0 = time.monotonic()
    else:
        raise ValueError(fault.kind)
    poll(lambda: status() == "running", timeout, f"the link running again after {fault}",
         step=0.02)
    before = delivered()
    poll(lambda: delivered() > before, timeout, f"messages flowing again after {fault}",
         step=0.02)
    return Recovery(str(fault), noticed, time.monotonic() - t0)


# ---------------------------------------------------------------------- the two scenarios
PREFETCH = 200  # the links' prefetch: the duplicates a broken connection may cause


def _http(base: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
            return json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and method == "GET":
            return None
        raise AssertionError(f"{method} {path}: {exc.code} {exc.read()!r}") from None


def _declare(url: str, queues: tuple[str, ...] = (), exchanges: tuple[str, ...] = (),
             bind: tuple[str, str] | None = None) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for name in exchanges:
            ch.exchange_declare(name, "fanout", durable=True)
        for name in queues:
            ch.queue_declare(name, durable=True)
        if bind is not None:
            ch.queue_bind(bind[0], bind[1])
    finally:
        conn.close()


@dataclass
class Scenario:
    """A running link through proxies, and how to watch it."""

    kind: str  # "shovel" | "federation"
    proxies: list[tuple[TcpProxy, str]]
    source_url: str  # where the publisher sends (exchange, routing key)
    exchange: str
    routing_key: str
    dest_url: str
    dest_queue: str
    status: Callable[[], str]
    source_settled: Callable[[], bool]  # nothing left unacked at the source

    def delivered(self) -> int:
        return queue_depth(self.dest_url, self.dest_queue)

    def publisher(self, rate: float = 300.0) -> ConfirmedPublisher:
        return ConfirmedPublisher(self.source_url, self.exchange, self.routing_key, rate)


def _uri_quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@contextlib.contextmanager
def shovel_scenario(workdir: Path) -> Iterator[Scenario]:
    """A shovel on B, reading from A through one proxy and writing to B through another
    (ack-mode on-confirm, prefetch PREFETCH, heartbeats 1 s)."""
    a = BrokerProcess(workdir / "a").start()
    b = BrokerProcess(workdir / "b", env={"AMQPD_PLUGINS": "shovel"}).start()
    src_proxy = TcpProxy("127.0.0.1", a.port).start()
    dest_proxy = TcpProxy("127.0.0.1", b.port).start()
    try:
        _declare(a.url, queues=("chaos.src",))
        _declare(b.url, queues=("chaos.dest",))
        _http(b.http_url, "PUT", "/api/parameters/shovel/%2F/chaos", {"value": {
            "src-uri": link_uri(src_proxy.port), "src-queue": "chaos.src",
            "dest-uri": link_uri(dest_proxy.port), "dest-queue": "chaos.dest",
            "ack-mode": "on-confirm", "reconnect-delay": 0.5,
            "src-prefetch-count": PREFETCH}})

        def status() -> str:
            info = _http(b.http_url, "GET", "/api/shovels/vhost/%2F/chaos")
            return str(info["state"]) if info else ""

        def settled() -> bool:
            info = _http(a.http_url, "GET", "/api/queues/%2F/chaos.src") or {}
            return queue_depth(a.url, "chaos.src") == 0 and \
                info.get("messages_unacknowledged", 1) == 0

        poll(lambda: status() == "running", 30, "the shovel running")
        yield Scenario("shovel", [(src_proxy, "source"), (dest_proxy, "destination")],
                       a.url, "", "chaos.src", b.url, "chaos.dest", status, settled)
    finally:
        src_proxy.stop()
        dest_proxy.stop()
        b.stop()
        a.stop()


@contextlib.contextmanager
def federation_scenario(workdir: Path) -> Iterator[Scenario]:
    """Exchange chaos.x federated from site "hq" to site "branch" (bound to chaos.sink
    there); the link's upstream connection runs through a proxy (ack-mode on-confirm,
    prefetch PREFETCH, heartbeats 1 s)."""
    env = {"AMQPD_PLUGINS": "federation"}
    up = BrokerProcess(workdir / "hq", env={**env, "AMQPD_CLUSTER_NAME": "hq"}).start()
    down = BrokerProcess(workdir / "branch",
                         env={**env, "AMQPD_CLUSTER_NAME": "branch"}).start()
    proxy = TcpProxy("127.0.0.1", up.port).start()
    try:
        _declare(up.url, exchanges=("chaos.x",))
        _declare(down.url, queues=("chaos.sink",), exchanges=("chaos.x",),
                 bind=("chaos.sink", "chaos.x"))
        _http(down.http_url, "PUT", "/api/parameters/federation-upstream/%2F/hq", {"value": {
            "uri": link_uri(proxy.port), "reconnect-delay": 0.5,
            "prefetch-count": PREFETCH, "ack-mode": "on-confirm"}})
        _http(down.http_url, "PUT", "/api/policies/%2F/chaos", {
            "pattern": "^chaos\\.x$", "definition": {"federation-upstream": "hq"},
            "apply-to": "exchanges"})

        def status() -> str:
            items = _http(down.http_url, "GET", "/api/federation-links") or []
            return str(items[0]["status"]) if items else ""

        upstream_q = _uri_quote("federation: chaos.x -> branch")

        def settled() -> bool:
            info = _http(up.http_url, "GET", f"/api/queues/%2F/{upstream_q}") or {}
            return info.get("messages", 1) == 0

        poll(lambda: status() == "running", 30, "the federation link running")
        # the upstream queue is bound once the link runs: from now on hq keeps everything
        poll(lambda: _http(up.http_url, "GET", f"/api/queues/%2F/{upstream_q}") is not None,
             30, "the link's upstream queue")
        yield Scenario("federation", [(proxy, "upstream")], up.url, "chaos.x", "",
                       down.url, "chaos.sink", status, settled)
    finally:
        proxy.stop()
        down.stop()
        up.stop()
