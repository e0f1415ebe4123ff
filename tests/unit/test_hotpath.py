"""Which hot path runs: the compiled modules only when every one is built and current."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqpd import hotpath

MODULES = ("amqpd.protocol.frames", "amqpd.broker.queue")
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]


def make_tree(root: Path, compiled: tuple[str, ...], ext_age: float = 0.0) -> None:
    """Sources for MODULES under ``root``; an (empty) extension file for ``compiled``."""
    for module in MODULES:
        src = hotpath.source_path(module, root)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text("")
        os.utime(src, (1_000_000, 1_000_000))
        if module in compiled:
            ext = src.with_suffix(EXT)
            ext.write_bytes(b"")
            os.utime(ext, (1_000_000 + ext_age, 1_000_000 + ext_age))


def test_nothing_built_runs_the_sources(tmp_path: Path) -> None:
    make_tree(tmp_path, ())
    assert hotpath.decide(MODULES, {}, tmp_path) == (
        False, "pure Python (not compiled at install)")


def test_a_full_current_build_runs_compiled(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES, ext_age=10)
    assert hotpath.decide(MODULES, {}, tmp_path) == (True, "compiled (mypyc)")


def test_the_environment_variable_forces_the_sources(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES, ext_age=10)
    ok, why = hotpath.decide(MODULES, {hotpath.PURE_ENV: "1"}, tmp_path)
    assert not ok and hotpath.PURE_ENV in why
    assert hotpath.decide(MODULES, {hotpath.PURE_ENV: "0"}, tmp_path)[0]


def test_a_partial_build_is_never_used(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES[:1], ext_age=10)
    ok, why = hotpath.decide(MODULES, {}, tmp_path)
    assert not ok and "partial build" in why and MODULES[1] in why


def test_a_build_older_than_its_source_is_never_used(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES, ext_age=-10)
    ok, why = hotpath.decide(MODULES, {}, tmp_path)
    assert not ok and "older than its source" in why


def test_pure_mode_loads_every_listed_module_from_its_source() -> None:
    """In a fresh interpreter with AMQPD_PURE_PYTHON=1 no compiled module is imported,
    whether or not this checkout has a build."""
    code = ("import amqpd, importlib, amqpd.hotpath as h\n"
            "mods = [importlib.import_module(m) for m in h.COMPILED_MODULES]\n"
            "print(h.MODE); print(*[m.__file__ for m in mods], sep='\\n')")
    env = dict(os.environ, **{hotpath.PURE_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert hotpath.PURE_ENV in out[0]
    assert len(out) == 1 + len(hotpath.COMPILED_MODULES)
    assert all(path.endswith(".py") for path in out[1:]), out


def test_a_build_in_this_checkout_is_the_one_that_runs() -> None:
    """After ``make install`` (which rebuilds when a source changed) a build present here
    must be complete and current, or the broker would quietly run at pure-Python speed."""
    if os.environ.get(hotpath.PURE_ENV, "") not in ("", "0"):
        pytest.skip("pure Python requested")
    built = [m for m in hotpath.COMPILED_MODULES if hotpath._extension_path(m)]
    if not built:
        pytest.skip("no compiled hot path in this checkout (no compiler at install?)")
    assert hotpath.COMPILED, f"{hotpath.MODE}: run `make install` to rebuild"
    import amqpd.broker.channel as channel

    assert not channel.__file__ or not channel.__file__.endswith(".py")
