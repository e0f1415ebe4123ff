"""Opening the store gives the event loop back while it restores a backlog (issue 34: a
warren standby taking over 1,000,000 messages held the loop ~14 s in one piece)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from amqpd.broker.message import Message
from amqpd.config import Settings
from amqpd.protocol import codec
from amqpd.server import Broker


def _broker(data: Path, loop: asyncio.AbstractEventLoop) -> Broker:
    s = Settings()
    s.data_dir = str(data)
    s.fsync = "never"
    b = Broker(s)
    b._loop = loop
    b.timers.start(loop)
    return b


async def _fill(data: Path, n: int) -> None:
    loop = asyncio.get_running_loop()
    b = _broker(data, loop)
    await b.open_store()
    vh = b.vhosts["/"]
    vh.declare_queue("backlog", durable=True)
    props = codec.encode_properties({"delivery_mode": 2})
    for i in range(n):
        b.publisher.publish(vh, "", Message("", "backlog", props, b"%d" % i,
                                            persistent=True), None)
    done: asyncio.Future[object] = loop.create_future()
    assert b.store is not None
    b.store.commit(done.set_result)
    await done
    b.store.close()


def test_the_loop_runs_between_slices_of_the_restore(tmp_path: Path) -> None:
    n, size = 2_500, 500

    async def main() -> tuple[set[int], int]:
        await _fill(tmp_path, n)
        b = _broker(tmp_path, asyncio.get_running_loop())
        seen: set[int] = set()  # the backlog's length each time the loop ran meanwhile
        stop = False

        async def watch() -> None:
            while not stop:
                q = b.vhosts["/"].queues.get("backlog") if "/" in b.vhosts else None
                if q is not None:
                    seen.add(q.message_count)
                await asyncio.sleep(0)

        task = asyncio.create_task(watch())
        await b.open_store(slice_size=size)
        stop = True
        await task
        count = b.vhosts["/"].queues["backlog"].message_count
        assert b.store is not None
        b.store.close()
        return seen, count

    seen, count = asyncio.run(main())
    assert count == n, "every message is back"
    # the loop ran after each slice of 500 but the last: it saw the backlog half restored
    assert {500, 1000, 1500, 2000} <= seen, sorted(seen)
