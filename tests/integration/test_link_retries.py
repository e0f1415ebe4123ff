"""Issue 29: links and shovels against a peer that accepts and closes, and a shovel whose
destination refuses publishes.

HAProxy with no backend up accepts each connection and closes it at once. A federation
link or a shovel pointed at it used to wait out its whole connection timeout (10 s)
every try; it must fail at once, say why in its status, and back off between tries.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration._http import q
from tests.integration.fed_support import (
    amqp_uri,
    api,
    channel,
    get_all,
    links,
    set_policy,
    set_upstream,
    site,
    wait_for,
)
from tests.integration.test_shovel_helpers import set_shovel, shovel_state, shovels
from tests.support.brokerproc import BrokerProcess

CONNECT_TIMEOUT_MS = 10000  # what the issue saw each try wait out


class AcceptAndClose:
    """A loopback listener that accepts every connection and closes it at once, counting
    them (what HAProxy does while no server of its backend is up)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.accepted: list[float] = []  # monotonic time of each accept
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="accept-close")
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 600  # bounded even if the test forgets to stop it
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(time.monotonic())
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def lb() -> Iterator[AcceptAndClose]:
    server = AcceptAndClose()
    yield server
    server.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = site(tmp_path, "retries", {"AMQPD_PLUGINS": "federation,shovel"})
    proc.start()
    yield proc
    proc.stop()


def _tries_within(lb: AcceptAndClose, seconds: float) -> list[float]:
    first = wait_for(lambda: lb.accepted[:1], timeout=15, what="a first connection")[0]
    time.sleep(max(0.0, first + seconds - time.monotonic()))
    return [t - first for t in lb.accepted if t - first <= seconds]


def test_federation_link_fails_at_once_and_backs_off(node: BrokerProcess,
                                                     lb: AcceptAndClose) -> None:
    with channel(node.url) as ch:
        ch.exchange_declare("lb.x", "fanout", durable=True)
    uri = amqp_uri(lb.port, connection_timeout=CONNECT_TIMEOUT_MS)
    set_upstream(node, "lb", {"uri": uri, "reconnect-delay": 4})
    set_policy(node, "fed", "^lb\\.", {"federation-upstream": "lb"})
    item = wait_for(lambda: next((i for i in links(node) if i["status"] == "error"), None),
                    timeout=5, what="the link to fail (well within the 10 s timeout)")
    assert "accepted the connection and closed it" in item["error"], item
    tries = _tries_within(lb, 6.0)
    # at once, then soon, then less often (0.25-0.5 s, 0.5-1, 1-2, 2-4, capped at 4 s):
    # several tries in 6 s, never a loop, never one per 10 s timeout
    assert 3 <= len(tries) <= 8, tries
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert all(0.2 <= g <= 4.5 for g in gaps), gaps  # never a loop, never past the cap


def test_shovel_fails_at_once_and_backs_off(node: BrokerProcess, lb: AcceptAndClose) -> None:
    set_shovel(api(node), "to-lb", {
        "src-uri": "amqp://", "src-queue": "lb-src",
        "dest-uri": amqp_uri(lb.port, connection_timeout=CONNECT_TIMEOUT_MS),
        "dest-queue": "x", "reconnect-delay": 4})

    def failed() -> dict[str, Any] | None:
        return next((s for s in shovels(api(node)) if s["state"] == "terminated"), None)

    item = wait_for(failed, timeout=5, what="the shovel to fail (within the 10 s timeout)")
    assert "accepted the connection and closed it" in item["reason"], item
    tries = _tries_within(lb, 6.0)
    assert 3 <= len(tries) <= 8, tries
    assert all(0.2 <= b - a <= 4.5 for a, b in itertools.pairwise(tries)), tries


def _queue(proc: BrokerProcess, name: str) -> dict[str, Any]:
    r = api(proc).request("GET", f"/api/queues/%2F/{q(name)}")
    assert r.status == 200, r.text
    result: dict[str, Any] = r.json()
    return result


N_REFUSED = 10


