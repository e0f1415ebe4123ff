"""Running cases: one at a time (run_case), all of them in a thread pool (run_all), and
the restart group (prepare everything, one broker restart, verify everything)."""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingConnection

from conformance.framework import REGISTRY, Case, Context, Settings, Skip
from conformance.rawclient import RawClosed, RawTimeout


@dataclass
class Result:
    id: str
    area: str
    result: str  # pass | fail | skip
    detail: str
    duration: float
    observed: list[str] = field(default_factory=list)


def run_case(c: Case, settings: Settings) -> Result:
    ctx = Context(c.id, settings)
    t0 = time.monotonic()
    # past settings.case_timeout the case's connections are cut, so a broker that never
    # answers fails this case rather than hanging the whole run (and run_all's pool)
    watchdog = threading.Timer(settings.case_timeout, ctx.cut_connections)
    watchdog.daemon = True
    watchdog.start()
    try:
        outcome, detail = _outcome(functools.partial(c.func, ctx))
    finally:
        watchdog.cancel()
        with contextlib.suppress(Exception):
            ctx.close()
    if ctx.cut:
        outcome, detail = "fail", (f"no result within {settings.case_timeout:g} s: the "
                                   f"case's connections were cut ({detail or outcome})")
    return Result(c.id, c.area, outcome, detail, round(time.monotonic() - t0, 3),
                  list(ctx.observed))


def select(pattern: str | None) -> list[Case]:
    import conformance.cases  # noqa: F401 - registers every case

    cases = list(REGISTRY.values())
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.search(c.id) or rx.search(c.area)]
    return cases


def run_all(cases: list[Case], settings: Settings, jobs: int = 4,
            on_result: Callable[[Result], None] | None = None) -> list[Result]:
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()
    results: list[Result] = []
    # Slow cases start first so that they overlap with the many quick ones; exclusive
    # ones (they affect the whole broker) run alone at the end.
    ordered = sorted((c for c in cases if not c.exclusive), key=lambda c: not c.slow)

    def one(c: Case) -> Result:
        r = run_case(c, settings)
        with lock:
            results.append(r)
            if on_result:
                on_result(r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, ordered))
    for c in cases:
        if c.exclusive and c.verify is None:
            one(c)
    restart = [c for c in cases if c.verify is not None]
    if restart:
        for r in run_restart_group(restart, settings):
            with lock:
                results.append(r)
                if on_result:
                    on_result(r)
    order = {c.id: i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order[r.id])
    return results


def _outcome(fn: Callable[[], None]) -> tuple[str, str]:
    try:
        fn()
        return "pass", ""
    except Skip as exc:
        return "skip", str(exc)
    except AssertionError as exc:
        return "fail", str(exc) or "assertion failed"
    except RawTimeout as exc:
        return "fail", f"expected an answer from the broker, got nothing in time ({exc})"
    except RawClosed as exc:
        return "fail", f"expected an answer from the broker, got the socket closed ({exc})"
    except pex.AMQPConnectionError as exc:
        return "fail", f"expected a working connection, got {type(exc).__name__}: {exc!r}"[:500]
    except Exception as exc:  # any other error is a failure of the broker under test
        return "fail", f"unexpected {type(exc).__name__}: {exc!r}"[:500]


def wait_for_broker(settings: Settings, timeout: float) -> None:
    """Until a connection can be opened (after a restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            params = pika.URLParameters(settings.url)
            params.connection_attempts = 1
            params.socket_timeout = 2
            BlockingConnection(params).close()
            return
        except pex.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def run_restart_group(cases: list[Case], settings: Settings) -> list[Result]:
    """Prepare every restart case, restart the broker once, verify each case."""
    import subprocess

    if not settings.restart_cmd:
        return [Result(c.id, c.area, "skip", "needs --restart-cmd", 0.0) for c in cases]
    t0 = time.monotonic()
    prepared: list[tuple[Case, Context, Any]] = []
    results: list[Result] = []
    for c in cases:
        ctx = Context(c.id, settings)
        state: list[Any] = []

        def prepare(c: Case = c, ctx: Context = ctx, state: list[Any] = state) -> None:
            state.append(c.func(ctx))

        outcome, detail = _outcome(prepare)
        if outcome == "pass":
            prepared.append((c, ctx, state[0]))
            ctx.disconnect()
        else:
            with contextlib.suppress(Exception):
                ctx.close()
            results.append(Result(c.id, c.area, outcome, f"before restart: {detail}",
                                  round(time.monotonic() - t0, 3)))
    proc = subprocess.run(settings.restart_cmd, shell=True, capture_output=True, text=True,
                          timeout=settings.restart_timeout, check=False)
    failure = ""
    if proc.returncode != 0:
        failure = f"restart command failed ({proc.returncode}): " \
                  f"{(proc.stderr or proc.stdout).strip()[:200]}"
    else:
        try:
            wait_for_broker(settings, settings.restart_timeout)
        except Exception as exc:
            failure = f"broker not back after restart: {exc!r}"
    for c, ctx, state in prepared:
        verify = c.verify
        assert verify is not None
        if failure:
            outcome, detail = "fail", failure
        else:
            outcome, detail = _outcome(functools.partial(verify, ctx, state))
        with contextlib.suppress(Exception):
            ctx.close()
        results.append(Result(c.id, c.area, outcome, detail, round(time.monotonic() - t0, 3),
                              list(ctx.observed)))
    return results
