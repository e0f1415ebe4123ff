"""x-message-deduplication: a fanout exchange that routes each header value once.

Compatible with rabbitmq-message-deduplication: the exchange routes as fanout, and a
message whose ``x-deduplication-header`` value it has seen within the cache TTL is not
routed at all (so, as with the plugin, a duplicate is *unroutable*: a mandatory one comes
back with basic.return NO_ROUTE, a confirm is a basic.ack, and an alternate exchange
gets it). Arguments: ``x-cache-size`` (required), ``x-cache-ttl`` (ms; without it an
entry stays until evicted), ``x-cache-persistence`` (``memory`` | ``disk``); a message's
own ``x-cache-ttl`` header overrides the exchange's. Policies carry the same keys: for
size and TTL the smaller of argument and policy wins (RabbitMQ's rule for max-length and
message-ttl), for persistence the argument wins.

Disk persistence is derived from the shared log, not kept in a file of its own. A new
value makes the route end in :class:`CacheRecord`, an internal destination (never in
``vhost.queues``) whose store key is ``"<vhost>\\x00amq.dedup.<exchange>"``; it is
durable, so the publish pipeline writes a persistent message *once* for its queues and
this key together, and the cache entry is that very record. A transient message gets a
body-less record of its own, written after the message's. Either way the cache record
is never durable without the message it admitted (the log is sequential), and the
confirm waits for the commit. An entry that expires or is evicted settles its record
under the key. Restart recovery (:func:`recover`) and a warren standby, which follows
the whole log and recovers from it when promoted, rebuild the cache from the key's live
records, in log order, with their publish times: nothing else to replicate.

In a cluster the cache is the cluster's (:class:`ClusterGate`, and
amqpd/cluster/dedup_cache.py for the etcd side): a value this node already knows to be
done is dropped at once as above; any other message with the header has one destination,
the gate, which asks the shared cache and routes the message on (through the bindings)
only when this publish took the value, confirming it once the destinations and the cache
both have it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from amqpd.broker.dedup import (
    DedupCache,
    Key,
    SharedCache,
    dedup_key,
    message_ttl,
    now_ms,
    validate_exchange_arguments,
)
from amqpd.broker.exchange import Binding, Destination, Exchange, register_exchange_type
from amqpd.broker.exchanges import internal
from amqpd.broker.message import Message
from amqpd.broker.persist import stored_message
from amqpd.broker.queue_type import QueueType
from amqpd.store.api import StoredMessage

if TYPE_CHECKING:
    from amqpd.broker.publish import OnConfirm
    from amqpd.broker.vhost import VHost
    from amqpd.server import Broker
    from amqpd.store.api import RecoveredQueue

log = logging.getLogger("amqpd.dedup")

KEY_PREFIX = "amq.dedup."


def store_key(vhost: str, exchange: str) -> str:
    return internal.store_key(vhost, KEY_PREFIX, exchange)


class CacheRecord(QueueType):
    """The destination that makes a new value's cache entry durable (disk persistence).

    Not a queue clients see: it holds nothing; :meth:`enqueue` only notes the log
    position of the message's record (which the pipeline wrote with this key among its
    keys), or writes a body-less record when the message itself was not logged.
    """

    type_name = "x-dedup-record"

    def __init__(self, exchange: DedupExchange, vhost: VHost) -> None:
        super().__init__(vhost, f"{KEY_PREFIX}{exchange.name}", durable=True)
        self.exchange = exchange

    @property
    def message_count(self) -> int:
        return 0  # it holds no messages: nothing for a consumer, no backlog to flow-control

    def enqueue(self, message: Message) -> None:
        self.exchange._recorded(message)


class _Waiting:
    """A message at the gate, waiting for the shared cache's answer."""

    __slots__ = (
        "answered",
        "error",
        "expires",
        "key",
        "message",
        "on_confirm",
        "revision",
        "unroutable",
    )

    def __init__(self, message: Message, key: Key, expires: int,
                 on_confirm: OnConfirm | None, unroutable: Callable[[], None] | None) -> None:
        self.message = message
        self.key = key
        self.expires = expires
        self.on_confirm = on_confirm
        self.unroutable = unroutable
        self.revision = 0  # non-zero: this publish took the value
        self.error: BaseException | None = None
        self.answered = False


