"""The install tests' sdist and wheel, built ahead of the test run.

``python -m tests.install.prebuild DIR`` (``make prebuild PREBUILT=DIR``; any Python,
this file needs only the standard library) makes a virtualenv of its own with the
``build`` frontend in DIR/builder (not the project's: ``make install`` may be installing
into that one meanwhile), copies the repository's files as a fresh clone has them into
DIR/src, runs ``python -m build`` on the copy (the wheel compiles the hot path:
AMQPD_PURE_PYTHON is removed from the environment), with every step's output in
DIR/build.log, and writes DIR/result.json last, whatever happened: the exit status, the
digest of the files built and the interpreter. CI (.ci/run) starts it beside ``make
install``, whose compile leaves the machine's second core idle, instead of in the test
run, where every core is taken.

The session fixture ``dist`` (conftest.py) finds DIR in AMQPD_TEST_PREBUILT, waits for
result.json, and takes the sdist and wheel only when they were built by this Python from
exactly the files the tests run on (else it builds them itself, as without the
variable); a failed build fails the tests that need it. Either way the tests check the
same artifacts, made by the same command from the same files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from tests.install import checkout

PREBUILT_ENV = "AMQPD_TEST_PREBUILT"
RESULT = "result.json"
BUILD_TIMEOUT = 1200.0


# the frontend, as pyproject.toml's test extra asks for it
BUILD_FRONTEND = "build>=1.0"


def build_command(src: Path, out: Path, python: str = sys.executable) -> list[str]:
    """``python -m build`` of the checkout ``src``: the sdist, then a wheel built from it."""
    return [python, "-m", "build", "--outdir", str(out), str(src)]


def interpreter() -> dict[str, str]:
    """What decides the wheel's tags: a wheel built by another Python may not install."""
    return {"version": sys.version, "platform": sysconfig.get_platform(),
            "cache_tag": str(sys.implementation.cache_tag)}


def prebuild(where: Path) -> int:
    where.mkdir(parents=True, exist_ok=True)
    builder = where / "builder"
    started = time.monotonic()
    result: dict[str, object] = {"returncode": 1, "digest": None,
                                 "interpreter": interpreter()}
    try:
        with (where / "build.log").open("wb") as log:
            names = checkout.present(checkout.tracked_files())
            src = checkout.fresh_checkout(where / "src", names)
            result["digest"] = checkout.tree_digest(src, names)
            python = str(builder / "bin/python")
            for step in (["sh", str(checkout.ROOT / "devtools/venv.sh"), sys.executable,
                          str(builder)],
                         [python, "-m", "pip", "install", "--quiet", BUILD_FRONTEND],
                         build_command(src, where / "dist", python)):
                log.write(f"$ {' '.join(step)}\n".encode())
                log.flush()
                result["returncode"] = subprocess.run(
                    step, stdout=log, stderr=subprocess.STDOUT, env=checkout.clean_env(),
                    timeout=BUILD_TIMEOUT, check=False).returncode
                if result["returncode"] != 0:
                    break
    except (OSError, subprocess.SubprocessError, checkout.NotACheckout) as exc:
        with (where / "build.log").open("a") as log:
            log.write(f"prebuild failed: {exc!r}\n")
    finally:  # whatever happened: the fixture waits for this file
        result["seconds"] = round(time.monotonic() - started, 1)
        partial = where / (RESULT + ".part")
        partial.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(partial, where / RESULT)  # whole or absent
    return int(str(result["returncode"]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.install.prebuild DIR")
    sys.exit(prebuild(Path(sys.argv[1])))
