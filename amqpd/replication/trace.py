"""Timestamps of a synchronous confirm's steps on both nodes, for the sync-cost bench.

Off unless ``AMQPD_SYNC_TRACE`` names a directory when the process starts: then every
step below appends ``(CLOCK_MONOTONIC ns, step, sequence)`` to a list in memory, and the
list is written to ``<dir>/<pid>.trace`` (one ``ns step seq`` line each) at exit.
CLOCK_MONOTONIC is one clock for every process of a machine, so the active's and the
standby's steps line up (``bench.sync_profile --trace`` pairs them into a breakdown of
where a group commit's wait past the local fsync goes).

Steps (active): ``w`` the writer wrote records up to seq (before its fsync), ``l`` it
pushed them to the standby through the live lane, ``f`` its fsync covering seq ended,
``g`` the gate saw the group commit durable here (loop), ``a`` the ACK reader read an
ACK of seq, ``r`` the gate released group commits up to seq. Standby: ``x`` a DATA frame
arrived and ``p`` it was written (seq of both: the last checked record before it), ``c``
its records are checked up to seq, ``q`` (just before ``c``) the write generation of
that frame (syncer.py), ``s`` the fsync thread starts a round covering generation seq,
``e`` that fsync ended, ``k`` the ACK of seq left.

When off, a step costs one global lookup and a branch; a traced run keeps a few tuples
per group commit (megabytes for a bench run of seconds).
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

_DIR = os.environ.get("AMQPD_SYNC_TRACE", "")
ON = bool(_DIR)
_steps: list[tuple[int, str, int]] = []


def mark(step: str, seq: int) -> None:
    """Record ``step`` for ``seq`` now (callers check :data:`ON` first)."""
    _steps.append((time.monotonic_ns(), step, seq))


def _dump() -> None:
    if not _steps:
        return
    path = Path(_DIR) / f"{os.getpid()}.trace"
    with open(path, "w") as f:
        f.writelines(f"{t} {s} {q}\n" for t, s, q in _steps)


if ON:
    atexit.register(_dump)
