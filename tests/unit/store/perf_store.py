"""Store micro-check (not a test, not collected): append rate with group commit and
restart time with a big backlog. Prints figures; asserts nothing about timing.

    python -m tests.unit.store.perf_store [--messages 1000000] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from amqpd.store import checkpoint
from amqpd.store.api import StoredMessage
from amqpd.store.log import SharedLog

QUEUE = "/\x00perf"


async def append_rate(directory: Path, n: int, per_tick: int) -> None:
    """Like the broker: per event-loop tick, append a batch, one commit per message
    (publisher confirms), yield; the store answers them all with a shared fsync."""
    loop = asyncio.get_running_loop()
    store = SharedLog(directory, loop=loop)
    store.open()
    msg = StoredMessage("amq.direct", "perf", b"\x10\x00\x02", b"x" * 16)
    confirmed = 0
    done = loop.create_future()

    def on_durable(exc: BaseException | None) -> None:
        nonlocal confirmed
        confirmed += 1
        if confirmed == n and not done.done():
            done.set_result(None)

    latencies: list[float] = []

    def tick_latency(exc: BaseException | None, t: float) -> None:
        latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        t_tick = time.perf_counter()
        for _ in range(min(per_tick, n - sent)):
            store.append_enqueue([QUEUE], msg)
            store.commit(on_durable)
            sent += 1
        store.commit(functools.partial(tick_latency, t=t_tick))
        await asyncio.sleep(0)
    await done
    elapsed = time.perf_counter() - t0
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e3
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3
    st = store.stats()
    store.close()
    print(
        f"append+commit: {n} msgs of 16 B, {per_tick}/tick: {n / elapsed:,.0f} msgs/s confirmed; "
        f"{st['fsyncs']} fsyncs ({st['fsyncs'] / elapsed:,.0f}/s, "
        f"{n / max(st['fsyncs'], 1):,.0f} confirms per fsync, avg {st['fsync_avg_us']} us); "
        f"confirm latency p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )


async def serial_latency(directory: Path, seconds: float) -> None:
    """One publisher waiting for each confirm: the cost of one commit round trip."""
    loop = asyncio.get_running_loop()
    store = SharedLog(directory, loop=loop)
    store.open()
    msg = StoredMessage("amq.direct", "perf", b"\x10\x00\x02", b"x" * 16)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fut: asyncio.Future[BaseException | None] = loop.create_future()
        store.append_enqueue([QUEUE], msg)
        store.commit(fut.set_result)
        await fut
        n += 1
    elapsed = time.perf_counter() - t0
    st = store.stats()
    store.close()
    print(
        f"serial confirm: {n / elapsed:,.0f} commits/s, {elapsed / n * 1e6:,.0f} us per "
        f"round trip (fsync avg {st['fsync_avg_us']} us)"
    )


def fill(directory: Path, n: int) -> None:
    store = SharedLog(directory)
    store.open()
    msg = StoredMessage("amq.direct", "perf", b"\x10\x00\x02", b"y" * 16)
    t0 = time.perf_counter()
    for i in range(n):
        store.append_enqueue([QUEUE], msg)
        if i % 10_000 == 9_999:
            store.commit(lambda exc: None)
    store.sync()
    elapsed = time.perf_counter() - t0
    print(f"fill: {n} appends in {elapsed:.2f}s = {n / elapsed:,.0f}/s (commit every 10k)")
    print(f"      on disk: {store.stats()['bytes_on_disk'] / 1e6:.1f} MB")
    # leave without close(): like kill -9, the periodic checkpoint + tail replay is used
    store._writer.stop()  # type: ignore[union-attr]


def restart(directory: Path, label: str) -> None:
    gc.collect()
    t0 = time.perf_counter()
    store = SharedLog(directory)
    state = store.open()
    elapsed = time.perf_counter() - t0
    n = len(state.queues[QUEUE].positions)
    print(f"restart ({label}): {n} live messages in {elapsed:.2f}s")
    store._checkpoint = lambda: None  # type: ignore[method-assign]  # keep the dir as is
    store.close()


def memory(directory: Path) -> None:
    gc.collect()
    tracemalloc.start()
    store = SharedLog(directory)
    state = store.open()
    n = len(state.queues[QUEUE].positions)
    del state  # the broker consumes the arrays and drops them
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"memory: {current / n:.1f} bytes per live message held by the store's index")
    store._checkpoint = lambda: None  # type: ignore[method-assign]
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="amqpd-perf-", dir=args.dir))
    try:
        asyncio.run(serial_latency(root / "serial", 2.0))
        asyncio.run(append_rate(root / "rate", 200_000, 500))
        asyncio.run(append_rate(root / "rate50", 100_000, 50))
        big = root / "big"
        fill(big, args.messages)
        restart(big, "after kill -9: periodic checkpoint + tail")
        (big / checkpoint.FILE_NAME).unlink()
        restart(big, "no checkpoint: full replay")
        s = SharedLog(big)
        s.open()
        s.close()  # clean shutdown writes a checkpoint at the end
        restart(big, "after clean shutdown")
        memory(big)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
