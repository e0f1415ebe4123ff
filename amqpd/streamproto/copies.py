"""What a subscription reads: a stream led on this node, or this node's copy of a
stream another node leads (issue 31).

RabbitMQ's stream plugin subscribes a client to the stream's member on the node it is
connected to (``rabbit_stream_manager:lookup_local_member``), the leader's or a
replica's, and the metadata command names both, so clients (rstream, rbfly,
rabbitmq-stream-js-client) spread their consumers over the replicas. amqpd does the
same on a member's node: a subscription there reads the member's copy of the stream
(:class:`amqpd.cluster.stream_replica.StreamReplica`, the copy the AMQP 0-9-1
consumers of that node read through :mod:`amqpd.cluster.stream_local`), cut into
chunks exactly as on the leader (:func:`amqpd.streamproto.chunks.next_chunk`).

* **Committed only.** On either node a subscription reads below the stream's commit
  point (:meth:`StreamSource.commit_point`): on the leader what its commit rule
  committed (one node: what is fsynced), on a member the commit point the leader told
  it (``SCOMMIT``). A copy that was never told one (a new leader has not spoken yet)
  is not readable: the subscribe is answered ``STREAM_NOT_AVAILABLE``, as RabbitMQ
  answers on a node with no running member.
* **When the copy changes.** A copy that starts again (its log reset: an uncommitted
  tail cut), is closed (replaced for a new leader, this node promoted, or no longer a
  member) or deleted ends its subscriptions with a metadata update
  ``STREAM_NOT_AVAILABLE``, as RabbitMQ's reader does when the member it reads goes
  down; clients ask the metadata again and subscribe anew from the offset they hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from amqpd.streamproto.chunks import ChunkCache

if TYPE_CHECKING:
    from amqpd.cluster.stream_replica import StreamReplica
    from amqpd.store.stream_log import StreamLog


class StreamSource(Protocol):
    """What a subscription needs of the stream it reads: a
    :class:`~amqpd.broker.stream.StreamQueue` led here, or a :class:`CopySource`."""

    name: str
    log: StreamLog
    chunk_cache: ChunkCache

    def commit_point(self) -> int:
        """The offset below which records may be delivered."""
        ...


class CopySource:
    """This node's copy of a stream led elsewhere, as its subscriptions here read it
    (module docstring). ``wake`` is called whenever the copy moved (records written,
    the commit point moved, the copy started again or went); :meth:`current` says
    which."""

    def __init__(self, name: str, replica: StreamReplica, wake: Callable[[], None]) -> None:
        self.name = name
        self.replica = replica
        self.log = replica.log
        self.generation = replica.generation
        # chunks the connection's subscriptions to this copy share (a new copy: new
        # chunks, since a copy that starts again reuses its offsets)
        self.chunk_cache = ChunkCache()
        self.wake = wake
        replica.watchers.append(wake)

    def commit_point(self) -> int:
        """Below what the leader told this copy is committed (nothing before it did)."""
        return max(0, self.replica.committed)

    def current(self) -> bool:
        """The copy is still open and has not started again since it was opened."""
        replica = self.replica
        return not replica.closed and replica.generation == self.generation

    def close(self) -> None:
        """No subscription reads it any more: stop hearing of it."""
        if self.wake in self.replica.watchers:
            self.replica.watchers.remove(self.wake)


__all__ = ["CopySource", "StreamSource"]
