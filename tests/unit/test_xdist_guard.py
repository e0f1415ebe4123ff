"""tests/support/xdist_guard.py: a worker that leaves its test loop with tests still
assigned stops the run with a reason, instead of xdist's bare ``assert not crashitem``
(CI's INTERNALERROR, which printed neither a cause nor the failures)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = textwrap.dedent("""
    import pytest
    from tests.support import xdist_guard

    def pytest_configure(config):
        pytest_configure.config = config
        xdist_guard.install(config)

    def pytest_runtest_logfinish(nodeid, location):
        # the worker leaves its loop after this test as if told to shut down (its channel
        # closed): the two tests after it are still assigned to it
        config = pytest_configure.config
        if nodeid.endswith("test_first") and hasattr(config, "workerinput"):
            worker = next(p for p in config.pluginmanager.get_plugins()
                          if type(p).__name__ == "WorkerInteractor")
            # the worker's own Marker: execnet runs xdist.remote as __channelexec__
            worker.nextitem_index = type(worker).run_one_test.__globals__["Marker"].SHUTDOWN
""")

TESTS = textwrap.dedent("""
    def test_first():
        assert True

    def test_second():
        assert False, "an ordinary failure, to be printed"

    def test_third():
        assert True
""")


def test_a_worker_leaving_with_tests_assigned_stops_the_run_saying_so(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_loop.py").write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
         "--dist", "loadfile", "-o", "addopts=", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert "assert not crashitem" not in text, text[-4000:]
    assert "INTERNALERROR" not in text, text[-4000:]
    assert ("Interrupted: xdist worker gw0 ended its session (exit status 0) with 2 test(s) "
            "still assigned, the first test_loop.py::test_second: nothing escaped") in text, \
        text[-4000:]
    assert "the last test it ran: test_loop.py::test_first" in text, text[-4000:]
    assert out.returncode == 2, (out.returncode, text[-4000:])
