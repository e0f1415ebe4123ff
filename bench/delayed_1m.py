"""One million delayed messages through an x-delayed-message exchange, in process.

    python -m bench.delayed_1m [N]          (default N = 1,000,000)

Measures, on this machine, what the delayed exchange itself costs (no sockets, no
client): hold cost per publish (persistent messages on a durable exchange, written to
a real SharedLog, plus transient ones kept in memory), memory per held message, how
many messages per second it routes once due and how late, and how long a restart takes
to rebuild the heap of N held messages from the log. The end-to-end scenario with real
clients is ``python -m bench --scenarios delayed``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqpd.broker.exchange import Exchange
from amqpd.broker.exchanges.delayed import DelayedMessageExchange, recover, store_key
from amqpd.broker.message import Message
from amqpd.broker.queue import Queue
from amqpd.config import Settings
from amqpd.protocol import codec
from amqpd.server import Broker
from amqpd.store.log import SharedLog

DAY_MS = 86_400_000


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def make_broker(data: Path, loop: asyncio.AbstractEventLoop) -> Broker:
    s = Settings()
    s.persistence = False
    b = Broker(s)
    b._loop = loop
    b.timers.start(loop)
    b.store = SharedLog(data / "log", fsync="never", loop=loop)
    return b


def restart(data: Path, loop: asyncio.AbstractEventLoop, name: str, type_: str,
            arguments: dict[str, Any], recover_key: Callable[[Broker, str, Any], bool],
            key: str) -> tuple[Broker, Exchange, float, float]:
    """A second broker on the same log: declare the durable exchange again and let
    ``recover_key`` rebuild its state from ``key``; the broker, the exchange, and the
    seconds the log open and the rebuild took."""
    b = make_broker(data, loop)
    assert b.store is not None
    t0 = time.perf_counter()
    state = b.store.open()
    t1 = time.perf_counter()
    vh = b.vhosts["/"]
    vh.declare_exchange(name, type_, durable=True, arguments=arguments)
    recover_key(b, key, state.queues[key])
    return b, vh.exchanges[name], t1 - t0, time.perf_counter() - t1


async def run(n: int) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="delayed-bench-") as tmp:
        data = Path(tmp)
        b = make_broker(data, loop)
        assert b.store is not None
        b.store.open()
        vh = b.vhosts["/"]
        vh.declare_exchange("dx", "x-delayed-message", durable=True,
                            arguments={"x-delayed-type": "direct"})
        q = vh.declare_queue("q", durable=True)
        assert isinstance(q, Queue)  # a classic queue: no x-queue-type
        vh.bind("queue", "q", "dx", "k")
        ex = vh.exchanges["dx"]
        assert isinstance(ex, DelayedMessageExchange)

        # 1. hold n persistent messages due between 1 hour and 40 days from now
        r0 = rss_mb()
        t0 = time.perf_counter()
        for _ in range(n):
            props = codec.encode_properties({"delivery_mode": 2, "headers": {
                "x-delay": 3_600_000 + rng.randrange(40 * DAY_MS)}})
            b.publisher.publish(vh, "dx", Message("dx", "k", props, b"x" * 64), None)
        hold_s = time.perf_counter() - t0
        b.store.commit(lambda _e: None)
        await asyncio.sleep(0.2)
        print(f"held {ex.pending:,} persistent: {hold_s / n * 1e6:.1f} us/msg "
              f"(incl. property encoding), RSS +{rss_mb() - r0:.0f} MB "
              f"({(rss_mb() - r0) * 2**20 / n:.0f} B/msg)")

        # 2. route a burst: 100k transient messages due within 2 s
        burst = min(n, 100_000)
        dues = []
        start = time.monotonic()
        for _ in range(burst):
            delay = rng.randrange(2000)
            dues.append(time.monotonic() + delay / 1000)
            props = codec.encode_properties({"headers": {"x-delay": delay}})
            b.publisher.publish(vh, "dx", Message("dx", "k", props, b"y" * 64), None)
        publish_end = time.monotonic()
        last = max(dues)
        while len(q.ready) < burst:
            await asyncio.sleep(0.001)
        done = time.monotonic()
        print(f"burst of {burst:,} due within 2 s (publishing took "
              f"{publish_end - start:.2f} s): all routed {max(0.0, done - last) * 1000:.0f} ms "
              f"after the last was due")
        b.store.close()

        # 3. restart: rebuild the heap from the log
        b2, ex2, open_s, rebuild_s = restart(data, loop, "dx", "x-delayed-message",
                                             {"x-delayed-type": "direct"}, recover,
                                             store_key("/", "dx"))
        assert isinstance(ex2, DelayedMessageExchange)
        print(f"restart: log open {open_s:.1f} s, heap of "
              f"{ex2.pending:,} rebuilt in {rebuild_s:.1f} s")
        assert b2.store is not None
        b2.store.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.delayed_1m",
                                 description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("n", nargs="?", type=int, default=1_000_000,
                    help="how many delayed messages (default 1,000,000)")
    asyncio.run(run(ap.parse_args(argv).n))


if __name__ == "__main__":
    main()
