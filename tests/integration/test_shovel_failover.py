"""on-confirm loses nothing: 100,000 messages while the destination is killed twice.

Two amqpd processes ("sites"): A holds the source queue and runs the shovel, B is the
destination. B is SIGKILLed twice mid-stream and restarted on the same port. At the end
B holds every message; duplicates are allowed (what was published to B but not yet
confirmed when it died is redelivered by A), losses are not.

How long the flow of 100,000 messages takes is the machine's business (a busy machine
ran this in 3 minutes): waits on the flow fail when it stops moving, not after a fixed
total, and the test's own timeout leaves room for a loaded machine.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.integration._http import Api
from tests.integration.test_shovel_helpers import (
    await_for,
    await_progress,
    count,
    drain,
    drain_fast,
    publish_fast,
    set_shovel,
    shovel_state,
    shovels,
)
from tests.support.brokerproc import BrokerProcess

N = 100_000


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_100k_on_confirm_survives_two_destination_kills(tmp_path: Path) -> None:
    a = BrokerProcess(tmp_path / "a", env={"AMQPD_PLUGINS": "shovel"}).start()
    b = BrokerProcess(tmp_path / "b").start()
    try:
        t0 = time.monotonic()
        await publish_fast(a.url, "orders", N)
        assert await count(a.url, "orders") == N
        t1 = time.monotonic()
        print(f"\npublished {N} in {t1 - t0:.1f}s")
        api = Api(a.http_url)
        set_shovel(api, "to-b", {"src-uri": "amqp://", "src-queue": "orders",
                                 "dest-uri": b.url, "dest-queue": "orders",
                                 "ack-mode": "on-confirm", "reconnect-delay": 0.2})
        seen_down = set()
        lefts: list[int] = []
        for kill_at in (N // 4, N // 2):
            def reached(n: int, at: int = kill_at) -> bool:
                return n >= at
            await await_progress(lambda: count(b.url, "orders"), reached, 60,
                                 f"{kill_at} messages at B")
            b.kill()
            # the kill must land mid-stream, or this test proves nothing
            left = await count(a.url, "orders")
            assert left > 0, "the shovel finished before the kill"
            lefts.append(left)
            # the shovel notices and says so: terminated with a reason, then starting
            down = await await_for(
                lambda: [s for s in shovels(api) if s["state"] != "running"], 15,
                "shovel not running while B is down")
            seen_down.add(down[0]["state"])
            assert down[0]["state"] in ("starting", "terminated")
            b.restart(keep_port=True, timeout=60)  # recovers tens of thousands of messages
            await await_for(lambda: shovel_state(api, "to-b") == "running", 30,
                            "shovel running again")

        # everything acked at A: the queue is empty and nothing is unacked
        await await_progress(lambda: api.get("/api/queues/%2F/orders").json().get("messages", -1),
                             lambda n: n == 0, 60, "source drained and acked")
        bodies = await drain_fast(b.url, "orders", N, timeout=60)
        got = {int(x) for x in bodies}
        missing = set(range(N)) - got
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:10]}"
        duplicates = len(bodies) - len(got)
        # bounded by what can be in flight at a kill: prefetch (1000) per kill
        assert duplicates <= 2 * 1000, duplicates
        print(f"\n100k shovelled across 2 kills in {time.monotonic() - t1:.1f}s, "
              f"{duplicates} duplicates, left at the source at each kill: {lefts}, "
              f"states seen while down: {sorted(seen_down)}")
    finally:
        b.stop()
        a.stop()


@pytest.mark.slow
async def test_source_restart_resumes(tmp_path: Path) -> None:
    """The shovel runs on B and reads from A; A is killed and comes back: nothing lost."""
    a = BrokerProcess(tmp_path / "a").start()
    b = BrokerProcess(tmp_path / "b", env={"AMQPD_PLUGINS": "shovel"}).start()
    try:
        n = 20_000
        await publish_fast(a.url, "jobs", n)
        api = Api(b.http_url)
        set_shovel(api, "from-a", {"src-uri": a.url, "src-queue": "jobs",
                                   "dest-uri": "amqp://", "dest-queue": "jobs",
                                   "reconnect-delay": 0.2, "src-prefetch-count": 500})

        async def some() -> bool:
            return await count(b.url, "jobs") >= n // 3
        await await_for(some, 60, "a third at B")
        a.kill()
        await await_for(lambda: shovel_state(api, "from-a") != "running", 15, "not running")
        a.restart(keep_port=True)
        bodies = await drain(b.url, "jobs", n, timeout=60)
        assert {int(x) for x in bodies} == set(range(n))
        await asyncio.sleep(0)
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
async def test_silent_destination_detected_by_heartbeats(tmp_path: Path) -> None:
    """A destination that stops answering (SIGSTOP) without closing its sockets is
    noticed through heartbeats (?heartbeat=1 in the URI), and the shovel resumes after."""
    a = BrokerProcess(tmp_path / "a", env={"AMQPD_PLUGINS": "shovel"}).start()
    b = BrokerProcess(tmp_path / "b").start()
    assert b.proc is not None
    try:
        api = Api(a.http_url)
        set_shovel(api, "hb", {"src-uri": "amqp://", "src-queue": "q",
                               "dest-uri": b.url + "?heartbeat=1", "dest-queue": "q",
                               "reconnect-delay": 0.2})
        await await_for(lambda: shovel_state(api, "hb") == "running", 15, "running")
        await publish_fast(a.url, "q", 1000)
        b.proc.send_signal(signal.SIGSTOP)
        try:
            await await_for(lambda: shovel_state(api, "hb") != "running", 15,
                            "shovel notices the silent destination")
        finally:
            b.proc.send_signal(signal.SIGCONT)
        await await_for(lambda: shovel_state(api, "hb") == "running", 20, "running again")
        await publish_fast(a.url, "q", 1000)  # bodies 0..999 again: a second batch
        await await_for(lambda: api.get("/api/queues/%2F/q").json().get("messages") == 0, 30,
                        "everything acked at the source")
        bodies = await drain(b.url, "q", 1000, timeout=60)
        assert {int(x) for x in bodies} == set(range(1000))
        assert len(bodies) >= 2000
    finally:
        b.stop()
        a.stop()
