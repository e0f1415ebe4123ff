"""DeliveryHold: while this node's leadership is in doubt the queues it leads deliver
nothing; once etcd's read confirms it, those still led here are dispatched again."""

from __future__ import annotations

import asyncio
from typing import Any

from amqpd.cluster.delivery_hold import DeliveryHold
from amqpd.cluster.leadership import Leadership
from amqpd.cluster.loop_clock import LoopClock


class VHost:
    def __init__(self) -> None:
        self.dispatched: list[str] = []

    def schedule_dispatch(self, queue: Any) -> None:
        self.dispatched.append(queue.name)


class Queue:
    """What the hold reads and sets of a broker queue (amqpd.broker.queue_type)."""

    def __init__(self, vhost: VHost, name: str) -> None:
        self.vhost = vhost
        self.name = name
        self.deleted = False
        self.deliveries_held = False


def test_hold_and_release() -> None:
    vh = VHost()
    kept, replaced, later = Queue(vh, "kept"), Queue(vh, "replaced"), Queue(vh, "later")
    led: list[Queue] = [kept, replaced]
    hold = DeliveryHold(lambda: led)
    hold.hold()
    assert kept.deliveries_held and replaced.deliveries_held
    led.append(later)  # led since (an etcd transaction): held by the next doubt too
    hold.hold()
    assert later.deliveries_held and len(hold.held) == 3
    replaced.deleted = True  # the read showed another node leading it: replaced
    led.remove(replaced)
    hold.release()
    assert not any(q.deliveries_held for q in (kept, replaced, later))
    assert vh.dispatched == ["kept", "later"]  # the replaced one delivers nothing more
    hold.release()  # nothing held: nothing dispatched again
    assert vh.dispatched == ["kept", "later"] and hold.held == []


def test_leadership_holds_on_each_doubt_and_releases_on_confirmation() -> None:
    async def main() -> None:
        vh = VHost()
        q = Queue(vh, "q")
        hold = DeliveryHold(lambda: [q])
        gate = asyncio.Event()

        async def read() -> None:
            await gate.wait()

        lead = Leadership(LoopClock(), 0.5, lambda: True, read)
        lead.on_doubt.append(hold.hold)
        lead.on_confirmed.append(hold.release)
        task = asyncio.create_task(lead.run())
        gate.set()
        for _ in range(200):
            if lead.confirmed():
                break
            await asyncio.sleep(0.005)
        assert lead.confirmed() and not q.deliveries_held and vh.dispatched == []
        gate.clear()
        lead.doubt("its event loop stalled for 2.0s")
        assert q.deliveries_held
        await asyncio.sleep(0.05)
        assert q.deliveries_held and vh.dispatched == []  # the read has not answered
        gate.set()
        for _ in range(200):
            if not q.deliveries_held:
                break
            await asyncio.sleep(0.005)
        assert lead.confirmed() and not q.deliveries_held and vh.dispatched == ["q"]
        task.cancel()

    asyncio.run(main())
