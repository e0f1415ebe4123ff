"""LoopClock: this loop's stalls are not counted as the others' silence."""

from __future__ import annotations

import asyncio

import pytest

from amqpd.cluster.loop_clock import LoopClock
from amqpd.cluster.view import ClusterView


class Wall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_runs_with_the_wall_clock_while_the_loop_ticks() -> None:
    wall = Wall()
    clock = LoopClock(tick=0.1, slack=0.15, wall=wall)
    start = clock()
    for _ in range(50):
        wall.t += 0.1
        assert clock.observe() == 0.0
    assert abs(clock() - start - 5.0) < 1e-9


def test_a_stall_is_left_out_and_the_clock_never_jumps_or_goes_back() -> None:
    wall = Wall()
    clock = LoopClock(tick=0.1, slack=0.15, wall=wall)
    wall.t += 0.1
    clock.observe()
    before = clock()
    readings = []
    for _ in range(30):  # a 3 s stall, read during it (the first callbacks after it)
        wall.t += 0.1
        readings.append(clock())
    assert readings == sorted(readings)
    assert readings[-1] - before <= 0.25 + 1e-9  # tick + slack at most
    stall = clock.observe()
    assert abs(stall - (3.0 - 0.25)) < 1e-9
    assert clock() == readings[-1]  # the ticker's accounting does not move the clock
    assert clock.stalls == 1 and abs(clock.longest - stall) < 1e-9
    wall.t += 0.1
    clock.observe()
    assert abs(clock() - readings[-1] - 0.1) < 1e-9  # and it runs on afterwards


def test_a_peer_heard_before_a_stall_is_still_running_after_it() -> None:
    """The case that paused loaded test nodes: no heartbeat processed for 3 s because this
    loop did not run, although the peer sent every one of them."""
    wall = Wall()
    clock = LoopClock(tick=0.1, slack=0.15, wall=wall)
    view = ClusterView("a", heartbeat_timeout=1.0, clock=clock)
    view.update({"a", "b", "c"}, {"a": {}, "b": {}, "c": {}})
    view.heartbeat("b")
    view.heartbeat("c")
    wall.t += 3.0  # stalled: the datagrams wait in the socket
    assert view.is_running("b") and view.sees_majority()
    view.heartbeat("b")  # the waiting datagram of b is read; c's is lost
    clock.observe()
    for _ in range(8):  # the loop runs freely again: c's silence counts from here
        wall.t += 0.1
        clock.observe()
    assert view.is_running("b")  # heard 0.8 s ago of running time
    assert not view.is_running("c")  # 0.25 s before the stall was noticed, plus 0.8 s


def test_a_dead_peer_is_noticed_within_the_timeout_while_the_loop_runs() -> None:
    wall = Wall()
    clock = LoopClock(tick=0.1, slack=0.15, wall=wall)
    view = ClusterView("a", heartbeat_timeout=1.0, clock=clock)
    view.update({"a", "b"}, {"a": {}, "b": {}})
    view.heartbeat("b")
    for _ in range(11):
        wall.t += 0.1
        clock.observe()
    assert not view.is_running("b")


def test_the_ticker_measures_a_real_blocking_call() -> None:
    import time

    async def main() -> float:
        clock = LoopClock(tick=0.02, slack=0.03)
        task = asyncio.create_task(clock.run())
        await asyncio.sleep(0.05)
        before = clock()
        time.sleep(0.4)  # the stall under test
        during = clock()
        await asyncio.sleep(0.05)
        task.cancel()
        assert during - before <= 0.06
        return clock.stalled

    assert asyncio.run(main()) >= 0.3


def _loops() -> list[str]:
    try:
        import uvloop  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


@pytest.mark.parametrize("kind", _loops())
def test_a_stall_is_seen_before_what_the_woken_loop_read_schedules(kind: str) -> None:
    """A SIGSTOP seen from inside: the loop blocks while a socket becomes readable. The
    reader schedules a dispatch (as the broker does for a consumer whose ack it read);
    the stall's listener must run first (amqpd.cluster.delivery_hold holds a woken
    leader's deliveries there). A ticker task woken from a sleep ran after it under
    uvloop (the loop the broker runs on when installed)."""
    import socket
    import time

    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = LoopClock(tick=0.02, slack=0.03)
        clock.on_stall.append(lambda seconds: order.append("stall") if seconds > 0.2 else None)
        task = asyncio.create_task(clock.run())
        await asyncio.sleep(0.1)
        here, there = socket.socketpair()
        here.setblocking(False)

        def readable() -> None:
            here.recv(64)
            loop.remove_reader(here.fileno())
            loop.call_soon(order.append, "dispatch")

        loop.add_reader(here.fileno(), readable)
        try:
            there.send(b"ack")
            time.sleep(0.4)  # the stop under test: the ack waits in the socket
            for _ in range(100):
                if "dispatch" in order:
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            here.close()
            there.close()

    if kind == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    assert order == ["stall", "dispatch"]
