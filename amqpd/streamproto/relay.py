"""Publishers declared on a node that does not lead their stream (issue 31): their
frames go to the leader's node, which stores them as its own publishers' frames.

RabbitMQ 3.10.8 takes ``declare_publisher`` on any node of a cluster (a replica's, or
one holding no copy) and writes to the stream's leader over Erlang distribution. Here
the inter-node link carries them (:mod:`amqpd.cluster.forwarded_publish`: its frames
and the theory of the link's part):

* On the publisher's node a :class:`RemotePublisher` stands for the client's publisher:
  each publish frame's entries are packed as the client sent them
  (:func:`~amqpd.streamproto.publishing.pack_entries`) and sent to the leader's node;
  the ids not yet answered are kept, and the leader's answers become the client's
  publish-confirm and publish-error frames.
* On the leader's node the :class:`PublishRelay` keeps one
  :class:`~amqpd.streamproto.publishing.Publisher` per forwarded publisher and stores
  its frames through the same :class:`~amqpd.streamproto.publishing.Writer` path as a
  local publish: the same deduplication by producer reference (an id at or below the
  last confirmed one is confirmed and dropped), the same confirm once the records are
  committed, the same refusals with RabbitMQ's response codes.
* Flow: the bytes a connection has sent to leaders' nodes and not had answered are
  bounded (the connection's ``in_flight``): past the bound it stops reading from its
  client until answers bring them below half, as a local publisher is held by the
  speed of its own node's writes.
* When the leader is lost (the link goes down, or the node no longer leads the stream),
  every id not yet answered gets publish-error 0x06 (stream not available), the
  connection gets a metadata-update for the stream and the publisher is gone: the
  client declares it again on the node the metadata names (docs/streams.md records
  what RabbitMQ 3.10.8 does).

The user's write permission is checked on the publisher's node when it is declared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from amqpd.broker.stream import StreamQueue
from amqpd.streamproto import codec as c
from amqpd.streamproto.publishing import (
    Entries,
    Named,
    Publisher,
    Sink,
    Writer,
    pack_entries,
    unpack_entries,
)

if TYPE_CHECKING:
    from amqpd.cluster.forwarded_publish import Answer, ForwardedPublishes
    from amqpd.server import Broker

log = logging.getLogger("amqpd.streamproto")


class Owner(Sink, Protocol):
    """The connection a remote publisher belongs to."""

    name: str

    def send(self, frame: bytes) -> None: ...

    def publisher_lost(self, pub: RemotePublisher) -> None: ...

    def in_flight(self, change: int) -> None:
        """Bytes sent to a leader's node and not yet answered grew (or shrank) by
        ``change``: the connection stops reading from its client past a bound."""
        ...


class RemotePublisher(Publisher):
    """A client's publisher whose stream another node leads (module docstring)."""

    def __init__(self, id: int, reference: str | None, queue: Named, vhost: str,
                 leader: str, owner: Owner) -> None:
        super().__init__(id, reference, queue)
        self.vhost = vhost
        self.leader = leader
        self.owner = owner
        self.number = 0  # the link's name for it (ForwardedPublishes.open)
        self.links: ForwardedPublishes | None = None
        # publishing ids sent, not yet answered: each its share of the bytes sent
        self.pending: dict[int, int] = {}
        # a named producer's highest confirmed id as the leader keeps it (its answers
        # carry it): the management API's ``confirmed_publishing_id``
        self.stored: int | None = None

    def bind(self, links: ForwardedPublishes) -> bool:
        """Reach the leader's node; False when there is no link to it now."""
        number = links.open(self.leader, self)
        if number is None:
            return False
        self.links, self.number = links, number
        return True

    def forward(self, entries: Entries) -> None:
        """One publish frame's entries, to the leader's node."""
        ids = [i for i, _ in entries]
        if not ids:
            return
        self.last_id = max(self.last_id, *ids)
        packed = pack_entries(entries)
        share = len(packed) // len(ids) + 1
        pending = self.pending
        for i in ids:
            pending[i] = pending.get(i, 0) + share
        self.owner.in_flight(share * len(ids))
        self.published += len(ids)  # as a local publisher counts (publishing.Writer)
        links = self.links
        if links is None or not links.send(self.number, self.vhost, self.queue.name,
                                           self.reference or "", packed):
            self.lost(f"no link to node '{self.leader}'")

    def answered(self, confirmed: list[int], errors: list[tuple[int, int]],
                 stored: int | None) -> None:
        if stored is not None:
            self.stored = stored
        pending = self.pending
        done = sum(pending.pop(i, 0) for i in confirmed) + sum(
            pending.pop(i, 0) for i, _ in errors)
        if done:
            self.owner.in_flight(-done)
        if confirmed:
            self.confirmed += len(confirmed)
            self.owner.confirm(self, confirmed)
        if errors:
            self.errored += len(errors)
            self.owner.error(self, errors)

    def lost(self, why: str) -> None:
        """The leader is lost: what it did not answer is refused, the client hears of
        the stream (metadata-update) and the publisher is gone."""
        links, self.links = self.links, None
        if links is None:
            return
        log.warning("stream connection %s: publisher %d of stream '%s' lost the stream's "
                    "leader (node '%s'): %s; %d publishing id(s) not confirmed",
                    self.owner.name, self.id, self.queue.name, self.leader, why,
                    len(self.pending))
        self._refuse_pending()
        self.owner.publisher_lost(self)
        self.owner.send(c.metadata_update(c.STREAM_NOT_AVAILABLE, self.queue.name))

    def ended(self) -> None:
        """The stream was deleted (its stand-in on this node removed): what the leader
        did not answer is refused and the leader's node forgets the publisher; the
        connection has dropped it and tells the client (metadata-update)."""
        self._refuse_pending()
        self.close()

    def _refuse_pending(self) -> None:
        """Publish-error 0x06 (stream not available) for every id not yet answered."""
        if self.pending:
            self.owner.in_flight(-sum(self.pending.values()))
            ids, self.pending = sorted(self.pending), {}
            self.errored += len(ids)
            self.owner.error(self, [(i, c.STREAM_NOT_AVAILABLE) for i in ids])

    def close(self) -> None:
        """The client deleted it or went: the leader's node forgets it."""
        if self.pending:
            self.owner.in_flight(-sum(self.pending.values()))
            self.pending = {}
        links, self.links = self.links, None
        if links is not None:
            links.close(self.number)


