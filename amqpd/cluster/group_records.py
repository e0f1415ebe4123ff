"""The group records of quorum queues (``{root}/quorum/{vhost}/{name}``) and streams
(``{root}/stream/...``) in etcd, read and edited alike by
:mod:`amqpd.cluster.quorum_group` and :mod:`amqpd.cluster.stream_group`: one record per
queue with its members, leader and term. :func:`read_group_records` reads them all,
:func:`poll_group_records` keeps a group kind's copy fresh, :func:`edit_group_record`
changes one in a transaction on the revision read."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from amqpd.cluster.mirror_state import Ident
from amqpd.cluster.quorum_state import MembershipError
from amqpd.coord.etcd import Compare, EtcdError, Put

if TYPE_CHECKING:
    from amqpd.coord.etcd import EtcdClient


async def edit_group_record(etcd: EtcdClient, key: str, missing: str,
                            change: Callable[[dict[str, Any]], bool],
                            ) -> tuple[dict[str, Any], int | None]:
    """A group record (a quorum queue's or a stream's) edited in place by ``change``,
    which says whether it changed anything, and written in a transaction on the
    revision read; read and tried again while other writers get there first (20
    tries, 50 ms apart). The record and the revision written (None: nothing changed,
    nothing written). LookupError(``missing``) without a record; MembershipError when
    it kept changing."""
    for _attempt in range(20):
        kv = await etcd.get(key)
        if kv is None:
            raise LookupError(missing)
        rec = json.loads(kv.value)
        if not change(rec):
            return rec, None
        result = await etcd.txn([Compare("mod", key, "==", kv.mod_revision)],
                                [Put(key, json.dumps(rec))])
        if result.succeeded:
            return rec, result.revision
        await asyncio.sleep(0.05)
    raise MembershipError("the group record kept changing; try again")


async def read_group_records(etcd: EtcdClient, prefix: str, known_terms: dict[Ident, int]
                             ) -> tuple[dict[Ident, dict[str, Any]], dict[Ident, int]]:
    """One read of the group records under ``prefix`` (``{prefix}{vhost}/{name}``):
    queue -> record and queue -> its revision; ``known_terms`` learns the newer terms.
    Quorum queues' and streams' (amqpd.cluster.stream_group) records alike."""
    _rev, kvs = await etcd.range_prefix(prefix)
    records: dict[Ident, dict[str, Any]] = {}
    revisions: dict[Ident, int] = {}
    for kv in kvs:
        parts = kv.key.decode()[len(prefix):].split("/")
        if len(parts) != 2:
            continue
        ident = (urllib.parse.unquote(parts[0]), urllib.parse.unquote(parts[1]))
        records[ident] = rec = json.loads(kv.value)
        revisions[ident] = kv.mod_revision
        term = int(rec.get("term", 0))
        if term > known_terms.get(ident, 0):
            known_terms[ident] = term
    return records, revisions


class GroupRecords(Protocol):
    """What :func:`poll_group_records` keeps fresh (QuorumGroups, StreamGroups)."""

    etcd: EtcdClient
    records: dict[Ident, dict[str, Any]]
    revisions: dict[Ident, int]
    known_terms: dict[Ident, int]


async def poll_group_records(groups: GroupRecords, prefix: str, every: float) -> None:
    """Read the records under ``prefix`` into ``groups`` every ``every`` seconds until
    cancelled (a read etcd refuses, or a malformed record, leaves the last one read)."""
    while True:
        with contextlib.suppress(EtcdError, ValueError):
            groups.records, groups.revisions = await read_group_records(
                groups.etcd, prefix, groups.known_terms)
        await asyncio.sleep(every)


__all__ = ["GroupRecords", "edit_group_record", "poll_group_records", "read_group_records"]
