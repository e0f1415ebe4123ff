"""Membership against a real private etcd: join, the record under the lease, updating it,
forget (refused while the node runs), a forgotten node finding out at start, and a name
held by another running process."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from amqpd.cluster.membership import Membership, NodeNameInUse, NotAllowed
from amqpd.cluster.view import ClusterView
from amqpd.coord.etcd import EtcdClient
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)


def member(etcd: EtcdProcess, root: str, name: str, data_dir: Path,
           record: dict[str, Any] | None = None) -> Membership:
    rec = record if record is not None else {"name": name, "link": "127.0.0.1:1"}
    return Membership(ClusterView(name), EtcdClient([etcd.url]), root, 2.0,
                      lambda: dict(rec), str(data_dir), "c1")


async def test_join_record_update_forget(etcd: EtcdProcess, tmp_path: Path) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    a = member(etcd, root, "a", tmp_path / "a", {"name": "a", "link": ""})
    b = member(etcd, root, "b", tmp_path / "b")
    try:
        await a.start()
        await b.start()
        await a.poll()
        assert a.view.members == {"a", "b"} and set(a.view.records) == {"a", "b"}
        lease = a.lease_id
        a.record = lambda: {"name": "a", "link": "127.0.0.1:7000"}  # the link listens
        await a.update_record()
        kv = await a.etcd.get(a.key("nodes", "a"))
        assert kv is not None and json.loads(kv.value)["link"] == "127.0.0.1:7000"
        assert kv.lease == lease  # the same lease: nothing left behind
        with pytest.raises(NotAllowed):
            await a.forget("b")  # b runs
        with pytest.raises(NotAllowed):
            await a.forget("a")
        await b.leave()
        await a.poll()
        await a.forget("b")
        assert a.view.members == {"a"}
        with pytest.raises(LookupError):
            await a.forget("b")
        # b starts again: its marker says it joined, its member key is gone
        b2 = member(etcd, root, "b", tmp_path / "b")
        await b2.start()
        assert b2.forgotten and "b" not in b2.view.members
        await b2.join()
        await b2.poll()
        assert not b2.forgotten and b2.view.members == {"a", "b"}
        await b2.leave()
        await b2.etcd.close()
    finally:
        for m in (a, b):
            await m.leave()
            await m.etcd.close()


async def test_name_held_by_another_process(etcd: EtcdProcess, tmp_path: Path) -> None:
    root = f"/t/{uuid.uuid4().hex}"
    first = member(etcd, root, "a", tmp_path / "a",
                   {"name": "a", "host": "elsewhere", "pid": 1})
    await first.start()
    second = member(etcd, root, "a", tmp_path / "a2")
    try:
        with pytest.raises(NodeNameInUse, match="in use"):
            await second.start()
    finally:
        await first.leave()
        for m in (first, second):
            await m.etcd.close()


async def test_the_lease_lasts_at_least_the_ttl_the_node_counts(
        etcd: EtcdProcess, tmp_path: Path) -> None:
    """etcd grants whole seconds; a lease_ttl of 2.4 s must not become a 2 s lease, or
    etcd could drop the node's record while the node still counts itself registered."""
    root = f"/t/{uuid.uuid4().hex}"
    a = Membership(ClusterView("a"), EtcdClient([etcd.url]), root, 2.4,
                   lambda: {"name": "a", "link": ""}, str(tmp_path / "a"), "c1")
    try:
        await a.start()
        ttl = await a.etcd.keepalive(a.lease_id)
        assert ttl >= 2.4, ttl
    finally:
        await a.leave()
        await a.etcd.close()
