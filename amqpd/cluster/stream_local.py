"""Stream consumers served from this node's copy (issue 30): a consumer of a stream led
by another node, on a node that holds one of its members, reads that member's log here,
as RabbitMQ's stream consumers read their local replica; only publishes go to the
leader.

* **Committed only.** The copy's reader delivers records below the commit point the
  leader told this member (``SCOMMIT``, :attr:`StreamReplica.committed`): every such
  record is written on a majority of the members, so the election after a loss of the
  leader keeps it (the longest log of a majority wins). A record the copy holds beyond
  that waits until the commit point passes it.
* **Where it starts.** ``x-stream-offset`` is read against the copy as the leader reads
  its own log (:func:`~amqpd.broker.api.start_offset`: first, last, next, an offset, a
  timestamp, an interval); ``next`` is the copy's end, as on a RabbitMQ replica.
* **What is delivered.** The record as stored, with its ``x-stream-offset`` header; the
  entry's id is the negative of its offset plus one, which is never a delivery id of a
  leader, so the remote queue's settling gives the credit back and sends nothing.
* **Disk reads** go through the stream consumers' read-ahead
  (:class:`~amqpd.broker.api.ReadAhead`): a reader far behind reads in a worker.
* **When the copy changes.** The copy started again (its log reset), was dropped
  (this node no longer a member, or its node won the election and the copy became the
  stream) or replaced (a new leader): :meth:`LocalRead.follows` is False, and the
  remote queue moves the consumer on at the offset after its last delivery -- to the
  new copy, to the leader over the link, or, after this node's promotion, to the new
  stream queue (:func:`amqpd.cluster.cluster_queues.replace_queue`). The copy's
  deliveries its channel still holds count against its prefetch there; each one
  settled gives its place back to where it reads now (the leader's credit, or a
  dispatch of the new queue: ``RemoteQueue._local_settled``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import ReadAhead, Record, pool_for, start_offset

if TYPE_CHECKING:
    from amqpd.cluster.stream_replica import StreamReplica

READ_BATCH: Final = 128  # records read for one consumer at once at most


def usable(replica: StreamReplica | None, leader: str) -> bool:
    """Whether this node's consumers may read ``replica`` here: fed by ``leader``, the
    stream's leader as the remote queue knows it, who told it a commit point."""
    return replica is not None and not replica.closed and replica.leader == leader \
        and replica.committed >= 0


def local_start(spec: Any, resume: int | None, replica: StreamReplica) -> int | None:
    """Where a consumer starts in ``replica``'s copy: at ``resume`` when it was given
    records already (the offset after its last; never before the copy's first), else
    where ``x-stream-offset: spec`` says (None: not a form RabbitMQ knows; the leader
    refuses it)."""
    if resume is not None:
        return max(resume, replica.log.first_offset)
    return start_offset(spec, replica.log, int(time.time() * 1000))


class LocalRead:
    """One consumer's position in this node's copy of a stream (module docstring).
    ``wake`` is called when it may deliver more (a read landed, the commit point moved,
    the copy changed)."""

    def __init__(self, replica: StreamReplica, offset: int, wake: Callable[[], None]) -> None:
        self.replica = replica
        self.generation = replica.generation
        self.wake = wake
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self.ahead = ReadAhead(replica.log, offset, pool_for(loop), wake)
        replica.watchers.append(wake)

    @property
    def offset(self) -> int:
        """The next offset this consumer gets."""
        return self.ahead.offset

    def follows(self, replica: StreamReplica | None) -> bool:
        """Still reading ``replica``, the copy this node holds now, as it was opened."""
        return replica is self.replica and not replica.closed and \
            replica.generation == self.generation

    def next_batch(self, credit: int) -> list[Record]:
        """Up to ``credit`` committed records in order ([] when there are none now, or a
        read-ahead is under way: ``wake`` follows)."""
        limit = self.replica.committed
        start = self.ahead.offset
        if start >= limit or credit <= 0:
            return []
        batch = self.ahead.next_batch(min(credit, READ_BATCH, limit - start))
        for i, record in enumerate(batch):
            if record.offset >= limit:  # past a gap retention made: not committed yet
                self.ahead.unread(batch[i:])
                return batch[:i]
        return batch

    def unread(self, records: list[Record]) -> None:
        """Records the consumer could not take come first next time."""
        self.ahead.unread(records)

    def close(self) -> None:
        self.ahead.close()
        if self.wake in self.replica.watchers:
            self.replica.watchers.remove(self.wake)


__all__ = ["READ_BATCH", "LocalRead", "local_start", "usable"]
