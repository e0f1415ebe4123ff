"""README's two commands in a fresh clone, with the machine's PEP 668-marked Python.

On Debian and Ubuntu, pip refuses to install into the system's /usr/bin/python3 (it is
"externally managed", PEP 668); pip ignores the marker inside a virtualenv, so only the
real system interpreter shows whether the Makefile keeps out of it. The Makefile must
make .venv/ with it and install there; `make run` then serves from .venv/ and `make
test` tests there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from tests.install.checkout import ROOT, clean_env
from tests.install.conftest import fresh_checkout, run, tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SYSTEM_PYTHON = Path("/usr/bin/python3")


def _why_not_system_python() -> str | None:
    """Why the PEP 668 test cannot run here, or None."""
    if shutil.which("make") is None:
        return "make is not installed"
    if not SYSTEM_PYTHON.exists():
        return f"no {SYSTEM_PYTHON} on this machine"
    probe = subprocess.run(
        [str(SYSTEM_PYTHON), "-I", "-c",
         "import os, sys, sysconfig, importlib.util as u\n"
         "print(sys.version_info >= (3, 11),"
         " os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')),"
         " u.find_spec('ensurepip') is not None)"],
        capture_output=True, text=True, timeout=60, check=False)
    recent, marked, ensurepip = (w == "True" for w in probe.stdout.split())
    if not recent:
        return f"{SYSTEM_PYTHON} is older than 3.11"
    if not marked:
        return f"{SYSTEM_PYTHON} is not marked externally managed (no PEP 668 marker)"
    if not ensurepip and not (os.geteuid() == 0 and shutil.which("apt-get")):
        return (f"{SYSTEM_PYTHON} has no venv module (python3-venv) and this user cannot "
                "install it")
    return None


def make(clone: Path, *args: str, timeout: float = 1200,
         **env: str) -> subprocess.CompletedProcess[str]:
    return run(["make", "--no-print-directory", *args], timeout=timeout, cwd=clone,
               env=clean_env(**env))


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A fresh clone after `make install PYTHON=/usr/bin/python3` (what `make run` and
    `make test` begin with). AMQPD_PURE_PYTHON=1 skips the compile to save a minute:
    the wheel test (test_packaging.py) covers compiling."""
    why = _why_not_system_python()
    if why:
        pytest.skip(why)
    clone = fresh_checkout(tmp_path_factory.mktemp("clone") / "amqpd")
    out = make(clone, "install", f"PYTHON={SYSTEM_PYTHON}", AMQPD_PURE_PYTHON="1")
    return clone, out.stdout


