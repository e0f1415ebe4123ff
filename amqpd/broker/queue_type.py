"""The queue-type seam: what every kind of queue implements, and the registry by name.

Modelled on RabbitMQ's ``rabbit_queue_type`` behaviour. The channel, the vhost and the
public broker API hold queues as :class:`QueueType` and call only the methods below, so
a new kind of queue (quorum, mirrored, stream) is a second implementation registered
with :func:`register_queue_type` under the name clients pass as ``x-queue-type``, and
neither the channel nor the API changes for it. Today's queue is the first
implementation: ``classic`` (:class:`amqpd.broker.queue.Queue`), the default.

The base class is compiled with the hot path: a call through it is a native method
call (a vtable slot), not a Python attribute lookup. A type written in an interpreted
module may subclass it (``allow_interpreted_subclasses``); a type on the per-message
path of its users belongs in a compiled module (``amqpd/hotpath.py``).

When each method is called (the entry's life: enqueue -> take -> delivered ->
settle | requeue):

* :meth:`validate_arguments` -- BEFORE declaration, with the declare arguments; raise
  406 PRECONDITION_FAILED with RabbitMQ's text for what this type refuses
  (:meth:`validate_consumer_arguments` likewise before a consumer is attached).
* ``__init__`` -- on declaration (and on recovery, before :meth:`restore`).
* :meth:`enqueue` -- a routed message arrives (publish pipeline, dead-lettering,
  delayed messages falling due).
* :meth:`take` -- a consumer with credit or basic.get wants the head; None when empty.
* :meth:`delivered` -- the entry left for a consumer; ``acked`` for no-ack deliveries.
* :meth:`settle` / :meth:`requeue` -- the client acked (or rejected without requeue),
  or the entries go back to their places marked redelivered.
* :meth:`add_consumer` / :meth:`remove_consumer` -- basic.consume / basic.cancel and
  channel close.
* :meth:`dispatch` -- at the end of a tick in which the queue became deliverable
  (the broker's dispatch scheduler calls it, never a handler inline).
* :meth:`delete` -- once, when the queue is deleted, after its bindings are gone.
* :meth:`restore` -- at boot, once per recovered message, in log order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from mypy_extensions import mypyc_attr

from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.exchange import Binding
    from amqpd.broker.extensions import QueueExt
    from amqpd.broker.message import Message
    from amqpd.broker.queue import Consumer
    from amqpd.broker.queue_entry import QueueEntry
    from amqpd.broker.vhost import VHost

DEFAULT_TYPE = "classic"


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueType:
    """Base of every queue type: the identity and counters the broker and the HTTP API
    read, and the operations the channel and the API call."""

    type_name: ClassVar[str] = ""

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

    # --- called BEFORE declaration
    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any], name: str, vhost: str) -> None:
        """Refuse declare arguments this type does not accept (406)."""

    @classmethod
    def validate_consumer_arguments(cls, arguments: dict[str, Any], name: str,
                                    vhost: str) -> None:
        """Refuse basic.consume arguments this type does not accept (406); called before
        the consumer is attached."""

    # --- state the channel and the API read
    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        """Messages ready for delivery (not counting unacknowledged ones)."""
        raise NotImplementedError

    def touch(self) -> None:
        """The queue was used (declare, basic.get): restarts its ``x-expires`` clock."""

    def info(self) -> dict[str, Any]:
        return {
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

    # --- messages
    def enqueue(self, message: Message) -> None:
        raise NotImplementedError

    def take(self) -> QueueEntry | None:
        raise NotImplementedError

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        raise NotImplementedError

    def settle(self, entries: Iterable[QueueEntry]) -> None:
        raise NotImplementedError

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        raise NotImplementedError

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


def resolve(arguments: dict[str, Any], name: str, vhost: str) -> type[QueueType]:
    """The type a declaration picks, its arguments validated by that type. An unknown
    type is checked against the classic rules first, then refused (RabbitMQ's text)."""
    wanted = queue_type_name(arguments)
    cls = QUEUE_TYPES.get(wanted) if isinstance(wanted, str) else None
    if cls is None:
        QUEUE_TYPES[DEFAULT_TYPE].validate_arguments(arguments, name, vhost)
        where = f"for queue '{name}' in vhost '{vhost}'" if name else "for queue"
        raise PreconditionFailed(
            f"invalid arg 'x-queue-type' {where}: \"unsupported queue type '{wanted}'\"")
    cls.validate_arguments(arguments, name, vhost)
    return cls


__all__ = ["DEFAULT_TYPE", "QUEUE_TYPES", "QueueType", "queue_type_name",
           "register_queue_type", "resolve"]
