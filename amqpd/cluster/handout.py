"""A quorum queue's leader hands a message out only once its checkout is committed.

Why. The leader records every delivery with the node whose consumer holds it
(:data:`amqpd.cluster.quorum_group.MHELD`), so that the member elected after its loss
knows what was handed out and redelivers it with redelivered=true. That record travels
on the replication links; the delivery itself travels on a client's socket (a consumer
on the leader's node, basic.get) or on the link to the consumer's node (``DELIVER``,
``GET_OK``). Sent side by side, a delivery could leave while its record was still in a
buffer that a kill -9 of the leader threw away: the new leader then gave the message
out again as never delivered (redelivered=false: CI's "1196 again without a flag").
RabbitMQ's quorum queue never does that: a checkout is a command of its Raft log, and
the delivery is an effect of applying it, which happens only once a majority holds it.
So here: the delivery waits until the members the group's commit rule counts (a
majority, the leader's own log included: :meth:`ReplicaSet.satisfied`) acknowledged
every record up to the checkout's (``MACK``).

How.

* :class:`CommitOutbox` -- the actions waiting, each with the replication sequence
  number it needs (the last one handed out when it was queued: the checkout's own
  record, and everything before it). Acknowledgements come in sequence order per
  member, so the waits are released in order; the order of the deliveries on every
  channel and link stays the order the queue chose. Pure: the unit tests drive it.
* :class:`Handouts` -- the deliveries to this node's own channels waiting there. A
  consumer's credit is taken when the queue chooses the delivery (its prefetch and its
  channel's count it as unacknowledged), so the queue hands it no more than its window
  while they wait; the delivery tag is given when the delivery is written, so tags stay
  in the order the client sees them. A delivery whose consumer is cancelled, or whose
  channel closed, before it could leave is not written: it comes back to its place in
  the queue as any returned checkout does (:meth:`QuorumQueue.return_checked_out
  <amqpd.broker.quorum.QuorumQueue.return_checked_out>`: redelivered, counted once more,
  as RabbitMQ returns a checkout whose channel went). basic.get waits the same way.
  Deliveries to other nodes' consumers wait in the same outbox
  (:meth:`amqpd.cluster.remote_served.Served.hand`).
* While the group has no majority nothing is acknowledged, so nothing waiting leaves,
  as RabbitMQ's quorum queue delivers nothing then; a deposed (fenced) leader's never
  leave. When the leader stops leading the queue (deleted, replaced after an election)
  what waits is dropped (:meth:`Handouts.drop`): credit given back, the messages back
  in the local queue, which no longer serves anyone.
* At most :data:`WAITING_CAP` deliveries wait per queue (a consumer without prefetch,
  or with no_ack, has no window of its own): the queue hands out more once some left.
* A basic.get waits at most :data:`GET_COMMIT_WAIT` (this node's channel's or another
  node's, :meth:`CommitOutbox.after_commit` with an expiry): a client's get must be
  answered, and a group that keeps failing its commits (a member counted as in sync
  that never acknowledges) would otherwise hold it for good (seen once in CI with a
  two-member group: the get's message counted as unacked, no get-ok sent). It is then
  answered get-empty, with a log line, and its message comes back to the queue as a
  returned checkout (redelivered, as a cancelled consumer's does): the checkout's
  record may be committed later, so the message counts as delivered once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from amqpd.cluster.mirror_state import ReplicaSet

# What these need of the broker's queue, consumer and entry (amqpd.broker.quorum's
# QuorumQueue, amqpd.broker.queue's Consumer, a QueueEntry): structural, so the cluster
# reaches the broker through no import of it (the import contracts in pyproject.toml).
QueueEntry = Any  # one message's place in the queue; only its identity matters here


class QueueType(Protocol):
    name: str
    deleted: bool
    ext: Any
    message_count: int

    def delivered(self, entry: QueueEntry, acked: bool) -> None: ...

    def return_checked_out(self, entries: list[QueueEntry]) -> None: ...


class Consumer(Protocol):
    local: Any  # the channel on this node (amqpd.broker.channel.Channel), or None
    no_ack: bool
    unacked: int

    def deliver(self, queue: Any, entry: QueueEntry) -> None: ...

log = logging.getLogger("amqpd.cluster.quorum")

WAITING_CAP: Final = 4096  # deliveries of one queue waiting for their checkout's commit
GET_COMMIT_WAIT: Final = 10.0  # s a basic.get waits for its checkout's commit (as GET_WAIT)


class _Wait:
    """One action waiting in a :class:`CommitOutbox`."""

    __slots__ = ("action", "deadline", "done", "expired", "seq")

    def __init__(self, seq: int, action: Callable[[], None],
                 expired: Callable[[], None] | None, deadline: float) -> None:
        self.seq = seq
        self.action = action
        self.expired = expired
        self.deadline = deadline
        self.done = False  # ran, or expired


class CommitOutbox:
    """Actions that run, in the order they came, once the records up to the sequence
    number each needs are committed in ``rs`` (module docstring)."""

    def __init__(self, rs: ReplicaSet) -> None:
        self.rs = rs
        self.waiting: deque[_Wait] = deque()
        self.expiring: deque[_Wait] = deque()  # those with an expiry, oldest first
        self.releasing = False

    def __len__(self) -> int:
        return len(self.waiting)

    def after_commit(self, action: Callable[[], None],
                     expired: Callable[[], None] | None = None,
                     wait: float = GET_COMMIT_WAIT) -> None:
        """Run ``action`` once every record handed out so far is committed: now, if it
        is and nothing waits before it. With ``expired``: if that has not happened
        ``wait`` seconds from now, :meth:`expire` runs ``expired`` instead (a get)."""
        seq = self.rs.seq
        if not self.waiting and self.rs.satisfied(seq):
            action()
            return
        w = _Wait(seq, action, expired, time.monotonic() + wait if expired else 0.0)
        self.waiting.append(w)
        if expired is not None:
            self.expiring.append(w)

    def expire(self, now: float) -> int:
        """Run the expiry of the actions with one whose time passed (their action will
        not run); the others keep their order. How many expired."""
        expiring = self.expiring
        due: list[_Wait] = []
        while expiring and (expiring[0].done or expiring[0].deadline <= now):
            w = expiring.popleft()
            if not w.done:
                w.done = True
                due.append(w)
        if not due:
            return 0
        kept = [w for w in self.waiting if not w.done]  # in place: release() holds it
        self.waiting.clear()
        self.waiting.extend(kept)
        for w in due:
            assert w.expired is not None
            try:
                w.expired()
            except Exception:  # one failed answer must not hold the others
                log.exception("a basic.get waiting for its checkout's commit failed")
        return len(due)

    def release(self) -> int:
        """Run the actions whose records are committed, in order; how many ran."""
        if self.releasing:  # an action's own records (a settle) re-entered
            return 0
        self.releasing = True
        n = 0
        waiting = self.waiting
        satisfied = self.rs.satisfied
        try:
            while waiting and satisfied(waiting[0].seq):
                w = waiting.popleft()
                w.done = True
                n += 1
                try:
                    w.action()
                except Exception:  # one failed delivery must not hold the others
                    log.exception("a delivery waiting for its checkout's commit failed")
        finally:
            self.releasing = False
        return n

    def clear(self) -> None:
        for w in self.waiting:
            w.done = True
        self.waiting.clear()
        self.expiring.clear()


class Handout:
    """One delivery to a channel on this node waiting for its checkout's commit: to
    ``consumer`` (basic.deliver), or the answer to a basic.get (``consumer`` None)."""

    __slots__ = ("channel", "consumer", "done", "entry", "no_ack", "queue")

    def __init__(self, queue: QueueType, consumer: Consumer | None, channel: Any,
                 entry: QueueEntry, no_ack: bool) -> None:
        self.queue = queue
        self.consumer = consumer
        self.channel = channel
        self.entry = entry
        self.no_ack = no_ack
        self.done = False  # left, withdrawn or dropped


class Handouts:
    """The deliveries of one quorum queue waiting for their checkout's commit: this
    node's channels' (here) and other nodes' (actions in :attr:`outbox`)."""

    def __init__(self, rs: ReplicaSet, on_room: Callable[[], None]) -> None:
        self.outbox = CommitOutbox(rs)
        self.local: dict[int, Handout] = {}  # id(entry) -> this node's, waiting or leaving
        self.on_room = on_room  # the cap held the queue back and some left: dispatch

    def has_room(self) -> bool:
        return len(self.outbox) < WAITING_CAP

    def release(self) -> None:
        """What is committed now leaves (an acknowledgement came, or the members
        changed)."""
        if not self.outbox.waiting:
            return
        full = not self.has_room()
        if self.outbox.release() and full:
            self.on_room()

    def hand_out(self, queue: QueueType, consumer: Consumer, entry: QueueEntry) -> None:
        """The queue chose ``consumer`` for ``entry`` (QuorumQueue.dispatch). Another
        node's consumer (remote_queue._Proxy) gets it through its link, whose
        ``DELIVER`` waits in :attr:`outbox` (remote_served.Served.hand); one on this
        node's channel: its credit taken now, the checkout recorded
        (``queue.delivered``: MHELD), the delivery written once that is committed."""
        channel = consumer.local
        if channel is None:
            consumer.deliver(queue, entry)
            return
        if not consumer.no_ack:
            consumer.unacked += 1
            channel.unacked_consumer_count += 1
        queue.delivered(entry, False)
        h = Handout(queue, consumer, channel, entry, consumer.no_ack)
        self.local[id(entry)] = h
        self.outbox.after_commit(lambda: self._deliver(h))

    def get_for(self, queue: QueueType, channel: Any, entry: QueueEntry,
                no_ack: bool) -> None:
        """basic.get on this node: ``entry`` (fetched) is answered once its checkout
        (recorded now) is committed."""
        queue.delivered(entry, False)
        h = Handout(queue, None, channel, entry, no_ack)
        self.local[id(entry)] = h
        self.outbox.after_commit(lambda: self._answer_get(h), lambda: self._get_expired(h))

    def expire(self, now: float) -> int:
        """The gets whose checkout was not committed in :data:`GET_COMMIT_WAIT`
        answered get-empty (module docstring); how many."""
        if not self.outbox.expiring:
            return 0
        full = not self.has_room()
        n = self.outbox.expire(now)
        if n and full:
            self.on_room()
        return n

    def leaving(self, entry: QueueEntry) -> Handout | None:
        """The queue's ``delivered`` for an entry written now: the handout, if it is
        one of these (its checkout is recorded already), else None."""
        return self.local.pop(id(entry), None) if self.local else None

    def _give_credit_back(self, h: Handout) -> None:
        consumer = h.consumer
        if consumer is not None and not consumer.no_ack:
            consumer.unacked -= 1
            h.channel.unacked_consumer_count -= 1

    def _deliver(self, h: Handout) -> None:
        if h.done:
            return
        h.done = True
        self._give_credit_back(h)
        consumer = h.consumer
        assert consumer is not None
        if h.channel.closed:
            self.local.pop(id(h.entry), None)
            self._return(h.queue, [h.entry])
            return
        try:
            h.channel.deliver(consumer, h.queue, h.entry)  # its delivered() pops it
        finally:
            self.local.pop(id(h.entry), None)

    def _answer_get(self, h: Handout) -> None:
        if h.done:
            return
        h.done = True
        q = h.queue
        if h.channel.closed:
            self.local.pop(id(h.entry), None)
            self._return(q, [h.entry])
            return
        try:
            h.channel.answer_get(q, h.entry, h.no_ack, q.message_count)
        finally:
            self.local.pop(id(h.entry), None)

    def _get_expired(self, h: Handout) -> None:
        if h.done:
            return
        h.done = True
        self.local.pop(id(h.entry), None)
        q = h.queue
        log.warning("quorum queue '%s': a basic.get waited %.0fs for a majority of the "
                    "members to commit its checkout and is answered get-empty; the "
                    "message goes back to the queue", q.name, GET_COMMIT_WAIT)
        self._return(q, [h.entry])
        if not h.channel.closed:
            h.channel.answer_get(q, None, True, 0)

    def withdraw(self, consumer: Consumer) -> int:
        """``consumer`` was cancelled (or its channel closed): what waits for it is not
        written; it comes back to the queue (module docstring). How many."""
        mine = [h for h in self.local.values() if h.consumer is consumer and not h.done]
        if not mine:
            return 0
        for h in mine:
            h.done = True
            del self.local[id(h.entry)]
            self._give_credit_back(h)
        self._return(mine[0].queue, [h.entry for h in mine])
        return len(mine)

    @staticmethod
    def _return(queue: QueueType, entries: list[QueueEntry]) -> None:
        if entries and not queue.deleted:
            queue.return_checked_out(entries)

    def drop(self) -> int:
        """The queue is no longer led here: nothing waiting leaves. Credit goes back;
        the messages go back to the local queue (uncounted: no record is written for a
        queue another node leads). How many deliveries were dropped."""
        waiting = [h for h in self.local.values() if not h.done]
        self.local.clear()
        dropped = len(self.outbox)
        self.outbox.clear()
        for h in waiting:
            h.done = True
            self._give_credit_back(h)
        q = waiting[0].queue if waiting else None
        if q is not None and not q.deleted and q.ext is not None:
            q.ext.requeue([h.entry for h in waiting])
        return dropped
