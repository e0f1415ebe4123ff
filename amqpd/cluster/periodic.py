"""Background work of a node's cluster part: :func:`every` runs a step every few
seconds for the node's life, a failure of one run logged and the next run tried all
the same (a reconciliation must never stop for good because one pass met something
unexpected); :func:`spawn` runs a task kept in a set until it ends; :func:`cancel_all`
ends a part's tasks when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any


async def every(seconds: float, step: Callable[[], None], log: logging.Logger,
                what: str) -> None:
    """Run ``step`` every ``seconds`` until cancelled; ``what`` names it in the log."""
    while True:
        await asyncio.sleep(seconds)
        try:
            step()
        except Exception:
            log.exception("%s failed", what)


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` as a task kept in ``tasks`` until it ends (so it can be cancelled
    with them, and is not collected while it runs)."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]], *,
                     no_wait: Iterable[asyncio.Task[Any]] = ()) -> None:
    """Cancel ``tasks`` and ``no_wait``, then wait until each of ``tasks`` has ended
    (its cancellation swallowed; any other failure is raised), so a stopping part leaves
    nothing of its own running. ``no_wait`` are tasks that clean up after themselves and
    need not be awaited."""
    tasks = list(tasks)
    for task in [*tasks, *no_wait]:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


__all__ = ["cancel_all", "every", "spawn"]
