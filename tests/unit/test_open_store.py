"""Opening the store gives the event loop back while it restores a backlog (issue 34: a
warren standby taking over 1,000,000 messages held the loop ~14 s in one piece)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.open_store_stall import fill_backlog, new_broker


def test_the_loop_runs_between_slices_of_the_restore(tmp_path: Path) -> None:
    n, size = 2_500, 500

    async def main() -> tuple[set[int], int]:
        await fill_backlog(tmp_path, n)
        b = new_broker(tmp_path, asyncio.get_running_loop())
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
