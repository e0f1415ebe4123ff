"""The warren's election state machine against a real private etcd (tests/support).

A stand-in node records what the election asked of it; each test uses its own key
prefix, so one etcd serves the module. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from amqpd.coord.election import (
    ACTIVE,
    STANDBY,
    Election,
    ElectionSettings,
    LeaderInfo,
)
from amqpd.coord.etcd import Compare, EtcdClient, EtcdUnavailable, Get, Put
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)

TTL = 2.0
_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"/test/{time.time_ns()}-{next(_prefixes)}"


@pytest.fixture
async def client(etcd: EtcdProcess) -> AsyncIterator[EtcdClient]:
    async with EtcdClient([etcd.url], timeout=2.0) as c:
        yield c


class FakeNode:
    """Stands in for the broker: records each call, in order, with its clock time."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.seq = 0
        self.epoch = 0
        self.insync: dict[str, int] = {}
        self.fenced_at: float | None = None
        self.recorded: list[list[str]] = []  # in-sync sets etcd recorded, in order

    async def become_active(self, epoch: int) -> None:
        self.epoch = epoch
        self.events.append(("active", epoch))

    async def become_standby(self, leader: LeaderInfo) -> None:
        self.epoch = leader.epoch
        self.events.append(("standby", leader.node, leader.epoch))

    def fence(self, reason: str) -> None:
        self.fenced_at = time.monotonic()
        self.events.append(("fence", reason))

    def log_position(self) -> tuple[int, int]:
        return self.epoch, self.seq

    def insync_standbys(self) -> dict[str, int]:
        return dict(self.insync)

    def insync_recorded(self, names: set[str]) -> None:
        self.recorded.append(sorted(names))

    def status(self) -> dict[str, Any]:
        return {"fake": True}


async def until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


_clients: list[EtcdClient] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _clients:
        await _clients.pop().close()


def make(url: str, name: str, prefix: str, ttl: float = TTL) -> tuple[Election, FakeNode]:
    node = FakeNode()
    _clients.append(EtcdClient([url], timeout=1.0))
    election = Election(_clients[-1], node,
                        ElectionSettings(name, prefix=prefix, lease_ttl=ttl,
                                         addresses={"amqp": f"{name}:5672"}))
    return election, node


async def crash(e: Election) -> None:
    """Like kill -9 for the election: nothing more is sent, the lease is not revoked."""
    if e._task is not None:
        e._task.cancel()
    e._stop_keeper()
    e._cancel_fence_timer()
    e.role = "stopped"
    await e.etcd.close()


# ---------------------------------------------------------------------------- the client
async def test_client_lease_txn_and_prefix(client: EtcdClient, prefix: str) -> None:
    lease = await client.grant(5)
    assert lease.ttl >= 5
    key = f"{prefix}/k"
    result = await client.txn([Compare("create", key, "==", 0)],
                              [Put(key, b"one", lease.id)], [Get(key)])
    assert result.succeeded
    again = await client.txn([Compare("create", key, "==", 0)], [Put(key, b"two")], [Get(key)])
    assert not again.succeeded and again.responses[0][0].value == b"one"
    kv = await client.get(key)
    assert kv is not None and kv.lease == lease.id and kv.value == b"one"
    assert await client.keepalive(lease.id) >= 4
    await client.put(f"{prefix}/nodes/a", "1")
    await client.put(f"{prefix}/nodes/b", "2")
    await client.put(f"{prefix}/nodesX", "3")  # not under prefix/nodes/
    assert [kv.value for kv in await client.get_prefix(f"{prefix}/nodes/")] == [b"1", b"2"]
    assert await client.revoke(lease.id)
    assert await client.get(key) is None  # a revoked lease's keys go at once
    assert await client.keepalive(lease.id) == 0
    assert not await client.revoke(lease.id)


async def test_client_unreachable_endpoint_times_out() -> None:
    from devtools.rabbitmq import free_ports

    (port,) = free_ports(1)
    async with EtcdClient([f"http://127.0.0.1:{port}"], timeout=0.5) as c:
        with pytest.raises(EtcdUnavailable):
            await c.get("x")


async def test_client_second_endpoint_serves(etcd: EtcdProcess) -> None:
    from devtools.rabbitmq import free_ports

    (port,) = free_ports(1)
    async with EtcdClient([f"http://127.0.0.1:{port}", etcd.url], timeout=2.0) as c:
        await c.put("/test/two-endpoints", "ok")
        kv = await c.get("/test/two-endpoints")
        assert kv is not None and kv.value == b"ok"


