"""Leadership: a node doubts its claim from its start and after a stall or a pause,
and confirms it only by a read of etcd that began after the last doubt."""

from __future__ import annotations

import asyncio

from amqpd.cluster.leadership import Leadership
from amqpd.cluster.loop_clock import LoopClock
from amqpd.coord.etcd import EtcdUnavailable


class Wall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def _until(cond: object, what: str) -> None:
    for _ in range(200):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError(what)


def test_doubted_from_the_start_until_a_read_while_ready() -> None:
    async def main() -> None:
        wall = Wall()
        clock = LoopClock(tick=0.1, slack=0.15, wall=wall)
        ready = [False]
        reads: list[int] = []

        async def read() -> None:
            reads.append(1)

        lead = Leadership(clock, 1.5, lambda: ready[0], read)
        task = asyncio.create_task(lead.run())
        await asyncio.sleep(0.05)
        assert not lead.confirmed() and not reads  # not ready: no read, no claim
        ready[0] = True
        await _until(lead.confirmed, "confirmed once ready")
        assert len(reads) == 1
        task.cancel()

    asyncio.run(main())


def test_a_stall_is_doubted_at_once_and_a_failed_read_confirms_nothing() -> None:
    async def main() -> None:
        wall = Wall()
        clock = LoopClock(tick=0.1, slack=0.15, wall=wall)
        fail = [False]

        async def read() -> None:
            if fail[0]:
                raise EtcdUnavailable("cut off")

        lead = Leadership(clock, 1.5, lambda: True, read)
        task = asyncio.create_task(lead.run())
        await _until(lead.confirmed, "confirmed at the start")
        fail[0] = True
        wall.t += 2.0  # a SIGSTOP: the first callback after it sees the stall ongoing
        assert not lead.confirmed()
        clock.observe()  # the ticker runs; the stall is over
        await asyncio.sleep(0.3)
        assert not lead.confirmed()  # etcd not read: still doubted
        fail[0] = False
        await _until(lead.confirmed, "confirmed after a good read")
        lead.doubt("paused")
        assert not lead.confirmed()
        await _until(lead.confirmed, "confirmed after the pause")
        assert lead.confirmations == 3
        task.cancel()

    asyncio.run(main())


def test_a_doubt_raised_during_a_read_needs_another_read() -> None:
    async def main() -> None:
        clock = LoopClock(tick=0.1, slack=0.15, wall=Wall())
        gate = asyncio.Event()
        reads: list[int] = []

        async def read() -> None:
            reads.append(1)
            await gate.wait()

        lead = Leadership(clock, 1.5, lambda: True, read)
        task = asyncio.create_task(lead.run())
        await _until(lambda: reads, "a read started")
        lead.doubt("paused during the read")
        gate.set()
        await _until(lead.confirmed, "confirmed")
        assert len(reads) == 2  # the read that began before the doubt did not count
        task.cancel()

    asyncio.run(main())
