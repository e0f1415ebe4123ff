"""Non-durable queues, known on every node of the cluster (RabbitMQ 3.10's classic
non-durable queues): declared on one node (their leader, always the declaring node),
listed by ``/api/queues`` on every node with their ``node``, found by a declare
(passive or not) on any node and used from there over the inter-node links; deleted
everywhere when their node goes down, and never brought back by a restart.

Why apart from the definitions (:mod:`amqpd.cluster.definitions`): those are durable and
live in etcd for ever; a non-durable queue lives as long as its node's process. So each
one is a key attached to its node's etcd *lease*::

    {etcd_prefix}/{cluster}/transient/{node}/{vhost}/{queue}   (percent-encoded parts)

with the queue's definition (as an export writes it, plus ``"node"``). The lease goes
when the node stops cleanly (revoked) or, after a kill -9, when it runs out: etcd then
deletes the keys itself, so a full cluster restart finds none and resurrects nothing.
Other nodes do not wait for that: when the link to a node goes while the cluster view
sees it down (its heartbeats stopped), they delete its non-durable queues at once
(consumers get basic.cancel), as RabbitMQ deletes the non-durable classic queues of a
lost node. A node whose lease was renewed (etcd out of reach longer than the lease)
writes its keys again under the new one; a node seen running again is read back.

A queue's key also carries its bindings (from any exchange but the default one: every
exchange is known on every node, the non-durable ones through
:mod:`amqpd.cluster.transient_defs`), so a message published on any node reaches it:
the others bind their stand-in the same way (routing happens where a message arrives),
and a binding whose exchange is not known yet is made when it is. A binding made or
removed on another node (a client's queue.bind there) is passed to the queue's node (a
request, :mod:`amqpd.cluster.node_requests`), which changes its queue and so its key:
the binding is then everywhere, as RabbitMQ's bindings are wherever they were made,
and goes with the queue. The reply there (bind-ok, unbind-ok) waits for the queue's
node's answer, which comes once that node's change is visible (below).

With ``cluster.visible_wait`` above 0 (the workers of one node), a reply that made or
changed such a queue here (queue.declare-ok, queue.bind-ok) waits until its key is
written and every linked node has applied it (:meth:`TransientQueues.after_visible`,
:mod:`amqpd.cluster.visibility`), as RabbitMQ answers once every node's table has it: a
client told declare-ok on one node then finds the queue, exclusive or bound, on any
other. The wait is bounded by that setting and skipped while this node holds no lease
(etcd out of reach): the reply then goes at once, and the change reaches the others
when it can.

Exclusive queues are here too, as in RabbitMQ: listed on every node, reached by
publishes from any node (their bindings travel with them), refused to every other
connection (405 RESOURCE_LOCKED: their stand-in's owner is ``ELSEWHERE``), deleted
with their connection or their node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import NotFound
from amqpd.cluster.leased_push import LeasedPush
from amqpd.cluster.periodic import cancel_all
from amqpd.cluster.prefix_watch import follow_prefix
from amqpd.cluster.remote_queue import jsonable
from amqpd.cluster.visibility import QUEUES, Applied
from amqpd.coord.etcd import EtcdClient, EtcdError, WatchEvent

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType
    from amqpd.cluster.node import Cluster

log = logging.getLogger("amqpd.cluster.transient")

Ident = tuple[str, str]  # (vhost, queue)


OnDone = Callable[[BaseException | None], None]

BIND_REQUEST = "transient-bind"  # another node's (un)binding of one of this node's queues

ELSEWHERE = object()  # the owner of an exclusive queue whose connection is on another node


def _transient(q: Any) -> bool:
    """A stand-in this module made (a non-durable or an exclusive queue)."""
    return not q.durable or q.exclusive_owner is not None


class TransientQueues(LeasedPush[Ident]):
    def __init__(self, cluster: Cluster, api: BrokerAPI, etcd: EtcdClient,
                 root: str) -> None:
        self.cluster = cluster
        self.api = api
        self.etcd = etcd
        self.node = cluster.node_name
        self.prefix = root + "/transient/"
        self.mine: dict[Ident, str] = {}  # this node's non-durable queues -> JSON body
        self.pending: dict[Ident, str | None] = {}  # to put (body) or delete (None)
        self.lease = 0  # the lease this node's keys were last written under
        # the bindings the others' queues have (vhost, queue) -> [[source, key, args]]
        self.wanted: dict[Ident, list[list[Any]]] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # replies waiting for every node to know this node's changes (after_visible):
        self.seq = 0  # changes made here so far (numbered)
        self.unwritten: dict[Ident, int] = {}  # key -> its first change not yet written
        self.revision = 0  # the store's revision of this node's last write
        self.visible = 0  # every change up to this one is known on every linked node
        self._asked = 0  # the highest change a barrier was started for
        self._visible_waiters: list[tuple[int, OnDone]] = []
        self._barriers: set[asyncio.Task[None]] = set()
        # seconds a reply waits at most (cluster.visible_wait; 0: it does not wait)
        self.visible_wait = 0.0
        # the store revision this node's watch has applied (the others' SYNC wait on it)
        self.applied = Applied()
        # bindings passed to their queue's node, not answered yet (after_visible waits)
        self._forwards: set[asyncio.Task[None]] = set()
        self._syncing = False  # applying a node's record here (not a client's change)

    # ------------------------------------------------------------------ keys
    def key(self, node: str, vhost: str, name: str) -> str:
        parts = (urllib.parse.quote(p, safe="") for p in (node, vhost, name))
        return self.prefix + "/".join(parts)

    def parse(self, raw: bytes) -> tuple[str, str, str] | None:
        text = raw.decode("utf-8", "replace")
        if not text.startswith(self.prefix):
            return None
        parts = text[len(self.prefix):].split("/")
        if len(parts) != 3:
            return None
        node, vhost, name = (urllib.parse.unquote(p) for p in parts)
        return node, vhost, name

    # ------------------------------------------------------------------ this node's queues
    def _body(self, q: QueueType) -> str:
        """The queue as the others get it, with its bindings (every exchange is known on
        every node, non-durable ones too: amqpd/cluster/transient_defs.py; not the
        default exchange's)."""
        # sorted by their JSON: two bindings of one exchange and key differ in their
        # arguments, and dicts do not compare
        bindings = sorted(
            ([b.source.name, b.routing_key, jsonable(b.arguments)]
             for b in (q.inbound or ()) if b.source.name),
            key=lambda item: json.dumps(item, sort_keys=True))
        return json.dumps({"name": q.name, "vhost": q.vhost.name, "durable": q.durable,
                           "exclusive": q.exclusive, "auto_delete": q.auto_delete,
                           "arguments": jsonable(q.arguments), "node": self.node,
                           "bindings": bindings}, separators=(",", ":"), sort_keys=True)

    def declared(self, q: QueueType) -> bool:
        """A queue that is no durable definition (non-durable, or exclusive) was
        created here: make it known. True: its reply waits (after_visible; only with
        ``visible_wait`` above 0)."""
        if q.forwards_publish:
            return False
        ident = (q.vhost.name, q.name)
        body = self._body(q)
        self.mine[ident] = body
        self.pending[ident] = body
        self._changed(ident)
        q.on_removed.append(lambda _q: self._forget(ident))
        self._wake.set()
        return self.visible_wait > 0

    def binding_changed(self, binding: Any, deleted: bool) -> bool:
        """A binding that is not a durable definition changed here: if its queue is
        one of this node's non-durable queues, the others get the queue's bindings
        again (so a message published on any node reaches it); if it is another
        node's, the change is passed to that node (:meth:`_forward`). True: its reply
        waits (after_visible)."""
        q = binding.destination
        ident = (q.vhost.name, q.name) if binding.destination_type == "queue" else None
        if ident is None or q.vhost.queues.get(q.name) is not q:
            return False  # (a queue being deleted: its bindings go with it everywhere)
        if ident in self.mine:
            self._keep(ident, self._body(q))
            return self.visible_wait > 0
        from amqpd.cluster.remote_queue import RemoteQueue

        if self._syncing or not isinstance(q, RemoteQueue) or not _transient(q) \
                or self.cluster.mirror.applying or self.cluster.tdefs.applying:
            return False  # its node's record applied here, or an exchange's deletion
        self._forward(q, binding, deleted)
        return True

    # ------------------------------------------------------------------ others' queues bound here
    def _forward(self, q: Any, binding: Any, deleted: bool) -> None:
        """Pass a client's (un)binding of another node's queue ``q`` to that node: it
        binds its queue, whose key then carries the binding to every node."""
        args = {"vhost": q.vhost.name, "queue": q.name, "source": binding.source.name,
                "key": binding.routing_key, "arguments": jsonable(binding.arguments),
                "unbind": deleted}
        timeout = self.cluster.mirror.timeout or 10.0

        async def forward() -> None:
            try:
                await self.cluster.ask(q.leader, BIND_REQUEST, args, timeout)
            except Exception as exc:  # its node gone or out of reach: the queue goes too
                log.warning("cluster: %s of non-durable queue %r of node %s to %r not "
                            "passed to that node: %s", "unbinding" if deleted else
                            "binding", q.name, q.leader, binding.source.name, exc)

        task = asyncio.get_running_loop().create_task(forward(), name="cluster-bind")
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    async def _serve_bind(self, args: dict[str, Any]) -> None:
        """Another node's (un)binding of one of this node's non-durable queues: made
        here; answered once the queue's key with it is visible (after_visible)."""
        vhost, name = str(args["vhost"]), str(args["queue"])
        q = self.api.vhost(vhost).queues.get(name) if self.api.has_vhost(vhost) else None
        if q is None or (vhost, name) not in self.mine:
            raise NotFound(f"no non-durable queue '{name}' in vhost '{vhost}' on node "
                           f"'{self.node}'")
        change = self.api.unbind if args.get("unbind") else self.api.bind
        change(vhost, "queue", name, str(args["source"]), str(args["key"]),
               dict(args.get("arguments") or {}), owner=q.exclusive_owner)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def visible(_error: BaseException | None) -> None:
            if not future.done():
                future.set_result(None)

        self.after_visible(visible)(None)
        await future

    # ------------------------------------------------------------------ replies wait
    def _keep(self, ident: Ident, body: str) -> None:
        changed = self.mine.get(ident) != body
        super()._keep(ident, body)
        if changed:
            self._changed(ident)

    def _forget(self, ident: Ident) -> None:
        if ident in self.mine:
            super()._forget(ident)
            self._changed(ident)

    def _changed(self, ident: Ident) -> None:
        self.seq += 1
        self.unwritten.setdefault(ident, self.seq)

    def _written(self, ident: Ident, revision: int) -> None:
        """A write is in: once every change up to some number is, the linked nodes are
        asked to apply the store up to the last write's revision (one barrier at a
        time covers every change written before it)."""
        self.revision = max(self.revision, revision)
        if ident not in self.pending:
            self.unwritten.pop(ident, None)
        upto = min(self.unwritten.values()) - 1 if self.unwritten else self.seq
        queues = self.cluster.queues
        if upto <= self._asked or queues is None or self.visible_wait <= 0:
            return
        self._asked = upto
        task = asyncio.get_running_loop().create_task(self._barrier(
            queues.barrier.wait(QUEUES, self.revision, self.visible_wait), upto))
        self._barriers.add(task)
        task.add_done_callback(self._barriers.discard)

    async def _barrier(self, wait: Any, upto: int) -> None:
        if not await wait:
            log.warning("cluster: a non-durable queue's change not applied by every "
                        "node within %g s; answering all the same", self.visible_wait)
        self._visible_upto(upto)

    def _visible_upto(self, upto: int) -> None:
        self.visible = max(self.visible, upto)
        ready = [w for w in self._visible_waiters if w[0] <= self.visible]
        if ready:
            self._visible_waiters = [w for w in self._visible_waiters if w[0] > self.visible]
            for _target, callback in ready:
                callback(None)

    def after_visible(self, callback: OnDone) -> OnDone:
        """``callback`` delayed until every change to this node's non-durable queues
        made so far is written and applied by every linked node, at most
        ``visible_wait`` seconds; at once if that is 0, or while this node holds no
        lease (etcd out of reach: nothing would be written). Either way after the
        bindings passed to other nodes so far are answered (:meth:`_forward`)."""
        target = self.seq
        if self._forwards:
            callback = self._after_forwards(set(self._forwards), callback)
        if self.visible_wait <= 0:
            return callback

        def done(error: BaseException | None) -> None:
            lease = self.cluster.membership.lease_id
            if error is not None or target <= self.visible or not lease \
                    or lease != self.lease or self.cluster.queues is None:
                callback(error)
                return
            entry = (target, callback)
            self._visible_waiters.append(entry)

            def expire() -> None:
                if entry in self._visible_waiters:
                    self._visible_waiters.remove(entry)
                    log.warning("cluster: a non-durable queue's change not known on every "
                                "node within %g s; answering all the same",
                                self.visible_wait)
                    callback(None)

            asyncio.get_running_loop().call_later(self.visible_wait, expire)

        return done


    def _after_forwards(self, forwards: set[asyncio.Task[None]],
                        callback: OnDone) -> OnDone:
        """``callback`` once ``forwards`` are answered (each is bounded by its ask)."""
        def done(error: BaseException | None) -> None:
            if error is not None:
                callback(error)
                return

            async def wait() -> None:
                await asyncio.wait(forwards)
                callback(None)

            task = asyncio.get_running_loop().create_task(wait())
            self._barriers.add(task)
            task.add_done_callback(self._barriers.discard)

        return done

    async def _first_lease(self) -> None:
        """Keys of this node's previous process (a kill -9 and a restart within its
        lease): its queues are gone."""
        try:
            for kv in await self.etcd.get_prefix(
                    self.prefix + urllib.parse.quote(self.node, safe="") + "/"):
                parsed = self.parse(kv.key)
                if parsed is not None and parsed[1:] not in self.mine:
                    self.pending[parsed[1:]] = None
        except EtcdError as exc:
            log.warning("cluster: cannot read this node's old non-durable queues yet: %s",
                        exc)
            raise

    def _etcd_key(self, ident: Ident) -> str:
        return self.key(self.node, *ident)

    def _not_written(self, ident: Ident, exc: EtcdError) -> None:
        log.warning("cluster: non-durable queue %r not yet in etcd: %s", ident[1], exc)

    # ------------------------------------------------------------------ the others'
    def _apply(self, node: str, vhost: str, name: str, value: bytes | None) -> None:
        if node == self.node:
            return
        from amqpd.cluster.remote_queue import RemoteQueue

        if not self.api.has_vhost(vhost):
            return
        vh = self.api.vhost(vhost)
        existing = vh.queues.get(name)
        if value is None:
            if isinstance(existing, RemoteQueue) and existing.leader == node \
                    and _transient(existing):
                self._drop(existing)
            return
        if existing is not None and not isinstance(existing, RemoteQueue):
            log.warning("cluster: non-durable queue %r in vhost %r of %s: this node has "
                        "its own of that name; keeping it", name, vhost, node)
            return
        if not self.cluster.is_running(node):
            return  # its queues are being deleted; read back when it is seen again
        queues = self.cluster.queues
        if queues is None:
            return  # no inter-node links yet: read back when the node is seen again
        try:
            item = json.loads(value)
            q = queues.materialise(vhost, item, node)
            if item.get("exclusive") and q.exclusive_owner is None:
                # a connection on its node owns it: every client here is refused with
                # 405 RESOURCE_LOCKED (declare, consume, get), publishes reach it
                q.exclusive_owner = ELSEWHERE
            self.wanted[(vhost, name)] = item.get("bindings") or []
            self._sync_bindings(q, self.wanted[(vhost, name)])
        except Exception as exc:
            log.error("cluster: non-durable queue %r in vhost %r of %s not made known "
                      "here: %s", name, vhost, node, exc)

    def _sync_bindings(self, q: Any, wanted: list[list[Any]]) -> None:
        """Bind the stand-in ``q`` as its node has the queue bound (routing happens on
        the node where a message arrives)."""
        def ident(source: str, key: str, arguments: Any) -> str:
            return json.dumps([source, key, jsonable(arguments)], sort_keys=True)

        self._syncing = True
        try:
            self._bind_as(q, wanted, ident)
        finally:
            self._syncing = False

    def _bind_as(self, q: Any, wanted: list[list[Any]],
                 ident: Callable[[str, str, Any], str]) -> None:
        want = {ident(*w): w for w in wanted if len(w) == 3}
        have = {ident(b.source.name, b.routing_key, b.arguments): b
                for b in list(q.inbound or ()) if b.source.name}
        vhost = q.vhost.name
        for key, b in have.items():
            if key not in want:
                self.api.unbind(vhost, "queue", q.name, b.source.name, b.routing_key,
                                b.arguments, owner=q.exclusive_owner)
        for key, (source, rk, arguments) in want.items():
            if key in have:
                continue
            try:
                self.api.bind(vhost, "queue", q.name, source, rk, dict(arguments or {}),
                              owner=q.exclusive_owner)  # (ELSEWHERE: as its owner)
            except Exception as exc:  # its exchange not (yet) known here
                log.warning("cluster: binding of non-durable queue %r to %r in vhost %r "
                            "not made here: %s", q.name, source, vhost, exc)

    def exchange_known(self, vhost: str, exchange: str) -> None:
        """An exchange became known here (a non-durable one, from etcd): the others'
        queues bound to it that could not be bound before are bound now."""
        from amqpd.cluster.remote_queue import RemoteQueue

        if not self.api.has_vhost(vhost):
            return
        queues = self.api.vhost(vhost).queues
        for (vh, name), wanted in list(self.wanted.items()):
            q = queues.get(name)
            if vh == vhost and isinstance(q, RemoteQueue) and _transient(q) \
                    and any(w and w[0] == exchange for w in wanted):
                self._sync_bindings(q, wanted)

    def _drop(self, q: Any) -> None:
        self.wanted.pop((q.vhost.name, q.name), None)
        q.gone = True  # nothing to ask of its leader: the queue is gone there
        q.vhost.delete_queue(q, reason="deleted with its node")

    def node_lost(self, node: str) -> None:
        """The link to ``node`` went and the view does not see it running: its
        non-durable queues are deleted here (consumers get basic.cancel)."""
        from amqpd.cluster.remote_queue import RemoteQueue

        if self.cluster.is_running(node):
            return  # a broken link to a live node: it comes back
        n = 0
        for vh in self.api.vhosts():
            for q in list(vh.queues.values()):
                if isinstance(q, RemoteQueue) and q.leader == node and _transient(q):
                    self._drop(q)
                    n += 1
        if n:
            log.info("cluster: node %s lost: its %d non-durable queue(s) deleted", node, n)

    def node_changed(self, node: str, running: bool) -> None:
        """The view's news: a node seen again is read back; a node seen down whose link
        is gone already (a kill -9 closes it before the heartbeats time out) is lost."""
        if node == self.node:
            return
        if running:
            asyncio.get_running_loop().create_task(self._read_node(node))
            return
        queues = self.cluster.queues
        if queues is None or queues.links.link(node) is None:
            self.node_lost(node)

    async def _read_node(self, node: str) -> None:
        with contextlib.suppress(EtcdError):
            _rev, kvs = await self.etcd.range_prefix(
                self.prefix + urllib.parse.quote(node, safe="") + "/")
            for kv in kvs:
                parsed = self.parse(kv.key)
                if parsed is not None:
                    self._apply(*parsed, kv.value)

    async def sync(self) -> int:
        """Read every node's non-durable queues; drop the ones etcd no longer has.
        Returns the revision read at."""
        from amqpd.cluster.remote_queue import RemoteQueue

        revision, kvs = await self.etcd.range_prefix(self.prefix)
        present: set[tuple[str, str, str]] = set()
        for kv in kvs:
            parsed = self.parse(kv.key)
            if parsed is not None:
                present.add(parsed)
                self._apply(*parsed, kv.value)
        for vh in self.api.vhosts():
            for q in list(vh.queues.values()):
                if isinstance(q, RemoteQueue) and _transient(q) \
                        and (q.leader, vh.name, q.name) not in present:
                    self._drop(q)
        return revision

    def _event(self, ev: WatchEvent) -> None:
        parsed = self.parse(ev.kv.key)
        if parsed is not None:
            self._apply(*parsed, None if ev.deleted else ev.kv.value)

    async def _watch_loop(self) -> None:
        await follow_prefix(self.etcd, self.prefix, self.sync, self._event, log,
                            "non-durable queues", self.applied.advance)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.api.serve_node_requests(BIND_REQUEST, self._serve_bind)
        self._tasks = [asyncio.create_task(self._push_loop(), name="cluster-transient-push"),
                       asyncio.create_task(self._watch_loop(),
                                           name="cluster-transient-watch")]

    async def stop(self) -> None:
        await cancel_all(self._tasks + list(self._barriers) + list(self._forwards))
        self._tasks = []


__all__ = ["TransientQueues"]
