"""What the per-object chart history costs: memory at its cap, and one sampler tick.

    python -m bench.object_history [--objects 5000] [--interval 5]

Fills an :class:`amqpd.http.object_history.ObjectHistory` to its caps (``--objects``
objects, as many points each as the interval keeps) with points shaped like a queue's
(a timestamp, five counters, ready and unacked), and reports the memory it holds
(tracemalloc, measured in a separate pass from the timing) and the time of one tick that
records a point for every object (what the rate sampler adds to each of its ticks).
It prints the figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

from amqpd.http.object_history import MAX_OBJECTS, ObjectHistory

FIELDS = 7  # five counters, ready, unacked (a queue's point after its timestamp)


def fill(history: ObjectHistory, objects: int, ticks: int, first: int = 0) -> None:
    for t in range(first, first + ticks):
        point = tuple(10**9 + t for _ in range(FIELDS))
        for key in range(objects):
            history.record(key, 1_700_000_000_000 + 5000 * t, point)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=MAX_OBJECTS)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    tracemalloc.start()
    history = ObjectHistory(args.interval, max_objects=args.objects)
    fill(history, args.objects, history.maxlen)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    times = []
    for run in range(args.runs):
        t0 = time.perf_counter()
        fill(history, args.objects, 1, first=history.maxlen + run)
        times.append(time.perf_counter() - t0)
    print(f"{args.objects} objects x {history.maxlen} points ({FIELDS} fields each): "
          f"{held / 1e6:.1f} MB held, {held / max(args.objects, 1):.0f} B per object")
    print(f"one tick recording every object: median {statistics.median(times) * 1000:.1f} ms "
          f"over {args.runs} runs")


if __name__ == "__main__":
    main()
