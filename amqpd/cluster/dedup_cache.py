"""A deduplication exchange's cache, shared by every node of a cluster (issue 32).

On one node (and in a warren) an ``x-message-deduplication`` exchange keeps its cache in
the process, derived from the node's log. In a cluster each node would keep its own, and
a retry that reaches another node than the original (HAProxy after a kill -9) would be
routed again. So in a cluster the cache is one set of etcd keys per exchange,
``<root>/dedup/<vhost>/<exchange>/<value>``, and the check-and-insert is one etcd
transaction: etcd decides, linearisably and durably on a majority of its members, which
publish took a value first; no amqpd node's kill -9 loses that decision.

A value is taken in two steps, so that it is never "seen" without its message and never
routed twice while its first message may still become durable:

1. :meth:`SharedDedupCache.take`: ``create_revision == 0`` -> put ``p:<node>`` (pending)
   under this node's membership lease. A value already there is a duplicate when done
   and unexpired, taken again (guarded by its revision) when expired, and waited for
   while pending (its node is routing the first copy), until it is done or gone.
2. The message is routed; once its destinations confirmed it, :meth:`settle` puts
   ``d:<expiry ms>`` (done; guarded by the pending entry's revision), and only then is
   the publisher's confirm sent. A refused message :meth:`release`\\ s the value.

A pending value whose node died goes with that node's lease (``lease_ttl``), and a retry
is then routed: its first copy may or may not have become durable before the node died
(the window between the destination's commit and step 2). docs/dedup.md says what closes
that window (queue-level deduplication on the destination).

Done entries with a TTL are attached to a lease that outlives their expiry by at most
:data:`BUCKET_S` (one lease per bucket and exchange), so etcd drops them; an expired one
still there is treated as absent. ``x-cache-size`` bounds the keys: every
``size // 10`` settles (at most 1,000) the oldest keys beyond the size are deleted.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable
from typing import Final

from amqpd.coord.etcd import Compare, Delete, EtcdClient, EtcdError, Get, Put

log = logging.getLogger("amqpd.dedup")

BUCKET_S: Final = 10  # done entries with a TTL share one etcd lease per 10 s of expiry
PARALLEL: Final = 8  # etcd requests in flight per node for all dedup exchanges
POLL_S: Final = 0.1  # how often a pending value of another publish is looked at again
_DONE: Final = b"d:"
_PENDING: Final = b"p:"


class PendingTooLong(EtcdError):
    """A value stayed pending (its first copy neither confirmed nor released) for longer
    than a node's lease: the publisher gets a nack and retries."""


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (ours end in '/')."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _done_value(expires: int) -> bytes:
    return _DONE + b"%016d" % expires


