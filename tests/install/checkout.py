"""The repository's files as a fresh clone has them, without pytest: used by the install
tests' fixtures (conftest.py) and by the ahead-of-time build (prebuild.py), which runs
before the test tools are installed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Variables of the session that runs pytest which must not reach a fresh install: an
# active virtualenv, make's inherited command-line variables, and AMQPD_PURE_PYTHON
# (tests decide themselves whether the install compiles).
_NOT_INHERITED = ("VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES",
                  "PYTHONPATH", "PYTHONHOME", "AMQPD_PURE_PYTHON", "AMQPCTL_URL",
                  "AMQPD_CONFIG")


class NotACheckout(Exception):
    """Which files a clone holds cannot be told here (the reason is the message)."""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    env.update(extra)
    return env


def tracked_files() -> list[str]:
    """What a clone of this repository holds (plus files not yet committed but not
    ignored, so an uncommitted change is tested as it will be committed)."""
    if shutil.which("git") is None:
        raise NotACheckout("git is not installed: cannot tell which files a clone holds")
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, timeout=60, check=False)
    if r.returncode != 0:
        raise NotACheckout(f"{ROOT} is not a git checkout: {r.stderr.decode().strip()}")
    return [name for name in r.stdout.decode().split("\0") if name]


def present(names: list[str]) -> list[str]:
    """``names`` without the files deleted but not yet committed (gone from a clone)."""
    return [name for name in names if (ROOT / name).is_file()]


def fresh_checkout(dest: Path, names: list[str] | None = None) -> Path:
    """A copy of the repository's files (``names``, by default all of
    :func:`tracked_files`) as a fresh clone has them: no .venv, no build output, no
    compiled modules."""
    for name in present(tracked_files() if names is None else names):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return dest


def tree_digest(base: Path, names: list[str]) -> str:
    """One SHA-256 over the names and contents of ``names`` under ``base``: equal for
    two trees exactly when they hold the same files with the same bytes."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256((base / name).read_bytes()).digest())
    return h.hexdigest()
