"""A bad setting stops ``amqpd`` before anything starts: one line on stderr naming the
setting (or the data directory) and exit code 2, wherever the value came from (flag,
config file, AMQPD_* variable). Issue 33's papercuts: a port above 65535 used to wrap
(--http-port 70000 ran on 4464) or end in an OverflowError traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run_amqpd(tmp_path: Path, args: list[str], env: dict[str, str] | None = None,
               config: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``amqpd`` with a data directory under tmp_path (unless ``args`` names one);
    the process must stop by itself: the timeout fails the test if it starts instead."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AMQPD_")}
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "amqpd", "--bind", "127.0.0.1"]
    if "--data-dir" not in args:
        cmd += ["--data-dir", str(tmp_path / "data")]
    if config is not None:
        cfg = tmp_path / "amqpd.toml"
        cfg.write_text(config)
        cmd += ["--config", str(cfg)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=full_env,
                          timeout=60, check=False)


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "env", "config", "message"), [
    (["--port", "70000"], None, None,
     "amqpd: setting 'port': port 70000 is out of range (0 = ephemeral, or 1-65535)"),
    (["--http-port", "70000"], None, None,
     "amqpd: setting 'http_port': port 70000 is out of range (0 = ephemeral, or 1-65535)"),
    ([], None, "port = 99999\n",
     "amqpd: setting 'port': port 99999 is out of range (0 = ephemeral, or 1-65535)"),
    ([], {"AMQPD_TLS_PORT": "65536"}, None,
     "amqpd: setting 'tls_port': port 65536 is out of range (0 = ephemeral, or 1-65535)"),
    ([], None, "log_level = \"verbose\"\n",
     "amqpd: setting 'log_level' must be one of debug, info, warning, error, not 'verbose'"),
])
def test_a_bad_setting_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                              env: dict[str, str] | None,
                                              config: str | None, message: str) -> None:
    result = _run_amqpd(tmp_path, args, env, config)
    assert result.returncode == 2, result.stderr
    assert _one_line(result) == message
    assert not (tmp_path / "data").exists()  # refused before anything was created


def test_data_dir_at_a_file(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    result = _run_amqpd(tmp_path, ["--data-dir", str(target)])
    assert result.returncode == 2, result.stderr
    assert _one_line(result) == (f"amqpd: data directory '{target}' is not a directory "
                                 "(a file is there)")


def test_data_dir_at_an_impossible_path(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    target = blocker / "data"
    result = _run_amqpd(tmp_path, ["--data-dir", str(target)])
    assert result.returncode == 2, result.stderr
    assert _one_line(result) == (f"amqpd: data directory '{target}' cannot be created: "
                                 "Not a directory")
