"""Setting up a quorum queue's or a stream's replica group on its declaring node: one
set-up at a time, and none while the group is led.

A declare's set-up that failed once (the group record of a queue of that name deleted a
moment ago still there) tries again after a pause. Were the pause left open to the
reconciliation, its own set-up would run beside the next try: one of the two leads, the
other reads the record naming this node and takes it up as a restart's, writing term + 1
(for a stream, a second epoch) while the node leads the term before. CI saw that record
once (``test_cluster_stream_removed``: epochs ``[[18, 0], [19, 0]]`` for a stream
declared again at once)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from amqpd.cluster.group_walk import lead_or_establish
from amqpd.cluster.quorum_group import QuorumGroups
from amqpd.cluster.stream_group import StreamGroups
from tests.support.record_etcd import RecordEtcd

KINDS = [QuorumGroups, StreamGroups]


def _groups(kind: Any) -> Any:
    groups = object.__new__(kind)
    groups.root, groups.node = "/r", "node-a"
    groups.establishing, groups.leading = set(), {}
    return groups


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
async def test_a_group_led_already_keeps_its_record_and_term(kind: type[Any]) -> None:
    """An _establish that finds the group led here writes nothing: taking the record up
    again would end the term the node leads."""
    groups = _groups(kind)
    ident = ("/", "q")
    etcd = RecordEtcd(groups.record_key(ident),
                 {"leader": "node-a", "members": ["node-a", "node-b", "node-c"],
                  "term": 18, "epochs": [[18, 0]]}, revision=40)
    groups.etcd = etcd
    q = SimpleNamespace(name="q")
    groups.leading[ident] = SimpleNamespace(q=q, term=18)
    await groups._establish(SimpleNamespace(name="/", queues={"q": q}), q)
    assert etcd.writes == 0 and json.loads(etcd.value)["term"] == 18
    assert ident not in groups.establishing


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
async def test_a_declares_set_up_holds_the_group_across_its_pause(kind: type[Any]) -> None:
    """Between a declare's failed try and its next one, the reconciliation's walk starts
    no set-up of its own; once the declare's set-up ends, the group is free again."""
    groups = _groups(kind)
    ident = ("/", "q")
    q: Any = SimpleNamespace(name="q")
    vh: Any = SimpleNamespace(name="/", queues={"q": q})
    tries: list[bool] = []
    failed_once = asyncio.Event()
    spawned: list[Any] = []

    async def establish(vh_: Any, q_: Any) -> None:
        tries.append(ident in groups.establishing)
        groups.establishing.discard(ident)  # as the real one does, in its finally
        if len(tries) == 1:
            failed_once.set()  # an old record still there: not led this time
        else:
            groups.leading[ident] = SimpleNamespace(q=q, term=1)

    def spawn(coro: Any) -> None:
        spawned.append(coro)
        coro.close()

    groups._establish = establish
    groups._spawn = spawn
    declare = asyncio.ensure_future(groups._establish_for_declare(vh, q))
    await asyncio.wait_for(failed_once.wait(), 5)
    # the declare's task is in its pause now (it ran on from the failed try to its sleep)
    assert not declare.done() and ident in groups.establishing
    assert lead_or_establish(groups, vh, q) is None and spawned == []
    await asyncio.wait_for(declare, 5)
    assert tries == [True, True] and ident in groups.leading
    assert ident not in groups.establishing
