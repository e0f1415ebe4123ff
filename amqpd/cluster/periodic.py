"""A step run every few seconds for the life of a node's cluster part, a failure of
one run logged and the next run tried all the same (a reconciliation must never stop
for good because one pass met something unexpected)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


async def every(seconds: float, step: Callable[[], None], log: logging.Logger,
                what: str) -> None:
    """Run ``step`` every ``seconds`` until cancelled; ``what`` names it in the log."""
    while True:
        await asyncio.sleep(seconds)
        try:
            step()
        except Exception:
            log.exception("%s failed", what)


__all__ = ["every"]