class _Back:
    """A forwarded publisher's confirms and refusals, back over the link, each with
    the producer's highest confirmed id as this node keeps it (the publisher's node
    shows it in the management API, as this node would a local publisher's)."""

    def __init__(self, answer: Answer, queue: StreamQueue) -> None:
        self.answer = answer
        self.queue = queue

    def _stored(self, pub: Publisher) -> int | None:
        if pub.reference is None:
            return None
        return self.queue.stream_tracking().publishers.get(pub.reference)

    def confirm(self, pub: Publisher, ids: list[int]) -> None:
        self.answer(ids, [], self._stored(pub))

    def error(self, pub: Publisher, errors: list[tuple[int, int]]) -> None:
        self.answer([], errors, self._stored(pub))


class PublishRelay:
    """The leader's side (module docstring): the node's
    :class:`~amqpd.cluster.forwarded_publish.PublishServer`."""

    def __init__(self, broker: Broker, loop: Callable[[], Any]) -> None:
        self.broker = broker
        self.writer = Writer(loop, "(forwarded)")
        # (publisher's node, its number) -> the publisher and its way back
        self._served: dict[tuple[str, int], tuple[Publisher, _Back]] = {}

    def forwarded(self, key: tuple[str, int], vhost: str, stream: str, reference: str,
                  packed: bytes, answer: Answer) -> str | None:
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(stream) if vh is not None else None
        if not isinstance(q, StreamQueue) or q.deleted:
            self._served.pop(key, None)
            return (f"stream '{stream}' in vhost '{vhost}' is not led on node "
                    f"'{self.broker.api.node_name()}'")
        served = self._served.get(key)
        if served is None or served[0].queue is not q:
            served = self._served[key] = (Publisher(key[1], reference or None, q),
                                          _Back(answer, q))
        try:
            entries = unpack_entries(packed)
        except c.FrameError as exc:
            log.warning("stream: publish forwarded by node '%s' for stream '%s' does not "
                        "decode: %s", key[0], stream, exc)
            self._served.pop(key, None)
            return f"malformed publish: {exc}"
        self.writer.publish(served[0], q, entries, served[1])
        return None

    def forwarded_end(self, key: tuple[str, int]) -> None:
        self._served.pop(key, None)

    def peer_gone(self, node: str) -> None:
        for key in [k for k in self._served if k[0] == node]:
            del self._served[key]


__all__ = ["Owner", "PublishRelay", "RemotePublisher"]
