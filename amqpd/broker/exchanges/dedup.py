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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from amqpd.broker.dedup import (
    DedupCache,
    Key,
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
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ declaration
    def validate(self, arguments: dict[str, Any]) -> None:
        validate_exchange_arguments(arguments)

    def attach(self, broker: Broker, vhost: VHost) -> None:
        """After declaration and after every policy change: the effective settings."""
        self.broker = broker
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
        }
        return out

    # ------------------------------------------------------------------ bindings: fanout
    def add_binding(self, binding: Binding) -> None:
        self._dests[binding.key] = binding.destination
        self._routes = tuple(self._dests.values())

    def remove_binding(self, binding: Binding) -> None:
        self._dests.pop(binding.key, None)
        self._routes = tuple(self._dests.values())

    # ------------------------------------------------------------------ routing
    def route(self, message: Message, routing_key: str) -> Iterable[Destination]:
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


__all__ = ["CacheRecord", "DedupExchange", "recover", "store_key"]