# ---------------------------------------------------------------------------- election
async def test_first_takes_the_key_second_follows(etcd: EtcdProcess, client: EtcdClient,
                                                  prefix: str) -> None:
    a, node_a = make(etcd.url, "a", prefix)
    b, node_b = make(etcd.url, "b", prefix)
    a.start()
    await until(lambda: a.role == ACTIVE, what="a active")
    b.start()
    await until(lambda: b.role == STANDBY, what="b standby")
    assert node_a.events == [("active", 1)]
    assert node_b.events == [("standby", "a", 1)]
    assert a.holds_lease() and not b.holds_lease()
    leader = await client.get(f"{prefix}/leader")
    assert leader is not None and leader.json()["node"] == "a" and leader.lease == a.lease_id
    assert (await client.get(f"{prefix}/epoch")).value == b"1"  # type: ignore[union-attr]
    nodes: list[dict[str, Any]] = []

    async def both_recorded() -> bool:
        nodes[:] = await a.nodes()
        return {n["node"] for n in nodes} == {"a", "b"}

    deadline = time.monotonic() + 5
    while not await both_recorded():
        assert time.monotonic() < deadline, nodes
        await asyncio.sleep(0.05)
    roles = {n["node"]: n["role"] for n in nodes}
    assert roles == {"a": "active", "b": "standby"}
    await b.stop()
    await a.stop()


async def pair_b_in_sync(url: str, prefix: str, ttl: float = TTL
                         ) -> tuple[Election, FakeNode, Election, FakeNode]:
    """a active, b its standby, and a has published b as in sync."""
    a, node_a = make(url, "a", prefix, ttl=ttl)
    b, node_b = make(url, "b", prefix, ttl=ttl)
    a.start()
    await until(lambda: a.role == ACTIVE)
    b.start()
    await until(lambda: b.role == STANDBY)
    node_a.insync = {"b": 0}
    await until(lambda: (a._published_state or {}).get("insync") == {"b": 0},
                what="a publishes b as in-sync")
    return a, node_a, b, node_b


async def test_graceful_stop_hands_over_without_lease_expiry(etcd: EtcdProcess,
                                                             prefix: str) -> None:
    # a lease far longer than the deadline below: only the revoke can explain a takeover
    a, node_a, b, node_b = await pair_b_in_sync(etcd.url, prefix, ttl=60.0)
    await a.stop()
    assert ("fence", "node is stopping; handing over") in node_a.events
    await until(lambda: b.role == ACTIVE, timeout=10, what="b takes over after the revoke")
    assert node_b.events[-1] == ("active", 2)
    await b.stop()


async def test_a_standby_out_of_sync_may_not_take_over(etcd: EtcdProcess, client: EtcdClient,
                                                      prefix: str) -> None:
    a, _node_a = make(etcd.url, "a", prefix)
    b, _node_b = make(etcd.url, "b", prefix)
    a.start()
    await until(lambda: a.role == ACTIVE)
    b.start()
    await until(lambda: b.role == STANDBY)
    await a.stop()  # b never made the in-sync set
    await until(lambda: bool(b.not_eligible), what="b sees it may not take over")
    assert "in-sync" in b.not_eligible
    assert b.role == STANDBY and await client.get(f"{prefix}/leader") is None
    # the old active, back again, is eligible (it was the last active): it leads again
    a2, node_a2 = make(etcd.url, "a", prefix)
    a2.start()
    await until(lambda: a2.role == ACTIVE, what="a leads again")
    assert node_a2.events == [("active", 2)]
    await until(lambda: b.role == STANDBY and b.leader is not None and b.leader.epoch == 2,
                what="b follows the new epoch")
    await b.stop()
    await a2.stop()


async def test_standby_that_lost_data_may_not_take_over(etcd: EtcdProcess,
                                                        prefix: str) -> None:
    a, node_a = make(etcd.url, "a", prefix)
    b, node_b = make(etcd.url, "b", prefix)
    a.start()
    await until(lambda: a.role == ACTIVE)
    b.start()
    await until(lambda: b.role == STANDBY)
    node_a.insync = {"b": 500}
    await until(lambda: (a._published_state or {}).get("insync") == {"b": 500})
    node_b.seq = 499  # acknowledged 500, holds only 499: its disk lost something
    await a.stop()
    await until(lambda: bool(b.not_eligible))
    assert "lost data" in b.not_eligible and b.role == STANDBY
    await b.stop()


