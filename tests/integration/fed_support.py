"""Helpers for the federation tests: sites (amqpd processes), upstreams, policies, polling."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pika

from tests.integration._http import Api, q
from tests.support.brokerproc import BrokerProcess

T = TypeVar("T")


def site(path: Path, name: str, extra_env: dict[str, str] | None = None) -> BrokerProcess:
    """An amqpd with federation enabled and its own cluster name (unique per site)."""
    env = {"AMQPD_PLUGINS": "federation", "AMQPD_CLUSTER_NAME": name}
    env.update(extra_env or {})
    return BrokerProcess(path / name, env=env)


@contextlib.contextmanager
def started_sites(path: Path, up_name: str, down_name: str,
                  ) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """An upstream and a downstream site, running, stopped on the way out."""
    up, down = site(path, up_name), site(path, down_name)
    up.start()
    try:
        down.start()
        try:
            yield up, down
        finally:
            down.stop()
    finally:
        up.stop()


def api(proc: BrokerProcess) -> Api:
    return Api(proc.http_url)


def amqp_uri(port: int, host: str = "127.0.0.1", vhost: str = "/", **query: Any) -> str:
    uri = f"amqp://guest:guest@{host}:{port}/{q(vhost)}"
    if query:
        uri += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return uri


def set_upstream(proc: BrokerProcess, name: str, value: dict[str, Any],
                 vhost: str = "/") -> None:
    r = api(proc).request("PUT", f"/api/parameters/federation-upstream/{q(vhost)}/{q(name)}",
                          {"value": value})
    assert r.status in (201, 204), r.text


def set_policy(proc: BrokerProcess, name: str, pattern: str, definition: dict[str, Any],
               apply_to: str = "exchanges", vhost: str = "/") -> None:
    r = api(proc).request("PUT", f"/api/policies/{q(vhost)}/{q(name)}",
                          {"pattern": pattern, "definition": definition,
                           "apply-to": apply_to})
    assert r.status in (201, 204), r.text


def links(proc: BrokerProcess) -> list[dict[str, Any]]:
    r = api(proc).request("GET", "/api/federation-links")
    assert r.status == 200, r.text
    result: list[dict[str, Any]] = r.json()
    return result


def wait_for(fn: Callable[[], T | None], timeout: float = 15.0, interval: float = 0.05,
             what: str | Callable[[], str] = "condition") -> T:
    """Poll ``fn`` until it returns something true. ``what`` may be a callable so that a
    description needing the broker (its links, say) is only asked for on time-out."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {_describe(what)}")
        time.sleep(interval)


def _describe(what: str | Callable[[], str]) -> str:
    if isinstance(what, str):
        return what
    try:
        return what()
    except OSError as exc:  # the broker cannot be asked either: say so, keep the time-out
        return f"(description unavailable: {exc})"


def wait_running(proc: BrokerProcess, n: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
    def ok() -> list[dict[str, Any]] | None:
        try:
            items = links(proc)
        except OSError:
            # just after a cut heals the host's neighbour entry for the namespace can still
            # be FAILED (EHOSTUNREACH) for a moment: that is "not yet", not a failure
            return None
        running = [i for i in items if i["status"] == "running"]
        return items if len(running) >= n else None
    return wait_for(ok, timeout, what=lambda: f"{n} running link(s) on {proc.http_url}: "
                    f"{links(proc)}")


@contextlib.contextmanager
def channel(url: str) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def get_all(url: str, queue: str, limit: int) -> list[tuple[Any, bytes]]:
    """Every message in ``queue`` now (basic.get with auto-ack), at most ``limit``: what
    a test counts once the queue stopped growing."""
    got: list[tuple[Any, bytes]] = []
    with channel(url) as ch:
        for _ in range(limit):
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got.append((props, body))
    return got


def copies_and_lost(url: str, queue: str, confirmed: set[int]) -> tuple[int, set[int]]:
    """Empty ``queue`` (numbered bodies): how many second copies it held, and which of
    ``confirmed`` it did not hold."""
    got = Counter(int(body) for _props, body in get_all(url, queue, 3 * len(confirmed)))
    return sum(got.values()) - len(got), confirmed - set(got)


def drain(ch: Any, queue: str, expected: int, timeout: float = 15.0) -> list[tuple[Any, bytes]]:
    """Get messages from ``queue`` until ``expected`` arrived (or time out), acking each."""
    got: list[tuple[Any, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        got.append((props, body))
    return got


def settle(ch: Any, queue: str, seconds: float = 1.0) -> list[bytes]:
    """Whatever else arrives within ``seconds`` (to check nothing more does)."""
    time.sleep(seconds)
    out: list[bytes] = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)
