"""The publish pipeline, and the persistence glue every message passes through.

:meth:`Publisher.publish` is what every publisher uses: the AMQP channel, the HTTP API's
``.../publish`` and plugins (through :meth:`amqpd.broker.api.BrokerAPI.publish`). It
checks what needs the properties (user-id, expiration, CC/BCC), routes through the
vhost (:meth:`VHost.route`; direct reply-to and held delayed messages are destinations
like any queue), applies length limits, writes persistent messages for durable queues
to the store once, answers the publisher confirm, and enqueues -- log-only where memory
is short (paging).

It also owns what batches store traffic across a tick: one store commit for every
confirm waiter of the tick, DELIVERED marks gathered per queue, and the memory budget
that decides paging. The :class:`~amqpd.server.Broker` keeps the process lifecycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, cast

from amqpd.broker import extensions
from amqpd.broker.dedup import admitted
from amqpd.broker.limits import admit
from amqpd.broker.message import LoggedMessage, Message
from amqpd.broker.persist import stored_message
from amqpd.broker.queue import Queue
from amqpd.broker.queue_type import QueueType
from amqpd.protocol.constants import FLAG_EXPIRATION_HI, FLAG_HEADERS_HI, FLAG_USER_ID_LO
from amqpd.protocol.errors import PreconditionFailed
from amqpd.store.api import StoreError

if TYPE_CHECKING:
    import asyncio

    from amqpd.broker.exchange import Exchange
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker

log = logging.getLogger("amqpd.publish")

# What an in-memory ready message costs beyond its body (entry, message object, strings):
# the memory budgets count it, so a backlog of tiny messages pages out too.
MESSAGE_OVERHEAD: Final = 256

OnConfirm = Callable[[BaseException | None], None]


def _may_refuse(queues: list[QueueType]) -> bool:
    """Whether a queue on the route might refuse a message (``x-overflow`` reject-publish,
    a quorum queue's limit): only then is :func:`admit` asked, the rest pay nothing."""
    for q in queues:
        ext = q.ext
        if ext is not None and ext.rejects:
            return True
    return False


def _reachable(queues: list[QueueType]) -> list[QueueType]:
    """The route without the queues whose leader node is out of reach
    (:meth:`QueueType.routable`): RabbitMQ 3.10 routes nothing to a queue whose node is
    down (the message is unroutable there: a mandatory one comes back with basic.return,
    the confirm is an ack). A mirrored queue whose synchronised mirror is taking over
    stays in the route (its publish is nacked until the new leader is known), and so
    does a queue whose node is still counted running while its link is down."""
    for q in queues:
        if not q.routable():
            return [q for q in queues if q.routable()]
    return queues


def _any_own_log(queues: list[QueueType]) -> bool:
    """Whether a queue on the route keeps its own log (a stream): its confirm waits."""
    return any(q.own_log for q in queues)


class JointConfirm:
    """One publisher confirm over several parts (this node's store and each node a
    message was forwarded to): ``done`` once, when every part answered, with the first
    error if any."""

    def __init__(self, done: OnConfirm, parts: int) -> None:
        self.done = done
        self.left = parts
        self.error: BaseException | None = None

    def part(self, error: BaseException | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if self.left == 0:
            self.done(self.error)


class Publisher:
    """One per broker (``broker.publisher``)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.loop: asyncio.AbstractEventLoop | None = None  # set by Broker.start
        self.paging_all = False  # node over its message memory budget: page everything
        self.ready_bytes_total = 0
        self._pending_commit = False
        self._commit_waiters: list[OnConfirm] = []
        self._delivered_batch: dict[str, list[int]] = {}
        # how many queues that keep every message exist (QueueType.keeps_all: a type
        # that always does, quorum, or a replicated queue led here, a mirrored one:
        # QueueType.replicated): while any do, a transient message routed to one is
        # written to the store like a persistent one
        self.keeping_queues = 0
        # how many queues led by another node this node knows (amqpd.cluster,
        # QueueType.forwards_publish): while any do, routed messages are split between
        # local queues and forwarded ones, and the route leaves out unroutable ones
        self.forwarding_queues = 0
        # how many queues with a log of their own (streams, QueueType.own_log) exist:
        # while any do, the shared log's write leaves them out and a confirm for a
        # message one took waits for its log's sync (QueueType.sync_log)
        self.own_log_queues = 0
        self._own_logs_written: list[QueueType] = []  # this tick's, synced at the commit
        # how many queues deduplicate (x-message-deduplication, amqpd.broker.dedup):
        # while none do, a publish does not look for them
        self.dedup_queues = 0
        # the mandatory callback of the publish being forwarded now: a cluster's dedup
        # exchange (its ClusterGate, a remote destination) learns only later whether a
        # message is a duplicate, and then returns it as unroutable, as on one node
        self.on_unroutable: Callable[[], None] | None = None

    def publish(
        self, vhost: VHost, exchange_name: str, message: Message, username: str | None,
        on_confirm: OnConfirm | None = None,
        on_unroutable: Callable[[], None] | None = None,
        only: frozenset[str] | None = None,
    ) -> list[QueueType]:
        """Route and enqueue a message; persist it if it must survive a restart.

        ``only`` (a federation link retrying a message that some queues of its route
        already took) keeps just the queues of the route with those names.

        ``on_confirm`` (publisher confirms) is called exactly once: after the store's
        group commit when the message was written to the store (persistent and routed to
        durable queues, or held by a durable delayed exchange), at once for anything
        else, and with the error if the store could not take the message (the message
        then reaches only non-durable queues and the publisher gets a nack).
        ``on_unroutable`` (mandatory) is called when no destination took the message.
        """
        props = message.properties
        if len(props) >= 2 and props[1] & FLAG_USER_ID_LO and username is not None:
            user_id = message.props.get("user_id")
            if user_id is not None and user_id != username:
                raise PreconditionFailed(
                    f"user_id property set to '{user_id}' but authenticated user was "
                    f"'{username}'"
                )
        message, exchange, queues = self._route(vhost, exchange_name, message)
        if only is not None:
            queues = [q for q in queues if q.name in only]
        exchange.stat_publish_in += 1  # RabbitMQ's publish_in / publish_out
        exchange.stat_publish_out += len(queues)
        if not queues and on_unroutable is not None:
            on_unroutable()
        if self.dedup_queues and queues:
            # after the mandatory check: a duplicate a queue refuses was routed (the plugin)
            queues = admitted(queues, message)
        confirm_now = on_confirm
        if queues and _may_refuse(queues):
            queues, refused = admit(self.broker, queues, message)  # overflow=reject-publish[-dlx]
            if refused:
                exchange.refused(message)
            if refused and on_confirm is not None:
                on_confirm(PreconditionFailed("rejected by a queue's length limit"))
                on_confirm = confirm_now = None
        forwarded: list[QueueType] | None = None
        if self.forwarding_queues and queues:
            # (only for a route of one: a message other queues took is no return)
            self.on_unroutable = on_unroutable if len(queues) == 1 else None
            queues, forwarded, on_confirm = self._forward(queues, message, on_confirm)
            self.on_unroutable = None
            confirm_now = on_confirm
        if queues and not message.persistent and self.keeping_queues:
            # a quorum queue writes every message it takes, transient ones too (a durable
            # classic queue reached by the same message keeps it as well: one write)
            message.persistent = any(q.keeps_all for q in queues)
        store = self.broker.store
        if queues and message.persistent:
            if self.own_log_queues:
                durable = [q.store_key for q in queues if q.durable and not q.own_log]
            else:
                durable = [q.store_key for q in queues if q.durable]
            if durable:
                try:
                    message.position = store.append_enqueue(durable, stored_message(message))
                except StoreError as exc:
                    log.error("store refused a persistent message: %s", exc)
                    self.store_failed(exc)
                    exchange.refused(message)
                    queues = [q for q in queues if not q.durable]
                    for q in queues:
                        q.enqueue(message)
                    if on_confirm is not None:
                        on_confirm(exc)
                    return queues
                if on_confirm is not None:
                    self.commit(on_confirm)
                    confirm_now = None
                self._pending_commit = True
        if not store.on_disk or (props and props[0] & FLAG_EXPIRATION_HI):
            # nowhere to page to, or TTL'd (kept whole: expiry reads the properties)
            for q in queues:
                q.enqueue(message)
        else:
            self._enqueue_all(queues, message)
        if confirm_now is not None:
            # a destination may have written the message itself (a durable delayed
            # exchange holding a persistent one): then the confirm waits for the log
            if message.position >= 0 or (self.own_log_queues and _any_own_log(queues)):
                self.commit(confirm_now)
            else:
                confirm_now(None)
        if forwarded:
            return queues + forwarded
        return queues

    def _route(self, vhost: VHost, exchange_name: str, message: Message,
               ) -> tuple[Message, Exchange, list[QueueType]]:
        """The message as routed (CC/BCC applied), the exchange it was published to and
        the queues it reaches now (those of other nodes only while reachable)."""
        routing_keys = [message.routing_key]
        props = message.properties
        if len(props) >= 2 and props[0] & (FLAG_EXPIRATION_HI | FLAG_HEADERS_HI):  # CC/BCC
            message, routing_keys = extensions.prepare_publish(message)
        exchange = vhost.get_exchange(exchange_name)
        queues = vhost.route(exchange, message, routing_keys)
        if self.forwarding_queues and queues:
            queues = _reachable(queues)
        return message, exchange, queues

    def route_names(self, vhost: VHost, exchange_name: str, message: Message) -> list[str]:
        """The names of the queues :meth:`publish` would put ``message`` into now."""
        return [q.name for q in self._route(vhost, exchange_name, message)[2]]

    def _forward(self, queues: list[QueueType], message: Message,
                 on_confirm: OnConfirm | None,
                 ) -> tuple[list[QueueType], list[QueueType] | None, OnConfirm | None]:
        """Hand ``message`` to the queues on the route led by other nodes; the local
        queues, those, and the confirm the local part answers (the publisher's confirm
        comes once every part answered, a nack if any part failed)."""
        local: list[QueueType] = []
        remote: list[QueueType] = []
        for q in queues:
            if q.forwards_publish:
                remote.append(q)
            else:
                local.append(q)
        if not remote:
            return queues, None, on_confirm
        if on_confirm is None:
            for q in remote:
                q.forward(message, None)
            return local, remote, None
        joint = JointConfirm(on_confirm, len(remote) + 1)
        for q in remote:
            q.forward(message, joint.part)
        return local, remote, joint.part

    def _enqueue_all(self, queues: list[QueueType], message: Message) -> None:
        """Enqueue, log-only where memory is short.

        Past a queue's memory limit, a message already in the log is kept only there
        (free); a transient one is written there only when all queues together are over
        the node's budget (RabbitMQ also pages transient messages only under pressure).
        Paging is the classic queue's (:attr:`QueueType.pages_out`): other queue types
        take the message as it is.
        """
        logged = message.position >= 0
        # only a logged message may be held log-only: a transient one (the common case)
        # does not read the setting (an attribute of an interpreted object)
        limit = self.broker.settings.queue_memory_limit if logged else 0
        paging_all = self.paging_all
        shared: LoggedMessage | None = None  # the logged copy, one for every queue
        to_write: list[QueueType] | None = None  # queues whose copy must first be written
        for q in queues:
            if not q.pages_out:
                q.enqueue(message)
            elif logged and q.durable and (paging_all or q.ready_bytes + len(
                    cast(Queue, q).ready) * MESSAGE_OVERHEAD > limit):
                if shared is None:
                    shared = LoggedMessage(self.broker.store, message.position, message.size)
                q.enqueue(shared)
            elif paging_all:
                if to_write is None:
                    to_write = []
                to_write.append(q)
            else:
                q.enqueue(message)
        if to_write is not None:
            self._page_out(to_write, message)

    def _page_out(self, queues: list[QueueType], message: Message) -> None:
        """Under node memory pressure: write the message once, for all of ``queues``,
        and let each hold it log-only (a fan-out pays one write, not one per queue)."""
        store = self.broker.store
        try:
            # transient: a paged copy is never recovered (RabbitMQ drops transient
            # messages at restart, paged or not)
            position = store.append_enqueue(
                [q.store_key for q in queues], stored_message(message, transient=True))
        except StoreError:
            for q in queues:
                q.enqueue(message)  # cannot page: keep it in memory
            return
        paged = LoggedMessage(store, position, message.size)
        for q in queues:
            q.in_store = True
            q.enqueue(paged)

    def enqueue_forwarded(self, q: QueueType, message: Message,
                          on_confirm: OnConfirm | None) -> None:
        """The publish pipeline's steps after routing, for one local queue: a publish
        another cluster node routed here (amqpd/cluster/remote_served.py, the leader's
        side of a queue used from that node). Deduplication, the queue's length limit
        (reject-publish), the store for a persistent message in a durable queue (or
        any message of a queue that keeps every message; a stream writes its own log),
        then the enqueue; ``on_confirm`` once that is durable."""
        if q.dedup is not None and not q.dedup.admit(message):
            if on_confirm is not None:  # x-message-deduplication: already in the queue
                on_confirm(None)
            return
        ext = q.ext
        if ext is not None and ext.rejects:
            _accepted, refused = admit(self.broker, [q], message)
            if refused:
                if on_confirm is not None:
                    on_confirm(PreconditionFailed("rejected by a queue's length limit"))
                return
        if not message.persistent and q.keeps_all:
            message.persistent = True
        store = self.broker.store
        if message.persistent and q.durable and not q.own_log:
            try:
                message.position = store.append_enqueue([q.store_key], stored_message(message))
            except StoreError as exc:
                self.store_failed(exc)
                if on_confirm is not None:
                    on_confirm(exc)
                return
            self._pending_commit = True
            if on_confirm is not None:
                self.commit(on_confirm)
                on_confirm = None
        props = message.properties
        if not store.on_disk or (props and props[0] & FLAG_EXPIRATION_HI):
            q.enqueue(message)
        else:
            self._enqueue_all([q], message)
        if on_confirm is not None:
            if q.own_log:  # a stream: its own log's sync (and commit rule) confirms
                self.commit(on_confirm)
            else:
                on_confirm(None)

    def commit(self, callback: OnConfirm) -> None:
        """Call back once everything appended so far is durable (or with the error).

        The callbacks of one tick share a single store commit: a confirm-heavy tick adds
        one job for the writer, not one per message. A failed write raises the store
        alarm; the callbacks still get the error (publisher confirms become nacks).
        """
        waiters = self._commit_waiters
        loop = self.loop
        if not waiters and loop is not None:
            loop.call_soon(self.register_commit)
        waiters.append(callback)
        if loop is None:
            self.register_commit()

    def own_log_written(self, queue: QueueType) -> None:
        """An :attr:`~QueueType.own_log` queue took a message this tick (it says so
        once per tick): the tick's commit syncs its log as well."""
        self._own_logs_written.append(queue)
        self._pending_commit = True

    def register_commit(self) -> None:
        """Hand this tick's commit waiters to the store, and to the own logs written
        this tick (at the end of the tick, or at shutdown)."""
        waiters, self._commit_waiters = self._commit_waiters, []
        if not waiters:
            return
        logs, self._own_logs_written = self._own_logs_written, []

        def done(error: BaseException | None) -> None:
            if error is not None:
                self.store_failed(error)
            for callback in waiters:
                try:
                    callback(error)
                except Exception:
                    log.exception("commit callback failed")

        if not logs:
            self.broker.store.commit(done)
            return
        joint = JointConfirm(done, len(logs) + 1)
        self.broker.store.commit(joint.part)
        for q in logs:
            q.sync_log(joint.part)

    def store_failed(self, error: BaseException) -> None:
        """The store could not write: raise the store alarm (publishers are blocked).

        A warren's :class:`~amqpd.store.api.NotReplicated` (durable here, too few in-sync
        standbys acknowledged it in time) is a nack for the publisher but no disk
        trouble: no alarm."""
        from amqpd.store.api import NotReplicated

        if isinstance(error, NotReplicated):
            return
        alarms = self.broker.alarms
        if "store" not in alarms.active:
            log.error("message store cannot write: %s", error)
        alarms.set_external("store", True, f"message store failing: {error}")

    def check_memory(self) -> None:
        """Once a second: page new messages of every queue while bodies exceed the budget."""
        total = 0
        for vhost in self.broker.vhosts.values():
            for q in vhost.queues.values():
                total += q.ready_bytes + q.message_count * MESSAGE_OVERHEAD
        self.ready_bytes_total = total
        # paging to a store that keeps everything in memory would free nothing
        self.paging_all = self.broker.store.on_disk and \
            total > self.broker.settings.message_memory_budget

    def body_of(self, message: Message) -> bytes:
        body = message.body
        if body is None:  # evicted: read back from the log
            return self.broker.store.read(message.position).body
        return body

    def after_commit(self, callback: OnConfirm) -> None:
        """Call back once everything written so far is durable, or with the store's
        error (tx.commit-ok waits for this)."""
        if not self._pending_commit:
            callback(None)
            return
        self.commit(callback)

    # ------------------------------------------------------------------ store hooks
    def store_settle(self, queue: QueueType, positions: list[int]) -> None:
        if not queue.deleted:
            self.broker.store.append_settle(queue.store_key, positions)

    def store_delivered(self, queue: QueueType, position: int) -> None:
        """Delivery marks are gathered per queue and written once per tick, one record
        each (a record per delivery cost ~16% of delivery CPU on a backlog drain).
        The store is told at once, before the bytes leave (its delivery promise)."""
        self.broker.store.delivering(queue.store_key, position)
        batch = self._delivered_batch
        if not batch and self.loop is not None:
            self.loop.call_soon(self.flush_delivered)
        batch.setdefault(queue.store_key, []).append(position)

    def flush_delivered(self) -> None:
        """Write the gathered DELIVERED marks (end of tick, or at shutdown)."""
        batch, self._delivered_batch = self._delivered_batch, {}
        store = self.broker.store
        for key, positions in batch.items():
            try:
                store.append_delivered_many(key, positions)
            except StoreError as exc:  # a failing store: marks are best effort
                log.warning("delivery marks not written: %s", exc)
                return

    def store_drop_queue(self, queue: QueueType) -> None:
        self.broker.store.drop_queue(queue.store_key)
