"""Run amqpd with its heap traced, and answer snapshot requests (bench/churn_memory.py).

    python -m bench.memprobe <python> -m amqpd [amqpd arguments...]

(``BrokerProcess(command_prefix=[python, "-m", "bench.memprobe"])`` makes that command
line.) tracemalloc starts before amqpd is imported. A thread watches
``$AMQPD_MEMPROBE_DIR`` for ``request-<n>``; for each it reads RSS, collects garbage
(and reports how many unreachable objects that found, and RSS after it), counts the
live objects by type (``gc.get_objects``), dumps a tracemalloc snapshot, and then
writes ``done-<n>.json``; ``request-<n>`` with a ``trim`` line also calls glibc's
``malloc_trim(0)`` and reports RSS after it (memory the allocator keeps but could hand
back is a high-water mark, not a leak). Measuring only: the broker is slower while
traced; ``AMQPD_MEMPROBE_FRAMES=0`` leaves tracemalloc off (counts and RSS only, at
full speed).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _answer(directory: Path, n: str, trim: bool) -> None:
    # RSS before and after a full collection: cyclic garbage that waits for the next
    # generation-2 collection (amqpd raises the thresholds, server.py) is not a leak
    out: dict[str, object] = {"rss_before_gc": _rss(), "gc_stats": gc.get_stats()}
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collection finds, by type, then freed
    try:
        out["gc_unreachable"] = gc.collect()
        garbage = Counter(type(o).__qualname__ for o in gc.garbage)
        out["gc_unreachable_types"] = dict(garbage.most_common(25))
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    gc.collect()
    out["rss"] = _rss()
    if trim:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        out["rss_after_trim"] = _rss()
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    out["objects"] = dict(counts.most_common(60))
    out["gc_objects"] = sum(counts.values())
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        out["traced"], out["traced_peak"] = current, peak
        tracemalloc.take_snapshot().dump(str(directory / f"snapshot-{n}.pickle"))
    tmp = directory / f"done-{n}.tmp"
    tmp.write_text(json.dumps(out))
    tmp.rename(directory / f"done-{n}.json")


def _watch(directory: Path) -> None:
    while True:
        for req in sorted(directory.glob("request-*")):
            n = req.name.removeprefix("request-")
            trim = "trim" in req.read_text()
            req.unlink()
            _answer(directory, n, trim)
        time.sleep(0.2)


def main() -> None:
    directory = Path(os.environ["AMQPD_MEMPROBE_DIR"])
    frames = int(os.environ.get("AMQPD_MEMPROBE_FRAMES", "10"))
    if frames > 0:  # 0: counts and RSS only, the broker at full speed
        tracemalloc.start(frames)
    threading.Thread(target=_watch, args=(directory,), daemon=True).start()
    argv = sys.argv[1:]
    if argv[1:3] != ["-m", "amqpd"]:
        raise SystemExit("usage: python -m bench.memprobe <python> -m amqpd [args]")
    from amqpd.cli import main as amqpd_main

    raise SystemExit(amqpd_main(argv[3:]))


if __name__ == "__main__":
    main()
