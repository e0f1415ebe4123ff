"""A short, bounded coverage-guided fuzzing run (atheris) of the frame parser and the
connection state machine; the longer run is fuzz/run.sh (see fuzz/connection.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run_atheris(module: str, runs: int, tmp_path: Path) -> None:
    """A bounded run of the harness ``module`` (python -m): it must finish and leave no
    crash input behind."""
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    env = dict(os.environ, AMQPD_PURE_PYTHON="1")
    proc = subprocess.run(
        [sys.executable, "-m", module, f"-runs={runs}", "-max_total_time=60",
         f"-artifact_prefix={tmp_path}/", "-print_final_stats=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Done" in proc.stderr or "stat::number_of_executed_units" in proc.stderr
    assert not list(tmp_path.glob("crash-*")), proc.stderr[-4000:]


def test_short_atheris_run_finds_nothing(tmp_path: Path) -> None:
    run_atheris("fuzz.connection", 1500, tmp_path)
