"""What a :class:`~amqpd.cluster.remote_queue.RemoteQueue` is made of (issue 28's
split of remote_queue.py): its state (:class:`RemoteQueueState`, whose ``__init__``
sets every field the parts use: the publish credit and confirms, the consumers and
their buffered deliveries, the delivery ids and positions, what a lost leader's stream
left on the channels), the per-consumer and per-held-delivery records, and the 404 of a
queue whose leader is out of reach. The parts -- :mod:`~amqpd.cluster.remote_consume`
(consumers, deliveries, basic.get) and :mod:`~amqpd.cluster.remote_failover` (the
stream to the leader, its loss, RECLAIM) -- and the core
(:mod:`~amqpd.cluster.remote_queue`: declare checks, publish forwarding, settling,
counts, delete) build on it. Theory of operation: :mod:`amqpd.cluster.remote_queue`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import (
    Consumer,
    NotFound,
    QueueEntry,
    QueueType,
)
from amqpd.cluster.link import Link

if TYPE_CHECKING:
    from amqpd.broker.api import ClusterPort, VHost
    from amqpd.cluster.cluster_queues import ClusterQueues
    from amqpd.cluster.stream_local import LocalRead

PUBLISH_WINDOW: Final = 2000  # publishes in flight per stream before the leader's credit
# a quorum queue's acks and rejects remembered (by position) for naming to a new leader
# if the current one is lost before it took them
RECENT_SETTLES: Final = 1024

OnConfirm = Callable[[BaseException | None], None]
# a publish waiting for the leader's credit: PUBLISH's fields (seq, persistent, exchange,
# routing key, properties, body), sent in a PUBLISHES batch once credit comes
Unsent = tuple[int, bool, str, str, bytes, bytes]


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

    __slots__ = ("answer", "buffer", "by_settle", "consumer", "id", "local", "resume",
                 "timer")

    def __init__(self, cid: int, consumer: Consumer) -> None:
        self.id = cid
        self.consumer = consumer
        self.buffer: deque[QueueEntry] = deque()
        # credit comes back on ack/requeue (prefetch) or on hand-out (no limit)
        self.by_settle = bool(consumer.prefetch) and not consumer.no_ack
        # the channel's callback while the leader has not yet accepted the consumer
        self.answer: Callable[[BaseException | None], None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        # a stream's: the offset after the last delivery its channel was given (where
        # it goes on after a failover: amqpd.cluster.stream_group)
        self.resume: int | None = None
        # a stream's consumer reading this node's copy instead of the leader
        # (amqpd.cluster.stream_local); None: served by the leader
        self.local: LocalRead | None = None


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


class RemoteQueueState(QueueType):
    """A remote queue's state (module docstring); the behaviour is
    :class:`~amqpd.cluster.remote_queue.RemoteQueue`'s and its parts'."""

    forwards_publish = True  # its leader stores and confirms what is published here
    real_type = "classic"  # the leader's queue's type (listed_type)

    def __init__(
        self, vhost: VHost, name: str, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None, *, port: ClusterPort,
    ) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        # the broker as the cluster reaches it (BrokerAPI.cluster_port), never vhost.broker
        self.port = port
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
        self._unsent: deque[Unsent] = deque()
        # the PUBLISHES frame this queue's publishes join while it is the last frame
        # queued on the link (RemoteQueue.forward; link_wire's batches)
        self._batch: bytearray | None = None
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
        # a stream's deliveries read from this node's copy (stream_local) and not
        # settled yet -> their consumer: a consumer sent to the leader meanwhile was
        # granted only what its prefetch window had left, so each of them settled
        # gives that window a place back there (RemoteQueue._settled)
        self._local_owner: dict[QueueEntry, _RemoteConsumer] = {}
        port.publisher.forwarding_queues += 1
        self.on_removed.append(self._uncount)

    def _uncount(self, queue: QueueType) -> None:
        """Gone from its vhost: one queue fewer for the publish pipeline to forward to."""
        self.port.publisher.forwarding_queues -= 1

    if TYPE_CHECKING:  # what one part calls on another
        @property
        def available(self) -> bool: ...
        def _count_answer(self, req: int) -> None: ...
        def _send(self, frame: bytes) -> None: ...
        def _unavailable(self) -> NotFound: ...
        def _request(self, kind: int, answer: Callable[[int], None]) -> None: ...
        def _forget_consumer(self, state: _RemoteConsumer) -> None: ...
        def _consume(self, state: _RemoteConsumer) -> None: ...
        def _stop_local(self, state: _RemoteConsumer) -> None: ...
        def _send_grants(self) -> None: ...
        def _settled(self, entries: list[QueueEntry], how: int) -> list[int]: ...
        def _held_settled(self, held: _Held, how: int) -> None: ...
        def _stale_settled(self, state: _RemoteConsumer) -> None: ...
        def detach(self, keep_consumers: bool = False) -> None: ...
        def cancel_kept(self) -> None: ...


__all__ = ["PUBLISH_WINDOW", "RECENT_SETTLES", "LinkLost", "OnConfirm", "RemoteQueueState",
           "home_node_down", "jsonable"]
