"""Message deduplication, shared by the exchange type and the queue argument.

Compatible with the rabbitmq-message-deduplication plugin: a message is identified by
its ``x-deduplication-header`` header; a message without that header is never checked.
This module owns what both levels share: reading the header from the raw properties
only when it can be there, the argument and policy validation (406 with a clear text),
and :class:`DedupCache`, the bounded cache of seen values.

Why a cache of our own rather than ``functools.lru_cache`` or a dict: the cache must be
bounded by entry count (``x-cache-size``; the oldest entry makes room, as the plugin
drops "unspecified existing entries"), each entry may carry its own expiry (the
per-message ``x-cache-ttl`` header), and an entry may pin a log record (``disk``
persistence) that must be settled when the entry leaves, so eviction has a side effect.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from amqpd.broker.message import Message
from amqpd.broker.policy import register_policy_key
from amqpd.broker.rawprops import value_end
from amqpd.protocol.constants import FLAG_CONTENT_ENCODING, FLAG_CONTENT_TYPE, FLAG_HEADERS_HI
from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.queue_type import QueueType
    from amqpd.server import Broker

HEADER: Final = "x-deduplication-header"
TTL_HEADER: Final = "x-cache-ttl"
_HEADER_NAME: Final = HEADER.encode()
_TTL_NAME: Final = TTL_HEADER.encode()
# the header's name as it sits in the raw property bytes (shortstr: length byte + name):
# a message whose properties lack these bytes cannot carry the header, and is not parsed
_RAW_HEADER: Final = bytes([len(HEADER)]) + _HEADER_NAME
PERSISTENCE: Final = ("memory", "disk")
_SIGNED: Final = {0x62: ">b", 0x73: ">h", 0x49: ">i", 0x6C: ">q"}  # b s I l

Key = bytes  # the header's field value as sent: its type byte, then its encoded value


def _header_field(props: bytes, name: bytes) -> bytes | None:
    """The raw field value (type byte + value) of header ``name``, walking the headers
    table in place: no decode of the other properties, no dict, no string per key."""
    try:
        flags = props[0]
        pos = 2
        if flags & (FLAG_CONTENT_TYPE >> 8):
            pos += 1 + props[pos]
        if flags & (FLAG_CONTENT_ENCODING >> 8):
            pos += 1 + props[pos]
        end = pos + 4 + int.from_bytes(props[pos:pos + 4], "big")
        pos += 4
        while pos < end:
            n = props[pos]
            key = props[pos + 1:pos + 1 + n]
            pos += 1 + n
            value_stop = value_end(props, pos)
            if key == name:
                return props[pos:value_stop]
            pos = value_stop
    except (IndexError, ValueError):
        return None  # a malformed table: the message is not checked
    return None


def dedup_key(message: Message) -> Key | None:
    """The message's ``x-deduplication-header`` value as a cache key, or None without one.

    The key is the value's encoding with its AMQP type byte, so values of different
    types never collide (``1`` and ``"1"`` are two keys) and tables and arrays compare
    by their contents; a void value is no value.
    """
    props = message.properties
    if not (props and props[0] & FLAG_HEADERS_HI and _RAW_HEADER in props):
        return None
    field = _header_field(props, _HEADER_NAME)
    if field is None or field == b"V":
        return None
    return field


def message_ttl(message: Message) -> int | None:
    """The per-message ``x-cache-ttl`` header (ms) when it is a positive integer."""
    props = message.properties
    if b"\x0bx-cache-ttl" not in props:
        return None
    field = _header_field(props, _TTL_NAME)
    fmt = _SIGNED.get(field[0]) if field else None
    if field is None or fmt is None:
        return None
    try:
        value: int = struct.unpack_from(fmt, field, 1)[0]
    except struct.error:
        return None
    return value if value > 0 else None


def now_ms() -> int:
    """Wall-clock milliseconds: entries outlive a restart, so expiry is not monotonic."""
    return int(time.time() * 1000)


# ---------------------------------------------------------------------- validation
def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PreconditionFailed(
            f"invalid argument '{key}': expected an integer greater than 0, got {value!r}")
    return value


def _persistence(key: str, value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if value not in PERSISTENCE:
        raise PreconditionFailed(
            f"invalid argument '{key}': expected 'memory' or 'disk', got {value!r}")
    return str(value)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PreconditionFailed(f"invalid argument '{key}': expected a boolean, got {value!r}")
    return value


def validate_exchange_arguments(arguments: dict[str, Any]) -> None:
    """An ``x-message-deduplication`` exchange's declare arguments (406 when wrong)."""
    if "x-cache-size" not in arguments:
        raise PreconditionFailed(
            "missing argument 'x-cache-size': an x-message-deduplication exchange needs "
            "an integer greater than 0")
    _positive_int("x-cache-size", arguments["x-cache-size"])
    if "x-cache-ttl" in arguments:
        _positive_int("x-cache-ttl", arguments["x-cache-ttl"])
    if "x-cache-persistence" in arguments:
        _persistence("x-cache-persistence", arguments["x-cache-persistence"])


