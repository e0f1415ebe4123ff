"""Queues led by another node: :class:`RemoteQueue` here, :class:`Served` on the leader.

Every queue lives on one node, its leader. Any other node that knows the queue (the
cluster's definitions: :func:`materialise`) holds a :class:`RemoteQueue` in its vhost in
the queue's place, a queue type (:mod:`amqpd.broker.queue_type`) whose operations go
over the link to the leader (:mod:`amqpd.cluster.link`, frames in
:mod:`amqpd.cluster.link_wire`), so channels, exchanges and the API use it as any queue:

* publish: routing happens on the node where the message arrives; the publish pipeline
  hands the message to :meth:`RemoteQueue.forward`. The leader enqueues it as its own
  publish pipeline would (length limits, the store for persistent messages in durable
  queues) and confirms it after its group commit; the publisher's confirm waits for that
  (:class:`amqpd.broker.publish.JointConfirm`). Publishes are sent within a credit the
  leader grants per stream (:data:`PUBLISH_WINDOW`, given back as it takes them), so a
  fast publisher is held on its own node, where its queue shows the backlog and the
  channel's flow control slows it.
* consume: the leader attaches a consumer of its own (priority, exclusive and single
  active consumer are the leader's business) or refuses it (403 for an exclusive
  consumer there), and the client's consume-ok waits for that answer
  (:meth:`RemoteQueue.consume_for`, bounded by :data:`ANSWER_TIMEOUT`). It delivers
  only within the credit this
  node grants: the consumer's prefetch (granted again as the client acks or requeues)
  or, without one, :data:`DELIVERY_WINDOW` (granted again as deliveries go out). The
  deliveries wait here in order until the client's channel may take them.
* acks, nack/reject, requeue, channel close: :meth:`settle` / :meth:`reject` /
  :meth:`requeue` send the leader's delivery ids back; the leader settles them,
  dead-letters them (its queue has the dead-letter options) or puts them back in place.
* basic.get, purge, delete: a request on the stream (basic.get's answer comes later,
  through ``Channel.answer_get``).
* counts: a declare-ok asks the leader (:meth:`RemoteQueue.counts_for`); the management
  API shows them as last reported (with each delivery and about once a second).

Node loss: when the link to the leader goes, every consumer of its queues here gets
basic.cancel (of a mirrored queue a mirror can take over only those with
``x-cancel-on-ha-failover``: the others consume again from the promoted mirror once
the catalogue names it, or from this node's new queue if the mirror here is promoted,
in whichever order the link's end and the promotion come; amqpd.cluster.mirror),
publishes waiting for a confirm get a nack, and until the link is back (or a new
leader is known) the queue answers declare, basic.get and basic.consume with 404
``home node '<node>' of durable queue '<name>' in vhost '<vhost>' is down or
inaccessible``; the publish pipeline leaves it out of routes (``available`` is False:
the message is unroutable there, as in RabbitMQ 3.10). Delivery ids of the old link
are dead (entries carry them plus a base that grows with every stream): a mirrored
queue's new leader has put those messages back already. A consumer kept across the
failover still has them unacked on its channel, and they count against its prefetch as
the client sees it: the new leader is granted only what that window has left, and a
credit more as each of them is settled (else deliveries would wait here for a channel
that may not take them, and the queue's other consumers would never get them).

A quorum queue's new leader keeps them checked out to this node instead (RabbitMQ
3.10's checkouts survive an election; amqpd.cluster.quorum_group): its leader names
every delivery's store position (DELIVER / GET_OK), and when the queue is opened on
the new leader, RECLAIM names, by the lost leader's positions, what this node's
channels still hold (:class:`_Held`); RECLAIMED gives each the delivery id it has on
the new stream, so the client's ack, nack or reject by the old tag settles it there
(one settled meanwhile is settled at once). The last acks and rejects sent to the lost
leader (:data:`RECENT_SETTLES`) are named too: one it never took is settled on the new
leader, not redelivered. What this node does not name, the new leader returns to the
queue.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.message import Message
from amqpd.broker.persist import stored_message
from amqpd.broker.queue import Consumer
from amqpd.broker.queue_entry import QueueEntry
from amqpd.broker.queue_type import QUEUE_TYPES, QueueType, queue_type_name
from amqpd.cluster import link_wire as W
from amqpd.cluster.link import Link, LinkHandler, LinkManager
from amqpd.protocol.constants import FLAG_EXPIRATION_HI
from amqpd.protocol.errors import (
    AccessRefused,
    AMQPError,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.broker.vhost import VHost
    from amqpd.cluster.deadlines import ConfirmDeadlines
    from amqpd.server import Broker

log = logging.getLogger("amqpd.cluster.queues")

PUBLISH_WINDOW: Final = 2000  # publishes in flight per stream before the leader's credit
DELIVERY_WINDOW: Final = 500  # deliveries in flight to a consumer without a prefetch
STATS_INTERVAL: Final = 1.0
# a consume (consume-ok) and a declare's counts wait this long at most for the leader
ANSWER_TIMEOUT: Final = 5.0
# a stream the leader refuses (404) while the catalogue says it leads the queue is
# opened again this often, this many times (its leader is taking the queue over)
REOPEN_DELAY: Final = 0.2
# consumers kept when a mirrored queue's leader is lost wait this long for a new leader
# before the failover is looked at again (RemoteQueue._cancel_kept): they are cancelled
# then unless a mirror can still take over, and after FAILOVER_LIMIT in any case
FAILOVER_WAIT: Final = 30.0
FAILOVER_LIMIT: Final = 300.0
REOPEN_TRIES: Final = 50
# a quorum queue's acks and rejects remembered (by position) for naming to a new leader
# if the current one is lost before it took them
RECENT_SETTLES: Final = 1024
EXTENSION_KINDS: Final = 80  # frame types from here on belong to ClusterQueues.extensions
# a link to a node the view does not see running is closed once silent this long
LINK_SILENCE: Final = 2.0
LOCATORS: Final = ("client-local", "min-masters", "random")  # RabbitMQ 3.10's names

OnConfirm = Callable[[BaseException | None], None]
_NONE: Final = object()


class LinkLost(Exception):
    """The link to the queue's leader went before it answered."""


def home_node_down(node: str, name: str, vhost: str, durable: bool) -> NotFound:
    """RabbitMQ 3.10's 404 for a queue whose node is down."""
    kind = "durable queue" if durable else "queue"
    return NotFound(f"home node '{node}' of {kind} '{name}' in vhost '{vhost}' is down "
                    "or inaccessible")


# ---------------------------------------------------------------------- this node's side
class _RemoteConsumer:
    """A local consumer of a remote queue: its deliveries waiting for its channel."""

    __slots__ = ("answer", "buffer", "by_settle", "consumer", "id", "timer")

    def __init__(self, cid: int, consumer: Consumer) -> None:
        self.id = cid
        self.consumer = consumer
        self.buffer: deque[QueueEntry] = deque()
        # credit comes back on ack/requeue (prefetch) or on hand-out (no limit)
        self.by_settle = bool(consumer.prefetch) and not consumer.no_ack
        # the channel's callback while the leader has not yet accepted the consumer
        self.answer: Callable[[BaseException | None], None] | None = None
        self.timer: asyncio.TimerHandle | None = None


class _Held:
    """A delivery of a lost leader still unacknowledged on a channel here (``key``: the
    id its entry has there). For a quorum queue, ``origin`` and ``position`` name the
    message in that leader's log, so the new leader can hand it back to this node
    (RECLAIM); ``done`` is how the client settled it while no leader had it back yet
    (SETTLE, REJECT or REQUEUE: told once reclaimed; one requeued before RECLAIM is
    not named in it, so the new leader returns the message itself)."""

    __slots__ = ("done", "key", "origin", "position", "state")

    def __init__(self, key: int, state: _RemoteConsumer | None, origin: str,
                 position: int) -> None:
        self.key = key
        self.state = state
        self.origin = origin
        self.position = position
        self.done = 0