async def test_crashed_active_lease_expires_and_standby_takes_over(
        etcd: EtcdProcess, client: EtcdClient, prefix: str) -> None:
    a, node_a = make(etcd.url, "a", prefix)
    b, node_b = make(etcd.url, "b", prefix)
    a.start()
    await until(lambda: a.role == ACTIVE)
    b.start()
    await until(lambda: b.role == STANDBY)
    node_a.insync = {"b": 0}
    await until(lambda: (a._published_state or {}).get("insync") == {"b": 0})
    assert node_a.recorded[-1] == ["b"]  # told only once etcd has it
    await crash(a)
    await until(lambda: b.role == ACTIVE, timeout=TTL * 5, what="b takes over")
    assert node_b.events == [("standby", "a", 1), ("active", 2)]
    state = await client.get(f"{prefix}/state")
    assert state is not None and state.json() == {"node": "b", "epoch": 2, "seq": 0,
                                                  "insync": {}}
    # the old node restarts: it was not in b's in-sync set, so it follows
    a2, node_a2 = make(etcd.url, "a", prefix)
    a2.start()
    await until(lambda: a2.role == STANDBY)
    assert node_a2.events == [("standby", "b", 2)]
    await a2.stop()
    await b.stop()


async def test_a_blocked_loop_does_not_cost_the_lease(etcd: EtcdProcess, client: EtcdClient,
                                                      prefix: str) -> None:
    """Renewals run in a thread of their own: an active whose event loop is stuck for
    twice the lease (a takeover loading a backlog) is still active, at the same epoch,
    and never fenced (issue 34)."""
    a, node_a = make(etcd.url, "a", prefix)
    a.start()
    await until(lambda: a.role == ACTIVE)
    renewed = a.renewed_at
    time.sleep(TTL * 2)  # blocking the loop is the point
    assert a.renewed_at > renewed, "no renewal while the loop was blocked"
    assert a.holds_lease()
    await asyncio.sleep(TTL / 2)  # the loop's fence timer runs late, and re-arms
    assert a.role == ACTIVE and a.epoch == 1 and node_a.fenced_at is None
    leader = await client.get(f"{prefix}/leader")
    assert leader is not None and json.loads(leader.value)["epoch"] == 1
    await a.stop()


async def test_partitioned_active_fences_before_its_lease_expires(
        etcd: EtcdProcess, client: EtcdClient, prefix: str) -> None:
    proxy = TcpProxy("127.0.0.1", etcd.client_port).start()
    try:
        a, node_a = make(f"http://127.0.0.1:{proxy.port}", "a", prefix)
        b, _node_b = make(etcd.url, "b", prefix)
        a.start()
        await until(lambda: a.role == ACTIVE)
        b.start()
        await until(lambda: b.role == STANDBY)
        node_a.insync = {"b": 0}
        await until(lambda: (a._published_state or {}).get("insync") == {"b": 0})
        proxy.cut("blackhole")
        gone_at = None
        deadline = time.monotonic() + TTL * 5
        while time.monotonic() < deadline:  # watch the key directly, not through the proxy
            if await client.get(f"{prefix}/leader") is None or b.role == ACTIVE:
                gone_at = time.monotonic()
                break
            await asyncio.sleep(0.01)
        assert gone_at is not None, "the partitioned active's lease never expired"
        assert node_a.fenced_at is not None, "the active did not fence itself"
        assert node_a.fenced_at < gone_at, "fenced only after the lease could expire"
        assert a.role != ACTIVE and not a.holds_lease()
        await until(lambda: b.role == ACTIVE, what="b takes over")
        proxy.restore()
        await until(lambda: a.role == STANDBY, what="the old active follows b once healed")
        assert node_a.events[-1] == ("standby", "b", 2)
        await a.stop()
        await b.stop()
    finally:
        proxy.stop()


async def test_racing_candidates_one_winner_and_epochs_never_repeat(
        etcd: EtcdProcess, client: EtcdClient, prefix: str) -> None:
    await client.put(f"{prefix}/epoch", "41")
    elections = [make(etcd.url, name, prefix) for name in ("a", "b", "c")]
    for e, _ in elections:
        e.start()
    await until(lambda: sum(e.role == ACTIVE for e, _ in elections) == 1
                and sum(e.role == STANDBY for e, _ in elections) == 2, what="one leader")
    winner = next(e for e, _ in elections if e.role == ACTIVE)
    assert winner.epoch == 42
    epochs = [42]
    for _round in range(2):  # hand over twice, each time to an in-sync follower
        node = next(n for e, n in elections if e is winner)
        node.insync = {e.settings.node_name: 0 for e, _ in elections if e is not winner}
        await until(lambda: set((winner._published_state or {}).get("insync", {}))  # noqa: B023
                    == set(node.insync))  # noqa: B023
        old = winner
        await old.stop()
        await until(lambda: any(e.role == ACTIVE for e, _ in elections if e is not old))  # noqa: B023
        winner = next(e for e, _ in elections if e.role == ACTIVE)
        epochs.append(winner.epoch)
        idx = next(i for i, (e, _) in enumerate(elections) if e is old)
        elections[idx] = make(etcd.url, old.settings.node_name, prefix)
        elections[idx][0].start()
        await until(lambda: elections[idx][0].role == STANDBY)  # noqa: B023
    assert epochs == [42, 43, 44]
    assert (await client.get(f"{prefix}/epoch")).value == b"44"  # type: ignore[union-attr]
    for e, _ in elections:
        await e.stop()


