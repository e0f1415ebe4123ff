"""Quorum queues on one node: RabbitMQ 3.10's ``x-queue-type: quorum`` without replication.

Clients and frameworks (Celery, Spring AMQP, MassTransit...) declare quorum queues; on a
single node amqpd gives them the semantics RabbitMQ 3.10.8 gives a quorum queue, as
measured on it (see conformance/cases/quorum.py):

* Declaration: durable only; never exclusive, auto-delete or server-named; only the
  arguments of :data:`QUEUE_ARGUMENTS` are checked (and compared on redeclare), the other
  RabbitMQ queue arguments are refused as not supported "of queue type
  rabbit_quorum_queue" and unknown ``x-`` arguments are kept as they are.
* Delivery count: every return of a delivery (nack/reject with requeue, channel or
  connection closed with it unacked, basic.recover) counts. A returned message goes to
  the *back* of the queue and carries an ``x-delivery-count`` header (a long) from then
  on; basic.get also shows it on a first delivery (value 0), basic.deliver does not.
* ``x-delivery-limit`` (argument, or ``delivery-limit`` policy: the lower wins; a
  non-integer argument means none): a message returned more often than the limit is
  dead-lettered with reason ``delivery_limit`` (or dropped without a DLX). The
  dead-lettered copy does not carry the ``x-delivery-count`` header.
* Overflow: ``drop-head`` as classic queues; ``reject-publish`` refuses publishes while
  the queue is *over* its limit, and once that happened keeps refusing until the queue is
  down to 80 % of it (rabbit_fifo's soft limit); ``reject-publish-dlx`` is not supported
  by quorum queues and behaves as ``drop-head`` (RabbitMQ logs a warning, so do we).
* Refused: global QoS on a channel consuming from one (540 NOT_IMPLEMENTED at
  basic.consume), queue.delete with if-unused or if-empty (540).
* Every message is kept on disk, transient ones too (``keeps_every_message``); a
  returned message is written again with its count (and its old record settled), so
  after a restart (or a kill -9) it is at the back of the queue with the count it had,
  redelivered, and with the publish time and expiry of its first record (its TTL
  counts from the publish, not from the return or the restart).

On one node a quorum queue is its own leader and only member, and
``node-is-quorum-critical`` is healthy. In a cluster the replica group (members on
other nodes, majority commit, elections) is :mod:`amqpd.cluster.quorum_group`, which
sets :attr:`QuorumQueue.group` on the node that leads the queue. After an election the
new leader takes what the lost one had handed out as its own deliveries
(:meth:`QuorumQueue.checked_out_entry`); what comes back of those goes to the *front*
of the queue, counted (:meth:`QuorumQueue.return_checked_out`), as RabbitMQ 3.10.8
returns a lost node's consumers' checkouts.

:class:`QuorumQueue` is the queue-type seam's ``quorum`` implementation
(:mod:`amqpd.broker.queue_type`), picked by ``x-queue-type: quorum``. On one node it is
the classic queue (TTL, limits, DLX, single active consumer, x-expires all come from
:class:`amqpd.broker.queue.Queue` and its extensions) with the seam's methods
overridden where the list above differs: the declare, consume and delete refusals,
requeue at the back with a count, basic.get's count, the reject-publish soft limit, the
management fields. A replicated
implementation (issue 16) would register under the same name in its place, keeping the
refusals (the class-level checks here) and replacing where messages live.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from amqpd.broker import rawprops
from amqpd.broker.message import LoggedMessage, Message
from amqpd.broker.queue import Queue
from amqpd.broker.queue_entry import QueueEntry, QuorumEntry, expiry_of
from amqpd.broker.queue_type import QueueType, register_queue_type
from amqpd.protocol.constants import BASIC_CONSUME, CLASS_BASIC, method_of
from amqpd.protocol.errors import NotImplemented_, PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.policy import QueueOptions
    from amqpd.broker.queue import Consumer
    from amqpd.broker.vhost import VHost

log = logging.getLogger("amqpd.quorum")

TYPE_NAME = "quorum"
MODULE = "rabbit_quorum_queue"  # the name RabbitMQ's error texts use
# The queue arguments a 3.10 quorum queue takes (its capabilities' queue_arguments):
# checked on declare and compared on redeclare; the others below are refused.
QUEUE_ARGUMENTS = frozenset({
    "x-expires", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
    "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-overflow",
    "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size",
    "x-delivery-limit", "x-message-ttl", "x-dead-letter-strategy",
})
# RabbitMQ queue arguments that only other queue types take
UNSUPPORTED_ARGUMENTS = (
    "x-max-priority", "x-queue-mode", "x-queue-version", "x-queue-master-locator",
    "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
)
# what extensions.validate_queue_arguments checks for a classic queue as well
_COMMON_ARGUMENTS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange",
                     "x-dead-letter-routing-key", "x-max-length", "x-max-length-bytes",
                     "x-overflow", "x-single-active-consumer", "x-message-deduplication")
DLX_STRATEGIES = ("at-most-once", "at-least-once")
DELIVERY_COUNT = "x-delivery-count"
SOFT_LIMIT = 0.8  # rabbit_fifo accepts publishes again at 80 % of the length limit


# ---------------------------------------------------------------------------- declaring
class QuorumQueue(Queue):
    """``x-queue-type: quorum`` on one node: the classic queue with RabbitMQ 3.10's
    quorum refusals, delivery counting and reject-publish soft limit (module docstring).
    """

    type_name = TYPE_NAME
    keeps_every_message = True
    needs_ext = True  # the delivery limit and reject-publish are worked out there
    compared_arguments = QUEUE_ARGUMENTS

    def __init__(
        self, vhost: VHost, name: str, durable: bool = False,
        exclusive_owner: object | None = None, auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        self.delivery_limit: int | None = None
        self.blocked = False  # reject-publish: over the limit, not yet back to 80 %
        # in a cluster, the replica group this node leads the queue for
        # (amqpd.cluster.quorum_group.GroupLeading): without a majority, nothing is
        # delivered (its serving() says when)
        self.group: Any = None
        publisher = vhost.broker.publisher
        publisher.keeping_queues += 1  # transient messages are written while any exist
        self.on_removed.append(_removed)

    # -- refusals ------------------------------------------------------------------------
    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any], name: str, vhost: str) -> None:
        """The values of the arguments a quorum queue takes, then those it does not take
        (the first one the client sent, as RabbitMQ reports it)."""
        from amqpd.broker.extensions import validate_queue_arguments

        where = f"for queue '{name}' in vhost '{vhost}'"
        validate_queue_arguments(
            {k: v for k, v in arguments.items() if k in _COMMON_ARGUMENTS}, name, vhost)
        check_count_arguments(arguments, ("x-max-in-memory-length", "x-max-in-memory-bytes",
                                          "x-quorum-initial-group-size"),
                              "x-quorum-initial-group-size", where)
        strategy = arguments.get("x-dead-letter-strategy")
        if strategy is not None and strategy not in DLX_STRATEGIES:
            raise PreconditionFailed(
                f"invalid arg 'x-dead-letter-strategy' {where}: invalid_dlx_strategy")
        for key in arguments:
            if key in UNSUPPORTED_ARGUMENTS:
                raise PreconditionFailed(f"invalid arg '{key}' {where} of queue type {MODULE}")

    @classmethod
    def validate_declaration(cls, arguments: dict[str, Any], name: str, vhost: str,
                             durable: bool, exclusive: bool, auto_delete: bool,
                             server_named: bool) -> None:
        """Refuse what RabbitMQ 3.10.8 refuses when a quorum queue is declared."""
        refuse_replicated_flags(cls, MODULE, arguments, name, vhost, durable, exclusive,
                                auto_delete, server_named)

    def check_consume(self, arguments: dict[str, Any], global_prefetch: int) -> None:
        """basic.consume: no global QoS (540) and no stream offset (406)."""
        if global_prefetch:
            raise NotImplemented_(f"queue '{self.name}' in vhost '{self.vhost.name}' does not "
                                  "support global qos", CLASS_BASIC,
                                  method_of(BASIC_CONSUME))
        if "x-stream-offset" in arguments:
            raise PreconditionFailed(
                f"invalid arg 'x-stream-offset' for queue '{self.name}' in vhost "
                f"'{self.vhost.name}' of queue type {MODULE}")
        super().check_consume(arguments, global_prefetch)

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """queue.delete's conditional flags are refused by quorum queues (540)."""
        flag = "if-unused" if if_unused else "if-empty" if if_empty else None
        if flag is not None:
            raise NotImplemented_(
                f"cannot delete queue '{self.name}' in vhost '{self.vhost.name}'. "
                f"queue.delete operations with {flag} flag set are not supported by "
                "quorum queues")

    def type_info(self, node: str) -> dict[str, Any]:
        """One node is leader, member and online."""
        return {"type": TYPE_NAME, "leader": node, "members": [node], "online": [node]}

    # -- options -------------------------------------------------------------------------
    def effective_options(self, opts: QueueOptions) -> QueueOptions:
        """The delivery limit (argument or policy, the lower wins); reject-publish-dlx
        is not supported and behaves as drop-head."""
        arg = self.arguments.get("x-delivery-limit")
        if isinstance(arg, bool) or not isinstance(arg, int):
            arg = None
        pol = (self.policy or {}).get("delivery-limit")
        if isinstance(pol, bool) or not isinstance(pol, int):
            pol = None
        limits = [v for v in (arg, pol) if v is not None]
        self.delivery_limit = min(limits) if limits else None
        if opts.overflow == "reject-publish-dlx":
            log.warning("queue '%s' in vhost '%s': overflow reject-publish-dlx is not "
                        "supported by quorum queues; drop-head applies",
                        self.name, self.vhost.name)
            opts = dataclasses.replace(opts, overflow="drop-head")
        if opts.overflow != "reject-publish":
            self.blocked = False
        return opts

    # -- reject-publish ------------------------------------------------------------------
    def refuses_publish(self, message: Message) -> bool:
        """True while reject-publish refuses a new message: over the limit, or once it
        was, until back at 80 % of it."""
        if self.blocked and self._below_soft_limit():
            self.blocked = False
        return self.blocked or self._over_limit()

    def after_enqueue_rejecting(self) -> None:
        """reject-publish: the queue went over its limit; refuse until back at 80 %."""
        if self._over_limit():
            self.blocked = True

    def _over_limit(self) -> bool:
        opts = self.ext.opts  # type: ignore[union-attr]
        return (opts.max_length is not None and len(self.ready) > opts.max_length) or (
            opts.max_length_bytes is not None and self.ready_bytes > opts.max_length_bytes)

    def _below_soft_limit(self) -> bool:
        opts = self.ext.opts  # type: ignore[union-attr]
        return (opts.max_length is None
                or len(self.ready) <= int(opts.max_length * SOFT_LIMIT)) \
            and (opts.max_length_bytes is None
                 or self.ready_bytes <= int(opts.max_length_bytes * SOFT_LIMIT))

    # -- deliveries ----------------------------------------------------------------------
    def dispatch(self) -> None:
        """As a classic queue's, except while the replica group lacks a majority; and
        in a group each delivery leaves only once its checkout is committed (the group
        holds it: amqpd.cluster.handout)."""
        group = self.group
        if group is None:
            super().dispatch()
            return
        if not group.serving():
            return
        consumers = self.consumers
        ready = self.ready
        handouts = group.handouts
        while ready and consumers and handouts.has_room():
            consumer = self._next_consumer()
            if consumer is None:
                return
            entry = self.take()
            if entry is None:
                return
            handouts.hand_out(self, consumer, entry)

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        """As a classic queue's; a delivery whose checkout the group recorded when it
        chose it (and which leaves now) is only settled if it needs no ack."""
        group = self.group
        if group is not None and group.handouts.leaving(entry) is not None:
            if acked:
                self.settle([entry])
            return
        super().delivered(entry, acked)

    def remove_consumer(self, consumer: Consumer) -> None:
        """As a classic queue's; what waits for the consumer's checkouts to commit comes
        back (amqpd.cluster.handout)."""
        super().remove_consumer(consumer)
        if self.group is not None:
            self.group.handouts.withdraw(consumer)

    def defers_get(self) -> bool:
        """In a replica group basic.get is answered once the checkout is committed."""
        return self.group is not None

    def fetch_for(self, channel: Any, no_ack: bool, wait: bool = True) -> None:
        """basic.get in a replica group (:meth:`defers_get`): the head is checked out
        now and answered through ``channel.answer_get`` once that is committed. While
        the group lacks a majority (after a restart, until the other members' copies
        are back) a get of a queue with ready messages waits for it
        (``GroupLeading.when_serving``, bounded) rather than answer get-empty while the
        declare-ok counts them: RabbitMQ never does (issue 35)."""
        group = self.group
        if wait and group is not None and self.message_count and not group.serving():
            group.when_serving(lambda: self._fetch_after_wait(channel, no_ack))
            return
        entry = self.fetch()
        if entry is None:
            channel.answer_get(self, None, True, 0)
            return
        if self.ext is not None:
            self.ext.drop_expired_head()  # RabbitMQ's message-count leaves them out
        if self.group is None:  # no longer led in a group (it stopped while a get waited)
            channel.answer_get(self, entry, no_ack, self.message_count)
            return
        self.group.handouts.get_for(self, channel, entry, no_ack)

    def _fetch_after_wait(self, channel: Any, no_ack: bool) -> None:
        """A waiting basic.get's turn (:meth:`fetch_for`): answered as the queue is now
        (get-empty if the group still lacks a majority or the queue went)."""
        if channel.closed:
            return
        if self.deleted:
            channel.answer_get(self, None, True, 0)
            return
        self.fetch_for(channel, no_ack, wait=False)

    def fetch(self) -> QueueEntry | None:
        """basic.get shows the delivery count even on a first delivery (0); nothing
        while the replica group lacks a majority."""
        if self.group is not None and not self.group.serving():
            return None
        entry = self.take()
        if entry is None or isinstance(entry, QuorumEntry):
            return entry
        base, count = self._counted(entry)
        return QuorumEntry(_with_count(base, count), entry.seq, entry.redelivered,
                           expiry_of(entry), 0, base, count)

    def published_message(self, entry: QueueEntry) -> Message:
        """A returned delivery is republished as published, without the
        x-delivery-count header RabbitMQ adds only on delivery."""
        return entry.base if isinstance(entry, QuorumEntry) else entry.message

    def _counted(self, entry: QueueEntry) -> tuple[Message, int]:
        """The message as published and its delivery count so far. An entry recovered
        after a restart carries its count in the header it was stored with."""
        message = entry.message
        ext = self.ext
        if ext is None or entry.seq > ext.cold_last:
            return message, 0
        if type(message) is LoggedMessage:
            message = message.load()
        count = message.headers.get(DELIVERY_COUNT)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return message, 0
        return _without_count(message), count

    def _store_count(self, old: Message, new: Message) -> None:
        """Write the returned message again, with its count, and settle the old record:
        after a restart it is at the back of the queue with the count it had, as in
        RabbitMQ (whose log keeps the count), marked redelivered. The new record keeps
        what the publish pipeline stamped on the old one (publish time, per-message
        expiry, priority: ENQUEUE_META, :func:`amqpd.broker.persist.stored_message`), so
        its TTL clock keeps running from the publish across a restart, as a classic
        queue's message's does. If the store fails the count lives in memory only."""
        store = self.vhost.broker.store
        if not self.in_store or old.position < 0:
            return
        from amqpd.store.api import StoredMessage, StoreError

        try:
            first = store.read(old.position)  # its stamps (a cache or read-ahead hit, often)
            new.position = store.append_enqueue(
                [self.store_key], StoredMessage(new.exchange, new.routing_key,
                                                new.properties, new.body, first.published,
                                                first.expires, first.priority,
                                                first.transient))
            store.append_delivered(self.store_key, new.position)  # redelivered after recovery
            store.append_settle(self.store_key, [old.position])
            store.commit(lambda _error: None)
        except StoreError as exc:
            log.warning("queue '%s' in vhost '%s': delivery count not written: %s",
                        self.name, self.vhost.name, exc)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        """Deliveries come back: each counts one more delivery and goes to the back of the
        queue with its count in ``x-delivery-count``; past the delivery limit it is
        dead-lettered (reason ``delivery_limit``) instead."""
        ext = self.ext
        assert ext is not None
        if self.blocked and self._below_soft_limit():
            self.blocked = False
        for entry in sorted(entries, key=lambda e: e.seq):
            returned = self._one_more_return(entry)
            if returned is None:
                continue
            self.unacked_count -= 1
            message, base, count = returned
            back = QuorumEntry(message, self._seq.take(), True,
                               expiry_of(entry), 0, base, count)
            self.ready.append(back)
            self.ready_bytes += back.message.size
            if back.expires is not None:
                ext.timed = True
        ext.arm_expiry_at_head()
        if self.consumers:
            self.vhost.schedule_dispatch(self)

    def _one_more_return(self, entry: QueueEntry) -> tuple[Message, Message, int] | None:
        """A delivery coming back counts one more (``x-delivery-count``): past the
        delivery limit it is dead-lettered and settled (None; settle() counts it as
        acked, as RabbitMQ's stats do for a discard); else the message with its new
        count, written where it lives so far, with its base and the count."""
        if isinstance(entry, QuorumEntry):
            base, count = entry.base, entry.count + 1
        else:
            base, count = self._counted(entry)
            count += 1
        if self.delivery_limit is not None and count > self.delivery_limit:
            self.vhost.broker.dead_letter(self, [QueueEntry(base, entry.seq)],
                                          "delivery_limit")
            self.settle([entry])
            return None
        message = _with_count(base, count)
        message.position = entry.message.position  # the record it lives in so far
        self._store_count(entry.message, message)
        return message, base, count

    # -- across an election (amqpd.cluster.quorum_group) ---------------------------------
    def checked_out_entry(self, message: Message) -> QuorumEntry:
        """A message a lost leader had handed to a consumer, as one of this queue's
        deliveries not yet acknowledged: its count so far from the header it was stored
        with, and a place (``seq``) taken now, so that when it comes back it goes there
        (:meth:`return_checked_out`)."""
        if type(message) is LoggedMessage:
            message = message.load()
        count = message.headers.get(DELIVERY_COUNT)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            count = 0
        self.unacked_count += 1
        return QuorumEntry(message, self._seq.take(), True, None, 0,
                           _without_count(message), count)

    def return_checked_out(self, entries: Iterable[QueueEntry]) -> None:
        """Deliveries that consumers of a lost leader held come back: each counts one
        more delivery, as a requeue does (``x-delivery-count``, dead-lettered past the
        delivery limit), but goes back to its place, not to the back: the places
        :meth:`checked_out_entry` took at the election are ahead of every message never
        delivered, so they come first, in their order, as RabbitMQ 3.10.8 returns a lost
        node's consumers' checkouts (docs/clustering.md)."""
        ext = self.ext
        assert ext is not None
        back: list[QueueEntry] = []
        for entry in sorted(entries, key=lambda e: e.seq):
            returned = self._one_more_return(entry)
            if returned is None:
                continue
            message, base, count = returned
            back.append(QuorumEntry(message, entry.seq, True, None, 0, base, count))
        if back:
            ext.requeue(back)


