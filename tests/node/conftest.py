"""node_modules for the Node client tests (amqplib, @cloudamqp/amqp-client,
rabbitmq-stream-js-client), installed
with npm from package.json on first use; the tests skip with the reason when node, npm or
the registry is not there. Parallel workers (pytest-xdist) take turns through a file lock,
so two never run npm in the same directory at once."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def node_modules() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed")
    wanted = [HERE / "node_modules" / "amqplib",
              HERE / "node_modules" / "@cloudamqp" / "amqp-client",
              HERE / "node_modules" / "rabbitmq-stream-js-client"]
    with open(HERE / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not all(p.is_dir() for p in wanted):
            try:
                subprocess.run([npm, "install", "--no-audit", "--no-fund", "--no-save"],
                               cwd=HERE, check=True, capture_output=True, timeout=120)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                pytest.skip(f"npm install failed (offline?): {exc}")
    return HERE / "node_modules"
