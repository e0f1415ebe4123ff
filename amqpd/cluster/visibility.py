"""A barrier over the inter-node links: "every peer linked now has applied the
coordination store's changes of non-durable queues up to revision R".

Why: a non-durable (or exclusive) queue and its bindings reach the other nodes through
their watches of the store (:mod:`amqpd.cluster.transient`), after the declaring node
wrote them. A watch lags: with only the write awaited, a client told queue.declare-ok
or queue.bind-ok on one node could, the moment after, find the queue unknown on
another (404 on basic.consume, a second exclusive queue of the same name, a fanout
that skips the queue for its first messages). RabbitMQ answers once every node's table
has the change, and a node of ``workers = N`` must behave as one process. So the
declaring node, once its write is in at revision R, sends ``SYNC R`` on every live link
and the reply waits for every ``SYNCED R`` (bounded by the caller's timeout). A peer
answers once its watch of the non-durable queues has applied revision R or later (a
store watch delivers changes in revision order, so it has then applied every earlier
one too). A link that goes down releases what waited on it: that peer is no longer
there to be ahead of.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from amqpd.cluster import link_wire as W

if TYPE_CHECKING:
    from amqpd.cluster.link import Link, LinkManager


class VisibilityBarrier:
    """The asking side's waits (per link: revision asked, its future)."""

    def __init__(self, links: LinkManager) -> None:
        self.links = links
        self.waits: dict[Link, list[tuple[int, asyncio.Future[None]]]] = {}

    async def wait(self, revision: int, timeout: float) -> bool:
        """Ask every peer linked now; True once each answered (or its link went),
        False if some did not within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for link in list(self.links.links.values()):
            if not link.up or link.closed:
                continue
            future: asyncio.Future[None] = loop.create_future()
            self.waits.setdefault(link, []).append((revision, future))
            link.send(W.encode(W.SYNC, 0, revision))
            futures.append(future)
        if not futures:
            return True
        _done, pending = await asyncio.wait(futures, timeout=timeout)
        for future in pending:
            future.cancel()
        for link in list(self.waits):
            left = [w for w in self.waits[link] if not w[1].done()]
            if left:
                self.waits[link] = left
            else:
                del self.waits[link]
        return not pending

    def answered(self, link: Link, revision: int) -> None:
        """``SYNCED revision`` from ``link``'s peer: what asked for up to it is done."""
        for asked, future in self.waits.get(link, ()):
            if asked <= revision and not future.done():
                future.set_result(None)

    def link_down(self, link: Link) -> None:
        for _asked, future in self.waits.pop(link, ()):
            if not future.done():
                future.set_result(None)


def answer_when(link: Link, revision: int) -> None:
    """The answering side's reply to ``SYNC revision`` (once it applies: the caller
    calls this when its watch has reached ``revision``)."""
    if not link.closed:
        link.send(W.encode(W.SYNCED, 0, revision))


__all__ = ["VisibilityBarrier", "answer_when"]
