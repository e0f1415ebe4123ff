"""One set of definitions for the whole cluster, ordered by etcd.

Theory of operation. The unit is the :class:`~amqpd.broker.journal.DefinitionJournal`'s
entry: ``(kind, key, JSON body)`` for a vhost, user, permission, topic permission,
policy, parameter, global parameter, exchange, durable queue or binding; an empty body
deletes. Each lives in etcd at::

    {etcd_prefix}/{cluster}/defs/{kind name}/{key parts, each percent-encoded, "/"-joined}

with the body as its value (a queue's body also names its leader: ``"node"``).

* **Local change -> etcd.** A change made on this node (AMQP, HTTP, definitions import,
  a plugin) is applied here first, as on a single node, recorded in the local log by the
  journal, and handed to :meth:`DefinitionMirror.recorded`. The push task writes the
  pending changes to etcd in order, a batch per transaction (a queue delete with its
  bindings lands in one revision). Creating a queue or an exchange that etcd does not
  hold yet is a transaction guarded by ``create_revision == 0``: when two nodes declare
  the same name at once, the first one wins and the other applies the winner's version.
  The reply to the client (declare-ok, an HTTP response) waits until etcd holds the
  change (:meth:`after_mirrored`).
* **etcd -> every node, in revision order.** Each node watches the prefix and applies
  each event through :meth:`amqpd.broker.api.BrokerAPI.apply_definition` (which records
  it locally too, so a restart without etcd still has it). A node that starts, or whose
  watch broke, reads the whole prefix at a revision, applies the difference between it
  and what it holds (etcd wins: what etcd no longer has was deleted meanwhile), then
  watches from the next revision: nothing is missed and nothing applied twice.
* **Its own echo.** Every entry's last applied revision is kept; events at or below it
  are ignored. While a key has changes of this node not yet acknowledged by etcd, events
  for it are held back: when the push lands at revision R, a held event newer than R
  (another node wrote after us) is applied, an older one (already overwritten by ours)
  is dropped. So every node ends at etcd's last value for every key.
* **Ahead of the watch.** :meth:`refresh` reads one entry's record from etcd and
  applies it at once: a declare of a queue this node sees led elsewhere goes through it
  first, so a delete another node has already answered is never missed.
* **A fresh cluster.** The first node to find the prefix empty claims ``seeded`` (a
  guarded create) and pushes everything it holds; every later node takes etcd's.

Queues: the catalogue (``ClusterView.catalogue``, ``(vhost, queue) -> leader``) holds
every durable queue of the cluster. A node creates a local queue object only for a queue
it leads; for the others it calls the inter-node links' hook
``view.queues.materialise(vhost, definition, leader)`` (a
:class:`~amqpd.cluster.cluster_queues.ClusterQueues`) when the view has links, else it
keeps just the catalogue entry (which exports and ``queue_leader`` read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import DEFINITION_KINDS
from amqpd.cluster.periodic import cancel_all
from amqpd.cluster.visibility import DEFINITIONS, Applied
from amqpd.coord.etcd import (
    Compare,
    Delete,
    EtcdClient,
    EtcdError,
    EtcdRequestError,
    EtcdUnavailable,
    Get,
    Op,
    Put,
    WatchCompacted,
)

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.cluster.view import ClusterView

log = logging.getLogger("amqpd.cluster.definitions")

Ident = tuple[int, str]
OnDone = Callable[[BaseException | None], None]
KIND_BY_NAME = {name: kind for kind, name in DEFINITION_KINDS.items()}
KIND_QUEUE = KIND_BY_NAME["queue"]
KIND_EXCHANGE = KIND_BY_NAME["exchange"]
KIND_BINDING = KIND_BY_NAME["binding"]
# creates go parents first (a vhost before its exchanges, queues before bindings),
# deletes children first
APPLY_ORDER = ["vhost", "user", "permission", "topic_permission", "global_parameter",
               "parameter", "policy", "exchange", "queue", "binding"]
RANK = {KIND_BY_NAME[name]: i for i, name in enumerate(APPLY_ORDER)}
BATCH = 64  # operations per etcd transaction (etcd allows 128 by default)
# seconds a reply waits for etcd to take a definition change, by default
# (cluster.definition_timeout)
MIRROR_TIMEOUT = 10.0


def _norm(kind: int, body: bytes | None) -> Any:
    """A body as a comparable value (a queue's leader is catalogue, not definition)."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return body
    if kind == KIND_QUEUE and isinstance(value, dict):
        value.pop("node", None)
    return value


class DefinitionMirror:
    watch = DEFINITIONS  # its kind in a SYNC (amqpd.cluster.visibility)

    def __init__(self, view: ClusterView, api: BrokerAPI, etcd: EtcdClient,
                 root: str, timeout: float | None = None) -> None:
        self.view = view
        self.timeout = MIRROR_TIMEOUT if timeout is None else timeout
        self.api = api
        self.etcd = etcd
        self.prefix = root + "/defs/"
        self.seed_key = root + "/seeded"
        self.state: dict[Ident, bytes] = {}  # the cluster's entries as this node knows them
        self.known_rev: dict[Ident, int] = {}
        self.pending: deque[tuple[int, int, str, bytes]] = deque()  # (seq, kind, key, body)
        self.inflight: Counter[Ident] = Counter()
        self.deferred: dict[Ident, tuple[int, bytes | None]] = {}
        self.enqueued = 0
        self.pushed = 0
        self.waiters: deque[tuple[int, OnDone]] = deque()
        self.applying = False
        self.synced = False
        self.revision = 0  # the last etcd revision applied from the watch or a read
        # the same, told to the other nodes' SYNC (amqpd.cluster.visibility)
        self.applied = Applied()
        # seconds a reply waits at most for every linked node to apply the change
        # (cluster.visible_wait; 0: it waits for etcd only)
        self.visible_wait = 0.0
        self._barriers: set[asyncio.Task[None]] = set()
        self.applied_remote = 0
        self.failed_remote = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # after_gone's callbacks, by the entry they wait to see deleted
        self.gone_waiters: dict[Ident, list[OnDone]] = {}
        # called with (vhost, queue) when this node records a durable queue it leads,
        # before the declare is answered (amqpd.cluster.mirror starts the mirrors then;
        # amqpd.cluster.quorum_group returns the task establishing the queue's group,
        # and the declare is answered only once that is done: see after_mirrored)
        self.queue_listeners: list[Callable[[str, str], Awaitable[None] | None]] = []
        # (enqueued number, task) of those listeners' work not done yet
        self.gates: list[tuple[int, asyncio.Future[None]]] = []

    # ------------------------------------------------------------------ keys
    def etcd_key(self, kind: int, key: str) -> str:
        parts = "/".join(urllib.parse.quote(p, safe="") for p in key.split("\x00"))
        return f"{self.prefix}{DEFINITION_KINDS[kind]}/{parts}"

    def parse_key(self, raw: bytes) -> Ident | None:
        text = raw.decode("utf-8", "replace")
        if not text.startswith(self.prefix):
            return None
        kind_name, sep, rest = text[len(self.prefix):].partition("/")
        kind = KIND_BY_NAME.get(kind_name)
        if kind is None or not sep:
            return None
        return kind, "\x00".join(urllib.parse.unquote(p) for p in rest.split("/"))

    def local_entries(self) -> dict[Ident, bytes]:
        """What this node holds of the entries this mirror keeps (the durable ones)."""
        return self.api.definition_entries()

    # ------------------------------------------------------------------ local -> etcd
    def recorded(self, kind: int, key: str, body: bytes) -> None:
        """The journal's hook: a change made on this node; etcd gets it in order."""
        if self.applying:
            return  # a change that came from etcd: it is there already
        ident = (kind, key)
        body = self._outgoing(kind, key, body)
        self.enqueued += 1
        self.pending.append((self.enqueued, kind, key, body))
        self.inflight[ident] += 1
        if body:
            self.state[ident] = body
        else:
            self.state.pop(ident, None)
        self._wake.set()
        if kind == KIND_QUEUE and body and self.queue_listeners:
            vhost, _, name = key.partition("\x00")
            if self.view.catalogue.get((vhost, name)) == self.view.node_name:
                for listener in self.queue_listeners:
                    work = listener(vhost, name)
                    if work is not None:
                        self.gates.append((self.enqueued, asyncio.ensure_future(work)))

    def _outgoing(self, kind: int, key: str, body: bytes) -> bytes:
        """The entry as etcd gets it: a queue's names its leader (this node, unless the
        catalogue says another node leads it), and the catalogue follows."""
        if kind != KIND_QUEUE:
            return body
        vhost, _, name = key.partition("\x00")
        if not body:
            self.view.catalogue.pop((vhost, name), None)
            return body
        leader = self.view.catalogue.get((vhost, name)) or self.view.node_name
        item = json.loads(body)
        item["node"] = leader
        self.view.catalogue[(vhost, name)] = leader
        return json.dumps(item, separators=(",", ":"), default=str).encode()

    def after_mirrored(self, callback: OnDone) -> OnDone:
        """``callback`` delayed until etcd holds every change enqueued so far, or
        called with :class:`EtcdUnavailable` after ``timeout`` seconds (etcd out of
        reach: with ``partition_handling = ignore`` the node goes on serving, and a
        client must not wait for ever; the change stays queued and reaches etcd when
        it is back)."""
        target = self.enqueued
        self.gates = [g for g in self.gates if not g[1].done()]
        gates = [task for number, task in self.gates if number <= target]
        if gates:
            callback = self._after_gates(gates, callback)

        def done(error: BaseException | None) -> None:
            if error is not None or target <= self.pushed:
                callback(error)
                return
            self.waiters.append((target, self._bounded(callback, lambda: (
                f"etcd has not taken the change within {self.timeout:g} s "
                f"({len(self.pending)} pending; it is applied here and goes to etcd "
                "when etcd is reachable)"))))

        return done

    def _after_gates(self, gates: list[asyncio.Future[None]], callback: OnDone) -> OnDone:
        """``callback`` delayed until the listeners' work for the changes it waits on is
        done (a quorum queue's group established): a declare-ok must not come before
        the queue can replicate its first publish. An error of that work, or
        ``timeout`` seconds without its end, is the callback's error."""

        def then(error: BaseException | None) -> None:
            if error is not None:
                callback(error)
                return
            pending = [g for g in gates if not g.done()]
            failed = next((g.exception() for g in gates
                           if g.done() and not g.cancelled() and g.exception()), None)
            if not pending:
                callback(failed)
                return
            bounded = self._bounded(callback, lambda: (
                f"the queue's replica group was not set up within {self.timeout:g} s"))
            left = [len(pending)]

            def one_done(task: asyncio.Future[None]) -> None:
                left[0] -= 1
                exc = None if task.cancelled() else task.exception()
                if exc is not None:
                    bounded(exc)
                elif left[0] == 0:
                    bounded(None)

            for task in pending:
                task.add_done_callback(one_done)

        return then

    def after_gone(self, kind: int, key: str, callback: OnDone) -> None:
        """Call ``callback(None)`` once this node has applied etcd's delete of the
        entry, or with :class:`EtcdUnavailable` after ``timeout`` seconds.

        A queue led by another node is deleted by its leader, which writes the delete
        to etcd; the deleting node's delete-ok waits for it here, so a declare the
        client makes next on any node (refreshed through :meth:`refresh`) finds it
        deleted, and the leader's delete cannot land after a new declare (issue 28)."""
        ident = (kind, key)
        if ident not in self.state:
            callback(None)
            return
        self.gone_waiters.setdefault(ident, []).append(self._bounded(callback, lambda: (
            f"the delete has not reached etcd within {self.timeout:g} s")))

    def _bounded(self, callback: OnDone, why: Callable[[], str]) -> OnDone:
        """``callback`` made to run once: when called, or with
        :class:`EtcdUnavailable` (``why()``) after ``timeout`` seconds."""
        called = [False]

        def once(err: BaseException | None) -> None:
            if not called[0]:
                called[0] = True
                timer.cancel()
                callback(err)

        timer = asyncio.get_running_loop().call_later(
            self.timeout, lambda: once(EtcdUnavailable(why())))
        return once

    def _take_batch(self) -> list[tuple[int, int, str, bytes]]:
        batch: list[tuple[int, int, str, bytes]] = []
        seen: set[Ident] = set()
        for item in self.pending:
            _seq, kind, key, body = item
            ident = (kind, key)
            if ident in seen or len(batch) >= BATCH:
                break  # etcd refuses a key twice in one transaction
            if self._is_create(kind, key, body):
                if not batch:
                    batch.append(item)  # a guarded create travels alone
                break
            seen.add(ident)
            batch.append(item)
        return batch

    def _is_create(self, kind: int, key: str, body: bytes) -> bool:
        return bool(body) and kind in (KIND_QUEUE, KIND_EXCHANGE) \
            and self.known_rev.get((kind, key), 0) == 0

    async def _push_loop(self) -> None:
        backoff = 0.1
        while True:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._take_batch()
            _seq, kind, key, body = batch[0]
            create = len(batch) == 1 and self._is_create(kind, key, body)
            ops: list[Op] = [Put(self.etcd_key(k, ky), b) if b else Delete(self.etcd_key(k, ky))
                             for _s, k, ky, b in batch]
            try:
                if create:
                    ekey = self.etcd_key(kind, key)
                    result = await self.etcd.txn([Compare("create", ekey, "==", 0)], ops,
                                                 [Get(ekey)])
                else:
                    result = await self.etcd.txn([], ops)
            except EtcdUnavailable as exc:
                log.warning("cluster: definitions not yet in etcd (%d pending): %s",
                            len(self.pending), exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except EtcdRequestError as exc:
                # etcd refused the request itself (not a network fault): retrying the
                # same bytes cannot help. Drop it loudly; a resync restores agreement.
                log.error("cluster: etcd refused definition changes %s: %s",
                          [ky.replace("\x00", "/") for _s, _k, ky, _b in batch], exc)
                result = None
            backoff = 0.1
            for _ in batch:
                self.pending.popleft()
            for _s, k, ky, _b in batch:
                ident = (k, ky)
                self.inflight[ident] -= 1
                if result is not None and result.succeeded:
                    self.known_rev[ident] = max(self.known_rev.get(ident, 0), result.revision)
            if result is not None and not result.succeeded:
                # another node created it first: its version is the cluster's
                existing = result.responses[0][0] if result.responses and \
                    result.responses[0] else None
                log.warning("cluster: %s %r was created on another node first; taking "
                            "its definition", DEFINITION_KINDS[kind], key.replace("\x00", "/"))
                if existing is not None:
                    self._apply_remote((kind, key), existing.value, existing.mod_revision)
            for _s, k, ky, _b in batch:
                self._release_deferred((k, ky))
            queues = self.view.queues
            if result is not None and self.visible_wait > 0 and queues is not None:
                # answered once every linked node applied it (amqpd.cluster.visibility)
                task = asyncio.get_running_loop().create_task(self._visible(
                    queues.barrier.wait(self.watch, result.revision, self.visible_wait),
                    batch[-1][0]))
                self._barriers.add(task)
                task.add_done_callback(self._barriers.discard)
            else:
                self.pushed = batch[-1][0]
                self._fire_waiters()
            if result is None:
                self._wake.set()

    async def _visible(self, wait: Awaitable[bool], upto: int) -> None:
        if not await wait:
            log.warning("cluster: a definition change not applied by every linked node "
                        "within %g s; answering all the same", self.visible_wait)
        self.pushed = max(self.pushed, upto)
        self._fire_waiters()

    def _fire_waiters(self) -> None:
        while self.waiters and self.waiters[0][0] <= self.pushed:
            _target, callback = self.waiters.popleft()
            try:
                callback(None)
            except Exception:
                log.exception("cluster: a definition waiter failed")

    def _release_deferred(self, ident: Ident) -> None:
        if self.inflight[ident] > 0:
            return
        del self.inflight[ident]
        held = self.deferred.pop(ident, None)
        if held is not None and held[0] > self.known_rev.get(ident, 0):
            self._apply_remote(ident, held[1], held[0])

    # ------------------------------------------------------------------ etcd -> local
    async def initial_sync(self) -> None:
        """Read the prefix once and bring this node in line (or seed a fresh cluster)."""
        for _ in range(3):
            revision, kvs = await self.etcd.range_prefix(self.prefix)
            seeded = await self.etcd.get(self.seed_key) if not kvs else None
            if kvs or seeded is not None:
                # (seeded and empty: the cluster holds no definitions, really)
                self._resync(revision, kvs, first=not self.synced)
                self.synced = True
                return
            local = sorted(self.local_entries().items(),
                           key=lambda e: RANK[e[0][0]])
            # the claim carries the first entries, so that "seeded" never means "empty
            # for now"; the rest (a big node) follows in order through the push task
            first = [(ident, self._outgoing(ident[0], ident[1], body))
                     for ident, body in local[:BATCH]]
            claim = await self.etcd.txn(
                [Compare("create", self.seed_key, "==", 0)],
                [Put(self.seed_key, self.view.node_name),
                 *(Put(self.etcd_key(*ident), body) for ident, body in first)])
            if claim.succeeded:
                log.info("cluster: etcd holds no definitions; seeding it with this node's "
                         "%d", len(local))
                for ident, body in first:
                    self.state[ident] = body
                    self.known_rev[ident] = claim.revision
                for (kind, key), body in local[BATCH:]:
                    self.recorded(kind, key, body)
                self.revision = claim.revision
                self.applied.advance(self.revision)
                self.synced = True
                return
            await asyncio.sleep(0.2)  # another node is seeding right now: read again
        raise EtcdUnavailable("cluster: etcd's definitions stayed empty while claimed")

    def _resync(self, revision: int, kvs: list[Any], first: bool) -> None:
        remote: dict[Ident, tuple[bytes, int]] = {}
        for kv in kvs:
            ident = self.parse_key(kv.key)
            if ident is not None:
                remote[ident] = (kv.value, kv.mod_revision)
        if first:
            # what this node holds from its own log (or its defaults)
            for ident, body in self.local_entries().items():
                self.state.setdefault(ident, body)
        puts = sorted(remote.items(), key=lambda e: RANK[e[0][0]])
        for ident, (value, rev) in puts:
            if rev < self.known_rev.get(ident, 0):
                continue  # this node applied or wrote a newer one while the read ran
            if self.inflight[ident] > 0:
                self.deferred[ident] = (rev, value)
            else:
                self._apply_remote(ident, value, rev)
        gone = [ident for ident in self.state if ident not in remote
                and self.inflight[ident] == 0 and self.known_rev.get(ident, 0) <= revision]
        for ident in sorted(gone, key=lambda i: -RANK[i[0]]):
            self._apply_remote(ident, None, revision)
        self.revision = max(self.revision, revision)
        self.applied.advance(self.revision)
        log.info("cluster: definitions in line with etcd at revision %d (%d entries)",
                 revision, len(remote))

    def _event(self, ident: Ident, value: bytes | None, rev: int) -> None:
        if rev <= self.known_rev.get(ident, 0):
            return
        if self.inflight[ident] > 0:
            held = self.deferred.get(ident)
            if held is None or held[0] < rev:
                self.deferred[ident] = (rev, value)
            return
        self._apply_remote(ident, value, rev)

    def _apply_remote(self, ident: Ident, value: bytes | None, rev: int) -> None:
        kind, key = ident
        self.known_rev[ident] = max(self.known_rev.get(ident, 0), rev)
        old = self.state.get(ident)
        if value:
            self.state[ident] = value
        else:
            self.state.pop(ident, None)
            for waiter in self.gone_waiters.pop(ident, ()):
                waiter(None)
        local_copy = True
        if kind == KIND_QUEUE:
            vhost, _, name = key.partition("\x00")
            leader = None
            if value:
                item = json.loads(value)
                leader = str(item.get("node") or "") or None
                if leader is not None:
                    self.view.catalogue[(vhost, name)] = leader
            else:
                self.view.catalogue.pop((vhost, name), None)
            if leader is not None and leader != self.view.node_name:
                local_copy = False
                self._materialise(vhost, item, leader)
        if not local_copy:
            return
        if _norm(kind, old) == _norm(kind, value) and self._holds(ident, value):
            return
        self.applying = True
        try:
            self.api.apply_definition(kind, key, value or None)
            self.applied_remote += 1
        except Exception as exc:  # one bad entry must not stop the others
            self.failed_remote += 1
            log.error("cluster: cannot apply %s %r from etcd: %s", DEFINITION_KINDS[kind],
                      key.replace("\x00", "/"), exc)
        finally:
            self.applying = False

    def _holds(self, ident: Ident, value: bytes | None) -> bool:
        """Does the broker hold this entry already (state can run ahead of the broker
        on the first sync, where it was filled from the broker itself)?"""
        kind, key = ident
        if kind in (KIND_QUEUE, KIND_EXCHANGE):
            vhost, _, name = key.partition("\x00")
            found = (self.api.find_queue(vhost, name) if kind == KIND_QUEUE
                     else self.api.find_exchange(vhost, name))
            return (found is not None) == bool(value)
        return True

    def _materialise(self, vhost: str, item: dict[str, Any], leader: str) -> None:
        """A queue led by another node: the inter-node links stand for it, if present."""
        queues = self.view.queues
        if queues is None:
            return  # catalogue only (no inter-node links on this view)
        try:
            queues.materialise(vhost, item, leader)
        except Exception as exc:
            log.error("cluster: queue %r in vhost %r led by %s not materialised: %s",
                      item.get("name"), vhost, leader, exc)

    async def read_all(self) -> None:
        """Read the whole prefix now and apply the difference, ahead of the watch
        (amqpd.cluster.leadership confirms a node's leadership so)."""
        revision, kvs = await self.etcd.range_prefix(self.prefix)
        self._resync(revision, kvs, first=False)

    async def refresh(self, kind: int, key: str) -> None:
        """Bring one entry in line with etcd's record now, ahead of the watch.

        A declare on this node of a queue another node has just deleted (its delete-ok
        means etcd holds the delete) must not act on the stale copy the watch has not
        removed yet: it answered ``404 home node ... is down``, or declare-ok for a
        queue the delete then removed everywhere (issue 28). etcd's range is
        linearizable, so what it returns is at least as new as any reply a client
        got; an entry this node is still pushing is left to the push task."""
        ident = (kind, key)
        ekey = self.etcd_key(kind, key)
        revision, kvs = await self.etcd.range_prefix(ekey)
        if self.inflight[ident] > 0:
            return
        found = next((kv for kv in kvs if kv.key == ekey.encode()), None)
        if found is not None:
            self._event(ident, found.value, found.mod_revision)
        elif ident in self.state and self.known_rev.get(ident, 0) < revision:
            self._event(ident, None, revision)

    async def _watch_loop(self) -> None:
        while True:
            try:
                async for events in self.etcd.watch_prefix(self.prefix, self.revision + 1):
                    for ev in events:
                        ident = self.parse_key(ev.kv.key)
                        if ident is not None:
                            self._event(ident, None if ev.deleted else ev.kv.value,
                                        ev.kv.mod_revision)
                        self.revision = max(self.revision, ev.kv.mod_revision)
                    self.applied.advance(self.revision)
            except asyncio.CancelledError:
                raise
            except (EtcdError, ValueError) as exc:
                if not isinstance(exc, WatchCompacted):
                    log.info("cluster: definitions watch ended (%s); reading etcd again",
                             exc)
            await asyncio.sleep(0.2)
            # whatever happened while not watching: read it all again, apply the difference
            with contextlib.suppress(EtcdError):
                revision, kvs = await self.etcd.range_prefix(self.prefix)
                self._resync(revision, kvs, first=False)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks = [self._run(self._push_loop, "cluster-defs-push"),
                       self._run(self._watch_loop, "cluster-defs-watch")]

    def _run(self, loop: Callable[[], Any], name: str) -> asyncio.Task[None]:
        """Run one of the two loops; one that ends by an unexpected exception is logged
        and started again: without the push loop no change of this node would reach
        etcd again, and every declare here would wait out its deadline (issue 28)."""
        task: asyncio.Task[None] = asyncio.create_task(loop(), name=name)

        def ended(t: asyncio.Task[None]) -> None:
            if t.cancelled() or t not in self._tasks:
                return
            log.error("cluster: %s ended (%r); starting it again", name, t.exception())
            self._tasks[self._tasks.index(t)] = self._run(loop, name)

        task.add_done_callback(ended)
        return task

    async def stop(self, drain: float = 2.0) -> None:
        """Give pending changes a moment to reach etcd, then stop."""
        deadline = time.monotonic() + drain
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await cancel_all([*self._tasks, *self._barriers])
        self._tasks = []

    # ------------------------------------------------------------------ export
    def catalogue_items(self, kind: int) -> list[dict[str, Any]]:
        out = []
        for (k, _key), body in self.state.items():
            if k == kind:
                item = json.loads(body)
                item.pop("node", None)
                out.append(item)
        return out


__all__ = ["DefinitionMirror"]
