"""Fixtures for the install tests: a fresh checkout, and one build shared by the session.

These tests install amqpd the ways people and operators do (README's make commands,
``python -m build``, pip, pipx), so they are slow: each install fetches the
dependencies (from pip's cache when warm) and the wheel build compiles the hot path
once (~1 min of CPU) for every test that needs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Variables of the session that runs pytest which must not reach a fresh install: an
# active virtualenv, make's inherited command-line variables, and AMQPD_PURE_PYTHON
# (tests decide themselves whether the install compiles).
_NOT_INHERITED = ("VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES",
                  "PYTHONPATH", "PYTHONHOME", "AMQPD_PURE_PYTHON", "AMQPCTL_URL",
                  "AMQPD_CONFIG")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    env.update(extra)
    return env


def tracked_files() -> list[str]:
    """What a clone of this repository holds (plus files not yet committed but not
    ignored, so an uncommitted change is tested as it will be committed)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot tell which files a clone holds")
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, timeout=60, check=False)
    if r.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: {r.stderr.decode().strip()}")
    return [name for name in r.stdout.decode().split("\0") if name]


def fresh_checkout(dest: Path) -> Path:
    """A copy of the repository's files as a fresh clone has them: no .venv, no build
    output, no compiled modules."""
    for name in tracked_files():
        src = ROOT / name
        if src.is_file():  # a file deleted but not yet committed is gone from a clone
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run(cmd: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure the assertion shows its output."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                       **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{cmd} exited {r.returncode}:\n{tail(r.stdout)}\n{tail(r.stderr)}"
    return r


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build`` of a fresh checkout: the sdist, and a wheel built from it (with
    the compiled hot path: AMQPD_PURE_PYTHON is removed from the environment)."""
    src = fresh_checkout(tmp_path_factory.mktemp("build-src"))
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], timeout=1200,
        env=clean_env())
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return Dist(wheel=wheels[0], sdist=sdists[0])


@pytest.fixture(scope="session")
def make_venv(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A new, empty virtualenv of the Python running the tests."""
    def make(name: str) -> Path:
        venv = tmp_path_factory.mktemp(name) / "venv"
        run([sys.executable, "-m", "venv", str(venv)], timeout=300, env=clean_env())
        return venv
    return make

