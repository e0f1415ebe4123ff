"""A take-over's etcd transaction whose answer was lost.

A failover writes the queue's definition and its replica record in one guarded etcd
transaction. When etcd is slow (a SIGSTOP, a loaded machine) the client gives up
waiting (EtcdError) although etcd may have applied the transaction, or may still apply
it. The definition then names this node the leader while this node, believing it
failed, hosts nothing: every node answers 404 for the queue and its messages are
unreachable (the chaos test, seed 107 with namespace partitions, 2026-12-06). So a lost
answer is never read as a refusal: the keys are read back until etcd answers, and the
transaction counts as applied when every key holds what it put — values that name this
node as the leader, which no other node writes.

A transaction that lands even after the read-back (still in flight then) is the other
half: the next election round finds the record naming this node while it does not lead
the queue (:func:`names_this_node`) and finishes the take-over then.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

from amqpd.coord.etcd import Compare, EtcdClient, EtcdError, Put

log = logging.getLogger(__name__)

READBACK_WINDOW = 30.0  # seconds of asking before the take-over is given up as failed
READBACK_PAUSE = 0.2


async def take_over_txn(etcd: EtcdClient, compare: Sequence[Compare],
                        puts: Sequence[Put], what: str,
                        window: float = READBACK_WINDOW) -> int | None:
    """Run the guarded transaction: the revision it wrote at, or None when a guard
    failed (another node changed a key first). An answer lost on the way is settled by
    reading the keys back (:mod:`this module's docstring <amqpd.cluster.takeover_txn>`);
    EtcdError only when etcd answered nothing for ``window`` seconds."""
    try:
        result = await etcd.txn(compare, puts)
    except EtcdError as exc:
        log.warning("%s: etcd's answer to the take-over was lost (%s); reading it back",
                    what, exc)
    else:
        return result.revision if result.succeeded else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window
    while True:
        try:
            revision = await applied(etcd, puts)
        except EtcdError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(READBACK_PAUSE)
            continue
        log.warning("%s: the take-over %s", what,
                    "was applied" if revision is not None else "was not applied")
        return revision


async def applied(etcd: EtcdClient, puts: Sequence[Put]) -> int | None:
    """The revision of the keys ``puts`` wrote, if every one holds its value now."""
    revision: int | None = None
    for put in puts:
        kv = await etcd.get(put.key)
        value = put.value.encode() if isinstance(put.value, str) else put.value
        if kv is None or kv.value != value:
            return None
        revision = kv.mod_revision
    return revision


def names_this_node(record: dict[str, Any], definition: bytes | None, node: str) -> bool:
    """The replica record and the queue's definition both name ``node`` its leader: a
    take-over of this node's that etcd applied after this node stopped waiting."""
    if record.get("leader") != node or definition is None:
        return False
    try:
        return bool(json.loads(definition).get("node") == node)
    except ValueError:
        return False