class ClusterGate(QueueType):
    """In a cluster, the one destination of a message carrying the header (unless this
    node already knows its value): a destination the publish pipeline forwards to
    (:attr:`~amqpd.broker.queue_type.QueueType.forwards_publish`), handing it the
    message with the publisher's confirm (:meth:`forward`), and goes on.

    The gate asks the cluster's cache (:class:`SharedCache`: etcd, one transaction) and
    answers in publish order whatever order the answers come in: a duplicate is dropped
    as on one node (a mandatory one returned with 312 NO_ROUTE, then acked); a value
    this publish took is published again through the exchange's bindings (the exchange
    lets exactly that message through), and once that publish is confirmed the value is
    settled in the cache, and only then is the publisher's confirm sent. A refused or
    failed one frees the value (a nack: the retry is routed)."""

    type_name = "x-dedup-gate"
    forwards_publish = True

    def __init__(self, exchange: DedupExchange, vhost: VHost, shared: SharedCache) -> None:
        super().__init__(vhost, f"{KEY_PREFIX}{exchange.name}", durable=False)
        self.exchange = exchange
        self.shared = shared
        self._waiting: deque[_Waiting] = deque()
        self._asks: set[asyncio.Task[None]] = set()  # takes in flight (their items wait)
        self._finishing: set[asyncio.Task[None]] = set()  # settles: they confirm themselves

    @property
    def message_count(self) -> int:
        return 0

    def enqueue(self, message: Message) -> None:
        self.forward(message, None)  # dead-lettered or delayed into the exchange

    def forward(self, message: Message, on_confirm: OnConfirm | None) -> None:
        ex = self.exchange
        key = ex._last_key if message is ex._last else dedup_key(message)
        if key is None:  # cannot happen: only a message with the header comes here
            if on_confirm is not None:
                on_confirm(None)
            return
        ttl = message_ttl(message) or ex.ttl
        item = _Waiting(message, key, now_ms() + ttl if ttl else 0, on_confirm,
                        self.vhost.broker.publisher.on_unroutable)
        self._waiting.append(item)
        self._spawn(self._ask(item), self._asks)

    def _spawn(self, work: Any, tasks: set[asyncio.Task[None]]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _ask(self, item: _Waiting) -> None:
        try:
            item.revision = await self.shared.take(item.key)
        except Exception as exc:  # etcd out of reach, a value pending too long
            log.warning("deduplication exchange '%s': cannot check a value: %s",
                        self.exchange.name, exc)
            item.error = exc
        item.answered = True
        self._answer()

    def _answer(self) -> None:
        """Handle the answered messages at the head, in publish order."""
        waiting = self._waiting
        while waiting and waiting[0].answered:
            item = waiting.popleft()
            if item.error is not None:
                if item.on_confirm is not None:
                    item.on_confirm(item.error)
            elif not item.revision:
                self.exchange.cache.hits += 1
                if item.unroutable is not None:
                    item.unroutable()
                if item.on_confirm is not None:
                    item.on_confirm(None)
            else:
                self._route_on(item)

    def _route_on(self, item: _Waiting) -> None:
        ex = self.exchange

        def done(error: BaseException | None) -> None:
            self._spawn(self._finish(item, error), self._finishing)

        ex._passing = item.message
        try:
            self.vhost.broker.publisher.publish(self.vhost, ex.name, item.message, None,
                                                on_confirm=done, on_unroutable=item.unroutable)
        except Exception as exc:  # the exchange went meanwhile
            done(exc)
        finally:
            ex._passing = None

    async def _finish(self, item: _Waiting, error: BaseException | None) -> None:
        """The routed message's confirm: settle (or free) the value, then answer."""
        try:
            if error is None:
                await self.shared.settle(item.key, item.revision, item.expires)
                self.exchange.cache.add(item.key, item.expires, now_ms())
            else:
                await self.shared.release(item.key, item.revision)
        except Exception as exc:
            # the message is where it should be; the value stays pending until this
            # node's lease ends: confirm what was done, say what was not
            log.warning("deduplication exchange '%s': value not %s in the cluster's "
                        "cache: %s", self.exchange.name, "settled" if error is None else
                        "freed", exc)
        if item.on_confirm is not None:
            item.on_confirm(error)

    def close(self) -> None:
        """The exchange is deleted: what waits for the cache is nacked; a message routed
        on already still settles its value and gets its confirm."""
        for task in list(self._asks):
            task.cancel()
        for item in self._waiting:
            if item.on_confirm is not None:
                item.on_confirm(RuntimeError(f"exchange '{self.exchange.name}' deleted"))
        self._waiting.clear()


@register_exchange_type
class DedupExchange(Exchange):
    type_name = "x-message-deduplication"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self._dests: dict[tuple[str, str, str, str], Destination] = {}
        self._routes: tuple[Destination, ...] = ()  # _dests' values, rebuilt on (un)bind
        self.cache = DedupCache(1, self._settle)
        self.ttl: int | None = None
        self.persistence = "memory"
        self.broker: Broker | None = None
        self.record: CacheRecord | None = None  # set while disk persistence is in effect
        # the message the last route() call decided on, and what it decided: vhost.route
        # asks once per routing key (CC/BCC), the cache must be asked only once
        self._last: Message | None = None
        self._last_key: Key | None = None
        self._last_dests: tuple[Destination, ...] = ()
        self._settled: list[int] = []
        self._vhost: VHost | None = None
        self.gate: ClusterGate | None = None  # in a cluster, once first needed
        self._passing: Message | None = None  # the gate's message being routed on
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ declaration
    def validate(self, arguments: dict[str, Any]) -> None:
        validate_exchange_arguments(arguments)

    def attach(self, broker: Broker, vhost: VHost) -> None:
        """After declaration and after every policy change: the effective settings."""
        self.broker = broker
        self._vhost = vhost
        args, pol = self.arguments, self.policy or {}
        sizes = [v for v in (args.get("x-cache-size"), pol.get("x-cache-size"))
                 if isinstance(v, int)]
        ttls = [v for v in (args.get("x-cache-ttl"), pol.get("x-cache-ttl"))
                if isinstance(v, int)]
        persistence = args.get("x-cache-persistence", pol.get("x-cache-persistence", "memory"))
        if isinstance(persistence, bytes):
            persistence = persistence.decode("utf-8", "replace")
        self.ttl = min(ttls) if ttls else None
        if min(sizes) != self.cache.size:
            self.cache.resize(min(sizes))
        self.persistence = str(persistence)
        if self.gate is not None:
            self.gate.shared.size = self.cache.size
        disk = self.persistence == "disk" and self.durable
        if disk and self.record is None:
            self.record = CacheRecord(self, vhost)
        elif not disk and self.record is not None:
            # no longer on disk: the records go, the entries stay (in memory)
            self.record = None
            self._flush()
            self.cache.drop_positions()
            broker.store.drop_queue(self.key)

    @property
    def key(self) -> str:
        return store_key(self.vhost, self.name)

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["deduplication"] = {
            "cache_size": self.cache.size,
            "cache_entries": len(self.cache),
            "cache_ttl": self.ttl,
            "cache_persistence": self.persistence,
            "duplicates": self.cache.hits,
            # "cluster": one cache for every node (in etcd), cache_entries being what
            # this node knows of it and cluster_entries its last count there
            "cache_scope": "cluster" if self.gate is not None else "node",
        }
        if self.gate is not None:
            out["deduplication"]["cluster_entries"] = self.gate.shared.entries
        return out

    # ------------------------------------------------------------------ bindings: fanout
    def add_binding(self, binding: Binding) -> None:
        self._dests[binding.key] = binding.destination
        self._routes = tuple(self._dests.values())

    def remove_binding(self, binding: Binding) -> None:
        self._dests.pop(binding.key, None)
        self._routes = tuple(self._dests.values())

    # ------------------------------------------------------------------ routing
    def _cluster_gate(self) -> ClusterGate | None:
        """The gate to the cluster's cache (None on a single node)."""
        gate = self.gate
        broker = self.broker
        if gate is None and broker is not None and broker.cluster is not None:
            assert self._vhost is not None
            shared = broker.cluster.dedup_cache(self.vhost, self.name)
            shared.size = self.cache.size
            gate = self.gate = ClusterGate(self, self._vhost, shared)
            broker.publisher.forwarding_queues += 1  # the pipeline forwards to remote ones
        return gate

    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
        if message is self._passing:
            return self._routes  # the gate routes on a value it took in the cluster
        if message is self._last:
            return self._last_dests  # another CC key of the same message
        key = dedup_key(message)
        if key is None:
            return self._routes
        now = now_ms()
        cache = self.cache
        self._last = message
        self._last_key = key
        if cache.seen(key, now):
            cache.hits += 1
            self._last_dests = ()
            if self._settled:
                self._flush()
            return ()
        gate = self._cluster_gate()
        if gate is not None:
            self._last_dests = (gate,)
            return self._last_dests
        ttl = message_ttl(message) or self.ttl
        cache.add(key, now + ttl if ttl else 0, now)
        dests = self._routes
        if self.record is not None:
            if dests:
                dests = (*dests, self.record)  # last: its enqueue follows the queues'
            else:
                self._write_record(message, key)  # unroutable, yet cached (the plugin's)
        self._last_dests = dests
        if self._settled:
            self._flush()
        return dests

    def refused(self, message: Message) -> None:
        """The publisher gets a nack (a queue refused it, or the store did): forget the
        value, so that its retry is routed rather than dropped as a duplicate."""
        key = self._last_key if message is self._last else dedup_key(message)
        if key is not None and self._last_dests:
            self.cache.discard(key)
            self._flush()

    def _recorded(self, message: Message) -> None:
        """CacheRecord.enqueue: the pipeline is done writing ``message``."""
        key = self._last_key if message is self._last else dedup_key(message)
        if key is None:
            return
        if message.position >= 0:
            self.cache.set_position(key, message.position)  # the message's own record
        else:
            self._write_record(message, key)

    def _write_record(self, message: Message, key: Key) -> None:
        broker = self.broker
        assert broker is not None
        stored = stored_message(message)
        record = StoredMessage(stored.exchange, stored.routing_key, stored.properties, b"",
                               stored.published)
        position = broker.store.append_enqueue([self.key], record)
        self.cache.set_position(key, position)
        broker.store.commit(_ignore)

    def _settle(self, position: int) -> None:
        self._settled.append(position)

    def _flush(self) -> None:
        """Settle the records of entries that left (one store call per route)."""
        if self._settled and self.broker is not None:
            self.broker.store.append_settle(self.key, self._settled)
            self._settled = []

    def close(self) -> None:
        broker = self.broker
        if self.gate is not None:
            self.gate.close()
            self.gate = None
            if broker is not None:
                broker.publisher.forwarding_queues -= 1
        cluster = broker.cluster if broker is not None else None
        if cluster is not None and cluster.runs_here(f"dedup\x00{self.vhost}\x00{self.name}"):
            # every node deletes the exchange; one drops its cluster-wide cache
            try:
                task = asyncio.get_running_loop().create_task(
                    cluster.dedup_cache(self.vhost, self.name).drop())
            except RuntimeError:
                log.warning("deduplication exchange '%s': its cluster cache is left in "
                            "etcd (deleted outside the event loop)", self.name)
            else:
                _dropping.add(task)
                task.add_done_callback(_dropping.discard)
        self.record = None
        self.cache.on_leave = None
        self.cache.clear()
        self._settled = []
        self._last = None
        if self.broker is not None and self.durable:
            self.broker.store.drop_queue(self.key)

    # ------------------------------------------------------------------ recovery
    def restore(self, message: Message, position: int, published: int, now: int) -> None:
        """One live record from the log, oldest first."""
        key = dedup_key(message)
        if key is None:
            self._settle(position)
            return
        ttl = message_ttl(message) or self.ttl
        expires = published + ttl if ttl and published else 0
        if expires and expires <= now:
            self._settle(position)
            return
        self.cache.add(key, expires, now, position)


_dropping: set[asyncio.Task[None]] = set()  # cluster caches being dropped


def _ignore(_error: BaseException | None) -> None:
    """A cache record's commit: the publish pipeline reports store failures."""


def recover(broker: Broker, key: str, recovered: RecoveredQueue) -> bool:
    """Rebuild a disk-persisted cache from its store key; False if ``key`` is not one."""
    mine, ex = internal.owner(broker, key, KEY_PREFIX)
    if not mine:
        return False
    store = broker.store
    if not isinstance(ex, DedupExchange) or ex.record is None:
        store.drop_queue(key)  # its exchange is gone, or no longer persists its cache
        return True
    now = now_ms()
    for position, stamp in zip(recovered.positions, recovered.stamps, strict=True):
        stored = store.read(position)
        message = Message(stored.exchange, stored.routing_key, stored.properties, b"")
        ex.restore(message, position, stamp >> 1, now)
    ex._flush()
    log.info("deduplication exchange '%s': %d cache entries recovered", ex.name, len(ex.cache))
    return True


__all__ = ["CacheRecord", "ClusterGate", "DedupExchange", "recover", "store_key"]