class SharedDedupCache:
    """One exchange's cluster-wide cache (the broker side's
    :class:`amqpd.broker.dedup.SharedCache` protocol)."""

    def __init__(self, registry: DedupCaches, vhost: str, exchange: str) -> None:
        self.registry = registry
        name = base64.urlsafe_b64encode(f"{vhost}\x00{exchange}".encode()).decode()
        self.prefix = f"{registry.root}/dedup/{name}/".encode()
        self.size = 1
        self._settled = 0
        self._trimming = False
        self.entries: int | None = None  # the last count of keys in etcd (None: not yet)

    def _key(self, value: bytes) -> bytes:
        return self.prefix + base64.urlsafe_b64encode(value)

    async def take(self, value: bytes) -> int:
        """The value's pending revision when this publish took it; 0 for a duplicate."""
        reg = self.registry
        key = self._key(value)
        deadline = time.monotonic() + reg.pending_wait
        while True:
            lease = reg.lease()
            if not lease:
                raise EtcdError("this node has no cluster lease (not joined)")
            pending = Put(key, _PENDING + reg.node.encode(), lease)
            async with reg.slots:
                result = await reg.etcd.txn([Compare("create", key, "==", 0)], [pending],
                                            [Get(key)])
            if result.succeeded:
                return result.revision
            kvs = result.responses[0] if result.responses else []
            if not kvs:
                continue  # gone between the compare and the read: try again
            kv = kvs[0]
            if kv.value.startswith(_DONE):
                expires = int(kv.value[len(_DONE):] or b"0")
                if not expires or expires > _now_ms():
                    return 0
                async with reg.slots:  # expired, not yet dropped: take it over
                    result = await reg.etcd.txn([Compare("mod", key, "==", kv.mod_revision)],
                                                [pending])
                if result.succeeded:
                    return result.revision
                continue
            if time.monotonic() > deadline:
                raise PendingTooLong(f"deduplication value pending on "
                                     f"{kv.value[len(_PENDING):].decode(errors='replace')}")
            await asyncio.sleep(POLL_S)

    async def settle(self, value: bytes, revision: int, expires: int) -> None:
        """The message that took ``value`` is confirmed: the value is done."""
        reg = self.registry
        key = self._key(value)
        lease = await reg.expiry_lease(expires) if expires else 0
        async with reg.slots:
            result = await reg.etcd.txn([Compare("mod", key, "==", revision)],
                                        [Put(key, _done_value(expires), lease)])
        if not result.succeeded:
            log.warning("deduplication value %r changed while its message was routed", value)
        self._settled += 1
        if self._settled >= max(1, min(self.size // 10, 1000)) and not self._trimming:
            self._settled = 0
            self._trimming = True
            try:
                await self._trim()
            finally:
                self._trimming = False

    async def release(self, value: bytes, revision: int) -> None:
        """The message that took ``value`` was refused: free it for the retry."""
        reg = self.registry
        key = self._key(value)
        async with reg.slots:
            await reg.etcd.txn([Compare("mod", key, "==", revision)], [Delete(key)])

    async def _trim(self) -> None:
        """Delete the oldest keys beyond ``size`` (the memory bound, in etcd)."""
        reg = self.registry
        end = base64.b64encode(_prefix_end(self.prefix)).decode()
        start = base64.b64encode(self.prefix).decode()
        async with reg.slots:
            answer = await reg.etcd.call("kv/range", {"key": start, "range_end": end,
                                                      "count_only": True})
        count = int(answer.get("count", 0))
        self.entries = count
        excess = count - self.size
        if excess <= 0:
            return
        async with reg.slots:
            answer = await reg.etcd.call("kv/range", {
                "key": start, "range_end": end, "keys_only": True, "limit": str(excess),
                "sort_order": "ASCEND", "sort_target": "CREATE"})
        keys = [base64.b64decode(kv["key"]) for kv in answer.get("kvs") or []]
        for i in range(0, len(keys), 100):  # etcd's default limit: 128 ops per txn
            async with reg.slots:
                await reg.etcd.txn([], [Delete(k) for k in keys[i:i + 100]])
        self.entries = count - len(keys)

    async def drop(self) -> None:
        """The exchange was deleted: its cache goes (a failure is logged: the keys
        then stay until they expire, or until a trim of an exchange of that name)."""
        try:
            async with self.registry.slots:
                await self.registry.etcd.call("kv/deleterange", {
                    "key": base64.b64encode(self.prefix).decode(),
                    "range_end": base64.b64encode(_prefix_end(self.prefix)).decode()})
        except EtcdError as exc:
            log.warning("deduplication cache %r left in etcd: %s", self.prefix, exc)


class DedupCaches:
    """Every dedup exchange's shared cache on this node (``Cluster.dedup_cache``)."""

    def __init__(self, endpoints: list[str], root: str, node: str, lease: Callable[[], int],
                 lease_ttl: float) -> None:
        # a client of its own: dedup traffic must not delay the membership's renewals
        self.etcd = EtcdClient(endpoints, timeout=2.0)
        self.root = root
        self.node = node
        self.lease = lease
        # a pending value of a live node is waited for at most this long (two leases:
        # a dead node's pending values are gone by then)
        self.pending_wait = 2 * lease_ttl + 2.0
        self.slots = asyncio.Semaphore(PARALLEL)
        self.caches: dict[tuple[str, str], SharedDedupCache] = {}
        self._leases: dict[int, int] = {}  # expiry bucket -> etcd lease id

    def get(self, vhost: str, exchange: str) -> SharedDedupCache:
        cache = self.caches.get((vhost, exchange))
        if cache is None:
            cache = self.caches[(vhost, exchange)] = SharedDedupCache(self, vhost, exchange)
        return cache

    def forget(self, vhost: str, exchange: str) -> None:
        self.caches.pop((vhost, exchange), None)

    async def expiry_lease(self, expires: int) -> int:
        """A lease that ends within BUCKET_S after ``expires`` (wall-clock ms)."""
        bucket = expires // (BUCKET_S * 1000) + 1
        lease = self._leases.get(bucket)
        if lease is None:
            ttl = max(bucket * BUCKET_S - int(time.time()) + 1, 2)
            async with self.slots:
                lease = (await self.etcd.grant(ttl)).id
            self._leases[bucket] = lease
            now_bucket = int(time.time()) // BUCKET_S
            for old in [b for b in self._leases if b < now_bucket]:
                del self._leases[old]  # expired in etcd by now
        return lease

    async def close(self) -> None:
        await self.etcd.close()


__all__ = ["DedupCaches", "PendingTooLong", "SharedDedupCache"]