def _refusing_route(node: BrokerProcess, p: str = "sh", dedup: bool = False) -> None:
    """{p}.x (fanout) -> {p}.healthy and {p}.orders, {p}.orders full (max-length 1 with
    reject-publish: it refuses every publish until the policy goes), and N_REFUSED
    persistent messages with ids in the source queue {p}.src. ``dedup``: {p}.healthy
    deduplicates, and the messages carry their id as ``x-deduplication-header``."""
    with channel(node.url) as ch:
        ch.exchange_declare(f"{p}.x", "fanout", durable=True)
        for name in (f"{p}.healthy", f"{p}.orders"):
            args = {"x-message-deduplication": True} if dedup and "healthy" in name else None
            ch.queue_declare(name, durable=True, arguments=args)
            ch.queue_bind(name, f"{p}.x")
        ch.queue_declare(f"{p}.src", durable=True)
        set_policy(node, "full", f"^{p}\\.orders$",
                   {"max-length": 1, "overflow": "reject-publish"}, apply_to="queues")
        ch.basic_publish("", f"{p}.orders", b"filler")
        wait_for(lambda: _queue(node, f"{p}.orders")["messages"] == 1, what="orders full")
        ch.confirm_delivery()
        for i in range(N_REFUSED):
            headers = {"x-deduplication-header": f"id-{i}"} if dedup else None
            ch.basic_publish("", f"{p}.src", f"m{i}".encode(), pika.BasicProperties(
                delivery_mode=2, message_id=f"id-{i}", headers=headers))


def _get_all(node: BrokerProcess, queue: str) -> list[tuple[Any, bytes]]:
    return get_all(node.url, queue, 20 * N_REFUSED)  # far more than it may hold


def _refusal_lifted(node: BrokerProcess, p: str = "sh") -> None:
    """The policy goes: orders takes the message it refused, the source settles."""
    r = api(node).request("DELETE", "/api/policies/%2F/full")
    assert r.status == 204, r.text
    wait_for(lambda: _queue(node, f"{p}.orders")["messages"] == N_REFUSED + 1, timeout=30,
             what="orders to take every message")
    wait_for(lambda: _queue(node, f"{p}.src")["messages"] == 0, what="source settled")


def test_local_shovel_refused_publish_goes_only_to_the_refusing_queue(
        node: BrokerProcess) -> None:
    """A shovel into this node (dest-uri ``amqp://``) whose destination exchange routes
    to a healthy queue and a refusing one: the message is published per queue, so the
    healthy queue gets each message exactly once, the refusing one gets it again after
    a backoff (flagged ``x-shovel-retry``) until it takes it, no hot loop, nothing lost.
    (Through an AMQP connection to itself, as before issue 29's fix, every retry put one
    more copy into sh.healthy.)"""
    n = N_REFUSED
    _refusing_route(node)
    log_start = node.log_path.stat().st_size
    set_shovel(api(node), "refused", {"src-uri": "amqp://", "src-queue": "sh.src",
                                      "dest-uri": "amqp://", "dest-exchange": "sh.x",
                                      "dest-add-forward-headers": True})
    wait_for(lambda: _queue(node, "sh.healthy")["messages"] >= 1, what="a first copy")
    time.sleep(3.0)  # a few retry rounds (50 ms doubling): healthy must not grow with them
    text = node.log_path.read_bytes()[log_start:].decode(errors="replace")
    state = shovel_state(api(node), "refused")
    _refusal_lifted(node)
    healthy = _get_all(node, "sh.healthy")
    orders = [(p, b) for p, b in _get_all(node, "sh.orders") if b != b"filler"]
    ids = sorted(f"id-{i}" for i in range(n))
    assert sorted(p.message_id for p, _b in healthy) == ids  # each exactly once
    assert not any("x-shovel-retry" in (p.headers or {}) for p, _b in healthy)
    assert sorted(p.message_id for p, _b in orders) == ids  # nothing lost
    rounds = text.count("local publish to 'sh.orders' failed")
    assert 1 <= rounds <= 12, text[-2000:]  # backed off, never a hot loop
    assert state == "running"  # its status fields as before
    retried = [p for p, _b in orders if "x-shovel-retry" in (p.headers or {})]
    assert retried and all(p.headers["x-shovel-retry"] >= 2 for p in retried)
    # forward headers as with an AMQP destination: dest-uri as given, no credentials
    hop = healthy[0][0].headers["x-shovelled"][0]
    assert hop["dest-uri"] == "amqp://" and hop["dest-exchange"] == "sh.x", hop
    with contextlib.suppress(Exception):
        api(node).request("DELETE", "/api/parameters/shovel/%2F/refused")