async def test_epoch_compare_and_swap_refuses_a_stale_takeover(
        etcd: EtcdProcess, client: EtcdClient, prefix: str) -> None:
    """The takeover guards the epoch's revision: a write between read and txn wins."""
    b, _ = make(etcd.url, "b", prefix)
    real_get = b.etcd.get
    bumped = False

    async def get_then_bump(key: Any, timeout: float | None = None) -> Any:
        nonlocal bumped
        kv = await real_get(key, timeout)
        if key == b.epoch_key and not bumped:  # someone else moves the epoch meanwhile
            bumped = True
            await client.put(b.epoch_key, "7")
        return kv

    b.etcd.get = get_then_bump  # type: ignore[method-assign]
    assert not await b._try_takeover(1.0)
    assert b.role != ACTIVE and await client.get(f"{prefix}/leader") is None
    assert (await client.get(f"{prefix}/epoch")).value == b"7"  # type: ignore[union-attr]
    assert await b._try_takeover(1.0)
    assert b.epoch == 8
    await b.stop()


async def test_restarted_node_finds_its_own_key_and_takes_it_back(
        etcd: EtcdProcess, client: EtcdClient, prefix: str) -> None:
    a, _ = make(etcd.url, "a", prefix, ttl=60.0)
    a.start()
    await until(lambda: a.role == ACTIVE)
    await crash(a)  # the key stays for 60 s unless someone revokes it
    a2, node_a2 = make(etcd.url, "a", prefix, ttl=60.0)
    a2.start()
    await until(lambda: a2.role == ACTIVE, what="restart takes the key back")
    assert node_a2.events == [("active", 2)]
    leader = await client.get(f"{prefix}/leader")
    assert leader is not None and json.loads(leader.value)["epoch"] == 2
    await a2.stop()


async def test_quick_restart_leaves_the_key_to_the_in_sync_standby(
        etcd: EtcdProcess, client: EtcdClient, prefix: str) -> None:
    """Killed and restarted within its lease: the node revokes its old key, but the
    in-sync standby takes it, and the restarted node follows (issue 34's restart race)."""
    a, _node_a, b, node_b = await pair_b_in_sync(etcd.url, prefix, ttl=60.0)
    await crash(a)
    a2, node_a2 = make(etcd.url, "a", prefix, ttl=60.0)
    a2.start()
    await until(lambda: b.role == ACTIVE, what="the standby takes the released key")
    await until(lambda: a2.role == STANDBY, what="the restarted node follows")
    assert node_a2.events == [("standby", "b", 2)]
    assert node_b.events[-1] == ("active", 2)
    await a2.stop()
    await b.stop()


async def test_own_key_after_a_fence_is_not_called_an_earlier_run(
        etcd: EtcdProcess, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    """The key still names this node under the lease it held before it fenced (the
    revoke did not get through, as when etcd was down and restarts with its leases):
    the log says so, and the node takes the key again at once."""
    a, _node = make(etcd.url, "a", prefix, ttl=60.0)
    a.start()
    await until(lambda: a.role == ACTIVE)
    real_revoke = a.etcd.revoke
    failed = False

    async def revoke_fails_once(lease_id: int, timeout: float | None = None) -> bool:
        nonlocal failed
        if not failed:
            failed = True
            raise EtcdUnavailable("etcd is down (simulated)")
        return await real_revoke(lease_id, timeout)

    a.etcd.revoke = revoke_fails_once  # type: ignore[method-assign]
    a._lose("simulated: lease not renewed")
    await until(lambda: a.role == ACTIVE and a.epoch == 2, what="takes the key again")
    assert "before it fenced itself (epoch 1)" in caplog.text
    assert "earlier run" not in caplog.text
    await a.stop()