def validate_queue_argument(arguments: dict[str, Any]) -> bool:
    """``x-message-deduplication`` on a queue: whether it is on (406 when not a bool)."""
    value = arguments.get("x-message-deduplication")
    if value is None:
        return False
    return _flag("x-message-deduplication", value)


def _check_size(key: str, value: Any) -> None:
    _positive_int(key, value)


def _check_persistence(key: str, value: Any) -> None:
    _persistence(key, value)


def _check_flag(key: str, value: Any) -> None:
    _flag(key, value)


# the plugin's policy keys are the argument names themselves
register_policy_key("x-cache-size", _check_size)
register_policy_key("x-cache-ttl", _check_size)
register_policy_key("x-cache-persistence", _check_persistence)
register_policy_key("x-message-deduplication", _check_flag)


# ---------------------------------------------------------------------- the cache
class SharedCache(Protocol):
    """An exchange's cache kept for the whole cluster (``ClusterStatus.dedup_cache``;
    amqpd/cluster/dedup_cache.py has the theory). A value is taken (pending) before its
    message is routed and settled (done) once the message is confirmed, so a value is
    never recognised on any node without a confirmed message behind it."""

    size: int
    entries: int | None  # keys the cache held at its last count (None: not counted yet)

    async def take(self, value: bytes) -> int:
        """Non-zero (a revision to settle or release with) when this publish took the
        value; 0 when it is a duplicate. Raises when the cache cannot be asked."""
        ...

    async def settle(self, value: bytes, revision: int, expires: int) -> None: ...

    async def release(self, value: bytes, revision: int) -> None: ...

    async def drop(self) -> None: ...


class DedupCache:
    """Seen header values, at most ``size`` of them, each with an optional expiry.

    Insertion order is eviction order (an OrderedDict: O(1) lookup, insert and evict).
    An entry is its key and one int (its expiry, wall-clock ms, 0: never; a shared small
    int when there is no TTL); the log positions of a disk cache sit in a second dict,
    empty for a memory cache. ``on_leave(position)`` is called for every entry that
    leaves carrying a log position, so the owner can settle the record that made it
    durable.
    """

    def __init__(self, size: int, on_leave: Callable[[int], None] | None = None) -> None:
        self.size = size
        self.on_leave = on_leave
        self._entries: OrderedDict[Key, int] = OrderedDict()  # key -> expires_ms (0: never)
        self.positions: dict[Key, int] = {}  # key -> log position of its record (disk)
        self.hits = 0  # duplicates refused since start (a counter for the metrics)

    def __len__(self) -> int:
        return len(self._entries)

    def _leave(self, key: Key) -> None:
        if self.positions:
            position = self.positions.pop(key, -1)
            if position >= 0 and self.on_leave is not None:
                self.on_leave(position)

    def seen(self, key: Key, now: int) -> bool:
        """Whether ``key`` is cached and unexpired (an expired entry leaves here)."""
        expires = self._entries.get(key)
        if expires is None:
            return False
        if expires and expires <= now:
            del self._entries[key]
            self._leave(key)
            return False
        return True

    def add(self, key: Key, expires: int, now: int, position: int = -1) -> None:
        """Cache ``key`` until ``expires`` (0: until evicted); make room if full."""
        entries = self._entries
        if entries.pop(key, None) is not None:
            self._leave(key)
        self._trim_expired(now)
        while len(entries) >= self.size:
            old, _ = entries.popitem(last=False)
            self._leave(old)
        entries[key] = expires
        if position >= 0:
            self.positions[key] = position

    def _trim_expired(self, now: int) -> None:
        """Drop up to two expired entries from the old end: with one TTL for every
        entry that keeps the cache free of expired ones at no extra cost per message."""
        entries = self._entries
        for _ in range(2):
            if not entries:
                return
            key = next(iter(entries))
            expires = entries[key]
            if not expires or expires > now:
                return
            del entries[key]
            self._leave(key)

    def set_position(self, key: Key, position: int) -> None:
        """The log record that made ``key`` durable (written after :meth:`add`)."""
        if key in self._entries:
            self.positions[key] = position

    def discard(self, key: Key) -> None:
        """Forget ``key`` (its message was refused after all)."""
        if self._entries.pop(key, None) is not None:
            self._leave(key)

    def drop_positions(self) -> None:
        """The records are gone (persistence switched to memory): keep the entries."""
        self.positions.clear()

    def resize(self, size: int) -> None:
        """A policy changed the bound: evict the oldest down to it."""
        self.size = size
        while len(self._entries) > size:
            old, _ = self._entries.popitem(last=False)
            self._leave(old)

    def clear(self) -> None:
        """Forget everything (the exchange is deleted), settling every record."""
        keys = list(self._entries)
        self._entries.clear()
        for key in keys:
            self._leave(key)


