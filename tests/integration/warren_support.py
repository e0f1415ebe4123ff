"""A static warren pair of real amqpd processes for tests (no etcd): helpers shared by
tests/integration/test_warren_static.py and bench/replication.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess

SECRET = "warren-test-secret"


def node(data_dir: Path, name: str, role: str, peer: str = "127.0.0.1:1", /,
         **settings: object) -> BrokerProcess:
    """A node with static ``role``; its replication listener on an ephemeral port."""
    env = {"AMQPD_REPLICATION_ROLE": role, "AMQPD_REPLICATION_NODE_NAME": name,
           "AMQPD_REPLICATION_SECRET": SECRET, "AMQPD_REPLICATION_LISTEN": "127.0.0.1:0",
           "AMQPD_REPLICATION_PEERS": peer, "AMQPD_NODE_NAME": name}
    for key, value in settings.items():
        env["AMQPD_REPLICATION_" + key.upper()] = str(value)
    return BrokerProcess(data_dir, env=env)


def ready(proc: BrokerProcess) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((proc.data_dir / "ready.json").read_text())
    return data


def replication_addr(proc: BrokerProcess) -> str:
    return f"127.0.0.1:{ready(proc)['replication']['port']}"


def api(proc: BrokerProcess) -> Api:
    return Api(proc.http_url)


def status(proc: BrokerProcess) -> dict[str, Any]:
    r = api(proc).get("/api/replication")
    assert r.status == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def wait_for(cond: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        time.sleep(0.05)


def standby_caught_up(active: BrokerProcess) -> bool:
    """One in-sync standby that acknowledged everything the active wrote."""
    s = status(active)
    return any(sb["in_sync"] and sb["acked_seq"] >= s["last_seq"] for sb in s["standbys"])


def start_pair(tmp_path: Path, **settings: object) -> tuple[BrokerProcess, BrokerProcess]:
    active = node(tmp_path / "a", "node-a", "active", **settings).start()
    standby = node(tmp_path / "b", "node-b", "standby", replication_addr(active),
                   **settings).start()
    return active, standby


def promote(proc: BrokerProcess) -> dict[str, Any]:
    """``amqpctl promote`` against the node; its new AMQP port comes back."""
    out = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", proc.http_url,
                          "-u", "guest", "-p", "guest", "--json", "promote"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr + out.stdout
    result: dict[str, Any] = json.loads(out.stdout)
    proc.port = next(x["port"] for x in result["listeners"] if x["protocol"] == "amqp")
    return result


async def _publish(url: str, routing_key: str, bodies: list[bytes], exchange: str = "",
                   batch: int = 200, timeout: float = 30.0) -> list[bool]:
    import aio_pika

    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        ex = ch.default_exchange if not exchange else await ch.get_exchange(exchange)
        results: list[bool] = []
        for i in range(0, len(bodies), batch):
            outcome = await asyncio.gather(*(
                ex.publish(aio_pika.Message(b, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                           routing_key, timeout=timeout)
                for b in bodies[i:i + batch]), return_exceptions=True)
            for o in outcome:
                if isinstance(o, BaseException) and not isinstance(
                        o, aio_pika.exceptions.DeliveryError):
                    raise o
                results.append(not isinstance(o, BaseException))
        return results
    finally:
        await conn.close()


def publish_confirmed(url: str, routing_key: str, bodies: list[bytes], exchange: str = "",
                      timeout: float = 30.0) -> list[bool]:
    """Publish persistent messages with confirms, many in flight; True = acked."""
    return asyncio.run(_publish(url, routing_key, bodies, exchange, timeout=timeout))
