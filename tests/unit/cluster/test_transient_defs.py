"""The cluster incarnation of amqpd/cluster/transient_defs.py against a real private
etcd, with a stand-in cluster: when a starting node joins the running incarnation (a
node of it heartbeats, or keeps its lease longer than a lease period although no
heartbeat arrives) and when it starts a new one (nobody of it runs: no record, records
whose leases run out, a dead process of this host), deleting the older entries; two
nodes starting at once end in one incarnation.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from typing import Any

import pytest

from amqpd.cluster.transient_defs import TransientDefinitions
from amqpd.coord.etcd import EtcdClient
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)


class FakeAPI:
    def transient_definition_entries(self) -> dict[tuple[int, str], bytes]:
        return {}

    def apply_definition(self, kind: int, key: str, body: bytes | None) -> None:
        pass


class FakeMembership:
    lease_id = 0


class FakeTransient:
    def __init__(self) -> None:
        self.known: list[tuple[str, str]] = []

    def exchange_known(self, vhost: str, name: str) -> None:
        self.known.append((vhost, name))


class FakeCluster:
    """What TransientDefinitions asks of amqpd.cluster.node.Cluster."""

    def __init__(self, name: str, heard: set[str]) -> None:
        self.node_name = name
        self.transient = FakeTransient()
        self.heard = heard  # nodes whose heartbeats "arrive"
        self.membership = FakeMembership()
        self.catalogue: dict[Any, Any] = {}
        self.tdefs: TransientDefinitions | None = None
        self.etcd: EtcdClient | None = None
        self.root = ""

    def heard_since(self, node: str, since: float) -> bool:
        return node in self.heard

    def record(self) -> dict[str, Any]:
        return {"name": self.node_name, "host": socket.gethostname(), "pid": os.getpid(),
                "incarnation": self.tdefs.incarnation if self.tdefs else None}

    async def publish_record(self) -> None:
        assert self.etcd is not None
        await self.etcd.put(f"{self.root}/nodes/{self.node_name}", json.dumps(self.record()),
                            lease=self.membership.lease_id)


async def member(etcd: EtcdProcess, root: str, name: str, heard: set[str] | None = None,
                 lease_ttl: float = 2.0) -> tuple[TransientDefinitions, EtcdClient]:
    client = EtcdClient([etcd.url])
    cluster = FakeCluster(name, heard or set())
    cluster.etcd, cluster.root = client, root
    cluster.membership.lease_id = (await client.grant(5)).id
    tdefs = TransientDefinitions(cluster, FakeAPI(), client, root,  # type: ignore[arg-type]
                                 lease_ttl)
    cluster.tdefs = tdefs
    return tdefs, client


async def other_node(client: EtcdClient, root: str, name: str, incarnation: int,
                     ttl: int, host: str = "elsewhere", pid: int = 1) -> int:
    """A record of another node, in ``incarnation``, under a lease of ``ttl`` seconds."""
    lease = (await client.grant(ttl)).id
    await client.put(f"{root}/nodes/{name}", json.dumps(
        {"name": name, "host": host, "pid": pid, "incarnation": incarnation}), lease=lease)
    return lease


async def test_incarnations_join_or_start(etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex[:8]}"
    # a fresh cluster: incarnation 1
    first, c1 = await member(etcd, root, "a")
    await first.join()
    assert first.incarnation == 1 and first.synced
    await c1.put(first.prefix + "exchange/%2F/tx", "{}")
    # a node that hears a running node of incarnation 1 joins it
    joiner, c2 = await member(etcd, root, "b", heard={"a"})
    await joiner.join()
    assert joiner.incarnation == 1
    assert list(joiner.state.values()) == [b"{}"]  # the incarnation's entries read
    # a record of incarnation 1 whose process is gone (this host, dead pid): a new one
    await c1.delete(f"{root}/nodes/a")
    dead = 2 ** 22 + 12345  # beyond the usual pid range: no such process
    await other_node(c1, root, "a", 1, ttl=30, host=socket.gethostname(), pid=dead)
    await c1.delete(f"{root}/nodes/b")
    restarted, c3 = await member(etcd, root, "b")
    await restarted.join()
    assert restarted.incarnation == 2
    assert await c1.get_prefix(f"{root}/tdefs/000000000001/") == []  # the old entries gone
    assert (await c1.get(f"{root}/tdefs/incarnation")).value == b"2"  # type: ignore[union-attr]
    for c in (c1, c2, c3):
        await c.close()


async def test_silent_node_keeping_its_lease_runs_one_whose_lease_ends_does_not(
        etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex[:8]}"
    client = EtcdClient([etcd.url])
    await client.put(f"{root}/tdefs/incarnation", "4")
    # node x of another host, no heartbeat reaches us, but it renews its lease
    lease = await other_node(client, root, "x", 4, ttl=2)

    async def renew() -> None:
        while True:
            await client.keepalive(lease)
            await asyncio.sleep(0.5)

    renewing = asyncio.ensure_future(renew())
    try:
        tdefs, c = await member(etcd, root, "b", lease_ttl=2.0)
        await tdefs.join()  # waits a lease period (+1 s), then takes x as running
        assert tdefs.incarnation == 4
        await c.close()
    finally:
        renewing.cancel()
    # its lease runs out (nobody renews it): its record goes, a new incarnation starts
    tdefs, c = await member(etcd, root, "c", lease_ttl=2.0)
    await tdefs.join()
    assert tdefs.incarnation == 5
    await c.close()
    await client.close()


async def test_two_nodes_starting_at_once_share_one_incarnation(etcd: EtcdProcess) -> None:
    root = f"/t/{uuid.uuid4().hex[:8]}"
    a, ca = await member(etcd, root, "a")
    b, cb = await member(etcd, root, "b")
    await asyncio.gather(a.join(), b.join())
    assert a.incarnation == b.incarnation == 1
    await ca.close()
    await cb.close()
