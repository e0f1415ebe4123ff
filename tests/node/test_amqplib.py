"""Node's amqplib against a real amqpd: publish, consume and confirm (skipped without node)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from tests.support.brokerproc import BrokerProcess

HERE = Path(__file__).parent


def test_amqplib_publish_consume_confirm(broker: BrokerProcess, node_modules: Path) -> None:
    prefix = f"node-{uuid.uuid4().hex[:8]}"
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/"
    proc = subprocess.run(["node", str(HERE / "amqplib_check.js"), url, prefix], cwd=HERE,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "serverProperties": "amqpd",
        "confirmed": 50,
        "consumerTag": result["consumerTag"],
        "inOrder": True,
        "redelivered": True,
        "returned": True,
        "notFound": 404,
    }
    assert result["consumerTag"].startswith("amq.ctag-")  # amqplib lets the server name it
