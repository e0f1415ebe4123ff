"""The queue-type seam: what every kind of queue implements, and the registry by name.

Modelled on RabbitMQ's ``rabbit_queue_type`` behaviour. The channel, the vhost and the
public broker API hold queues as :class:`QueueType` and call only the methods below, so
a new kind of queue (mirrored, stream) is a second implementation registered with
:func:`register_queue_type` under the name clients pass as ``x-queue-type``, and neither
the channel nor the API changes for it. ``classic`` (:class:`amqpd.broker.queue.Queue`)
is the default; ``quorum`` (:class:`amqpd.broker.quorum.QuorumQueue`, one node) is the
second, ``stream`` (:class:`amqpd.broker.stream.StreamQueue`, one node, its own log:
:attr:`QueueType.own_log`) the third. What a type refuses or answers differently
(declare flags, redeclare equivalence, conditional delete, consume, basic.get,
dead-lettering, overflow, the management fields) is a method or class attribute here
with the classic answer as its default, so no caller asks which type it holds.

The base class is compiled with the hot path: a call through it is a native method
call (a vtable slot), not a Python attribute lookup. A type written in an interpreted
module may subclass it (``allow_interpreted_subclasses``); a type on the per-message
path of its users belongs in a compiled module (``amqpd/hotpath.py``).

When each method is called (the entry's life: enqueue -> take -> delivered ->
settle | requeue):

* :meth:`validate_declaration` -- BEFORE declaration, with the declare flags and
  arguments (by default :meth:`validate_arguments`, the arguments alone); raise 406
  PRECONDITION_FAILED with RabbitMQ's text for what this type refuses.
  :meth:`check_consume` likewise before a consumer is attached (by default
  :meth:`validate_consumer_arguments`), :meth:`check_delete` before a queue.delete.
* ``__init__`` -- on declaration (and on recovery, before :meth:`restore`).
* :meth:`enqueue` -- a routed message arrives (publish pipeline, dead-lettering,
  delayed messages falling due).
* :meth:`take` -- a consumer with credit wants the head; None when empty.
  :meth:`fetch` -- the same for basic.get (a type may show the entry differently).
* :meth:`delivered` -- the entry left for a consumer; ``acked`` for no-ack deliveries.
* :meth:`settle` / :meth:`requeue` -- the client acked (or rejected without requeue),
  or the entries go back to their places marked redelivered. :meth:`reject` -- rejected
  without requeue: dead-lettered, then settled.
* :meth:`add_consumer` / :meth:`remove_consumer` -- basic.consume / basic.cancel and
  channel close.
* :meth:`dispatch` -- at the end of a tick in which the queue became deliverable
  (the broker's dispatch scheduler calls it, never a handler inline), unless
  :attr:`deliveries_held` (then :meth:`fetch` gives nothing as well).
* :meth:`delete` -- once, when the queue is deleted, after its bindings are gone.
* :meth:`restore` -- at boot, once per recovered message, in log order.
* :meth:`options_changed` -- after the queue's policy was (re)applied.

Overflow with ``reject-publish``: :meth:`refuses_publish` before a message is admitted
(only when the queue's overflow rejects), :meth:`after_enqueue_rejecting` after one was.
Dead-lettering republishes :meth:`published_message` of an entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from mypy_extensions import mypyc_attr

from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.dedup import QueueDedup
    from amqpd.broker.exchange import Binding
    from amqpd.broker.extensions import QueueExt
    from amqpd.broker.message import Message
    from amqpd.broker.policy import QueueOptions
    from amqpd.broker.queue import Consumer
    from amqpd.broker.queue_entry import QueueEntry, Unacked
    from amqpd.broker.vhost import VHost

DEFAULT_TYPE = "classic"


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueType:
    """Base of every queue type: the identity and counters the broker and the HTTP API
    read, and the operations the channel and the API call."""

    type_name: ClassVar[str] = ""
    # a transient message routed to a queue of this type is written to the store like a
    # persistent one, always (a quorum queue); the publish pipeline asks the instance's
    # :attr:`keeps_all`, which a replicated queue of another type sets too
    keeps_every_message: ClassVar[bool] = False
    # always carries QueueExt (amqpd.broker.extensions), even without options
    needs_ext: ClassVar[bool] = False
    # arguments compared on redeclare; None: the classic set (vhost.EQUIVALENCE_ARGS)
    compared_arguments: ClassVar[frozenset[str] | None] = None
    # where a publish goes: True for a queue led by another node
    # (amqpd.cluster.remote_queue), which the publish pipeline hands a routed message
    # through :meth:`forward` (its leader stores and confirms it), not into this node's
    # store and :meth:`enqueue`. It keeps no deduplication cache here either (its
    # leader checks: amqpd.broker.dedup)
    forwards_publish: ClassVar[bool] = False
    # the queue keeps its records in a log of its own (a stream: amqpd.broker.stream),
    # not in the shared log: the publish pipeline leaves it out of the shared log's
    # write and a confirm waits for :meth:`sync_log` (asked only while such queues exist)
    own_log: ClassVar[bool] = False

    def __init__(
        self, vhost: VHost, name: str, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.consumers: list[Consumer] = []
        self.deleted = False
        self.store_key = f"{vhost.name}\x00{name}"
        # the store holds entries of this queue: durable, or paged out under memory pressure
        self.in_store = durable
        self.unacked_count = 0
        self.ready_bytes = 0  # body bytes of ready messages held in memory (budgets)
        self.policy: dict[str, Any] | None = None
        self.policy_name: str | None = None
        # TTL/limits/priority/DLX/x-expires/SAC state (amqpd.broker.extensions); None = none
        self.ext: QueueExt | None = None
        # counters for management stats
        self.stat_publish = 0
        self.stat_deliver = 0
        self.stat_ack = 0
        self.stat_redeliver = 0
        self.on_removed: list[Callable[[QueueType], None]] = []
        # bindings to this queue (Exchange.bind keeps it): delete finds them directly
        self.inbound: set[Binding] | None = None
        # every message routed here is written to the store, transient ones too: always
        # for a keeps_every_message type, and while a replica group copies the queue's
        # records to other nodes (:meth:`replicated`: a mirrored classic queue's leader,
        # amqpd.cluster.mirror), so transient messages reach the mirrors as well. The
        # publish pipeline reads it (a struct read) while keeping queues exist
        self.keeps_all = self.keeps_every_message
        # x-message-deduplication (amqpd.broker.dedup): the values of the messages in it
        self.dedup: QueueDedup | None = None
        # under memory pressure the publish pipeline may hand it a logged message to
        # hold log-only (the classic queue's paging, amqpd.broker.queue.Queue sets it);
        # an attribute, not a class check, so the per-message test is a struct read
        self.pages_out = False
        # deliveries wait: the cluster holds them on the queues this node leads as a
        # replica group's leader while its leadership is unconfirmed (woken from a
        # SIGSTOP, back from a long stall: amqpd.cluster.delivery_hold), so a deposed
        # leader hands its consumers nothing its successor delivers. The dispatch
        # scheduler skips the queue (a bool test per dirty queue, not per message) and
        # :meth:`fetch` answers empty; whoever sets it schedules a dispatch on clearing
        self.deliveries_held = False

    # --- called BEFORE declaration
    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any], name: str, vhost: str) -> None:
        """Refuse declare arguments this type does not accept (406)."""

    @classmethod
    def validate_declaration(cls, arguments: dict[str, Any], name: str, vhost: str,
                             durable: bool, exclusive: bool, auto_delete: bool,
                             server_named: bool) -> None:
        """Refuse a declaration this type does not accept (406): by default only its
        arguments are checked; a type with rules on the flags overrides this."""
        cls.validate_arguments(arguments, name, vhost)

    @classmethod
    def validate_consumer_arguments(cls, arguments: dict[str, Any], name: str,
                                    vhost: str) -> None:
        """Refuse basic.consume arguments this type does not accept (406); called before
        the consumer is attached."""

    def check_consume(self, arguments: dict[str, Any], global_prefetch: int) -> None:
        """basic.consume on this queue, before the consumer is attached:
        ``global_prefetch`` is the channel's global QoS (0: none)."""
        self.validate_consumer_arguments(arguments, self.name, self.vhost.name)

    def check_consumer(self, consumer: Consumer) -> None:
        """basic.consume: the consumer as made (``no_ack``, ``prefetch``), before
        consume-ok; a stream refuses automatic acks and a missing prefetch."""

    def check_return(self, method: str) -> None:
        """A client's basic.nack / basic.reject (``method``) or basic.recover gives
        deliveries of this queue back, before anything moves (no refusal here)."""

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """queue.delete with these flags, before they are looked at (no refusal here)."""

    def check_bind(self) -> None:
        """A client's queue.bind to this queue (no refusal here; a queue whose leader
        node is down answers 404 as RabbitMQ 3.10 does)."""

    # --- state the channel and the API read
    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        """Messages ready for delivery (not counting unacknowledged ones)."""
        raise NotImplementedError

    def flow_backlog(self) -> int:
        """What credit flow weighs (``Channel._credit_flow``): the messages waiting for
        a consumer. A stream keeps what its consumers have read, so it answers how far
        its slowest consumer lags instead (amqpd.broker.stream)."""
        return self.message_count

    def touch(self) -> None:
        """The queue was used (declare, basic.get): restarts its ``x-expires`` clock."""

    def listed_type(self) -> str:
        """The type as the management API lists it and the cluster's per-type fields
        are chosen by: :attr:`type_name`, unless the queue stands for one of another
        type (a queue led by another node lists its leader's type)."""
        return self.type_name

    def routable(self) -> bool:
        """Does the publish pipeline keep this queue in a route now? A queue whose
        leader node is out of reach is left out, as RabbitMQ 3.10 routes nothing to a
        queue whose node is down (asked only while queues led elsewhere exist)."""
        return True

    def refreshes_view(self, then: Callable[[], None]) -> bool:
        """queue.declare of this existing queue, before it is looked at: True when
        this node's view of the queue may lag the cluster's (a queue led by another
        node: a delete made there may not have reached this node), and ``then`` is
        called once it is current; False (``then`` unused) when the view is current."""
        return False

    def confirms_delete(self, answer: Callable[[BaseException | None], None]) -> bool:
        """queue.delete of this queue was done here: True when delete-ok waits for
        the cluster to record the delete (its leader writes it), ``answer(None)`` then
        or an error; False (``answer`` unused) when delete-ok may go at once."""
        return False

    def ready_entries(self) -> Iterable[QueueEntry]:
        """The ready entries this queue holds on this node, in queue order: what a
        replica group that starts from it counts as its copies' backlog, and what a
        restarted node takes back as a copy (amqpd.cluster). Empty for a type that
        holds no ready list here (a stream, a queue led by another node)."""
        return ()

    def ready_positions(self) -> list[int]:
        """The store positions of the ready messages held here (those in the store)."""
        return [e.message.position for e in self.ready_entries() if e.message.position >= 0]

    def replicated(self, on: bool) -> None:
        """A replica group starts (``on``) or stops copying this queue's records to
        other nodes: the cluster's mirrored classic queues (amqpd.cluster.mirror),
        on the node that leads the queue. While it does the queue keeps every message
        in the store (:attr:`keeps_all`), so what is replicated is every message the
        queue holds, and the publish pipeline counts it among its keeping queues. A
        type that always keeps every message is unchanged by it; a call that changes
        nothing changes no count."""
        keeps = on or self.keeps_every_message
        if keeps == self.keeps_all:
            return
        self.keeps_all = keeps
        self.vhost.broker.publisher.keeping_queues += 1 if keeps else -1

    def type_info(self, node: str) -> dict[str, Any]:
        """The management API's fields for this type beyond :meth:`info` (``node``: this
        broker's node name), e.g. a quorum queue's leader and members."""
        return {}

    def info(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "vhost": self.vhost.name,
            "type": self.type_name,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "exclusive": self.exclusive,
            "arguments": self.arguments,
            "messages_ready": self.message_count,
            "messages_unacknowledged": self.unacked_count,
            "messages": self.message_count + self.unacked_count,
            "consumers": len(self.consumers),
        }
        if self.dedup is not None:
            out["deduplication"] = self.dedup.info()
        return out

    # --- messages
    def enqueue(self, message: Message) -> None:
        raise NotImplementedError

    def take(self) -> QueueEntry | None:
        raise NotImplementedError

    def fetch(self) -> QueueEntry | None:
        """basic.get: the head, as :meth:`take` gives it unless the type shows a fetched
        entry differently; nothing while :attr:`deliveries_held`."""
        if self.deliveries_held:
            return None
        return self.take()

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        raise NotImplementedError

    def shared_unacked(self, consumer: Consumer) -> Unacked | None:
        """The one unacked record a channel may keep for every delivery to ``consumer``
        when acks on this queue only count (:meth:`settle` needs how many, not which):
        None here, each delivery has its own."""
        return None

    def forward(self, message: Message,
                on_confirm: Callable[[BaseException | None], None] | None) -> None:
        """A :attr:`forwards_publish` queue: take a routed message, calling
        ``on_confirm`` (if given) once its node has it as safe as its own publishers'
        messages."""
        raise NotImplementedError

    def defers_get(self) -> bool:
        """Whether basic.get is answered later, through :meth:`fetch_for`: a queue
        led by another node, and a quorum queue's leader's in a cluster (once the
        checkout is committed)."""
        return False

    def fetch_for(self, channel: Any, no_ack: bool) -> None:
        """basic.get when :meth:`defers_get`: answered later through
        ``channel.answer_get`` (the head is on another node, or its checkout waits)."""
        raise NotImplementedError

    def consume_for(self, consumer: Consumer,
                    answer: Callable[[BaseException | None], None]) -> None:
        """basic.consume: ``answer`` gets None once the queue accepted ``consumer``
        (consume-ok), or the refusal, before any delivery. Here the queue accepts at
        once, then attaches it; a queue led by another node attaches it when that node
        accepted it (or refused: 403 for an exclusive consumer there)."""
        answer(None)
        self.add_consumer(consumer)

    def counts_for(self, answer: Callable[[int, int], None]) -> None:
        """declare-ok's counts: ``answer(messages, consumers)`` as the queue has them
        when asked (here, at once; a queue led by another node asks its leader)."""
        answer(self.message_count, len(self.consumers))

    def published_message(self, entry: QueueEntry) -> Message:
        """The message of ``entry`` as it was published (what dead-lettering
        republishes): the entry's own unless the type decorated it."""
        return entry.message

    def refuses_publish(self, message: Message) -> bool:
        """overflow=reject-publish[-dlx]: would ``message`` be refused now? Asked only
        while the queue's overflow rejects and it has a length limit."""
        raise NotImplementedError

    def effective_options(self, opts: QueueOptions) -> QueueOptions:
        """The options (arguments + policies) as this type applies them; called each time
        they are worked out."""
        return opts

    def attach_ext(self, opts: QueueOptions) -> None:
        """The queue has options (arguments, policies) and no extension state yet
        (``self.ext`` is None): a type that implements them through
        :class:`~amqpd.broker.extensions.QueueExt` attaches one; the others read them
        in :meth:`options_changed`."""

    def options_changed(self) -> None:
        """The queue's policy was (re)applied: ``self.policy`` is current (a type that
        does not use :class:`~amqpd.broker.extensions.QueueExt` reads it here)."""

    def sync_log(self, callback: Callable[[BaseException | None], None]) -> None:
        """An :attr:`own_log` queue: call back once everything it took is durable."""
        raise NotImplementedError

    def after_enqueue_rejecting(self) -> None:
        """A message was enqueued while the overflow rejects (a type may start refusing
        from here on)."""

    def settle(self, entries: Iterable[QueueEntry]) -> None:
        raise NotImplementedError

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        raise NotImplementedError

    def reject(self, entries: list[QueueEntry]) -> None:
        """Rejected without requeue (basic.reject/nack): dead-lettered if the queue has
        a dead-letter exchange, then settled."""
        self.vhost.broker.dead_letter(self, entries, "rejected")
        self.settle(entries)

    def purge(self) -> int:
        """Drop every ready message; how many there were."""
        raise NotImplementedError

    def restore(self, message: Message, redelivered: bool, published: int = 0,
                extra: int = 0) -> None:
        """A recovered message, at the tail. ``published`` (wall-clock ms, 0 if unknown)
        and ``extra`` (expires_ms << 8 | priority) come from the store's record."""
        raise NotImplementedError

    # --- consumers
    def add_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def dispatch(self) -> None:
        raise NotImplementedError

    # --- end of life
    def delete(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Broker shutdown, before the shared store closes: an :attr:`own_log` queue
        makes its log durable and closes it (nothing to do for the others)."""


QUEUE_TYPES: dict[str, type[QueueType]] = {}


def register_queue_type(cls: type[QueueType]) -> type[QueueType]:
    """Make ``cls.type_name`` declarable as ``x-queue-type``."""
    QUEUE_TYPES[cls.type_name] = cls
    return cls


def queue_type_name(arguments: dict[str, Any] | None) -> Any:
    """The ``x-queue-type`` a declaration asks for (``classic`` when absent)."""
    if not arguments:
        return DEFAULT_TYPE
    value = arguments.get("x-queue-type")
    return DEFAULT_TYPE if value is None else value


def resolve(arguments: dict[str, Any], name: str, vhost: str, durable: bool = False,
            exclusive: bool = False, auto_delete: bool = False,
            server_named: bool = False) -> type[QueueType]:
    """The type a declaration picks, the declaration validated by that type. An unknown
    type is checked against the classic rules first, then refused (RabbitMQ's text)."""
    wanted = queue_type_name(arguments)
    cls = QUEUE_TYPES.get(wanted) if isinstance(wanted, str) else None
    if cls is None:
        QUEUE_TYPES[DEFAULT_TYPE].validate_arguments(arguments, name, vhost)
        where = f"for queue '{name}' in vhost '{vhost}'" if name else "for queue"
        raise PreconditionFailed(
            f"invalid arg 'x-queue-type' {where}: \"unsupported queue type '{wanted}'\"")
    cls.validate_declaration(arguments, name, vhost, durable, exclusive, auto_delete,
                             server_named)
    return cls


__all__ = ["DEFAULT_TYPE", "QUEUE_TYPES", "QueueType", "queue_type_name",
           "register_queue_type", "resolve"]
