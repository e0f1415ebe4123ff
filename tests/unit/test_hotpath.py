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


def make_tree(root: Path, compiled: tuple[str, ...], stamp: bool = True) -> None:
    """Sources for MODULES under ``root``; an (empty) extension file for ``compiled``, and
    the build's stamp of the sources, as setup.py writes it."""
    for module in MODULES:
        src = hotpath.source_path(module, root)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"# {module}\n")
        if module in compiled:
            ext = src.with_suffix(EXT)
            ext.write_bytes(b"")
            # pip extracts wheels in any order: times must not matter
            os.utime(ext, (1_000, 1_000))
    if stamp:
        hotpath.write_stamp(root, MODULES, sources=root)


def test_nothing_built_runs_the_sources(tmp_path: Path) -> None:
    make_tree(tmp_path, ())
    assert hotpath.decide(MODULES, {}, tmp_path) == (
        False, "pure Python (not compiled at install)")


def test_a_full_current_build_runs_compiled(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES)
    assert hotpath.decide(MODULES, {}, tmp_path) == (True, "compiled (mypyc)")


def test_the_environment_variable_forces_the_sources(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES)
    ok, why = hotpath.decide(MODULES, {hotpath.PURE_ENV: "1"}, tmp_path)
    assert not ok and hotpath.PURE_ENV in why
    assert hotpath.decide(MODULES, {hotpath.PURE_ENV: "0"}, tmp_path)[0]


def test_a_partial_build_is_never_used(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES[:1])
    ok, why = hotpath.decide(MODULES, {}, tmp_path)
    assert not ok and "partial build" in why and MODULES[1] in why


def test_a_build_of_another_source_is_never_used(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES)
    hotpath.source_path(MODULES[1], tmp_path).write_text("# edited after the build\n")
    ok, why = hotpath.decide(MODULES, {}, tmp_path)
    assert not ok and "changed since it was compiled" in why and MODULES[1] in why


def test_a_build_without_its_stamp_is_never_used(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES, stamp=False)
    ok, why = hotpath.decide(MODULES, {}, tmp_path)
    assert not ok and hotpath.STAMP in why


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


def test_a_compiled_file_left_by_an_older_build_stops_the_compiled_path(tmp_path: Path) -> None:
    make_tree(tmp_path, MODULES)
    extra = hotpath.source_path("amqpd.broker.message", tmp_path)
    extra.write_text("")
    extra.with_suffix(EXT).write_bytes(b"")
    assert hotpath.leftovers(MODULES, tmp_path) == ["amqpd.broker.message"]
    ok, why = hotpath.decide(MODULES, {}, tmp_path)
    assert not ok and "left by an older build" in why and "amqpd.broker.message" in why
