"""Node clients as RabbitMQ users run them, on amqpd and on a private RabbitMQ 3.10:

- amqplib closing a busy connection (a burst of publishes, then connection.close; frames
  may follow the close on the wire): no ECONNRESET, the callback API's close returns;
- @cloudamqp/amqp-client with heartbeat=1 (it only echoes the broker's heartbeats and
  drops a socket silent for one second) stays connected while idle;
- @cloudamqp/amqp-client's session RPC (rpcServer / rpcClient / rpcCall over direct
  reply-to), with server and client on one connection and on two, and its clean-up
  (the queue deleted under the server's consumer: the broker's basic.cancel must carry
  nowait=true, or the client answers cancel-ok and the connection dies with 503).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from tests.support.targets import both_brokers

__all__ = ["both_brokers"]  # the fixture, imported for pytest

HERE = Path(__file__).parent


def _node(script: str, *args: str, timeout: float = 90) -> dict[str, object]:
    proc = subprocess.run(["node", str(HERE / script), *args], cwd=HERE, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def _url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def test_amqplib_close_after_a_burst(both_brokers: int, node_modules: Path) -> None:
    result = _node("amqplib_close_check.js", _url(both_brokers), f"close-{uuid.uuid4().hex[:8]}",
                   "10")
    assert result == {"callbackClosed": 10, "promiseClosed": 10, "errors": []}


def test_amqp_client_heartbeat_of_one_second(both_brokers: int, node_modules: Path) -> None:
    result = _node("amqp_client_check.mjs", "heartbeat", _url(both_brokers),
                   f"hb-{uuid.uuid4().hex[:8]}")
    assert result == {"negotiated": 1, "closedWhileIdle": None, "body": "still here"}


def test_amqp_client_rpc_over_direct_reply_to(both_brokers: int, node_modules: Path) -> None:
    result = _node("amqp_client_check.mjs", "rpc", _url(both_brokers),
                   f"rpc-{uuid.uuid4().hex[:8]}")
    assert result == {
        "sameConnection": ["processed:a", "processed:b", "processed:c"],
        "rpcCall": "processed:once",
        "sequentialCalls": 10,
        "otherConnection": ["processed:x", "processed:y"],
    }
