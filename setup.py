"""Build hook: compile amqpd's hot path with mypyc, or install pure Python when it can't.

Everything else about the package is in pyproject.toml. The modules compiled are listed in
``amqpd/hotpath.py`` (read here without importing amqpd: its dependencies are not
installed while this runs). The compiled build is optional in every way:

* ``AMQPD_PURE_PYTHON=1`` at install time skips it;
* without mypyc (it ships with mypy, a build requirement) or a C compiler, the build
  warns and the package installs without extensions (a compiler that is not on PATH
  is noticed before mypyc spends half a minute translating the modules to C);
* a build that fails half-way removes what it made, so a partial build never ships
  (``amqpd.hotpath`` would refuse one anyway and run the sources).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _hotpath() -> Any:
    spec = importlib.util.spec_from_file_location("_amqpd_hotpath", HERE / "amqpd/hotpath.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _warn(message: str) -> None:
    print(f"amqpd setup: {message}; installing the pure-Python hot path", file=sys.stderr)


def _missing_compiler() -> str | None:
    """Why the C compiler the build would use cannot run, or None if it is there (or
    unknown, as with MSVC: then the build itself finds out)."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC")
    if not cc:
        return None
    program = shlex.split(cc)[0]
    if shutil.which(program) is None:
        return f"no C compiler ({program} is not on PATH)"
    return None


# The setup.py commands that compile. A PEP 517 frontend also runs this file for
# metadata (egg_info, dist_info) and for the sdist: those need no translation to C.
BUILD_COMMANDS = frozenset({"build", "build_ext", "bdist_wheel", "editable_wheel",
                            "develop", "install", "bdist_egg"})


def compiled_extensions() -> list[Any]:
    hotpath = _hotpath()
    if os.environ.get(hotpath.PURE_ENV, "") not in ("", "0"):
        return []
    if BUILD_COMMANDS.isdisjoint(sys.argv[1:]):
        return []
    missing = _missing_compiler()
    if missing:
        _warn(missing)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        _warn(f"mypyc is not available ({exc})")
        return []
    os.chdir(HERE)  # mypycify wants paths relative to the project
    paths = [str(Path(*m.split(".")).with_suffix(".py")) for m in hotpath.COMPILED_MODULES]
    try:
        return list(mypycify(paths, opt_level="3", debug_level="0"))
    except BaseException as exc:  # mypyc reports type errors with SystemExit
        _warn(f"mypyc could not compile the hot path ({exc!r})")
        return []


class OptionalBuildExt(build_ext):
    """All extensions or none: a failed C compile leaves the pure-Python package."""

    def run(self) -> None:
        self._remove_leftovers()
        try:
            super().run()
            if self.extensions:
                self._stamp()
        except Exception as exc:
            _warn(f"compiling the hot path failed ({exc!r})")
            for ext in self.extensions:
                for path in self._outputs(ext):
                    if os.path.exists(path):
                        os.remove(path)
            del self.extensions[:]

    def _remove_leftovers(self) -> None:
        """Compiled files of an earlier build whose module list differed: a leftover
        module would be imported instead of its source and link to a library that is
        no longer built (amqpd.hotpath refuses to run with one)."""
        wanted = {self.get_ext_filename(ext.name) for ext in self.extensions}
        suffix = importlib.machinery.EXTENSION_SUFFIXES[-1]  # ".so": every other ends so
        for base in {Path(self.build_lib), HERE}:
            for path in [*(base / "amqpd").rglob(f"*{suffix}"), *base.glob(f"*__mypyc*{suffix}")]:
                if str(path.relative_to(base)) not in wanted:
                    path.unlink()

    def _stamp(self) -> None:
        """Record what was compiled, beside every copy of the built package (the
        in-place one of an editable install, and the one a wheel is made from)."""
        hotpath = _hotpath()
        for package in {Path(self.build_lib) / "amqpd",
                        Path(self.get_ext_fullpath("amqpd.x")).parent}:
            if package.is_dir():
                hotpath.write_stamp(package, sources=HERE / "amqpd")

    def _outputs(self, ext: Any) -> tuple[str, str]:
        return (self.get_ext_fullpath(ext.name),
                os.path.join(self.build_lib, self.get_ext_filename(ext.name)))


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": OptionalBuildExt})