def test_make_install_makes_a_project_venv_with_the_system_python(
        clone: tuple[Path, str], tmp_path: Path) -> None:
    path, output = clone
    assert f"making the virtualenv .venv with {SYSTEM_PYTHON}" in output
    assert "installing amqpd and its test tools into .venv" in output
    cfg = (path / ".venv/pyvenv.cfg").read_text()
    assert f"home = {SYSTEM_PYTHON.parent}" in cfg.splitlines()
    located = run([str(path / ".venv/bin/python"), "-I", "-c",
                   "import amqpd, pytest; print(amqpd.__file__)"], timeout=60,
                  cwd=tmp_path).stdout.strip()
    assert Path(located) == path / "amqpd/__init__.py"  # editable: this checkout
    in_system = subprocess.run(
        [str(SYSTEM_PYTHON), "-I", "-c",
         "import importlib.util as u; print(u.find_spec('amqpd') is not None)"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert in_system.stdout.strip() == "False", "amqpd went into the system interpreter"


def test_make_run_serves_from_the_venv(clone: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = clone
    ready = tmp_path / "ready.json"
    args = (f"--bind 127.0.0.1 --port 0 --http-port 0 --data-dir {tmp_path / 'data'} "
            f"--ready-file {ready}")
    log = tmp_path / "make-run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["make", "--no-print-directory", "run",
                                 f"PYTHON={SYSTEM_PYTHON}", f"ARGS={args}"],
                                cwd=path, env=clean_env(AMQPD_PURE_PYTHON="1"), stdout=out,
                                stderr=subprocess.STDOUT)
    broker_pid = None
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, f"make run exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no broker in 120 s:\n{log.read_text()}"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        broker_pid = int(info["pid"])
        argv = Path(f"/proc/{broker_pid}/cmdline").read_bytes().split(b"\0")
        assert argv[:3] == [b".venv/bin/python", b"-m", b"amqpd"], argv
        assert "amqpd is installed in .venv and up to date" in log.read_text()
        params = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{info['amqp_port']}/%2F")
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare("make-run-q")
        ch.basic_publish("", "make-run-q", b"hello")
        deadline = time.monotonic() + 10
        body = None
        while body is None and time.monotonic() < deadline:
            _m, _p, body = ch.basic_get("make-run-q", auto_ack=True)
        assert body == b"hello"
        conn.close()
        os.kill(broker_pid, signal.SIGTERM)  # the broker, by the PID it reported
        assert proc.wait(60) == 0, tail(log.read_text())
    finally:
        if proc.poll() is None:
            if broker_pid is not None:
                os.kill(broker_pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)


def test_make_test_runs_pytest_in_the_venv(clone: tuple[Path, str]) -> None:
    path, _ = clone
    out = make(path, "test", f"PYTHON={SYSTEM_PYTHON}", "PYTEST_ARGS=tests/unit/test_config.py",
               "WORKERS_TESTS=tests/unit/test_config.py",
               "PURE_TESTS=tests/unit/test_hotpath.py").stdout
    assert "amqpd is installed in .venv and up to date" in out
    assert "'.venv/bin/python' -m pytest -q tests/unit/test_config.py" in out
    assert "--- again against nodes of two workers (AMQPD_WORKERS=2)" in out
    assert out.count(" passed") == 3, out  # the suite, with two workers, pure


def test_make_install_again_only_when_a_source_changed(clone: tuple[Path, str]) -> None:
    path, _ = clone
    out = make(path, "install", f"PYTHON={SYSTEM_PYTHON}", AMQPD_PURE_PYTHON="1").stdout
    assert "up to date" in out and "installing" not in out
    time.sleep(0.01)  # a later modification time than the stamp's, on any file system
    os.utime(path / "amqpd/config.py")
    out = make(path, "install", f"PYTHON={SYSTEM_PYTHON}", AMQPD_PURE_PYTHON="1").stdout
    assert "installing amqpd and its test tools into .venv" in out


def test_make_uses_the_active_virtualenv(clone: tuple[Path, str],
                                         tmp_path: Path) -> None:
    """With $VIRTUAL_ENV set (an activated virtualenv), make installs this checkout there
    and makes no .venv/ of its own. (Last in this file: it points the clone's virtualenv
    at another checkout.)"""
    path, _ = clone
    other = fresh_checkout(tmp_path / "other")
    active = path / ".venv"
    out = make(other, "install", VIRTUAL_ENV=str(active), AMQPD_PURE_PYTHON="1").stdout
    assert f"installing amqpd and its test tools into {active}" in out
    assert not (other / ".venv").exists()
    located = run([str(active / "bin/python"), "-I", "-c", "import amqpd; print(amqpd.__file__)"],
                  timeout=60, cwd=tmp_path).stdout.strip()
    assert Path(located) == other / "amqpd/__init__.py"


def test_a_python_without_ensurepip_is_named_and_left_alone(tmp_path: Path) -> None:
    """A Python whose venv cannot install pip (Debian's without python3-venv): make
    says what to do and leaves no half-made virtualenv. The interpreter here is this
    one with ``ensurepip`` hidden; not under /usr, so no apt-get is attempted."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    if sys.base_prefix == "/usr":
        pytest.skip("the tests run on the distribution's Python: with ensurepip hidden, "
                    "make would apt-get install python3-venv instead of explaining")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "ensurepip.py").write_text("raise ImportError('hidden by the test')\n")
    fake = tmp_path / "python3"
    fake.write_text(f"#!/bin/sh\nPYTHONPATH={hide} exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    r = subprocess.run(["make", "--no-print-directory", "venv", f"PYTHON={fake}",
                        f"VENV={venv}"], cwd=ROOT, env=clean_env(), capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode != 0
    assert "cannot make a virtualenv: it has no ensurepip module" in r.stderr, r.stderr
    assert "run make inside an active virtualenv" in r.stderr
    assert not venv.exists()
