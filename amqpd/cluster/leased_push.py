"""Keys a node keeps in etcd under its own lease (its non-durable queues, the facts it
shares with the others), pushed by one task: :class:`LeasedPush`.

Such keys vanish with the node's lease, so they are written again, every one, whenever
the lease changes (the first start, or a lease that ran out while etcd was out of
reach); between leases only what changed is written. A write etcd refuses is tried
again after a growing pause (0.1 s doubling to 2 s), so a node cut off from etcd neither
spins nor loses what it still has to write. One task writes, one key at a time: a key
changed again while its write was under way stays pending with the newer body.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Generic, TypeVar

from amqpd.coord.etcd import EtcdError

if TYPE_CHECKING:
    from amqpd.cluster.node import Cluster
    from amqpd.coord.etcd import EtcdClient

K = TypeVar("K")

BACKOFF_FIRST = 0.1  # seconds before a failed write is tried again ...
BACKOFF_MOST = 2.0  # ... doubling to at most this
IDLE_CHECK = 0.5  # seconds between looks at the lease while nothing is pending


class LeasedPush(Generic[K]):
    """What a part of the node keeps under its lease: ``mine`` (key -> body, as this
    node has it), ``pending`` (what is still to be written: a body, or None to delete),
    and the task :meth:`_push_loop` that writes it."""

    cluster: Cluster
    etcd: EtcdClient
    mine: dict[K, str]
    pending: dict[K, str | None]
    lease: int  # the lease this node's keys were last written under (0: none yet)
    _wake: asyncio.Event

    def _keep(self, ident: K, body: str) -> None:
        """``ident`` is ``body`` now here: written to etcd if it changed."""
        if self.mine.get(ident) != body:
            self.mine[ident] = body
            self.pending[ident] = body
            self._wake.set()

    def _forget(self, ident: K) -> None:
        """``ident`` is no longer this node's: its key is deleted."""
        if self.mine.pop(ident, None) is not None:
            self.pending[ident] = None
            self._wake.set()

    async def _first_lease(self) -> None:
        """Called before the first write under this process's first lease (an
        :class:`EtcdError` is tried again later); by default nothing."""

    def _etcd_key(self, ident: K) -> str:
        """The etcd key of ``ident``."""
        raise NotImplementedError

    def _not_written(self, ident: K, exc: EtcdError) -> None:
        """Log that ``ident`` could not be written yet."""
        raise NotImplementedError

    def _written(self, ident: K, revision: int) -> None:
        """``ident`` was written (still pending if it changed meanwhile) at the store's
        ``revision`` (0 for a delete, whose revision etcd does not answer); by default
        nothing."""

    async def _push_loop(self) -> None:
        backoff = BACKOFF_FIRST
        while True:
            lease = self.cluster.membership.lease_id
            if lease and not self.lease:
                try:
                    await self._first_lease()
                except EtcdError:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MOST)
                    continue
            if lease and lease != self.lease:
                # a new lease (first start, or the old one ran out): every key again
                self.pending.update(self.mine)
                self.lease = lease
            if not self.pending or not lease:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), IDLE_CHECK)
                continue
            ident, body = next(iter(self.pending.items()))
            key = self._etcd_key(ident)
            revision = 0
            try:
                if body is None:
                    await self.etcd.delete(key)
                else:
                    revision = await self.etcd.put(key, body, lease=lease)
            except EtcdError as exc:
                self._not_written(ident, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MOST)
                continue
            backoff = BACKOFF_FIRST
            if self.pending.get(ident, 0) == body:
                del self.pending[ident]
            self._written(ident, revision)


__all__ = ["LeasedPush"]
