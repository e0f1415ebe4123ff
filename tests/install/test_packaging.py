"""``python -m build``: a wheel with the compiled hot path, an sdist that installs as pure
Python without a compiler, and the commands pip and pipx install from them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

import amqpd
from amqpd import hotpath
from tests.install.checkout import clean_env
from tests.install.conftest import Dist, run, tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

COMMANDS = ("amqpd", "amqpctl", "amqpd-conformance")


@contextlib.contextmanager
def serving(amqpd_command: Path, tmp: Path, env: dict[str, str]) -> Iterator[dict[str, object]]:
    """Start ``amqpd_command`` on ephemeral loopback ports, yield its ready-file info,
    then stop it with SIGTERM (it must exit 0)."""
    ready = tmp / "ready.json"
    log = tmp / "amqpd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(amqpd_command), "--bind", "127.0.0.1", "--port", "0", "--http-port", "0",
             "--data-dir", str(tmp / "data"), "--ready-file", str(ready)],
            cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, f"amqpd exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"amqpd not ready in 60 s:\n{log.read_text()}"
            time.sleep(0.05)
        yield json.loads(ready.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, tail(log.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def round_trip(port: int, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"from the wheel", pika.BasicProperties(delivery_mode=2))
        _method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"from the wheel"
    finally:
        conn.close()


def test_the_wheel_is_compiled_for_this_platform_and_the_sdist_is_complete(
        dist: Dist) -> None:
    assert dist.wheel.name.startswith(f"amqpd-{amqpd.__version__}-")
    assert dist.sdist.name == f"amqpd-{amqpd.__version__}.tar.gz"
    tag = dist.wheel.name.removesuffix(".whl").split("-", 2)[2]
    assert "none-any" not in tag, f"a pure wheel ({tag}): the hot path was not compiled"
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    for module in hotpath.COMPILED_MODULES:
        stem = "/".join(module.split("."))
        assert any(n.startswith(stem + ".") and n.endswith(".so") for n in names), module
    assert f"amqpd/{hotpath.STAMP}" in names
    data = f"amqpd-{amqpd.__version__}.data/data/share/amqpd"
    assert {f"{data}/amqpd.service", f"{data}/amqpd.toml"} <= names
    with tarfile.open(dist.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"setup.py", "pyproject.toml", "amqpd/hotpath.py", "etc/amqpd.service",
            "etc/amqpd.toml", "docs/operations.md", "conformance/cli.py"} <= members
    assert not [m for m in members if m.endswith((".so", hotpath.STAMP))]


@pytest.fixture(scope="module")
def wheel_venv(dist: Dist, make_venv: Callable[[str], Path]) -> Path:
    venv = make_venv("wheel")
    run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(dist.wheel)],
        timeout=900, env=clean_env())
    return venv


def test_the_installed_wheel_serves_clients(wheel_venv: Path, tmp_path: Path) -> None:
    """pip install of the wheel into a fresh virtualenv gives the three commands; the
    broker runs the compiled hot path and answers AMQP, the API and the conformance
    suite's channel cases."""
    bin_dir = wheel_venv / "bin"
    env = clean_env()
    version = run([str(bin_dir / "amqpd"), "--version"], timeout=60, env=env).stdout
    assert version.strip() == f"amqpd {amqpd.__version__} (hot path: compiled (mypyc))"
    for command in ("amqpctl", "amqpd-conformance"):
        run([str(bin_dir / command), "--help"], timeout=60, env=env)
    assert (wheel_venv / "share/amqpd/amqpd.service").is_file()
    with serving(bin_dir / "amqpd", tmp_path, env) as info:
        port, http_port = int(str(info["amqp_port"])), int(str(info["http_port"]))
        round_trip(port, "wheel-q")
        listed = run([str(bin_dir / "amqpctl"), "--url", f"http://127.0.0.1:{http_port}",
                      "--json", "list_queues", "name"], timeout=60, env=env).stdout
        assert {"name": "wheel-q"} in json.loads(listed)
        overview = run([str(bin_dir / "amqpctl"), "--url", f"http://127.0.0.1:{http_port}",
                        "--json", "status"], timeout=60, env=env).stdout
        assert json.loads(overview)["node"]
        # exits 0 only when no case failed
        run([str(bin_dir / "amqpd-conformance"), "--url",
             f"amqp://guest:guest@127.0.0.1:{port}/%2F", "--only", "^channel", "--quiet"],
            timeout=300, env=env)


def test_the_sdist_installs_as_pure_python_without_a_compiler(
        dist: Dist, make_venv: Callable[[str], Path], tmp_path: Path) -> None:
    """pip builds the sdist with no C compiler on PATH (an empty PATH: pip and the build
    run by absolute path): setup.py warns and the package installs without extensions.
    The dependencies are left out (--no-deps): the wheel test covers them, and which hot
    path runs is decided by amqpd/__init__.py, which needs none."""
    venv = make_venv("sdist")
    no_tools = tmp_path / "empty-bin"
    no_tools.mkdir()
    run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-deps",
         str(dist.sdist)], timeout=900, env=clean_env(PATH=str(no_tools)))
    mode = run([str(venv / "bin/python"), "-c", "import amqpd.hotpath as h; print(h.MODE)"],
               timeout=60, env=clean_env(), cwd=tmp_path).stdout.strip()
    assert mode == "pure Python (not compiled at install)"
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not list((site / "amqpd").rglob("*.so")) and not list(site.glob("*__mypyc*"))
    wheel_info = next(site.glob("amqpd-*.dist-info")) / "WHEEL"
    assert "Root-Is-Purelib: true" in wheel_info.read_text()


def test_pipx_installs_the_three_commands(dist: Dist, tmp_path: Path) -> None:
    """pipx (a test dependency) installs the built wheel into its own virtualenv and
    links the commands into PIPX_BIN_DIR, as `pipx install .` does after building."""
    home, bin_dir = tmp_path / "pipx", tmp_path / "bin"
    env = clean_env(PIPX_HOME=str(home), PIPX_BIN_DIR=str(bin_dir),
                    PIPX_MAN_DIR=str(tmp_path / "man"))
    run([sys.executable, "-m", "pipx", "install", "--python", sys.executable,
         str(dist.wheel)], timeout=900, env=env)
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted(COMMANDS)
    version = run([str(bin_dir / "amqpd"), "--version"], timeout=60, env=env).stdout
    assert version.startswith(f"amqpd {amqpd.__version__} ")
    for command in ("amqpctl", "amqpd-conformance"):
        run([str(bin_dir / command), "--help"], timeout=60, env=env)
    with serving(bin_dir / "amqpd", tmp_path, env) as info:
        round_trip(int(str(info["amqp_port"])), "pipx-q")
    assert os.path.realpath(bin_dir / "amqpd").startswith(str(home))