class RemoteQueue(QueueType):
    """A queue whose leader is ``leader`` (module docstring). The class is specialised
    per real type (:func:`remote_class`) so redeclare compares what that type compares."""

    remote = True
    real_type = "classic"

    def __init__(
        self, vhost: VHost, name: str, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        self.in_store = False  # its messages are in the leader's store, never here
        self.leader = ""
        self.cluster: ClusterQueues | None = None
        self.link: Link | None = None
        self.stream = 0
        self.gone = False  # the leader says the queue no longer exists
        self.reopen_tries = 0  # streams opened again after a 404 (ClusterQueues._reopen)
        self.ready_count = 0
        self.remote_unacked = 0
        self.remote_consumers = 0
        self._credit = 0
        self._unsent: deque[bytes] = deque()
        self._pub_seq = 0
        self._confirms: dict[int, OnConfirm] = {}
        self._cons: dict[int, _RemoteConsumer] = {}
        self._by_consumer: dict[int, _RemoteConsumer] = {}  # id(Consumer) -> state
        self._next_cid = 0
        self._owner: dict[int, _RemoteConsumer | None] = {}  # live delivery id -> consumer
        # a quorum queue's leader names each delivery's store position: live delivery
        # id -> position, what RECLAIM asks a new leader for after a failover
        self._pos: dict[int, int] = {}
        # deliveries of a lost leader's stream still unacked on their channel (entry id
        # -> _Held), for a consumer kept across the failover (and a quorum queue's
        # basic.get): they count against the consumer's prefetch until the client
        # settles them. A quorum queue's new leader keeps them checked out to this node
        # and hands them back (RECLAIM / RECLAIMED); another queue's new leader holds
        # those messages again, redelivered
        self._stale: dict[int, _Held] = {}
        self._held_done: list[_Held] = []  # settled by the client before any RECLAIM
        # a quorum queue's latest acks and rejects sent to the leader, by position: if
        # the leader is lost, those it never took are named to the next one (RECLAIM)
        # and settled there, not redelivered
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_SETTLES)
        self._reclaiming: dict[tuple[str, int], _Held] = {}  # RECLAIM sent, no answer yet
        # reclaimed deliveries are the current stream's: their entries' id -> live id
        self._renamed: dict[int, int] = {}
        self._alias: dict[int, int] = {}  # ... and back
        # the ids of this node's entries are the leader's delivery ids plus a base that
        # grows with every stream opened, so an entry of an earlier stream (a leader
        # since lost) can never be taken for one of the current stream's
        self._base = 0
        self._kept_timer: asyncio.TimerHandle | None = None
        self._kept_since = 0.0  # loop time the consumers were first kept (detach)
        self._gets: dict[int, tuple[Any, bool]] = {}
        self._next_req = 0
        self._requests: dict[int, Callable[[int], None]] = {}
        self._counts: dict[int, Callable[[int, int], None]] = {}
        self._grants: dict[int, int] = {}
        vhost.broker.publisher.remote_queues += 1
        self.on_removed.append(_removed)

    # -- state ---------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.link is not None and not self.gone

    @property
    def routable(self) -> bool:
        """Whether the publish pipeline keeps this queue in a route: while its leader is
        reachable, and while a synchronised mirror is about to take it over
        (amqpd.cluster.mirror) -- a publish then gets a nack, not the ack-and-drop of a
        queue whose node is down for good (RabbitMQ 3.10's unroutable case). So is a
        queue whose leader's node is reachable (its link up) but has no stream up for
        it (a 404 of a leader still finishing its promotion, a stream opened again, a
        delete on its way): acking publishes routed nowhere then lost confirmed
        messages (issue 28)."""
        if self.available:
            return True
        cluster = self.cluster
        if cluster is None:
            return False
        return cluster.links.link(self.leader) is not None or (
            not self.gone and cluster.failover_expected(self))

    @property
    def message_count(self) -> int:
        return self.ready_count + len(self._unsent)

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["type"] = self.real_type
        out["messages_unacknowledged"] = self.remote_unacked
        out["messages"] = self.message_count + self.remote_unacked
        out["consumers"] = self.remote_consumers
        return out

    def type_info(self, node: str) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.leader, "type": self.real_type}
        if self.real_type == "quorum":
            out.update(leader=self.leader, members=[self.leader], online=(
                [self.leader] if self.available else []))
        if not self.available:
            out["state"] = "down"
        return out

    def _unavailable(self) -> NotFound:
        if self.gone:
            return NotFound(f"no queue '{self.name}' in vhost '{self.vhost.name}'")
        return home_node_down(self.leader, self.name, self.vhost.name, self.durable)

    def touch(self) -> None:
        """Every declare passes here first: 404 while the leader is out of reach."""
        if not self.available:
            raise self._unavailable()

    def check_consume(self, arguments: dict[str, Any], global_prefetch: int) -> None:
        if not self.available:
            raise self._unavailable()
        QUEUE_TYPES.get(self.real_type, QUEUE_TYPES["classic"]).validate_consumer_arguments(
            arguments, self.name, self.vhost.name)

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        if not self.available:
            raise self._unavailable()

    def check_bind(self) -> None:
        if not self.available:
            raise self._unavailable()

    def _send(self, frame: bytes) -> None:
        if self.link is not None:
            self.link.send(frame)

    # -- publish -------------------------------------------------------------------------
    def enqueue(self, message: Message) -> None:
        """Unconfirmed (dead-lettering, delayed messages falling due)."""
        self.forward(message, None)

    def forward(self, message: Message, on_confirm: OnConfirm | None) -> None:
        if not self.available:
            if on_confirm is not None:
                on_confirm(LinkLost(f"queue '{self.name}': leader {self.leader} unreachable"))
            return
        seq = 0
        if on_confirm is not None:
            deadlines = self.cluster.confirm_deadlines if self.cluster is not None else None
            if deadlines is not None:  # a nack if the leader never answers (issue 28)
                on_confirm = deadlines.track(on_confirm, f"queue '{self.name}' on "
                                                         f"{self.leader}")
            self._pub_seq += 1
            seq = self._pub_seq
            self._confirms[seq] = on_confirm
        self.stat_publish += 1
        body = self.vhost.broker.publisher.body_of(message)
        frame = W.encode(W.PUBLISH, self.stream, seq, bool(message.persistent),
                         message.exchange, message.routing_key, message.properties, body)
        if self._credit > 0 and not self._unsent:
            self._credit -= 1
            self._send(frame)
        else:
            self._unsent.append(frame)

    def refuses_publish(self, message: Message) -> bool:
        return False  # the leader applies its length limits

    def _got_credit(self, n: int) -> None:
        self._credit += n
        unsent = self._unsent
        while unsent and self._credit > 0:
            self._credit -= 1
            self._send(unsent.popleft())

    def _confirmed(self, seq: int, ok: bool) -> None:
        callback = self._confirms.pop(seq, None)
        if callback is not None:
            callback(None if ok else PreconditionFailed(
                f"queue '{self.name}' on {self.leader} refused the message"))

    # -- deliveries ----------------------------------------------------------------------
    def take(self) -> QueueEntry | None:
        return None  # deliveries arrive from the leader (dispatch)

    def fetch_for(self, channel: Any, no_ack: bool) -> None:
        if not self.available:
            raise self._unavailable()
        self._next_req += 1
        self._gets[self._next_req] = (channel, no_ack)
        self._send(W.encode(W.GET, self.stream, self._next_req, no_ack))

    def _got(self, req: int, delivery: int, redelivered: bool, ready: int,
             exchange: str, key: str, props: bytes, body: bytes, position: int) -> None:
        channel, no_ack = self._gets.pop(req, (None, True))
        self.ready_count = ready
        entry = QueueEntry(Message(exchange, key, props, body), self._base + delivery,
                           bool(redelivered))
        if channel is None or channel.closed:
            if not no_ack:
                self._send(W.encode(W.REQUEUE, self.stream, [delivery]))
            return
        if not no_ack:
            self._owner[entry.seq] = None
            if position:
                self._pos[entry.seq] = position - 1
        channel.answer_get(self, entry, no_ack, ready)

    def _got_empty(self, req: int) -> None:
        channel, _ = self._gets.pop(req, (None, True))
        if channel is not None and not channel.closed:
            channel.answer_get(self, None, True, 0)

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        self.stat_deliver += 1
        if entry.redelivered:
            self.stat_redeliver += 1
        if acked:
            self.stat_ack += 1
        else:
            self.unacked_count += 1

    def _settled(self, entries: list[QueueEntry], how: int) -> list[int]:
        """The live delivery ids among ``entries`` (credit back to their consumers);
        ``how``: SETTLE, REQUEUE or REJECT."""
        ids = []
        owner = self._owner
        grants = self._grants
        renamed = self._renamed
        for entry in entries:
            self.unacked_count -= 1
            seq = entry.seq
            if renamed:
                seq = renamed.pop(seq, seq)
                self._alias.pop(seq, None)
            if seq not in owner:
                # from a link that is gone: the leader put it back already, or a quorum
                # queue's new leader keeps it for this node (_Held)
                held = self._stale.pop(seq, None)
                if held is not None:
                    self._held_settled(held, how)
                continue
            state = owner.pop(seq)
            position = self._pos.pop(seq, None)
            if position is not None and how != W.REQUEUE:
                self._recent.append((position, how))
            ids.append(seq - self._base)
            if state is not None and state.by_settle and state.id in self._cons:
                grants[state.id] = grants.get(state.id, 0) + 1
        self._send_grants()
        return ids

    def _held_settled(self, held: _Held, how: int) -> None:
        """The client settled a delivery of a lost leader: its consumer's window has a
        place again; a quorum queue's new leader is told (now if it answered RECLAIM
        already, else once it does) unless the message went back to the queue."""
        if held.state is not None:
            self._stale_settled(held.state)
        if not held.origin or held.position < 0:
            return
        held.done = how
        if self._reclaiming.get((held.origin, held.position)) is not held and \
                how != W.REQUEUE:  # a requeue: the new leader returns what it is not named
            self._held_done.append(held)

    def _stale_settled(self, state: _RemoteConsumer) -> None:
        """A kept consumer's client settled a delivery of a lost leader: a place in its
        prefetch window is free again. Following a new leader elsewhere, the consumer
        was asked only for what its window had left (:meth:`_consume`), so that leader
        gets a credit back; following a promoted copy on this node
        (:func:`replace_queue`), that queue gets to deliver again."""
        consumer = state.consumer
        target = consumer.queue
        if target is not self:
            if not target.deleted:
                self.vhost.schedule_dispatch(target)
        elif state.by_settle and state.id in self._cons and self.link is not None:
            self._grants[state.id] = self._grants.get(state.id, 0) + 1

    def settle(self, entries: Any) -> None:
        entries = list(entries)
        ids = self._settled(entries, W.SETTLE)
        self.stat_ack += len(entries)
        if ids:
            self._send(W.encode(W.SETTLE, self.stream, ids))
        if self._cons:
            self.vhost.schedule_dispatch(self)

    def requeue(self, entries: Any) -> None:
        ids = self._settled(list(entries), W.REQUEUE)
        if ids:
            self._send(W.encode(W.REQUEUE, self.stream, ids))

    def reject(self, entries: list[QueueEntry]) -> None:
        """The leader dead-letters them (its queue has the dead-letter options)."""
        ids = self._settled(entries, W.REJECT)
        self.stat_ack += len(entries)
        if ids:
            self._send(W.encode(W.REJECT, self.stream, ids))
        if self._cons:
            self.vhost.schedule_dispatch(self)

    def purge(self) -> int:
        if not self.available:
            raise self._unavailable()
        n = self.ready_count
        self.ready_count = 0
        self._request(W.PURGE, lambda count: None)
        return n

    def _request(self, kind: int, answer: Callable[[int], None]) -> None:
        self._next_req += 1
        self._requests[self._next_req] = answer
        self._send(W.encode(kind, self.stream, self._next_req))

    def restore(self, message: Message, redelivered: bool, published: int = 0,
                extra: int = 0) -> None:
        raise NotImplementedError("a remote queue has nothing in this node's store")

    # -- consumers -----------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._next_cid += 1
        state = _RemoteConsumer(self._next_cid, consumer)
        self._cons[state.id] = state
        self._by_consumer[id(consumer)] = state
        self._consume(state)

    def consume_for(self, consumer: Consumer,
                    answer: Callable[[BaseException | None], None]) -> None:
        """basic.consume: the leader attaches its stand-in and answers (CONSUMED)
        before any delivery; ``answer`` is called then (consume-ok), or with the
        leader's refusal (403 ACCESS_REFUSED for an exclusive consumer there), or with
        the 404 of a leader out of reach when the link goes or ANSWER_TIMEOUT passes."""
        self.add_consumer(consumer)
        state = self._by_consumer[id(consumer)]
        state.answer = answer
        state.timer = asyncio.get_running_loop().call_later(
            ANSWER_TIMEOUT, self._consume_timeout, state)

    def _consumed(self, cid: int, code: int, text: str) -> None:
        state = self._cons.get(cid)
        if state is None:
            return  # cancelled meanwhile (a CANCEL is on the way)
        answer = state.answer
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.answer = None
        if code:
            error = {403: AccessRefused, 405: ResourceLocked}.get(code, NotFound)(text)
            self._forget_consumer(state)  # never attached on the leader
            if answer is not None:
                answer(error)
            else:  # consuming again after a failover, refused by the new leader
                state.consumer.channel.consumer_cancelled_by_server(state.consumer)
            return
        if answer is not None:
            answer(None)
            if state.buffer:
                self.vhost.schedule_dispatch(self)

    def _consume_timeout(self, state: _RemoteConsumer) -> None:
        state.timer = None
        answer = state.answer
        if answer is None or self._cons.get(state.id) is not state:
            return
        log.warning("queue '%s' in vhost '%s': leader %s did not answer a basic.consume "
                    "within %g s; refused", self.name, self.vhost.name, self.leader,
                    ANSWER_TIMEOUT)
        state.answer = None
        self.remove_consumer(state.consumer)
        answer(home_node_down(self.leader, self.name, self.vhost.name, self.durable))

    def _forget_consumer(self, state: _RemoteConsumer) -> None:
        """``state`` is no consumer here any more (nothing is said to the leader)."""
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        self._cons.pop(state.id, None)
        self._by_consumer.pop(id(state.consumer), None)
        try:
            self.consumers.remove(state.consumer)
        except ValueError:
            pass

    def counts_for(self, answer: Callable[[int, int], None]) -> None:
        """A declare-ok's counts as the leader has them now (the last reported ones if
        the leader is out of reach or does not answer within ANSWER_TIMEOUT)."""
        if not self.available:
            answer(self.message_count, self.remote_consumers)
            return
        self._next_req += 1
        req = self._next_req
        self._counts[req] = answer
        self._send(W.encode(W.COUNT, self.stream, req))
        asyncio.get_running_loop().call_later(ANSWER_TIMEOUT, self._count_answer, req)

    def _count_answer(self, req: int) -> None:
        answer = self._counts.pop(req, None)
        if answer is not None:
            answer(self.message_count, self.remote_consumers)

    def _counted(self, req: int, ready: int, unacked: int, consumers: int) -> None:
        self.ready_count, self.remote_unacked, self.remote_consumers = ready, unacked, consumers
        self._count_answer(req)

    def _consume(self, state: _RemoteConsumer) -> None:
        """Attach ``state``'s consumer on the leader. With a prefetch, the leader may
        hand out what the window has left: a consumer kept across a failover still
        holds the lost leader's unacked deliveries on its channel (``_stale``; each
        settled one grants a credit back), and a full prefetch on top of them would
        leave deliveries waiting here for ever that its channel may not take."""
        consumer = state.consumer
        window = DELIVERY_WINDOW
        if state.by_settle:
            window = max(0, consumer.prefetch - consumer.unacked)
        args = {"tag": consumer.tag, "exclusive": consumer.exclusive,
                "arguments": jsonable(consumer.arguments)}
        self._send(W.encode(W.CONSUME, self.stream, state.id, consumer.no_ack, window, args))

    def remove_consumer(self, consumer: Consumer) -> None:
        state = self._by_consumer.pop(id(consumer), None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        del self._cons[state.id]
        self._send(W.encode(W.CANCEL, self.stream, state.id))
        # deliveries not handed to the client go back to the leader
        back = [e.seq - self._base for e in state.buffer
                if self._owner.pop(e.seq, _NONE) is not _NONE]
        for e in state.buffer:
            self._pos.pop(e.seq, None)
        state.buffer.clear()
        if back:
            self._send(W.encode(W.REQUEUE, self.stream, back))

    def _deliver(self, cid: int, delivery: int, redelivered: bool, ready: int,
                 exchange: str, key: str, props: bytes, body: bytes, position: int) -> None:
        self.ready_count = ready
        state = self._cons.get(cid)
        if state is None:  # cancelled meanwhile: the CANCEL and a REQUEUE are on the way
            self._send(W.encode(W.REQUEUE, self.stream, [delivery]))
            return
        entry = QueueEntry(Message(exchange, key, props, body), self._base + delivery,
                           bool(redelivered))
        if not state.consumer.no_ack:
            self._owner[entry.seq] = state
            if position:  # a quorum queue's: RECLAIM names it after a failover
                self._pos[entry.seq] = position - 1
        state.buffer.append(entry)
        self.vhost.schedule_dispatch(self)

    def dispatch(self) -> None:
        """Hand waiting deliveries to their consumers as their channels allow."""
        grants = self._grants
        for state in list(self._cons.values()):
            if state.answer is not None:
                continue  # consume-ok not sent yet
            consumer = state.consumer
            buffer = state.buffer
            n = 0
            while buffer and consumer.has_credit() and consumer.channel.can_deliver(consumer):
                consumer.channel.deliver(consumer, self, buffer.popleft())
                n += 1
                if state.id not in self._cons:
                    break  # the channel went while delivering
            if n and not state.by_settle:
                grants[state.id] = grants.get(state.id, 0) + n
        self._send_grants()

    def _send_grants(self) -> None:
        grants = self._grants
        if grants:
            for cid, n in grants.items():
                self._send(W.encode(W.GRANT, self.stream, cid, n))
            grants.clear()

    def _cancelled(self, cid: int) -> None:
        state = self._cons.get(cid)
        if state is None:
            return
        consumer = state.consumer
        self.remove_consumer(consumer)
        consumer.channel.consumer_cancelled_by_server(consumer)

    # -- link ----------------------------------------------------------------------------
    def attach(self, link: Link, stream: int) -> None:
        self.link = link
        self.stream = stream
        self._credit = PUBLISH_WINDOW
        self._base += 1 << 40
        link.send(W.encode(W.OPEN, stream, self.vhost.name, self.name))
        if self.real_type == "quorum":
            self._reclaim()  # ahead of the consumers: what they hold stays theirs
        if self._kept_timer is not None:
            self._kept_timer.cancel()
            self._kept_timer = None
        for state in self._cons.values():  # consumers kept across a failover
            self._consume(state)

    def _reclaim(self) -> None:
        """Tell a quorum queue's leader (a new one after a failover, or the same one
        again) which deliveries of a lost leader this node's channels still hold, by
        that leader's store positions: the leader keeps the messages its consumers here
        held checked out for this node until it says (amqpd.cluster.quorum_group), so
        the client's acks by the old delivery tags settle them. Always sent, empty too:
        it is this node's whole answer, and what it does not name is returned."""
        by_origin: dict[str, dict[int, _Held]] = {}
        for held in [*self._held_done, *self._stale.values()]:  # held ones win
            if held.origin and held.position >= 0:
                by_origin.setdefault(held.origin, {})[held.position] = held
        self._held_done = []
        self._reclaiming = {}
        if not by_origin:
            self._send(W.encode(W.RECLAIM, self.stream, "", []))
            return
        for origin, helds in by_origin.items():
            for position, held in helds.items():
                self._reclaiming[(origin, position)] = held
            self._send(W.encode(W.RECLAIM, self.stream, origin, sorted(helds)))

    def _reclaimed(self, origin: str, positions: list[int], ids: list[int],
                   news: list[int]) -> None:
        """The leader's answer to RECLAIM: a delivery it hands back is one of this
        stream's from now on (its entry keeps the id the channel knows), or, if the
        client settled it meanwhile, is settled there now; one it no longer holds for
        this node (returned to the queue) stays a dead delivery here."""
        for position, delivery, new in zip(positions, ids, news, strict=False):
            held = self._reclaiming.pop((origin, position), None)
            if held is None:
                continue
            if not delivery:
                held.origin = ""  # redelivered from the queue: its ack settles nothing
                continue
            if held.done:
                self._send(W.encode(held.done, self.stream, [delivery]))
                if new and held.done != W.REQUEUE:
                    self._recent.append((new - 1, held.done))
                continue
            if self._stale.get(held.key) is not held:
                continue
            del self._stale[held.key]
            live = self._base + delivery
            self._owner[live] = held.state
            if new:
                self._pos[live] = new - 1
            self._renamed[held.key] = live
            self._alias[live] = held.key

    def detach(self, keep_consumers: bool = False) -> None:
        """The link went: consumers cancelled, confirms nacked, requests answered.

        A queue a mirror can take over (amqpd.cluster.mirror: ``failover_expected``)
        keeps its consumers instead, except those that asked for
        ``x-cancel-on-ha-failover``: they consume from the promoted mirror once this
        queue follows it. They are cancelled if etcd's record shows no mirror can take
        over (``failover_kept``, checked at once) or none did in the end
        (:meth:`_cancel_kept`). ``keep_consumers``: the queue follows a new leader
        already known, whatever ``failover_expected`` says.

        Publishes still waiting for the leader's credit never reach it: they are
        dropped here, and those a publisher waits a confirm for are nacked (a
        transaction holding one fails), with a log line -- nothing waits for a credit
        that cannot come."""
        self.link = None
        waiting = len(self._unsent)
        self._unsent.clear()
        confirms, self._confirms = self._confirms, {}
        if waiting or confirms:
            log.warning("queue '%s' in vhost '%s': link to its leader %s lost; %d "
                        "publish(es) waiting for its credit dropped, %d confirm(s) nacked",
                        self.name, self.vhost.name, self.leader, waiting, len(confirms))
        for callback in confirms.values():
            callback(LinkLost(f"link to {self.leader} lost"))
        keep = keep_consumers or (self.cluster is not None
                                  and self.cluster.failover_expected(self))
        kept = 0
        for state in list(self._cons.values()):
            # what waits here was never handed to the client, so it is not held here:
            # the leader's copy has it (a quorum queue's new leader returns it)
            for e in state.buffer:
                self._owner.pop(e.seq, None)
                self._pos.pop(e.seq, None)
            consumer = state.consumer
            answer = state.answer
            if answer is not None:  # the leader never answered: the consume fails
                state.answer = None
                self._forget_consumer(state)
                answer(self._unavailable())
                continue
            if keep and consumer.arguments.get("x-cancel-on-ha-failover") is not True:
                state.buffer.clear()  # the leader's copy has them (redelivered if marked)
                kept += 1
                continue
            del self._cons[state.id]
            self._by_consumer.pop(id(consumer), None)
            try:
                self.consumers.remove(consumer)
            except ValueError:
                pass
            consumer.channel.consumer_cancelled_by_server(consumer)
        stale = self._stale
        positions = self._pos
        alias = self._alias
        for seq, owner in self._owner.items():
            position = positions.get(seq, -1)
            if (owner is not None and owner.id in self._cons) or position >= 0:
                # still on a channel here, unacked (a kept consumer's, or a quorum
                # queue's basic.get): the key is the id its entry has there
                key = alias.get(seq, seq)
                stale[key] = _Held(key, owner if owner is not None and owner.id in
                                   self._cons else None, self.leader, position)
        self._owner.clear()  # the leader requeued them when the link went
        positions.clear()
        for position, how in self._recent:
            # settled just before the link went: the lost leader may never have taken
            # it, and then the next one holds it for this node; named, it is settled
            held = _Held(-1, None, self.leader, position)
            held.done = how
            self._held_done.append(held)
        self._recent.clear()
        alias.clear()
        self._renamed.clear()
        for held in self._reclaiming.values():  # asked, never answered: ask again
            if held.done and held.done != W.REQUEUE:
                self._held_done.append(held)
        self._reclaiming = {}
        if kept and self._kept_timer is None:
            loop = asyncio.get_running_loop()
            self._kept_since = loop.time()
            self._kept_timer = loop.call_later(FAILOVER_WAIT, self._cancel_kept)
            if self.cluster is not None and not keep_consumers:
                self.cluster.failover_kept(self)
        gets, self._gets = self._gets, {}
        for channel, _ in gets.values():
            if not channel.closed:
                channel.answer_get(self, None, True, 0)
        requests, self._requests = self._requests, {}
        for done in requests.values():
            done(0)
        for req in list(self._counts):
            self._count_answer(req)

    def _cancel_kept(self) -> None:
        """No leader took over within FAILOVER_WAIT: the kept consumers are cancelled,
        unless a mirror can still take over (a slow election on a loaded machine), for
        at most FAILOVER_LIMIT."""
        self._kept_timer = None
        if self.link is not None or self.deleted:
            return
        loop = asyncio.get_running_loop()
        if self.cluster is not None and self.cluster.failover_expected(self) \
                and loop.time() - self._kept_since < FAILOVER_LIMIT:
            self._kept_timer = loop.call_later(FAILOVER_WAIT, self._cancel_kept)
            return
        self.cancel_kept()

    def cancel_kept(self) -> None:
        """The consumers kept across a failover are cancelled: no leader will take the
        queue over (amqpd.cluster.mirror found no mirror to promote, or the wait is
        over)."""
        if self._kept_timer is not None:
            self._kept_timer.cancel()
            self._kept_timer = None
        if self.link is not None:
            return
        for state in list(self._cons.values()):
            consumer = state.consumer
            self.remove_consumer(consumer)
            consumer.channel.consumer_cancelled_by_server(consumer)

    def delete(self) -> None:
        """Deleted here (queue.delete, or the definition went): consumers told, and the
        leader asked to delete it too (it answers 0 if it is gone already)."""
        for consumer in list(self.consumers):
            self.remove_consumer(consumer)
            consumer.channel.consumer_cancelled_by_server(consumer)
        if self.available:
            self._request(W.DELETE, lambda count: None)
        if self.cluster is not None:
            self.cluster.forget(self)


def _removed(queue: QueueType) -> None:
    queue.vhost.broker.publisher.remote_queues -= 1


def jsonable(value: Any) -> Any:
    """Queue and consumer arguments as link frames and etcd keys carry them (JSON): AMQP
    tables may hold bytes and decimals, which JSON does not."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


_CLASSES: dict[str, type[RemoteQueue]] = {}


def remote_class(type_name: str) -> type[RemoteQueue]:
    """RemoteQueue for a queue of ``type_name`` on its leader: redeclares compare what
    that type compares."""
    cls = _CLASSES.get(type_name)
    if cls is None:
        real = QUEUE_TYPES.get(type_name, QUEUE_TYPES["classic"])
        cls = type(f"Remote{real.__name__}", (RemoteQueue,), {
            "real_type": type_name, "compared_arguments": real.compared_arguments,
            "__module__": __name__})
        _CLASSES[type_name] = cls
    return cls


# ---------------------------------------------------------------------- the leader's side
class _Proxy:
    """The leader's stand-in for a channel on the consuming node: delivers within the
    credit that node granted (``ConsumerChannel`` of amqpd.broker.queue)."""

    def __init__(self, served: Served, cid: int, credit: int) -> None:
        self.served = served
        self.cid = cid
        self.credit = credit
        self.consumer: Consumer | None = None
        self.closed = False

    def can_deliver(self, consumer: Consumer) -> bool:
        return self.credit > 0 and not self.closed

    def deliver(self, consumer: Consumer, queue: QueueType, entry: QueueEntry) -> None:
        self.credit -= 1
        served = self.served
        delivery = served.next_id()
        msg = entry.message
        position = served.delivered(queue, entry, consumer.no_ack)
        if not consumer.no_ack:
            served.unacked[delivery] = entry
        served.hand(queue, entry, consumer.no_ack, W.encode(
            W.DELIVER, served.stream, self.cid, delivery, entry.redelivered,
            queue.message_count, msg.exchange, msg.routing_key, msg.properties,
            served.broker.publisher.body_of(msg), position), self)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        self.closed = True
        self.served.proxies.pop(self.cid, None)
        self.served.link.send(W.encode(W.CANCELLED, self.served.stream, self.cid))


class Served:
    """One stream a peer opened on this node's queue ``queue``."""

    def __init__(self, broker: Broker, link: Link, stream: int, queue: QueueType) -> None:
        self.broker = broker
        self.link = link
        self.stream = stream
        self.queue = queue
        self.proxies: dict[int, _Proxy] = {}
        self.unacked: dict[int, QueueEntry] = {}
        self._next = 0
        self.credit_due = 0
        self.last_stats: tuple[int, int, int] | None = None

    def next_id(self) -> int:
        self._next += 1
        return self._next

    def delivered(self, queue: QueueType, entry: QueueEntry, no_ack: bool) -> int:
        """``queue.delivered`` for a delivery to the peer; a quorum queue's replica
        group records the checkout as the peer's (amqpd.cluster.quorum_group: it
        survives an election), and the peer learns the message's store position
        (+ 1; 0 for other queues) to name it after one (RECLAIM). A group's delivery
        that needs no ack is settled only once it is sent (:meth:`hand`)."""
        group = getattr(queue, "group", None)
        if group is None:
            queue.delivered(entry, acked=no_ack)
            return 0
        group.holder = self.link.peer
        try:
            queue.delivered(entry, acked=False)
        finally:
            group.holder = ""
        position = entry.message.position
        return position + 1 if position >= 0 and not no_ack else 0

    def hand(self, queue: QueueType, entry: QueueEntry, no_ack: bool, frame: bytes,
             proxy: _Proxy | None) -> None:
        """Send a delivery (``DELIVER`` of ``proxy``'s consumer, or ``GET_OK``) to the
        peer: a quorum queue's once its checkout (recorded by :meth:`delivered`) is
        committed (amqpd.cluster.handout), then settled if it needs no ack. One that
        needs no ack and can no longer be sent (the link went, the consumer was
        cancelled) comes back to the queue as a returned checkout; one that needs an
        ack is the stream's until settled (its close returns it)."""
        group = getattr(queue, "group", None)
        if group is None:
            self.link.send(frame)
            return
        link = self.link

        def send() -> None:
            gone = link.closed or (proxy is not None and proxy.closed)
            if no_ack and (gone or queue.deleted):
                if not queue.deleted:
                    queue.return_checked_out([entry])  # type: ignore[attr-defined]
                return
            link.send(frame)
            if no_ack:
                queue.settle([entry])

        group.after_commit(send)

    def reclaim(self, origin: str, positions: list[int]) -> None:
        """The peer's RECLAIM: what the quorum queue's group kept checked out for it
        since the election becomes this stream's deliveries (their ids answered in
        RECLAIMED); what it does not name is returned to the queue."""
        q = self.queue
        group = getattr(q, "group", None)
        got: dict[int, QueueEntry] = {}
        if group is not None and not q.deleted:
            got = group.reclaim(self.link.peer, origin, positions)
        ids: list[int] = []
        news: list[int] = []
        for position in positions:
            entry = got.pop(position, None)  # once, even if named twice
            if entry is None:
                ids.append(0)
                news.append(0)
                continue
            delivery = self.next_id()
            self.unacked[delivery] = entry
            ids.append(delivery)
            news.append(entry.message.position + 1)
        self.link.send(W.encode(W.RECLAIMED, self.stream, origin, positions, ids, news))

    def publish(self, seq: int, persistent: int, exchange: str, key: str, props: bytes,
                body: bytes) -> None:
        """Enqueue as this node's publish pipeline would (limits, store, paging);
        CONFIRM once the store has it (its group commit) or at once."""
        self.credit_due += 1
        q = self.queue
        link, stream = self.link, self.stream
        on_confirm: OnConfirm | None = None
        if seq:
            def on_confirm(error: BaseException | None) -> None:
                link.send(W.encode(W.CONFIRM, stream, seq, error is None))
        if q.deleted:
            if on_confirm is not None:
                on_confirm(LinkLost("queue deleted"))
            return
        enqueue_here(self.broker, q, Message(exchange, key, props, body, bool(persistent)),
                     on_confirm)

    def settle(self, ids: list[int], how: int) -> None:
        """``how``: SETTLE (acked), REQUEUE or REJECT."""
        entries = [e for e in (self.unacked.pop(i, None) for i in ids) if e is not None]
        if not entries or self.queue.deleted:
            return
        if how == W.REQUEUE:
            self.queue.requeue(entries)
        elif how == W.REJECT:
            self.queue.reject(entries)
        else:
            self.queue.settle(entries)

    def consume(self, cid: int, no_ack: int, credit: int, args: dict[str, Any]) -> None:
        """Attach a consumer standing for one on the user's node, or refuse it as a
        consume here would be refused (CONSUMED with the reply code either way, before
        any delivery: the user's consume-ok waits for it)."""
        q = self.queue
        exclusive = bool(args.get("exclusive"))
        where = f"queue '{q.name}' in vhost '{q.vhost.name}'"
        refusal: tuple[int, str] | None = None
        if q.deleted:
            refusal = 404, f"no {where}"
        elif q.exclusive:
            refusal = 405, f"cannot obtain exclusive access to locked {where}"
        elif q.consumers and (exclusive or any(c.exclusive for c in q.consumers)):
            refusal = 403, f"{where} in exclusive use"
        if refusal is not None:
            self.link.send(W.encode(W.CONSUMED, self.stream, cid, *refusal))
            return
        self.link.send(W.encode(W.CONSUMED, self.stream, cid, 0, ""))
        proxy = _Proxy(self, cid, credit)
        consumer = Consumer(proxy, q, str(args.get("tag", "")), bool(no_ack), exclusive, 0,
                            dict(args.get("arguments") or {}))
        proxy.consumer = consumer
        self.proxies[cid] = proxy
        q.add_consumer(consumer)

    def grant(self, cid: int, n: int) -> None:
        proxy = self.proxies.get(cid)
        if proxy is not None:
            proxy.credit += n
            self.queue.vhost.schedule_dispatch(self.queue)

    def cancel(self, cid: int) -> None:
        proxy = self.proxies.pop(cid, None)
        if proxy is not None and proxy.consumer is not None:
            proxy.closed = True
            self.queue.remove_consumer(proxy.consumer)

    def get(self, req: int, wire_no_ack: int) -> None:
        no_ack = bool(wire_no_ack)  # the compiled queue types want a bool, not the u8
        q = self.queue
        q.touch()
        entry = q.fetch()
        if entry is None:
            self.link.send(W.encode(W.GET_EMPTY, self.stream, req))
            return
        if q.ext is not None:
            q.ext.drop_expired_head()
        delivery = self.next_id()
        position = self.delivered(q, entry, no_ack)
        if not no_ack:
            self.unacked[delivery] = entry
        msg = entry.message
        self.hand(q, entry, no_ack, W.encode(
            W.GET_OK, self.stream, req, delivery, entry.redelivered, q.message_count,
            msg.exchange, msg.routing_key, msg.properties, self.broker.publisher.body_of(msg),
            position), None)

    def close(self) -> None:
        """The peer is gone or done: its consumers removed, its unacked put back."""
        for cid in list(self.proxies):
            self.cancel(cid)
        entries = list(self.unacked.values())
        self.unacked.clear()
        if entries and not self.queue.deleted:
            self.queue.requeue(entries)

    def stats(self) -> tuple[int, int, int]:
        q = self.queue
        return q.message_count, q.unacked_count, len(q.consumers)


def enqueue_here(broker: Broker, q: QueueType, message: Message,
                 on_confirm: OnConfirm | None) -> None:
    """The publish pipeline's steps after routing, for one local queue."""
    from amqpd.broker.limits import admit
    from amqpd.store.api import StoreError

    publisher = broker.publisher
    if q.dedup is not None and not q.dedup.admit(message):
        if on_confirm is not None:  # x-message-deduplication: already in the queue
            on_confirm(None)
        return
    ext = q.ext
    if ext is not None and ext.rejects:
        _accepted, refused = admit(broker, [q], message)
        if refused:
            if on_confirm is not None:
                on_confirm(PreconditionFailed("rejected by a queue's length limit"))
            return
    if not message.persistent and (q.keeps_every_message or q.mirrored):
        message.persistent = True
    store = broker.store
    if message.persistent and q.durable:
        try:
            message.position = store.append_enqueue([q.store_key], stored_message(message))
        except StoreError as exc:
            publisher.store_failed(exc)
            if on_confirm is not None:
                on_confirm(exc)
            return
        publisher._pending_commit = True
        if on_confirm is not None:
            publisher.commit(on_confirm)
            on_confirm = None
    props = message.properties
    if not store.on_disk or (props and props[0] & FLAG_EXPIRATION_HI):
        q.enqueue(message)
    else:
        publisher._enqueue_all([q], message)
    if on_confirm is not None:
        on_confirm(None)


# ---------------------------------------------------------------------- the node's queues
class ClusterQueues:
    """This node's side of queues across the cluster: the :class:`LinkHandler` of its
    links, the remote queues it holds (user side) and the streams it serves (leader
    side)."""

    def __init__(self, api: BrokerAPI, view: Any, cookie: bytes,
                 locator: str = "client-local") -> None:
        self.api = api
        self.broker: Broker = api._broker
        self.view = view
        self.locator = locator  # cluster.queue_leader_locator
        self.node: str = view.node_name
        self.links = LinkManager(self.node, cookie, self, self._address, view.is_running)
        self.remote: dict[str, dict[int, RemoteQueue]] = {}  # peer -> stream -> queue
        self._next_stream = 0
        self.served: dict[Link, dict[int, Served]] = {}
        self._stats_handle: asyncio.TimerHandle | None = None
        self._credit_flush = False
        self._declares: dict[int, RemoteQueue] = {}
        self._next_declare = 0
        # handlers of the other stream kinds on the same links (frame types from
        # EXTENSION_KINDS on: amqpd.cluster.mirror); told of links going up and down too
        self.extensions: list[LinkHandler] = []
        # queues this node held that another node leads (found at start): a mirror's
        # copy is adopted again by amqpd.cluster.mirror, the others deleted there
        self.retired: dict[tuple[str, str], QueueType] = {}
        # the deadlines of forwarded publishes' confirms (amqpd.cluster.deadlines)
        self.confirm_deadlines: ConfirmDeadlines | None = None
        # whether a queue whose link to its leader went will get a new leader (a
        # mirror can take over; set by amqpd.cluster.mirror): its consumers are kept
        self.failover_expected: Callable[[RemoteQueue], bool] = lambda queue: False
        # told when a queue kept its consumers on failover_expected's word: the mirrors
        # check that word against etcd's record (RemoteQueue.cancel_kept if it is wrong)
        self.failover_kept: Callable[[RemoteQueue], None] = lambda queue: None

    def _address(self, peer: str) -> tuple[str, int] | None:
        info = self.view.nodes().get(peer)
        return info.link if info is not None else None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.broker.queue_placer = self.place
        address = await self.links.listen(host, port)
        self.view.subscribe(self._node_changed)
        for name in self.view.nodes():
            if name != self.node and self.view.is_running(name):
                self.links.want(name)
        self._stats_handle = asyncio.get_running_loop().call_later(
            STATS_INTERVAL, self._send_stats)
        return address

    async def stop(self) -> None:
        self.broker.queue_placer = None
        if self._stats_handle is not None:
            self._stats_handle.cancel()
        await self.links.close()

    def _node_changed(self, node: str, running: bool) -> None:
        if node == self.node:
            return
        if running:
            self.links.want(node)
        else:
            asyncio.get_running_loop().create_task(self._watch_down(node))

    async def _watch_down(self, node: str) -> None:
        """The view lost sight of ``node`` (heartbeats late or gone). A dead process
        closes its links itself (the kernel does); a link still carrying traffic is
        kept (a busy node's heartbeats can be late: closing would nack everything in
        flight); a silent one is closed while the view still says so, as in a network
        partition: its queues are then down here."""
        loop = asyncio.get_running_loop()
        while not self.links.closing and not self.view.is_running(node):
            link = self.links.links.get(node)
            if link is None or link.closed:
                return
            if loop.time() - link.last_heard >= LINK_SILENCE:
                log.warning("link to %s closed: the node is not seen running and the "
                            "link is silent", node)
                link.close()
                return
            await asyncio.sleep(LINK_SILENCE / 4)

    # -- user side -----------------------------------------------------------------------
    def adopt(self, queue: RemoteQueue, leader: str) -> None:
        queue.leader = leader
        queue.cluster = self
        self._next_stream += 1
        self.remote.setdefault(leader, {})[self._next_stream] = queue
        queue.stream = self._next_stream
        link = self.links.link(leader)
        if link is not None:
            queue.attach(link, queue.stream)
        else:
            self.links.want(leader)

    def retire(self, queue: QueueType) -> None:
        """``queue`` was this node's own and another node leads it now: deleted here
        unless it holds messages, which may be this node's mirror copy of it (kept
        across a restart; amqpd.cluster.mirror adopts or deletes it)."""
        if queue.message_count or queue.unacked_count:
            self.retired[(queue.vhost.name, queue.name)] = queue
        else:
            queue.delete()

    def forget(self, queue: RemoteQueue) -> None:
        streams = self.remote.get(queue.leader, {})
        if streams.get(queue.stream) is queue:
            del streams[queue.stream]
            if queue.link is not None:
                queue.link.send(W.encode(W.CLOSE, queue.stream))

    # -- leader locators -----------------------------------------------------------------
    def locator_for(self, vhost: str, name: str, cls: type[QueueType],
                    arguments: dict[str, Any]) -> str:
        """``x-queue-master-locator``, else the ``queue-master-locator`` policy key, else
        ``cluster.queue_leader_locator`` (RabbitMQ 3.10's order)."""
        value = arguments.get("x-queue-master-locator")
        if isinstance(value, str) and value in LOCATORS:
            return value
        policy = self.broker.policies.match(vhost, "queues", name, cls.type_name)
        if policy is not None:
            value = policy.definition.get("queue-master-locator")
            if isinstance(value, str) and value in LOCATORS:
                return value
        return self.locator

    def choose_leader(self, locator: str) -> str:
        """The node a new queue is led by: this one (client-local), the running node
        leading the fewest queues (min-masters), or any running node (random)."""
        others = sorted(n for n in self.view.nodes() if n != self.node
                        and self.view.is_running(n) and self.links.link(n) is not None)
        running = [self.node, *others]
        if locator == "random":
            return random.choice(running)
        if locator == "min-masters":
            counts = dict.fromkeys(running, 0)
            for leader in self._leaders():
                if leader in counts:
                    counts[leader] += 1
            return min(running, key=lambda n: (counts[n], n != self.node, n))
        return self.node

    def _leaders(self) -> list[str]:
        catalogue = getattr(self.view, "catalogue", None)
        if isinstance(catalogue, dict) and catalogue:
            return [str(v) for v in catalogue.values()]
        out = []
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                if isinstance(q, RemoteQueue):
                    out.append(q.leader)
                elif q.durable and not q.exclusive:
                    out.append(self.node)
        return out

    def place(self, vhost: VHost, name: str, cls: type[QueueType], auto_delete: bool,
              arguments: dict[str, Any]) -> QueueType | None:
        """``Broker.queue_placer``: a new durable queue led by another node when the
        locator picks one (that node is asked to create it, ahead of everything this
        node sends about it on the link); None: create it here."""
        locator = self.locator_for(vhost.name, name, cls, arguments)
        if locator == "client-local":
            return None
        leader = self.choose_leader(locator)
        link = self.links.link(leader)
        if leader == self.node or link is None:
            return None
        self._next_declare += 1
        link.send(W.encode(W.DECLARE, 0, self._next_declare, {
            "vhost": vhost.name, "name": name, "auto_delete": auto_delete,
            "arguments": jsonable(arguments)}))
        q = materialise(self.api, vhost.name, {"name": name, "durable": True,
                                               "auto_delete": auto_delete,
                                               "arguments": arguments}, leader)
        assert isinstance(q, RemoteQueue)
        self._declares[self._next_declare] = q
        log.info("queue '%s' in vhost '%s' declared with leader %s (%s)", name,
                 vhost.name, leader, locator)
        return q

    def _declare_here(self, link: Link, req: int, body: dict[str, Any]) -> None:
        """A peer's locator chose this node to lead a queue: create it (as a declare
        here would, so the cluster's definitions record this node as its leader)."""
        code, text = 0, ""
        self.broker.queue_placer = None  # here, whatever this node's locator would say
        try:
            self.api.declare_queue(body["vhost"], body["name"], durable=True,
                                   auto_delete=bool(body.get("auto_delete")),
                                   arguments=dict(body.get("arguments") or {}))
        except AMQPError as exc:
            code, text = exc.reply_code, str(exc)
        finally:
            self.broker.queue_placer = self.place
        link.send(W.encode(W.DECLARED, 0, req, code, text))

    def _declared(self, req: int, code: int, text: str) -> None:
        q = self._declares.pop(req, None)
        if q is None or not code:
            return
        log.warning("queue '%s' in vhost '%s': leader %s refused to create it: %s %s",
                    q.name, q.vhost.name, q.leader, code, text)
        q.gone = True
        q.vhost.delete_queue(q)

    # -- LinkHandler ---------------------------------------------------------------------
    def link_up(self, link: Link) -> None:
        self.served[link] = {}
        for stream, queue in self.remote.get(link.peer, {}).items():
            queue.attach(link, stream)
        for ext in self.extensions:
            ext.link_up(link)

    def link_down(self, link: Link) -> None:
        for served in self.served.pop(link, {}).values():
            served.close()
        for queue in self.remote.get(link.peer, {}).values():
            if queue.link is link:
                queue.detach()
        lost = getattr(self.view, "node_lost", None)  # the cluster's non-durable queues
        if lost is not None and not self.links.closing:
            lost(link.peer)
        if not self.links.closing and self.view.is_running(link.peer):
            self.links.want(link.peer)
        for ext in self.extensions:
            ext.link_down(link)

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if kind < W.OPEN:
            raise W.WireError(f"handshake frame {kind} on a live link")
        if kind >= EXTENSION_KINDS:
            for ext in self.extensions:
                ext.frame(link, kind, stream, f)
            return
        if kind == W.DECLARE:
            self._declare_here(link, f[0], f[1])
            return
        if kind == W.DECLARED:
            self._declared(*f)
            return
        if kind in _LEADER_SIDE:
            self._serve(link, kind, stream, f)
            return
        queue = self.remote.get(link.peer, {}).get(stream)
        if queue is None or queue.link is not link:
            if kind == W.DELIVER:  # a stream we closed: give it back
                link.send(W.encode(W.REQUEUE, stream, [f[1]]))
            return
        if kind == W.CONFIRM:
            queue._confirmed(f[0], bool(f[1]))
        elif kind == W.DELIVER:
            queue._deliver(*f)
        elif kind == W.CREDIT:
            queue._got_credit(f[0])
        elif kind in (W.OPENED, W.STATS):
            queue.ready_count, queue.remote_unacked, queue.remote_consumers = f
            if kind == W.OPENED:
                queue.reopen_tries = 0
        elif kind == W.GET_OK:
            queue._got(*f)
        elif kind == W.GET_EMPTY:
            queue._got_empty(f[0])
        elif kind == W.CANCELLED:
            queue._cancelled(f[0])
        elif kind == W.CONSUMED:
            queue._consumed(*f)
        elif kind == W.RECLAIMED:
            queue._reclaimed(*f)
        elif kind == W.COUNTED:
            queue._counted(*f)
        elif kind in (W.PURGED, W.DELETED):
            answer = queue._requests.pop(f[0], None)
            if answer is not None:
                answer(f[1])
        elif kind == W.FAILED:
            log.warning("queue '%s' in vhost '%s' on %s: %s %s", queue.name,
                        queue.vhost.name, link.peer, f[0], f[1])
            retry = f[0] == 404 and self._catalogue_leader(queue) == link.peer \
                and queue.reopen_tries < REOPEN_TRIES
            queue.detach(keep_consumers=retry)
            if retry:
                # the catalogue says the peer leads it, but its queue is not there yet (a
                # mirror being promoted: amqpd.cluster.mirror): open the stream again
                queue.reopen_tries += 1
                asyncio.get_running_loop().call_later(REOPEN_DELAY, self._reopen, queue,
                                                      link)
                return
            queue.gone = True
            queue.link = link  # still reachable; ``gone`` answers 404

    def _catalogue_leader(self, queue: RemoteQueue) -> str | None:
        catalogue = getattr(self.view, "catalogue", None)
        if not isinstance(catalogue, dict):
            return None
        leader = catalogue.get((queue.vhost.name, queue.name))
        return str(leader) if leader is not None else None

    def _reopen(self, queue: RemoteQueue, link: Link) -> None:
        if queue.deleted or queue.link is not None or link.closed \
                or self.remote.get(link.peer, {}).get(queue.stream) is not queue:
            return
        queue.attach(link, queue.stream)

    # -- leader side ---------------------------------------------------------------------
    def _serve(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        streams = self.served.setdefault(link, {})
        if kind == W.OPEN:
            self._open(link, streams, stream, f[0], f[1])
            return
        served = streams.get(stream)
        if served is None:
            if kind == W.PUBLISH:
                if f[0]:
                    link.send(W.encode(W.CONFIRM, stream, f[0], False))
                link.send(W.encode(W.CREDIT, stream, 1))  # its credit is not lost
            elif kind == W.CONSUME:
                link.send(W.encode(W.CONSUMED, stream, f[0], 404, "no such queue stream"))
            elif kind == W.GET:
                link.send(W.encode(W.GET_EMPTY, stream, f[0]))
            return
        if kind == W.PUBLISH:
            served.publish(*f)
            self._schedule_credit()
        elif kind in (W.SETTLE, W.REQUEUE, W.REJECT):
            served.settle(f[0], kind)
        elif kind == W.CONSUME:
            served.consume(*f)
        elif kind == W.GRANT:
            served.grant(*f)
        elif kind == W.CANCEL:
            served.cancel(f[0])
        elif kind == W.RECLAIM:
            served.reclaim(f[0], f[1])
        elif kind == W.GET:
            served.get(*f)
        elif kind == W.COUNT:  # a declare on the user's node: a use, as a declare here
            if not served.queue.deleted:
                served.queue.touch()  # (x-expires starts again)
            link.send(W.encode(W.COUNTED, stream, f[0], *served.stats()))
        elif kind == W.PURGE:
            n = 0 if served.queue.deleted else served.queue.purge()
            link.send(W.encode(W.PURGED, stream, f[0], n))
        elif kind == W.DELETE:
            q = served.queue
            n = 0
            if not q.deleted:
                n = q.message_count
                q.vhost.delete_queue(q)
            link.send(W.encode(W.DELETED, stream, f[0], n))
        elif kind == W.CLOSE:
            served.close()
            del streams[stream]

    def _open(self, link: Link, streams: dict[int, Served], stream: int, vhost: str,
              name: str) -> None:
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if q is None or q.remote:
            link.send(W.encode(W.FAILED, stream, 404,
                               f"NOT_FOUND - no queue '{name}' in vhost '{vhost}'"))
            return
        # an exclusive queue is opened too (publishes from other nodes reach it, as in
        # RabbitMQ); consuming is refused (Served.consume), other nodes refuse it first
        old = streams.pop(stream, None)
        if old is not None:
            old.close()
        served = Served(self.broker, link, stream, q)
        streams[stream] = served
        served.last_stats = served.stats()
        link.send(W.encode(W.OPENED, stream, *served.last_stats))
        q.on_removed.append(lambda _q: self._queue_removed(link, stream, served))

    def _queue_removed(self, link: Link, stream: int, served: Served) -> None:
        streams = self.served.get(link)
        if streams is not None and streams.get(stream) is served:
            del streams[stream]
            link.send(W.encode(W.FAILED, stream, 404, "NOT_FOUND - queue deleted"))

    def _schedule_credit(self) -> None:
        if not self._credit_flush:
            self._credit_flush = True
            asyncio.get_running_loop().call_soon(self._flush_credit)

    def _flush_credit(self) -> None:
        """Credit back for the publishes taken this tick, one frame per stream."""
        self._credit_flush = False
        for link, streams in self.served.items():
            for stream, served in streams.items():
                if served.credit_due:
                    link.send(W.encode(W.CREDIT, stream, served.credit_due))
                    served.credit_due = 0

    def _send_stats(self) -> None:
        for link, streams in self.served.items():
            for stream, served in streams.items():
                now = served.stats()
                if now != served.last_stats:
                    served.last_stats = now
                    link.send(W.encode(W.STATS, stream, *now))
        self._stats_handle = asyncio.get_running_loop().call_later(
            STATS_INTERVAL, self._send_stats)


_LEADER_SIDE = frozenset({W.OPEN, W.CLOSE, W.PUBLISH, W.CONSUME, W.GRANT, W.CANCEL, W.GET,
                          W.SETTLE, W.REQUEUE, W.REJECT, W.PURGE, W.DELETE, W.COUNT,
                          W.DECLARE, W.RECLAIM})

_INSTANCES: dict[int, ClusterQueues] = {}


async def start(api: BrokerAPI, view: Any, cookie: bytes, host: str, port: int,
                locator: str = "client-local") -> ClusterQueues:
    """Start this node's links and queue streams (the cluster's startup calls it once
    the view is up); ``(host, port)`` is ``cluster.link_listen``, ``locator``
    ``cluster.queue_leader_locator``."""
    cluster = ClusterQueues(api, view, cookie, locator)
    await cluster.start(host, port)
    _INSTANCES[id(api)] = cluster
    return cluster


def materialise(api: BrokerAPI, vhost: str, definition: dict[str, Any],
                leader: str) -> QueueType:
    """The definitions applier's hook for a queue whose leader is another node: a
    :class:`RemoteQueue` in the vhost in the queue's place (``definition`` as the
    definitions export writes a queue: name, durable, auto_delete, arguments)."""
    cluster = _INSTANCES[id(api)]
    vh = cluster.broker.vhosts[vhost]
    name = definition["name"]
    existing = vh.queues.get(name)
    if isinstance(existing, RemoteQueue) and existing.leader == leader:
        return existing
    if isinstance(existing, RemoteQueue) and not existing.deleted:
        # the queue has a new leader (a mirror was promoted: amqpd.cluster.mirror):
        # the same object follows it, bindings and all
        cluster.forget(existing)
        if existing.link is not None:
            # the link to the old leader is still up (it was deposed, or this node has
            # not seen it go yet): its consumers follow the new leader all the same;
            # only x-cancel-on-ha-failover ones are cancelled (whatever the mirror
            # records read here say: they may already name the new leader, with no
            # mirror of its own yet)
            existing.detach(keep_consumers=True)
        existing.gone = False
        existing.reopen_tries = 0
        cluster.adopt(existing, leader)
        return existing
    arguments = dict(definition.get("arguments") or {})
    cls = remote_class(str(queue_type_name(arguments)))
    q = cls(vh, name, durable=bool(definition.get("durable", True)),
            auto_delete=bool(definition.get("auto_delete", False)), arguments=arguments)
    from amqpd.broker.exchange import Binding

    if existing is not None:
        # this node led it (it was down while a mirror took over): the cluster's
        # leader holds the messages now; the bindings stay the cluster's
        replace_queue(cluster, vh, existing, q)
        cluster.retire(existing)
    else:
        vh.queues[name] = q
        vh.exchanges[""].bind(Binding(vh.exchanges[""], q, name, {}))
    cluster.broker.apply_policies_to(vh, q)
    cluster.adopt(q, leader)
    return q


def replace_queue(cluster: ClusterQueues, vh: VHost, old: QueueType | None,
                  new: QueueType) -> None:
    """Put ``new`` in ``old``'s place in ``vh`` with ``old``'s bindings, recording no
    definition change (the queue stays the same queue of the cluster; only where it is
    led changes). A :class:`RemoteQueue` replaced stops following its leader."""
    from amqpd.broker.exchange import Binding

    vh.queues[new.name] = new
    if old is None:
        vh.exchanges[""].bind(Binding(vh.exchanges[""], new, new.name, {}))
        return
    for binding in list(old.inbound or ()):
        source = binding.source
        source.unbind(binding.key)
        source.bind(Binding(source, new, binding.routing_key, binding.arguments))
    old.deleted = True
    if isinstance(old, RemoteQueue):
        cluster.forget(old)
        if old.link is not None:
            # this node took the queue over while its link to the old leader is still
            # up (the leader was deposed, or its link's end is not seen yet): what was
            # in flight there is over (confirms nacked, deliveries the leader's copy
            # has); the consumers follow as if the link had gone
            old.detach(keep_consumers=True)
        if old._kept_timer is not None:
            old._kept_timer.cancel()
            old._kept_timer = None
        follow = not new.remote
        for consumer in list(old.consumers):
            old.remove_consumer(consumer)
            if follow and consumer.arguments.get("x-cancel-on-ha-failover") is not True:
                # a consumer kept across the failover consumes from the promoted copy
                consumer.queue = new
                new.add_consumer(consumer)
            else:
                consumer.channel.consumer_cancelled_by_server(consumer)
        for callback in old.on_removed:
            callback(old)


__all__ = ["EXTENSION_KINDS", "ClusterQueues", "RemoteQueue", "Served", "enqueue_here",
           "home_node_down", "materialise", "remote_class", "replace_queue", "start"]
