"""The mirrored queues' store wrapper (issue 16): the node's message store, with the
records of the replicated queues this node leads turned into replication frames.

:class:`ReplicatingStore` replaces ``broker.store`` while mirrored (or quorum) queues
run (:meth:`amqpd.cluster.mirror.Mirrors.start`); every call passes through to the real
store. For a store key in :attr:`ReplicatingStore.by_key` (a queue this node leads,
:class:`amqpd.cluster.mirror_leading.Leading`) it also hands the record to the leader's
streams, and its ``commit`` -- the one door of publisher confirms, tx.commit-ok and
every durability wait -- answers only once the synchronised mirrors acknowledged what
was replicated (:class:`amqpd.cluster.mirror_state.CommitGate`). Theory of operation:
:mod:`amqpd.cluster.mirror`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.broker.api import MessageStore, StoredMessage
    from amqpd.cluster.mirror import Mirrors
    from amqpd.cluster.mirror_leading import Leading



def _append(append: Callable[[str, Iterable[int]], None], queue: str, positions: Iterable[int],
            then: Callable[[list[int]], None] | None) -> None:
    """``append`` the records of ``positions`` to the inner store, then, for a queue
    this node leads, hand the same positions to its streams (``then``: the leader's
    ``settled`` or ``delivered``)."""
    if then is None:
        append(queue, positions)
        return
    positions = list(positions)
    append(queue, positions)
    then(positions)

class ReplicatingStore:
    """The node's message store, with the records of mirrored queues this node leads
    replicated, and commits that wait for the synchronised mirrors (module docstring).
    Everything else passes through unchanged."""

    def __init__(self, inner: MessageStore, mirrors: Mirrors) -> None:
        self.inner = inner
        self.mirrors = mirrors
        self.on_disk = inner.on_disk
        self.by_key: dict[str, Leading] = {}

    def __getattr__(self, name: str) -> Any:  # failed, maintain, ... of the real store
        return getattr(self.inner, name)

    def open(self) -> Any:
        return self.inner.open()

    def append_enqueue(self, queues: Sequence[str], message: StoredMessage) -> int:
        position = self.inner.append_enqueue(queues, message)
        if self.by_key:
            for key in queues:
                lead = self.by_key.get(key)
                if lead is not None:
                    lead.enqueued(position, message)
        return position

    def append_settle(self, queue: str, positions: Iterable[int]) -> None:
        lead = self.by_key.get(queue)
        _append(self.inner.append_settle, queue, positions,
                None if lead is None else lead.settled)

    def append_delivered(self, queue: str, position: int) -> None:
        self.inner.append_delivered(queue, position)
        lead = self.by_key.get(queue)
        if lead is not None:
            lead.delivered([position])

    def delivering(self, queue: str, position: int) -> None:
        self.inner.delivering(queue, position)
        lead = self.by_key.get(queue)
        if lead is not None:
            lead.checked_out(position)

    def append_delivered_many(self, queue: str, positions: Iterable[int]) -> None:
        lead = self.by_key.get(queue)
        _append(self.inner.append_delivered_many, queue, positions,
                None if lead is None else lead.delivered)

    def drop_queue(self, queue: str) -> None:
        self.inner.drop_queue(queue)
        lead = self.by_key.get(queue)
        if lead is not None:
            lead.dropped()

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        self.inner.append_definition(kind, key, body)

    def read(self, position: int) -> StoredMessage:
        return self.inner.read(position)

    def commit(self, callback: Any) -> None:
        gate = self.mirrors.gate
        needs = gate.needs_now()
        if not needs and not gate.waiting:
            self.inner.commit(callback)
            return

        def stored(error: BaseException | None) -> None:
            if error is not None:
                callback(error)
            else:
                gate.wait(needs, time.monotonic(), callback)

        self.inner.commit(stored)

    def stats(self) -> dict[str, int]:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


__all__ = ["ReplicatingStore"]
