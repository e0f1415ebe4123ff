"""Fixtures for the install tests: a fresh checkout, and one build shared by the session.

These tests install amqpd the ways people and operators do (README's make commands,
``python -m build``, pip, pipx), so they are slow: each install fetches the
dependencies (from pip's cache when warm) and the wheel build compiles the hot path
once (2.5 min of CPU here) for every test that needs it, or takes the build that
``make prebuild`` made ahead (prebuild.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.install import checkout, prebuild
from tests.install.checkout import ROOT, clean_env


def tracked_files() -> list[str]:
    """:func:`checkout.tracked_files`, or the test skipped with the reason."""
    try:
        return checkout.tracked_files()
    except checkout.NotACheckout as exc:
        pytest.skip(str(exc))


def fresh_checkout(dest: Path) -> Path:
    """:func:`checkout.fresh_checkout` of :func:`tracked_files`."""
    return checkout.fresh_checkout(dest, tracked_files())


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


def _found(out: Path) -> Dist:
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return Dist(wheel=wheels[0], sdist=sdists[0])


def _prebuilt(where: Path) -> Dist | None:
    """The dist prebuild.py made in ``where`` (waiting, bounded, for it to finish), or
    None when it was made by another Python or from other files than these."""
    result = where / prebuild.RESULT
    deadline = time.monotonic() + prebuild.BUILD_TIMEOUT + 60
    while not result.exists():
        assert time.monotonic() < deadline, f"no {result} after {prebuild.BUILD_TIMEOUT} s"
        time.sleep(0.5)  # polling the build started by make prebuild
    info = json.loads(result.read_text())
    log = where / "build.log"
    assert info["returncode"] == 0, \
        f"python -m build exited {info['returncode']}:\n{tail(log.read_text())}"
    names = checkout.present(tracked_files())
    if info["interpreter"] != prebuild.interpreter() or \
            info["digest"] != checkout.tree_digest(ROOT, names):
        print(f"{where}: built by another Python or from other files; building again")
        return None
    print(f"{where}: built ahead in {info['seconds']} s")
    return _found(where / "dist")


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build`` of a fresh checkout: the sdist, and a wheel built from it (with
    the compiled hot path: AMQPD_PURE_PYTHON is removed from the environment). Built
    ahead by ``make prebuild`` when AMQPD_TEST_PREBUILT names its directory (prebuild.py
    says when that one is taken)."""
    where = os.environ.get(prebuild.PREBUILT_ENV)
    if where:
        found = _prebuilt(Path(where))
        if found is not None:
            return found
    src = fresh_checkout(tmp_path_factory.mktemp("build-src"))
    out = tmp_path_factory.mktemp("dist")
    run(prebuild.build_command(src, out), timeout=prebuild.BUILD_TIMEOUT, env=clean_env())
    return _found(out)


@pytest.fixture(scope="session")
def make_venv(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A new, empty virtualenv of the Python running the tests."""
    def make(name: str) -> Path:
        venv = tmp_path_factory.mktemp(name) / "venv"
        run([sys.executable, "-m", "venv", str(venv)], timeout=300, env=clean_env())
        return venv
    return make

