"""A ``workers = 2`` node for tests, and forcing a connection onto a chosen worker.

How a connection is forced onto a worker: through the node's one AMQP port, as any
client connects. The supervisor hands connections round robin over the live workers,
so a test opens connections (each named) until the chosen worker's own management API
(its private port, from the ready file) lists that name, and closes the ones that
landed elsewhere. Where a connection landed is read back from the worker, never
assumed from the round-robin order.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika

from tests.support.brokerproc import BrokerProcess

ATTEMPTS = 8  # connections tried before a worker is said to be unreachable


def worker_api(node: BrokerProcess, index: int, path: str) -> Any:
    port = worker_info(node, index)["http_port"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.load(resp)


def node_api(node: BrokerProcess, path: str) -> Any:
    """The node's own HTTP port (the supervisor's front), e.g. ``/api/workers``."""
    req = urllib.request.Request(f"http://127.0.0.1:{read_ready(node)['http_port']}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.load(resp)


def read_ready(node: BrokerProcess) -> dict[str, Any]:
    return dict(json.loads((node.data_dir / "ready.json").read_text()))


def worker_info(node: BrokerProcess, index: int) -> dict[str, Any]:
    for w in read_ready(node)["workers"]:
        if w["index"] == index:
            return dict(w)
    raise AssertionError(f"no worker {index} in the ready file")


def connection_names(node: BrokerProcess, index: int) -> set[str]:
    return {c.get("client_properties", {}).get("connection_name", "")
            for c in worker_api(node, index, "/api/connections")}


def connect_on(node: BrokerProcess, index: int) -> pika.BlockingConnection:
    """A connection through the node's port that landed on worker ``index``."""
    extras: list[pika.BlockingConnection] = []
    try:
        for _ in range(ATTEMPTS):
            name = f"w{index}-{uuid.uuid4().hex[:8]}"
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", node.port, client_properties={"connection_name": name}))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the API lists it once it is open
                if name in connection_names(node, index):
                    return conn
                if any(name in connection_names(node, i)
                       for i in range(len(read_ready(node)["workers"])) if i != index):
                    break
                time.sleep(0.05)
            extras.append(conn)
        raise AssertionError(f"no connection landed on worker {index} in {ATTEMPTS} tries")
    finally:
        for c in extras:
            c.close()


def drain(ch: Any, queue: str, expect: int, timeout: float = 30, *,
          then_silence: float = 0.0, prefetch: int = 0) -> list[bytes]:
    """Consume ``queue`` with manual acks until ``expect`` messages came, or ``timeout``
    passed. With ``then_silence``, go on after ``expect`` until that many seconds pass
    with nothing (a second copy of a shovel would bring more)."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    for method, _props, body in ch.consume(queue, inactivity_timeout=then_silence or 1.0):
        if method is not None:
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if then_silence:
                continue
        if len(got) >= expect or time.monotonic() > deadline:
            break
    ch.cancel()
    return got


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_restarted(node: BrokerProcess, index: int, old_pid: int, timeout: float = 30) -> None:
    """Worker ``index`` runs again under a new pid and serves its private port."""
    def back() -> bool:
        try:
            info = worker_info(node, index)
        except (OSError, ValueError, AssertionError):
            return False
        if info.get("pid") in (None, old_pid):
            return False
        try:
            worker_api(node, index, "/api/overview")
        except OSError:
            return False
        return True
    wait_for(back, timeout, f"worker {index} to be restarted")


def kill_node(node: BrokerProcess) -> None:
    """kill -9 of the whole node: the supervisor and every worker, by their pids."""
    pids = [w["pid"] for w in read_ready(node)["workers"]]
    assert node.proc is not None
    node.proc.send_signal(signal.SIGKILL)  # first: a supervisor would restart workers
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node.proc.wait(10)
    wait_gone(pids)


def wait_gone(pids: list[int], timeout: float = 10) -> None:
    def gone() -> bool:
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            # a zombie of the supervisor's is gone for us: /proc says so
            try:
                if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                    continue
            except OSError:
                continue
            return False
        return True
    wait_for(gone, timeout, f"processes {pids} to end")


@contextmanager
def workers_node(data_dir: Path, workers: int = 2, env: dict[str, str] | None = None,
                 extra_args: list[str] | None = None) -> Iterator[BrokerProcess]:
    node = BrokerProcess(data_dir, extra_args=["--workers", str(workers), *(extra_args or [])],
                         env=dict(env or {}))
    node.start(timeout=60)
    try:
        yield node
    finally:
        pids = [w["pid"] for w in read_ready(node).get("workers", [])]
        node.stop()
        wait_gone(pids)
