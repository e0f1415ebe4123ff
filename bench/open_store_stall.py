"""How long opening the store holds the event loop in one piece, with a backlog.

A warren standby that takes over opens the store with every queued message in it
(issue 34). This fills a durable queue with N persistent messages through the broker's
own publish path, closes the store, then opens it twice on a new broker: once all at
once (``Broker._open_store``, as before issue 34) and once as a takeover does
(``Broker.open_store``: recovery in a worker thread, the restore in slices), while a
ticker on the loop records the longest gap between two of its turns. Both figures come
from the same run and the same log, so the machine's load affects both alike.

    python -m bench.open_store_stall 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from amqpd.broker.message import Message
from amqpd.config import Settings
from amqpd.protocol import codec
from amqpd.server import Broker


def new_broker(data: Path, loop: asyncio.AbstractEventLoop) -> Broker:
    """A broker on ``data`` (fsync off), not started: its store is opened by hand."""
    s = Settings()
    s.data_dir = str(data)
    s.fsync = "never"
    b = Broker(s)
    b._loop = loop
    b.timers.start(loop)
    return b


async def fill_backlog(data: Path, n: int) -> None:
    """A durable queue ``backlog`` with ``n`` persistent messages in the log at ``data``."""
    loop = asyncio.get_running_loop()
    b = new_broker(data, loop)
    await b.open_store()
    vh = b.vhosts["/"]
    vh.declare_queue("backlog", durable=True)
    props = codec.encode_properties({"delivery_mode": 2})
    for i in range(n):
        b.publisher.publish(vh, "", Message("", "backlog", props, b"x" * 64,
                                            persistent=True), None)
        if i % 50_000 == 0:
            await asyncio.sleep(0)
    done: asyncio.Future[object] = loop.create_future()
    assert b.store is not None
    b.store.commit(done.set_result)
    await done
    b.store.close()


async def _open(data: Path, sliced: bool) -> tuple[float, float, int]:
    """(seconds to open, longest loop gap, messages restored)."""
    loop = asyncio.get_running_loop()
    b = new_broker(data, loop)
    longest = 0.0
    stop = False

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    if sliced:
        await b.open_store()
    else:
        b._open_store()
        await asyncio.sleep(0)  # the ticker's turn after the one piece
    took = time.perf_counter() - t0
    stop = True
    await task
    count = b.vhosts["/"].queues["backlog"].message_count
    assert b.store is not None
    b.store.close()
    return took, longest, count


async def run(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="open-stall-") as tmp:
        data = Path(tmp)
        t0 = time.perf_counter()
        await fill_backlog(data, n)
        print(f"filled {n:,} persistent messages in {time.perf_counter() - t0:.1f} s")
        for sliced in (False, True):
            took, longest, count = await _open(data, sliced)
            assert count == n, (count, n)
            how = "open_store (thread + slices)" if sliced else "_open_store (one piece)"
            print(f"{how}: opened in {took:.2f} s, longest loop gap {longest:.3f} s, "
                  f"{count:,} messages back")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.open_store_stall",
                                 description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("n", nargs="?", type=int, default=1_000_000,
                    help="messages in the backlog (default 1,000,000)")
    asyncio.run(run(ap.parse_args(argv).n))


if __name__ == "__main__":
    main()