def test_remote_shovel_refused_publish_backs_off_into_the_refusing_queue_only(
        node: BrokerProcess) -> None:
    """The same route behind a real URI (an AMQP connection, even to this node): one
    confirm per publish, so the shovel retries after a backoff (the source never sees a
    nack: no hot loop). The destination is amqpd, which offers ``publish_retry_of``:
    each retry names its first try and goes only into the refusing queue, so the
    healthy queue holds each message once (before that capability it took one more
    copy per retry round; tests/integration/test_shovel_retry_routes.py, and
    docs/shovel.md for a destination that is not amqpd)."""
    n = N_REFUSED
    _refusing_route(node)
    log_start = node.log_path.stat().st_size
    set_shovel(api(node), "refused", {"src-uri": "amqp://", "src-queue": "sh.src",
                                      "dest-uri": amqp_uri(node.port),
                                      "dest-exchange": "sh.x"})
    wait_for(lambda: _queue(node, "sh.healthy")["messages"] >= n, what="first copies")
    time.sleep(3.0)  # a few retry rounds (50 ms doubling): healthy must not grow with them
    assert _queue(node, "sh.healthy")["messages"] == n
    text = node.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert 1 <= text.count("publishing them again") <= 12, text[-2000:]  # backed off
    _refusal_lifted(node)
    got = _get_all(node, "sh.healthy")
    assert sorted(p.message_id for p, _b in got) == sorted(f"id-{i}" for i in range(n))
    assert not any("x-shovel-retry" in (p.headers or {}) for p, _b in got)
    orders = [p for p, b in _get_all(node, "sh.orders") if b != b"filler"]
    assert sorted(p.message_id for p in orders) == sorted(f"id-{i}" for i in range(n))
    assert all(p.headers["x-shovel-retry"] >= 2 for p in orders)  # each one a retry
    assert not any("x-publish-retry-of" in p.headers for p in orders)
    with contextlib.suppress(Exception):
        api(node).request("DELETE", "/api/parameters/shovel/%2F/refused")


def test_remote_shovel_retries_dropped_by_a_deduplicating_queue(
        node: BrokerProcess) -> None:
    """What docs/shovel.md offers for a remote destination (where a retry goes through
    the exchange again): messages carrying ``x-deduplication-header`` and a healthy
    queue declared with ``x-message-deduplication``. While the first copy is still in
    it, the queue drops every retry's copy (the refusing queue takes the message once it
    can), so without a consumer the healthy queue holds each message once; nothing is
    lost. (With a consumer that took the first copy, a retry would be taken again: the
    queue only knows the values it holds.)"""
    n = N_REFUSED
    _refusing_route(node, "dd", dedup=True)
    log_start = node.log_path.stat().st_size
    set_shovel(api(node), "dd", {"src-uri": "amqp://", "src-queue": "dd.src",
                                 "dest-uri": amqp_uri(node.port), "dest-exchange": "dd.x"})

    def rounds() -> int:
        text = node.log_path.read_bytes()[log_start:].decode(errors="replace")
        return text.count("publishing them again")

    wait_for(lambda: rounds() >= 3, timeout=30, what="three retry rounds")
    assert _queue(node, "dd.healthy")["messages"] == n  # the retries' copies dropped
    _refusal_lifted(node, "dd")
    healthy = _get_all(node, "dd.healthy")
    orders = [(p, b) for p, b in _get_all(node, "dd.orders") if b != b"filler"]
    ids = sorted(f"id-{i}" for i in range(n))
    assert sorted(p.message_id for p, _b in healthy) == ids  # each exactly once
    assert sorted(p.message_id for p, _b in orders) == ids  # nothing lost
    with contextlib.suppress(Exception):
        api(node).request("DELETE", "/api/parameters/shovel/%2F/dd")