class QueueDedup:
    """A queue's ``x-message-deduplication``: the header values of the messages in it.

    A value enters when its message is admitted (:meth:`admit`, asked by the publish
    pipeline before the message is written or enqueued, so a refused one costs the log
    nothing) or recovered (:meth:`restore`: the cache is rebuilt from the queue's own
    messages, so it follows the queue's contents through a restart or a takeover), and
    leaves with the message (:meth:`release`: ack, no-ack delivery, reject, expiry,
    dead-lettering, overflow; :meth:`clear`: purge and delete). A requeued message never
    left. Bounded by the queue's length, not by a size of its own (as in the plugin).
    """

    def __init__(self) -> None:
        self.keys: dict[Key, int] = {}  # value -> messages in the queue carrying it
        self.hits = 0

    def admit(self, message: Message) -> bool:
        key = dedup_key(message)
        if key is None:
            return True
        if key in self.keys:
            self.hits += 1
            return False
        self.keys[key] = 1
        return True

    def restore(self, message: Message) -> None:
        key = dedup_key(message)
        if key is not None:
            self.keys[key] = self.keys.get(key, 0) + 1

    def release(self, message: Message) -> None:
        key = dedup_key(message)
        if key is None:
            return
        n = self.keys.get(key, 0)
        if n > 1:
            self.keys[key] = n - 1
        else:
            self.keys.pop(key, None)

    def clear(self) -> None:
        self.keys.clear()

    def info(self) -> dict[str, Any]:
        return {"cache_size": None, "cache_entries": len(self.keys), "duplicates": self.hits}


def admitted(queues: list[QueueType], message: Message) -> list[QueueType]:
    """The route without the deduplicating queues that already hold this value."""
    out = queues
    for q in queues:
        dedup = q.dedup
        if dedup is not None and not dedup.admit(message):
            if out is queues:
                out = list(queues)
            out.remove(q)
    return out


def _dedup_wanted(queue: QueueType) -> bool:
    value = queue.arguments.get("x-message-deduplication")
    if value is None and queue.policy is not None:
        value = queue.policy.get("x-message-deduplication")
    return value is True


def configure_queue(broker: Broker, queue: QueueType) -> None:
    """On declare and on every policy change: switch the queue's deduplication on or off
    (argument first, then policy), keeping the publish pipeline's count of such queues.

    Switched on for a queue that already holds messages, it knows only the values of
    messages admitted from then on (and, after a restart, of all it holds).

    A queue led by another node (``QueueType.forwards_publish``) keeps no cache here: its leader
    checks every message, wherever it was published (``remote_queue.enqueue_here``). A
    cache here would hold the values of messages this node forwarded, including those
    the leader never took (a nack when its link went), and drop their retries as
    duplicates while acking them: confirmed messages lost."""
    wanted = _dedup_wanted(queue) and not queue.forwards_publish
    if wanted and queue.dedup is None:
        queue.dedup = QueueDedup()
        broker.publisher.dedup_queues += 1
        queue.on_removed.append(_forget)
    elif not wanted and queue.dedup is not None:
        queue.dedup = None
        broker.publisher.dedup_queues -= 1
        queue.on_removed.remove(_forget)


def _forget(queue: QueueType) -> None:
    """The queue was deleted: one deduplicating queue fewer."""
    if queue.dedup is not None:
        queue.dedup = None
        queue.vhost.broker.publisher.dedup_queues -= 1


__all__ = [
    "HEADER", "PERSISTENCE", "TTL_HEADER", "DedupCache", "QueueDedup", "SharedCache", "admitted",
    "configure_queue", "dedup_key", "message_ttl", "now_ms", "validate_exchange_arguments",
    "validate_queue_argument",
]