register_queue_type(QuorumQueue)


def check_count_arguments(arguments: dict[str, Any], keys: tuple[str, ...], positive: str,
                          where: str) -> None:
    """The ``keys`` present must be integers >= 0, and ``positive`` > 0 (a group size),
    refused with RabbitMQ 3.10.8's texts (quorum queues and streams check alike)."""
    from amqpd.broker.extensions import type_name

    for key in keys:
        if key not in arguments:
            continue
        value = arguments[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise PreconditionFailed(
                f"invalid arg '{key}' {where}: \"expected integer, got {type_name(value)}\"")
        if value < 0:
            raise PreconditionFailed(f"invalid arg '{key}' {where}: {{value_negative,{value}}}")
        if key == positive and value == 0:
            raise PreconditionFailed(f"invalid arg '{key}' {where}: {{value_zero,0}}")


def refuse_replicated_flags(cls: type[QueueType], module: str, arguments: dict[str, Any],
                            name: str, vhost: str, durable: bool, exclusive: bool,
                            auto_delete: bool, server_named: bool) -> None:
    """What RabbitMQ 3.10.8 refuses when a quorum queue or a stream (``module`` names
    the type in its texts) is declared, in its order: a server-generated name, the
    arguments (``cls.validate_arguments``), then auto-delete, exclusive, non-durable."""
    if server_named:
        raise PreconditionFailed(f"Cannot declare a server-named queue for type {module}")
    cls.validate_arguments(arguments, name, vhost)
    for prop, bad in (("auto-delete", auto_delete), ("exclusive-owner", exclusive),
                      ("non-durable", not durable)):
        if bad:
            raise PreconditionFailed(
                f"invalid property '{prop}' for queue '{name}' in vhost '{vhost}'")


def _removed(queue: QueueType) -> None:
    queue.vhost.broker.publisher.keeping_queues -= 1


def _with_count(message: Message, count: int) -> Message:
    """A copy of ``message`` whose headers carry ``x-delivery-count`` (a long), set as
    RabbitMQ sets a header: replaced if present, the table sorted by key."""
    if type(message) is LoggedMessage:
        message = message.load()
    fields = rawprops.split_properties(message.properties)
    items = [kv for kv in rawprops.header_items(fields) if kv[0] != DELIVERY_COUNT]
    items.append((DELIVERY_COUNT, rawprops.long(count)))
    fields["headers"] = rawprops.encode_table(rawprops.sort_items(items))
    copy = Message(message.exchange, message.routing_key, rawprops.join_properties(fields),
                   message.body, persistent=message.persistent)
    copy.position = message.position
    return copy


def _without_count(message: Message) -> Message:
    """``message`` as published: without the ``x-delivery-count`` header it was stored
    with (what dead-lettering republishes, and what a new count is set on)."""
    fields = rawprops.split_properties(message.properties)
    items = [kv for kv in rawprops.header_items(fields) if kv[0] != DELIVERY_COUNT]
    fields["headers"] = rawprops.encode_table(items)
    copy = Message(message.exchange, message.routing_key, rawprops.join_properties(fields),
                   message.body, persistent=message.persistent)
    copy.position = message.position
    return copy


__all__ = ["DELIVERY_COUNT", "QUEUE_ARGUMENTS", "QuorumQueue", "check_count_arguments",
           "refuse_replicated_flags"]
