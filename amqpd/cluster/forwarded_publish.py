"""Stream-protocol publishers on a node that does not lead their stream (issue 31): the
inter-node link's part.

RabbitMQ 3.10.8 takes ``declare_publisher`` on any node of a cluster and writes to the
stream's leader (its osiris writer) over Erlang distribution. amqpd's stream listener
(:mod:`amqpd.streamproto.relay`) does the same over the link to the leader's node, with
four frames of :mod:`amqpd.cluster.link_wire` whose stream number names the publisher
(numbered by the publisher's node, unique per link):

* ``SPUB`` (publisher's node -> leader's node): vhost, stream, producer reference ("":
  unnamed) and one client frame's entries, packed as the protocol packs them. The
  leader stores them as a local publish would, in the order the frames came.
* ``SPUBBED`` (leader -> publisher's node): publishing ids confirmed, and ids refused
  with their response codes, as the leader's writer answers them; with a named
  producer's highest confirmed publishing id as the leader keeps it (for
  deduplication), which the management API shows on the publisher's node.
* ``SPUBEND`` (publisher's node -> leader): the publisher is gone; the leader forgets
  its state (the ids in flight for deduplication).
* ``SPUBLOST`` (leader -> publisher's node): the leader cannot take this publisher's
  frames (it no longer leads the stream, or its stream listener is off).

This module only carries them: what a frame means is the stream listener's, through
the two sides below (:class:`PublishServer` on the leader, :class:`Forwarded` on the
publisher's node). A link that goes down ends every publisher forwarded over it on
both ends (the publisher's node tells its client: :meth:`Forwarded.lost`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from amqpd.cluster import link_wire as W
from amqpd.cluster.link import Link

if TYPE_CHECKING:
    from amqpd.cluster.cluster_queues import ClusterQueues

log = logging.getLogger("amqpd.cluster.queues")

_KINDS = frozenset({W.SPUB, W.SPUBBED, W.SPUBEND, W.SPUBLOST})


class Forwarded(Protocol):
    """A publisher on this node whose stream another node leads."""

    def answered(self, confirmed: list[int], errors: list[tuple[int, int]],
                 stored: int | None) -> None:
        """The leader's answers, and its producer's highest confirmed id (None: an
        unnamed publisher, or none confirmed yet)."""
        ...

    def lost(self, why: str) -> None: ...


class Answer(Protocol):
    """The leader's way back to one forwarded publisher."""

    def __call__(self, confirmed: list[int], errors: list[tuple[int, int]],
                 stored: int | None) -> None: ...


class PublishServer(Protocol):
    """The leader's side: the stream listener storing forwarded frames."""

    def forwarded(self, key: tuple[str, int], vhost: str, stream: str, reference: str,
                  packed: bytes, answer: Answer) -> str | None:
        """Store one frame of publisher ``key`` (node, number); None, or why the
        publisher cannot be served here (SPUBLOST)."""
        ...

    def forwarded_end(self, key: tuple[str, int]) -> None: ...

    def peer_gone(self, node: str) -> None: ...


class ForwardedPublishes:
    """Both ends of forwarded stream publishers on this node's links (module
    docstring); one per node, ``cluster.forwarded_publishes``."""

    def __init__(self, queues: ClusterQueues,
                 server: Callable[[], PublishServer | None]) -> None:
        self.queues = queues
        self._server = server  # the stream listener's, when it runs
        self._next = 0
        self._mine: dict[int, tuple[str, Forwarded]] = {}  # number -> (leader, publisher)

    # ------------------------------------------------------------------ publisher's node
    def open(self, leader: str, publisher: Forwarded) -> int | None:
        """A number for ``publisher``, whose frames go to ``leader``; None when there
        is no link to that node now (it is asked to come up)."""
        if self.queues.links.link(leader) is None:
            self.queues.links.want(leader)
            return None
        self._next = self._next % 0xFFFFFFFF + 1
        self._mine[self._next] = (leader, publisher)
        return self._next

    def send(self, number: int, vhost: str, stream: str, reference: str,
             packed: bytes) -> bool:
        """Forward one frame's entries; False (and the publisher forgotten) when the
        link to its leader is not up."""
        mine = self._mine.get(number)
        link = self.queues.links.link(mine[0]) if mine is not None else None
        if link is None:
            self._mine.pop(number, None)
            return False
        link.send(W.encode(W.SPUB, number, vhost, stream, reference, packed))
        return True

    def close(self, number: int) -> None:
        """The publisher is gone: the leader forgets it."""
        mine = self._mine.pop(number, None)
        link = self.queues.links.link(mine[0]) if mine is not None else None
        if link is not None:
            link.send(W.encode(W.SPUBEND, number))

    # ------------------------------------------------------------------ the link's
    def link_up(self, link: Link) -> None:
        pass

    def link_down(self, link: Link) -> None:
        lost = [n for n, (leader, _) in self._mine.items() if leader == link.peer]
        for number in lost:
            _, publisher = self._mine.pop(number)
            publisher.lost(f"the link to node '{link.peer}' went down")
        server = self._server()
        if server is not None:
            server.peer_gone(link.peer)

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if kind not in _KINDS:
            return
        if kind == W.SPUBBED:
            mine = self._mine.get(stream)
            if mine is not None and mine[0] == link.peer:
                mine[1].answered(f[0], list(zip(f[1], f[2], strict=True)),
                                 f[3] - 1 if f[3] else None)
        elif kind == W.SPUBLOST:
            mine = self._mine.get(stream)
            if mine is not None and mine[0] == link.peer:
                del self._mine[stream]
                mine[1].lost(f[0])
        elif kind == W.SPUB:
            self._serve(link, stream, f)
        else:  # SPUBEND
            server = self._server()
            if server is not None:
                server.forwarded_end((link.peer, stream))

    def _serve(self, link: Link, number: int, f: list[Any]) -> None:
        server = self._server()
        why: str | None = "the stream listener is off on this node"
        if server is not None:

            def answer(confirmed: list[int], errors: list[tuple[int, int]],
                       stored: int | None) -> None:
                if not link.closed:
                    link.send(W.encode(W.SPUBBED, number, confirmed,
                                       [i for i, _ in errors], [code for _, code in errors],
                                       0 if stored is None else stored + 1))

            why = server.forwarded((link.peer, number), f[0], f[1], f[2], f[3], answer)
        if why is not None:
            link.send(W.encode(W.SPUBLOST, number, why))


def start(queues: ClusterQueues,
          server: Callable[[], PublishServer | None]) -> ForwardedPublishes:
    """Carry forwarded stream publishes on this node's links (``serve`` calls it)."""
    forwarded = ForwardedPublishes(queues, server)
    queues.extensions.append(forwarded)
    return forwarded


__all__ = ["Answer", "Forwarded", "ForwardedPublishes", "PublishServer", "start"]
