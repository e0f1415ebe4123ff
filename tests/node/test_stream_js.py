"""rabbitmq-stream-js-client (npm) unchanged against amqpd's stream listener: create,
publish, consume from first (tests/node/stream_js_check.js)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from devtools.rabbitmq import free_ports
from tests.support.brokerproc import BrokerProcess

HERE = Path(__file__).parent


def test_stream_js_client_publishes_and_consumes(node_modules: Path, tmp_path: Path) -> None:
    # not run against RabbitMQ 3.10.8: the client sends exchange-command-versions (a
    # 3.11+ command) right after open; 3.10.8's plugin closes the connection, and the
    # client dies on the close frame ("Unknown response 22"), tried 2026-12-06
    (port,) = free_ports(1)
    proc = BrokerProcess(tmp_path, extra_args=["--stream-port", str(port)])
    proc.start()
    try:
        out = subprocess.run(["node", str(HERE / "stream_js_check.js"), str(port)],
                             cwd=HERE, capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [f"j{i}" for i in range(5)]
    finally:
        proc.stop()
