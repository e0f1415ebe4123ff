"""Helpers for the extension tests (test_ext_*.py): pika channels and polling with deadlines."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pika
from pika.adapters.blocking_connection import BlockingChannel

T = TypeVar("T")


@contextmanager
def channel(url: str) -> Iterator[BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def wait_for(fn: Callable[[], T], timeout: float = 5.0, interval: float = 0.01) -> T:
    """Poll ``fn`` until it returns something truthy (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def _last_get(ch: BlockingChannel, queue: str) -> Any:
    method, props, body = ch.basic_get(queue, auto_ack=True)
    return (method, props, body) if method else None


def get_msg(ch: BlockingChannel, queue: str, timeout: float = 5.0) -> tuple[Any, Any, bytes]:
    return wait_for(lambda: _last_get(ch, queue), timeout)


def count(ch: BlockingChannel, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def drain(ch: BlockingChannel, queue: str) -> list[bytes]:
    out: list[bytes] = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def set_policy(http_url: str, vhost: str, name: str, pattern: str, definition: dict[str, Any],
               priority: int = 0, apply_to: str = "all") -> int:
    """PUT /api/policies/{vhost}/{name} as guest (the management API)."""
    return _http("PUT", f"{http_url}/api/policies/{_q(vhost)}/{name}",
                 {"pattern": pattern, "definition": definition, "priority": priority,
                  "apply-to": apply_to})


def clear_policy(http_url: str, vhost: str, name: str) -> int:
    return _http("DELETE", f"{http_url}/api/policies/{_q(vhost)}/{name}", None)


def queue_exists(http_url: str, vhost: str, name: str) -> bool:
    """Asked over HTTP: a passive queue.declare would count as use (x-expires)."""
    return _http("GET", f"{http_url}/api/queues/{_q(vhost)}/{_q(name)}", None) == 200


def _q(vhost: str) -> str:
    return urllib.parse.quote(vhost, safe="")


def _http(method: str, url: str, body: Any) -> int:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)

