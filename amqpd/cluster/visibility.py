"""A barrier over the inter-node links: "every peer linked now has applied the
coordination store's changes of one kind up to revision R".

Why: definitions (:mod:`amqpd.cluster.definitions`), non-durable exchanges and bindings
(:mod:`amqpd.cluster.transient_defs`) and non-durable or exclusive queues with their
bindings (:mod:`amqpd.cluster.transient`) reach the other nodes through their watches
of the store, after the declaring node wrote them. A watch lags: with only the write
awaited, a client told queue.declare-ok or queue.bind-ok on one node could, the moment
after, find the queue or exchange unknown on another (404 on basic.consume or
queue.bind, a second exclusive queue of the same name, a fanout that skips the queue
for its first messages). RabbitMQ answers once every node's table
has the change, and a node of ``workers = N`` must behave as one process. So the
declaring node, once its write is in at revision R, sends ``SYNC R`` on every live link
and the reply waits for every ``SYNCED R`` (bounded by the caller's timeout). A peer
answers once its watch of the non-durable queues has applied revision R or later (a
store watch delivers changes in revision order, so it has then applied every earlier
one too). A link that goes down releases what waited on it: that peer is no longer
there to be ahead of. Each kind has its own watch, so ``SYNC`` names the kind
(:data:`QUEUES`, :data:`DEFINITIONS`, :data:`TRANSIENT_DEFS`) and the peer answers from
that watch's :class:`Applied`.

Only a node whose ``cluster.visible_wait`` is above 0 asks (the workers of one node set
it: docs/workers.md); a node of a cluster of separate machines answers as it always
did, once etcd holds the change, and never sends ``SYNC`` to a peer that may not know
the frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from amqpd.cluster import link_wire as W

if TYPE_CHECKING:
    from amqpd.cluster.link import Link, LinkManager


QUEUES: Final = 0  # amqpd.cluster.transient: non-durable and exclusive queues
DEFINITIONS: Final = 1  # amqpd.cluster.definitions: durable definitions
TRANSIENT_DEFS: Final = 2  # amqpd.cluster.transient_defs: non-durable exchanges, bindings


class Applied:
    """The store revision one watch of this node has applied, and the peers' ``SYNC``
    answers waiting for it."""

    def __init__(self) -> None:
        self.revision = 0
        self._waiters: list[tuple[int, Callable[[], None]]] = []

    def advance(self, revision: int) -> None:
        if revision <= self.revision:
            return
        self.revision = revision
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= revision]
            self._waiters = [w for w in self._waiters if w[0] > revision]
            for _asked, answer in ready:
                answer()

    def when(self, revision: int, answer: Callable[[], None]) -> None:
        if revision <= self.revision:
            answer()
        else:
            self._waiters.append((revision, answer))


class VisibilityBarrier:
    """The asking side's waits (per link: revision asked, its future)."""

    def __init__(self, links: LinkManager) -> None:
        self.links = links
        self.waits: dict[Link, list[tuple[int, int, asyncio.Future[None]]]] = {}

    async def wait(self, watch: int, revision: int, timeout: float) -> bool:
        """Ask every peer linked now whether its ``watch`` applied ``revision``; True
        once each answered (or its link went), False if some did not within
        ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for link in list(self.links.links.values()):
            if not link.up or link.closed:
                continue
            future: asyncio.Future[None] = loop.create_future()
            self.waits.setdefault(link, []).append((watch, revision, future))
            link.send(W.encode(W.SYNC, 0, watch, revision))
            futures.append(future)
        if not futures:
            return True
        _done, pending = await asyncio.wait(futures, timeout=timeout)
        for future in pending:
            future.cancel()
        for link in list(self.waits):
            left = [w for w in self.waits[link] if not w[2].done()]
            if left:
                self.waits[link] = left
            else:
                del self.waits[link]
        return not pending

    def answered(self, link: Link, watch: int, revision: int) -> None:
        """``SYNCED watch revision`` from ``link``'s peer: what asked of that watch up
        to it is done."""
        for kind, asked, future in self.waits.get(link, ()):
            if kind == watch and asked <= revision and not future.done():
                future.set_result(None)

    def link_down(self, link: Link) -> None:
        for _kind, _asked, future in self.waits.pop(link, ()):
            if not future.done():
                future.set_result(None)


def answer_when(link: Link, watch: int, revision: int) -> None:
    """The answering side's reply to ``SYNC watch revision`` (the caller calls this
    once that watch has applied ``revision``)."""
    if not link.closed:
        link.send(W.encode(W.SYNCED, 0, watch, revision))


__all__ = ["DEFINITIONS", "QUEUES", "TRANSIENT_DEFS", "Applied", "VisibilityBarrier",
           "answer_when"]
