"""etc/amqpd.service: systemd accepts it, and amqpd keeps its side of the contract
(READY=1 over $NOTIFY_SOCKET once it listens, exit 0 on the unit's stop signal)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.install.checkout import ROOT
from tests.support.brokerproc import BrokerProcess

UNIT = ROOT / "etc/amqpd.service"


def unit_settings() -> dict[str, list[str]]:
    """``Key=value`` lines of the unit; a key may repeat (Environment=)."""
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    """systemd-analyze also checks that ExecStart's program exists. The unit names the
    operator's install, /opt/amqpd/bin/amqpd; where that is missing (as on a test
    machine) the copy verified here names the amqpd command of the Python running the
    tests instead, and nothing else changes."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (no systemd here)")
    text = UNIT.read_text()
    exec_start = unit_settings()["ExecStart"][0].split()[0]
    if not Path(exec_start).exists():
        installed = Path(sys.executable).parent / "amqpd"
        if not installed.exists():
            pytest.skip(f"neither {exec_start} nor {installed} exists for ExecStart")
        text = text.replace(f"ExecStart={exec_start}", f"ExecStart={installed}")
    unit = tmp_path / "amqpd.service"
    unit.write_text(text)
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr  # not even a warning


def test_the_unit_runs_amqpd_as_operators_expect() -> None:
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["User"] == ["amqpd"] and s["Group"] == ["amqpd"]
    assert set(s["Environment"]) == {"AMQPD_CONFIG=/etc/amqpd/amqpd.toml",
                                     "AMQPD_DATA_DIR=/var/lib/amqpd"}
    assert s["StateDirectory"] == ["amqpd"]
    assert s["KillSignal"] == ["SIGTERM"] and s["Restart"] == ["on-failure"]
    assert int(s["LimitNOFILE"][0]) >= 65536
    assert s["WantedBy"] == ["multi-user.target"]


def test_amqpd_notifies_readiness_once_it_listens(tmp_path: Path) -> None:
    """As systemd does for Type=notify: a datagram socket in $NOTIFY_SOCKET; READY=1 must
    come only when the AMQP port accepts connections; SIGTERM then ends it with 0."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0.5)
        proc = BrokerProcess(tmp_path / "amqpd", env={"NOTIFY_SOCKET": str(path)})
        try:
            proc.start()
            message = b""
            deadline = time.monotonic() + 30
            while b"READY=1" not in message and time.monotonic() < deadline:
                try:
                    message = sock.recv(4096)
                except TimeoutError:
                    continue
            fields = dict(line.split("=", 1) for line in message.decode().splitlines())
            assert fields["READY"] == "1"
            assert fields["STATUS"] == (f"listening on amqp 127.0.0.1:{proc.port}, "
                                        f"http port {proc.http_port}")
            with socket.create_connection(("127.0.0.1", proc.port), timeout=5):
                pass
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
            assert proc.proc.wait(30) == 0
        finally:
            proc.kill()
