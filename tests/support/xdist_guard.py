"""Say why a pytest-xdist worker ended its session while tests were still assigned to it.

A worker ends its session early when an exception escapes its test loop (anything a
test phase did not catch, e.g. a ``Failed`` raised outside setup, call and teardown) or
when its channel to the controller closes. pytest-xdist 3.8 then fails the whole run
with an ``INTERNALERROR`` (``assert not crashitem`` in ``worker_workerfinished``) and
prints neither the cause nor the failures so far: CI saw exactly that once, naming a
test that had passed three of three runs here, with nothing else to go on.

This plugin records, on the worker, what escaped and during which test; on the
controller it turns such an ending into a stop of the run with that reason
(``shouldstop``, which xdist handles like ``--maxfail``), so the log's tail names the
cause and pytest prints the failures and the summary as for any interrupted run. The
run still fails: nothing is retried or hidden.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Generator
from typing import Any

import pytest

_KEY = "amqpd_escaped"
_LAST = "amqpd_last_test"


class _Worker:
    """Worker side: which test is running, and what escaped the loop."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.current = ""
        self.last = ""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        self.current = item.nodeid
        result = yield
        self.current = ""
        self.last = item.nodeid
        return result

    def pytest_sessionfinish(self) -> None:
        self.config.workeroutput[_LAST] = self.last  # type: ignore[attr-defined]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        try:
            return (yield)
        except BaseException as exc:
            where = f"during {self.current}" if self.current else "between tests"
            text = "".join(traceback.format_exception(exc))
            reason = f"{type(exc).__name__}: {exc} escaped the test loop {where}"
            self.config.workeroutput[_KEY] = reason  # type: ignore[attr-defined]
            sys.stderr.write(f"xdist_guard: {reason}\n{text}")
            sys.stderr.flush()
            raise


def _pending(sched: Any, node: Any) -> list[str]:
    """The tests still assigned to ``node`` (``--dist load`` and ``loadfile`` alike)."""
    with_pending = getattr(sched, "node2pending", None)
    if isinstance(with_pending, dict) and node in with_pending:
        collection = getattr(sched, "collection", None) or []
        return [collection[i] for i in with_pending[node] if i < len(collection)]
    assigned = getattr(sched, "assigned_work", None)
    if isinstance(assigned, dict) and node in assigned:
        return [nodeid for unit in assigned[node].values()
                for nodeid, done in unit.items() if not done]
    return []


class _Controller:
    """Controller side: a worker that finished with work left stops the run, saying why."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        out = getattr(node, "workeroutput", None)
        if error is not None or not isinstance(out, dict):
            return  # a crash: xdist reports it and replaces the worker
        if out.get("exitstatus") == 2 or out.get("shouldfail") or out.get("shouldstop"):
            return  # interrupted or stopping on purpose: xdist handles these
        dsession = self.config.pluginmanager.getplugin("dsession")
        pending = _pending(getattr(dsession, "sched", None), node)
        if not pending:
            return  # a normal end
        cause = out.get(_KEY) or "nothing escaped its test loop (its channel closed?)"
        reason = (f"xdist worker {node.gateway.id} ended its session (exit status "
                  f"{out.get('exitstatus')}) with {len(pending)} test(s) still assigned, "
                  f"the first {pending[0]}: {cause}; the last test it ran: "
                  f"{out.get(_LAST) or 'none'}")
        sys.stderr.write(f"xdist_guard: {reason}\n")
        out["shouldstop"] = reason


def install(config: pytest.Config) -> None:
    """Register the side this process plays (tests/conftest.py's ``pytest_configure``).

    The controller's part is registered in every non-worker process: xdist registers its
    ``dsession`` after this runs, and without xdist ``pytest_testnodedown`` never fires."""
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_Worker(config), "amqpd-xdist-guard-worker")
    else:
        config.pluginmanager.register(_Controller(config), "amqpd-xdist-guard-controller")
