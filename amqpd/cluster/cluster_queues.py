"""This node's part in queues led across the cluster (issue 15): :class:`ClusterQueues`,
one per node, owns the inter-node links (:class:`~amqpd.cluster.link.LinkManager`),
follows the leaders of the :class:`~amqpd.cluster.remote_queue.RemoteQueue` objects
here (:func:`materialise`, :func:`replace_queue`), serves the streams other nodes open
for the queues this node leads (:class:`~amqpd.cluster.remote_served.Served`), places
new queues by the leader locator, and hands the frames of other stream kinds to its
``extensions`` (mirrored queues, quorum groups). Theory of operation:
:mod:`amqpd.cluster.remote_queue`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from amqpd.broker.api import REPLY_PREFIX, AMQPError, QueueType, queue_type_name, reply_inbox
from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster import stream_wire as S
from amqpd.cluster.link import Link, LinkHandler, LinkManager
from amqpd.cluster.remote_queue import RemoteQueue, jsonable, remote_class
from amqpd.cluster.remote_served import Served
from amqpd.cluster.reply_forward import ReplyForwards
from amqpd.cluster.visibility import VisibilityBarrier, answer_when

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, VHost
    from amqpd.cluster.deadlines import ConfirmDeadlines
    from amqpd.cluster.remote_state import RemoteQueueState
    from amqpd.cluster.stream_replica import StreamReplica

log = logging.getLogger("amqpd.cluster.queues")

STATS_INTERVAL: Final = 1.0
# a stream the leader refuses (404) while the catalogue says it leads the queue is
# opened again this often, this many times (its leader is taking the queue over)
REOPEN_DELAY: Final = 0.2
REOPEN_TRIES: Final = 50
EXTENSION_KINDS: Final = 80  # frame types from here on belong to ClusterQueues.extensions
# a link to a node the view does not see running is closed once silent this long
LINK_SILENCE: Final = 2.0
LOCATORS: Final = ("client-local", "min-masters", "random")  # RabbitMQ 3.10's names
# x-queue-leader-locator's values (streams; docs/streams.md) as those locators
LEADER_LOCATORS: Final[dict[str, str]] = {
    "client-local": "client-local", "balanced": "min-masters",
    "least-leaders": "min-masters", "random": "random"}


class QueuesView(Protocol):
    """What :class:`ClusterQueues` reads of the node's view of the cluster: the node
    (:class:`amqpd.cluster.node.Cluster`, a :class:`~amqpd.cluster.view.ClusterView`),
    or a stand-in in unit tests."""

    node_name: str
    catalogue: dict[tuple[str, str], str]  # (vhost, queue) -> leader node
    queues: ClusterQueues | None  # set by :func:`start`

    def nodes(self) -> dict[str, Any]:
        """Every member by name (a view's ``NodeInfo``: link address, running)."""
        ...

    def is_running(self, node: str) -> bool: ...

    def subscribe(self, callback: Callable[[str, bool], None]) -> None: ...

    def node_lost(self, node: str) -> None:
        """The link to ``node`` went: the cluster's non-durable queues there are lost
        to this node (amqpd.cluster.transient)."""
        ...

    def when_applied(self, watch: int, revision: int, answer: Callable[[], None]) -> None:
        """``answer`` once this node's ``watch`` (amqpd.cluster.visibility's kinds) has
        applied the store's ``revision`` (a peer's ``SYNC``)."""
        ...


class ClusterQueues:
    """This node's side of queues across the cluster: the :class:`LinkHandler` of its
    links, the remote queues it holds (user side) and the streams it serves (leader
    side)."""

    def __init__(self, api: BrokerAPI, view: QueuesView, cookie: bytes,
                 locator: str = "client-local") -> None:
        self.api = api
        self.broker = api.cluster_port()
        self.view = view
        self.locator = locator  # cluster.queue_leader_locator
        self.node: str = view.node_name
        self.links = LinkManager(self.node, cookie, self, self._address, view.is_running)
        # replies that wait until every peer applied a non-durable queue's change
        self.barrier = VisibilityBarrier(self.links)
        # stand-ins of the other nodes' direct reply-to inboxes
        self.replies = ReplyForwards(self)
        self.remote: dict[str, dict[int, RemoteQueue]] = {}  # peer -> stream -> queue
        self._next_stream = 0
        self.served: dict[Link, dict[int, Served]] = {}
        self._stats_handle: asyncio.TimerHandle | None = None
        self._credit_flush = False
        self._declares: dict[int, RemoteQueue] = {}
        self._next_declare = 0
        # handlers of the other stream kinds on the same links (frame types from
        # EXTENSION_KINDS on: amqpd.cluster.mirror); told of links going up and down too
        self.extensions: list[LinkHandler] = []
        # set once serve() started every extension: the links are up before (a peer
        # connects while this node still joins), and an extension frame then had no
        # handler (issue 35: below, extension_frame_too_early)
        self.extensions_started = False
        # queues this node held that another node leads (found at start): a mirror's
        # copy is adopted again by amqpd.cluster.mirror, the others deleted there
        self.retired: dict[tuple[str, str], QueueType] = {}
        # the deadlines of forwarded publishes' confirms (amqpd.cluster.deadlines)
        self.confirm_deadlines: ConfirmDeadlines | None = None
        # whether a queue whose link to its leader went will get a new leader (a
        # mirror can take over; set by amqpd.cluster.mirror): its consumers are kept
        self.failover_expected: Callable[[RemoteQueueState], bool] = lambda queue: False
        # told when a queue kept its consumers on failover_expected's word: the mirrors
        # check that word against etcd's record (RemoteQueue.cancel_kept if it is wrong)
        self.failover_kept: Callable[[RemoteQueueState], None] = lambda queue: None
        # this node's copy of a stream (vhost, name) led elsewhere, if it holds one (set
        # by amqpd.cluster.stream_group): its consumers here read it (stream_local)
        self.stream_copy: Callable[[str, str], StreamReplica | None] = \
            lambda vhost, name: None

    def _address(self, peer: str) -> tuple[str, int] | None:
        info = self.view.nodes().get(peer)
        return info.link if info is not None else None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.broker.queue_placer = self.place
        address = await self.links.listen(host, port)
        self.view.subscribe(self._node_changed)
        for name in self.view.nodes():
            if name != self.node and self.view.is_running(name):
                self.links.want(name)
        self._stats_handle = asyncio.get_running_loop().call_later(
            STATS_INTERVAL, self._send_stats)
        return address

    async def stop(self) -> None:
        self.broker.queue_placer = None
        if self._stats_handle is not None:
            self._stats_handle.cancel()
        await self.links.close()

    def _node_changed(self, node: str, running: bool) -> None:
        if node == self.node:
            return
        if running:
            self.links.want(node)
        else:
            asyncio.get_running_loop().create_task(self._watch_down(node))

    async def _watch_down(self, node: str) -> None:
        """The view lost sight of ``node`` (heartbeats late or gone). A dead process
        closes its links itself (the kernel does); a link still carrying traffic is
        kept (a busy node's heartbeats can be late: closing would nack everything in
        flight); a silent one is closed while the view still says so, as in a network
        partition: its queues are then down here."""
        loop = asyncio.get_running_loop()
        while not self.links.closing and not self.view.is_running(node):
            link = self.links.links.get(node)
            if link is None or link.closed:
                return
            if loop.time() - link.last_heard >= LINK_SILENCE:
                log.warning("link to %s closed: the node is not seen running and the "
                            "link is silent", node)
                link.close()
                return
            await asyncio.sleep(LINK_SILENCE / 4)

    # -- user side -----------------------------------------------------------------------
    def adopt(self, queue: RemoteQueue, leader: str) -> None:
        queue.leader = leader
        queue.cluster = self
        self._next_stream += 1
        self.remote.setdefault(leader, {})[self._next_stream] = queue
        queue.stream = self._next_stream
        link = self.links.link(leader)
        if link is not None:
            queue.attach(link, queue.stream)
        else:
            self.links.want(leader)

    def retire(self, queue: QueueType) -> None:
        """``queue`` was this node's own and another node leads it now: deleted here
        unless it holds messages, which may be this node's mirror copy of it (kept
        across a restart; amqpd.cluster.mirror adopts or deletes it)."""
        if queue.message_count or queue.unacked_count:
            self.retired[(queue.vhost.name, queue.name)] = queue
        else:
            queue.delete()

    def forget(self, queue: RemoteQueue) -> None:
        streams = self.remote.get(queue.leader, {})
        if streams.get(queue.stream) is queue:
            del streams[queue.stream]
            if queue.link is not None:
                queue.link.send(W.encode(W.CLOSE, queue.stream))

    # -- leader locators -----------------------------------------------------------------
    def locator_for(self, vhost: str, name: str, cls: type[QueueType],
                    arguments: dict[str, Any]) -> str:
        """``x-queue-leader-locator`` (RabbitMQ 3.10's streams: ``balanced`` picks the
        node leading the fewest queues), ``x-queue-master-locator``, else the same as
        policy keys, else ``cluster.queue_leader_locator`` (RabbitMQ 3.10's order)."""
        value = _leader_locator(arguments.get("x-queue-leader-locator"))
        if value is None:
            value = arguments.get("x-queue-master-locator")
        if isinstance(value, str) and value in LOCATORS:
            return value
        policy = self.broker.policies.match(vhost, "queues", name, cls.type_name)
        if policy is not None:
            value = _leader_locator(policy.definition.get("queue-leader-locator"))
            if value is None:
                value = policy.definition.get("queue-master-locator")
            if isinstance(value, str) and value in LOCATORS:
                return value
        return self.locator

    def choose_leader(self, locator: str) -> str:
        """The node a new queue is led by: this one (client-local), the running node
        leading the fewest queues (min-masters), or any running node (random)."""
        others = sorted(n for n in self.view.nodes() if n != self.node
                        and self.view.is_running(n) and self.links.link(n) is not None)
        running = [self.node, *others]
        if locator == "random":
            return random.choice(running)
        if locator == "min-masters":
            counts = dict.fromkeys(running, 0)
            for leader in self._leaders():
                if leader in counts:
                    counts[leader] += 1
            return min(running, key=lambda n: (counts[n], n != self.node, n))
        return self.node

    def _leaders(self) -> list[str]:
        catalogue = self.view.catalogue
        if catalogue:
            return [str(v) for v in catalogue.values()]
        out = []
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                if isinstance(q, RemoteQueue):
                    out.append(q.leader)
                elif q.durable and not q.exclusive:
                    out.append(self.node)
        return out

    def place(self, vhost: VHost, name: str, cls: type[QueueType], auto_delete: bool,
              arguments: dict[str, Any]) -> QueueType | None:
        """``Broker.queue_placer``: a new durable queue led by another node when the
        locator picks one (that node is asked to create it, ahead of everything this
        node sends about it on the link); None: create it here."""
        locator = self.locator_for(vhost.name, name, cls, arguments)
        if locator == "client-local":
            return None
        leader = self.choose_leader(locator)
        link = self.links.link(leader)
        if leader == self.node or link is None:
            return None
        self._next_declare += 1
        link.send(W.encode(W.DECLARE, 0, self._next_declare, {
            "vhost": vhost.name, "name": name, "auto_delete": auto_delete,
            "arguments": jsonable(arguments)}))
        q = self.materialise(vhost.name, {"name": name, "durable": True,
                                          "auto_delete": auto_delete,
                                          "arguments": arguments}, leader)
        assert isinstance(q, RemoteQueue)
        self._declares[self._next_declare] = q
        log.info("queue '%s' in vhost '%s' declared with leader %s (%s)", name,
                 vhost.name, leader, locator)
        return q

    def _declare_here(self, link: Link, req: int, body: dict[str, Any]) -> None:
        """A peer's locator chose this node to lead a queue: create it (as a declare
        here would, so the cluster's definitions record this node as its leader)."""
        code, text = 0, ""
        self.broker.queue_placer = None  # here, whatever this node's locator would say
        try:
            self.api.declare_queue(body["vhost"], body["name"], durable=True,
                                   auto_delete=bool(body.get("auto_delete")),
                                   arguments=dict(body.get("arguments") or {}))
        except AMQPError as exc:
            code, text = exc.reply_code, str(exc)
        finally:
            self.broker.queue_placer = self.place
        link.send(W.encode(W.DECLARED, 0, req, code, text))

    def _declared(self, req: int, code: int, text: str) -> None:
        q = self._declares.pop(req, None)
        if q is None or not code:
            return
        log.warning("queue '%s' in vhost '%s': leader %s refused to create it: %s %s",
                    q.name, q.vhost.name, q.leader, code, text)
        q.gone = True
        q.vhost.delete_queue(q)

    # -- LinkHandler ---------------------------------------------------------------------
    def link_up(self, link: Link) -> None:
        self.served[link] = {}
        for stream, queue in self.remote.get(link.peer, {}).items():
            queue.attach(link, stream)
        for ext in self.extensions:
            ext.link_up(link)

    def link_down(self, link: Link) -> None:
        for served in self.served.pop(link, {}).values():
            served.close()
        for queue in self.remote.get(link.peer, {}).values():
            if queue.link is link:
                queue.detach()
        if not self.links.closing:  # the cluster's non-durable queues there
            self.view.node_lost(link.peer)
        if not self.links.closing and self.view.is_running(link.peer):
            self.links.want(link.peer)
        self.barrier.link_down(link)
        for ext in self.extensions:
            ext.link_down(link)

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        # publishes to a queue led here and deliveries from a queue led there are nearly
        # every frame of a busy link (batched: link_wire's PUBLISHES and DELIVERS): they
        # go the short way
        if kind == _PUBLISHES:
            served = self.served.get(link, _NO_SERVED).get(stream)
            if served is not None:
                served.publish_many(f[0])
                if not self._credit_flush:
                    self._schedule_credit()
                return
        elif kind == _DELIVERS:
            remote = self.remote.get(link.peer, _NO_REMOTE).get(stream)
            if remote is not None and remote.link is link:
                remote.deliver_many(f[0], f[1])
                return
        elif kind == _PUBLISH:
            served = self.served.get(link, _NO_SERVED).get(stream)
            if served is not None:
                served.publish(f[0], f[1], f[2], f[3], f[4], f[5])
                if not self._credit_flush:
                    self._schedule_credit()
                return
        elif kind == _DELIVER:
            remote = self.remote.get(link.peer, _NO_REMOTE).get(stream)
            if remote is not None and remote.link is link:
                remote.on_frame(kind, f)
                return
        if kind < W.OPEN:
            raise W.WireError(f"handshake frame {kind} on a live link")
        if kind >= EXTENSION_KINDS:
            if not self.extensions_started:
                extension_frame_too_early(link, kind, stream, f)
                return
            for ext in self.extensions:
                ext.frame(link, kind, stream, f)
            return
        if kind in _STREAM_ZERO:
            self._stream_zero(link, kind, f)
            return
        if kind in _LEADER_SIDE:
            self._serve(link, kind, stream, f)
            return
        queue = self.remote.get(link.peer, {}).get(stream)
        if queue is None or queue.link is not link:
            if kind == W.DELIVER:  # a stream we closed: give it back
                link.send(W.encode(W.REQUEUE, stream, [f[1]]))
            elif kind == W.DELIVERS:
                link.send(W.encode_ids(W.REQUEUE, stream, f[1].ids()))  # a Delivers
            return
        if queue.on_frame(kind, f):
            return
        if kind == W.FAILED:
            log.warning("queue '%s' in vhost '%s' on %s: %s %s", queue.name,
                        queue.vhost.name, link.peer, f[0], f[1])
            retry = f[0] == 404 and self._catalogue_leader(queue) == link.peer \
                and queue.reopen_tries < REOPEN_TRIES
            queue.detach(keep_consumers=retry)
            if retry:
                # the catalogue says the peer leads it, but its queue is not there yet (a
                # mirror being promoted: amqpd.cluster.mirror): open the stream again
                queue.reopen_tries += 1
                asyncio.get_running_loop().call_later(REOPEN_DELAY, self._reopen, queue,
                                                      link)
                return
            queue.gone = True
            queue.link = link  # still reachable; ``gone`` answers 404

    def _stream_zero(self, link: Link, kind: int, f: list[Any]) -> None:
        """The frames about no queue stream: a peer's locator placing a queue here and
        its answer, the visibility barrier's question and answer."""
        if kind == W.DECLARE:
            self._declare_here(link, f[0], f[1])
        elif kind == W.DECLARED:
            self._declared(*f)
        elif kind == W.SYNC:
            watch, revision = f
            self.view.when_applied(watch, revision,
                                   lambda: answer_when(link, watch, revision))
        else:  # SYNCED
            self.barrier.answered(link, f[0], f[1])

    def _catalogue_leader(self, queue: RemoteQueue) -> str | None:
        leader = self.view.catalogue.get((queue.vhost.name, queue.name))
        return str(leader) if leader is not None else None

    def _reopen(self, queue: RemoteQueue, link: Link) -> None:
        if queue.deleted or queue.link is not None or link.closed \
                or self.remote.get(link.peer, {}).get(queue.stream) is not queue:
            return
        queue.attach(link, queue.stream)

    # -- leader side ---------------------------------------------------------------------
    def _serve(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        streams = self.served.setdefault(link, {})
        if kind == W.OPEN:
            self._open(link, streams, stream, f[0], f[1])
            return
        served = streams.get(stream)
        if served is None:
            if kind == W.PUBLISH:
                if f[0]:
                    link.send(W.encode(W.CONFIRM, stream, f[0], False))
                link.send(W.encode(W.CREDIT, stream, 1))  # its credit is not lost
            elif kind == W.PUBLISHES:
                for seq in f[0].seqs:  # a link_records.Publishes
                    if seq:
                        link.send(W.encode_confirm(stream, seq, False))
                link.send(W.encode_credit(stream, len(f[0])))
            elif kind == W.CONSUME:
                link.send(W.encode(W.CONSUMED, stream, f[0], 404, "no such queue stream"))
            elif kind == W.GET:
                link.send(W.encode(W.GET_EMPTY, stream, f[0]))
            return
        if kind == W.PUBLISH:
            served.publish(*f)
            self._schedule_credit()
        elif kind == W.PUBLISHES:
            served.publish_many(f[0])
            self._schedule_credit()
        elif kind in (W.SETTLE, W.REQUEUE, W.REJECT):
            served.settle(f[0], kind)
        elif kind == W.CONSUME:
            served.consume(*f)
        elif kind == W.GRANT:
            served.grant(*f)
        elif kind == W.CANCEL:
            served.cancel(f[0])
        elif kind == W.RECLAIM:
            served.reclaim(f[0], f[1])
        elif kind == W.GET:
            served.get(*f)
        elif kind == W.COUNT:  # a declare on the user's node: a use, as a declare here
            if not served.queue.deleted:
                served.queue.touch()  # (x-expires starts again)
            link.send(W.encode(W.COUNTED, stream, f[0], *served.stats()))
        elif kind == W.PURGE:
            n = 0 if served.queue.deleted else served.queue.purge()
            link.send(W.encode(W.PURGED, stream, f[0], n))
        elif kind == W.DELETE:
            q = served.queue
            n = 0
            if not q.deleted:
                n = q.message_count
                q.vhost.delete_queue(q)
            link.send(W.encode(W.DELETED, stream, f[0], n))
        elif kind == W.CLOSE:
            served.close()
            del streams[stream]

    def _open(self, link: Link, streams: dict[int, Served], stream: int, vhost: str,
              name: str) -> None:
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(name) if vh is not None else None
        if q is None and vh is not None and name.startswith(REPLY_PREFIX):
            q = reply_inbox(vh, name)  # a requester's inbox here (cluster.reply_forward)
        if q is None or q.forwards_publish:
            link.send(W.encode(W.FAILED, stream, 404,
                               f"NOT_FOUND - no queue '{name}' in vhost '{vhost}'"))
            return
        # an exclusive queue is opened too (publishes from other nodes reach it, as in
        # RabbitMQ); consuming is refused (Served.consume), other nodes refuse it first
        old = streams.pop(stream, None)
        if old is not None:
            old.close()
        served = Served(self.broker, link, stream, q)
        streams[stream] = served
        served.last_stats = served.stats()
        link.send(W.encode(W.OPENED, stream, *served.last_stats))
        q.on_removed.append(lambda _q: self._queue_removed(link, stream, served))

    def _queue_removed(self, link: Link, stream: int, served: Served) -> None:
        streams = self.served.get(link)
        if streams is not None and streams.get(stream) is served:
            del streams[stream]
            link.send(W.encode(W.FAILED, stream, 404, "NOT_FOUND - queue deleted"))

    def _schedule_credit(self) -> None:
        if not self._credit_flush:
            self._credit_flush = True
            asyncio.get_running_loop().call_soon(self._flush_credit)

    def _flush_credit(self) -> None:
        """Credit back for the publishes taken this tick, one frame per stream."""
        self._credit_flush = False
        for link, streams in self.served.items():
            for stream, served in streams.items():
                if served.credit_due:
                    link.send(W.encode_credit(stream, served.credit_due))
                    served.credit_due = 0

    def _send_stats(self) -> None:
        for link, streams in self.served.items():
            for stream, served in streams.items():
                now = served.stats()
                if now != served.last_stats:
                    served.last_stats = now
                    link.send(W.encode(W.STATS, stream, *now))
        self._stats_handle = asyncio.get_running_loop().call_later(
            STATS_INTERVAL, self._send_stats)

    # -- the definitions appliers' hook --------------------------------------------------
    def materialise(self, vhost: str, definition: dict[str, Any],
                    leader: str) -> QueueType:
        """The definitions applier's hook for a queue whose leader is another node: a
        :class:`RemoteQueue` in the vhost in the queue's place (``definition`` as the
        definitions export writes a queue: name, durable, auto_delete, arguments)."""
        vh = self.broker.vhosts[vhost]
        name = definition["name"]
        existing = vh.queues.get(name)
        if isinstance(existing, RemoteQueue) and existing.leader == leader:
            return existing
        if isinstance(existing, RemoteQueue) and not existing.deleted:
            # the queue has a new leader (a mirror was promoted: amqpd.cluster.mirror):
            # the same object follows it, bindings and all
            self.forget(existing)
            if existing.link is not None:
                # the link to the old leader is still up (it was deposed, or this node has
                # not seen it go yet): its consumers follow the new leader all the same;
                # only x-cancel-on-ha-failover ones are cancelled (whatever the mirror
                # records read here say: they may already name the new leader, with no
                # mirror of its own yet)
                existing.detach(keep_consumers=True)
            existing.gone = False
            existing.reopen_tries = 0
            self.adopt(existing, leader)
            return existing
        arguments = dict(definition.get("arguments") or {})
        cls = remote_class(str(queue_type_name(arguments)))
        q = cls(vh, name, durable=bool(definition.get("durable", True)),
                auto_delete=bool(definition.get("auto_delete", False)), arguments=arguments,
                port=self.broker)
        from amqpd.broker.api import Binding

        if existing is not None:
            # this node led it (it was down while a mirror took over): the cluster's
            # leader holds the messages now; the bindings stay the cluster's
            replace_queue(self, vh, existing, q)
            self.retire(existing)
        else:
            vh.queues[name] = q
            vh.exchanges[""].bind(Binding(vh.exchanges[""], q, name, {}))
        self.broker.apply_policies_to(vh, q)
        self.adopt(q, leader)
        return q


_PUBLISH: Final = W.PUBLISH
_DELIVER: Final = W.DELIVER
_PUBLISHES: Final = W.PUBLISHES
_DELIVERS: Final = W.DELIVERS
_NO_SERVED: Final[dict[int, Served]] = {}  # never written: a link with no stream served
_NO_REMOTE: Final[dict[int, RemoteQueue]] = {}

_STREAM_ZERO = frozenset({W.DECLARE, W.DECLARED, W.SYNC, W.SYNCED})
_LEADER_SIDE = frozenset({W.OPEN, W.CLOSE, W.PUBLISH, W.PUBLISHES, W.CONSUME, W.GRANT,
                          W.CANCEL, W.GET, W.SETTLE, W.REQUEUE, W.REJECT, W.PURGE,
                          W.DELETE, W.COUNT, W.DECLARE, W.RECLAIM})


def extension_frame_too_early(link: Link, kind: int, stream: int,
                              f: list[Any] | None = None) -> None:
    """An extension's frame before this node started its extensions (it is starting):
    dropped, as it has no handler yet; but a copy's ``MSTART`` (a mirrored queue's or a
    quorum queue's leader starting its replication to this node) is refused, so the
    leader tries again at its next reconciliation (a quarter of a second) instead of
    waiting :data:`~amqpd.cluster.mirror_leading.HAVE_WAIT` (10 s) for an ``MHAVE``
    that never comes; a stream copy's ``SSTART`` likewise (``SREFUSE``), and a
    forwarded stream publisher's ``SPUB`` is answered ``SPUBLOST``, a peer's ``ASK``
    (``f``: its fields) an error (amqpd.cluster.peer_ask: the asker leaves this node
    out at once instead of waiting its whole timeout). Measured before (issue 35):
    after a restart of a ``workers = 2`` node, a quorum queue's 2-member group got its
    majority back only 10 s later."""
    if kind == M.MSTART:
        link.send(W.encode(M.MREFUSE, stream, "this node is starting: not ready to copy"))
    elif kind == S.SSTART:  # a stream's copy: its leader asks again a second later
        link.send(W.encode(S.SREFUSE, stream, "this node is starting: not ready to copy"))
    elif kind == W.SPUB:
        # a forwarded stream publisher: dropped, its publishes would wait for ever; lost,
        # its client gets publish-error 0x06 and a metadata-update and asks again
        link.send(W.encode(W.SPUBLOST, stream, "the stream's leader node is starting"))
    elif kind == W.ASK and f:
        link.send(W.encode(W.ANSWER, 0, f[0], {"ok": False, "code": 503,
                                               "error": "this node is starting"}))


async def start(api: BrokerAPI, view: QueuesView, cookie: bytes, host: str, port: int,
                locator: str = "client-local") -> ClusterQueues:
    """Start this node's links and queue streams (the cluster's startup calls it once
    the view is up); ``(host, port)`` is ``cluster.link_listen``, ``locator``
    ``cluster.queue_leader_locator``. The view (the cluster node) holds the instance
    (``view.queues``): that is where the definitions appliers reach it."""
    cluster = ClusterQueues(api, view, cookie, locator)
    await cluster.start(host, port)
    view.queues = cluster
    return cluster


def _leader_locator(value: Any) -> str | None:
    return LEADER_LOCATORS.get(value) if isinstance(value, str) else None


def replace_queue(cluster: ClusterQueues, vh: VHost, old: QueueType | None,
                  new: QueueType) -> None:
    """Put ``new`` in ``old``'s place in ``vh`` with ``old``'s bindings, recording no
    definition change (the queue stays the same queue of the cluster; only where it is
    led changes). A :class:`RemoteQueue` replaced stops following its leader."""
    from amqpd.broker.api import Binding

    vh.queues[new.name] = new
    if old is None:
        vh.exchanges[""].bind(Binding(vh.exchanges[""], new, new.name, {}))
        return
    for binding in list(old.inbound or ()):
        source = binding.source
        source.unbind(binding.key)
        source.bind(Binding(source, new, binding.routing_key, binding.arguments))
    old.deleted = True
    if isinstance(old, RemoteQueue):
        cluster.forget(old)
        if old.link is not None:
            # this node took the queue over while its link to the old leader is still
            # up (the leader was deposed, or its link's end is not seen yet): what was
            # in flight there is over (confirms nacked, deliveries the leader's copy
            # has); the consumers follow as if the link had gone
            old.detach(keep_consumers=True)
        old.stop_kept_timer()
        follow = not new.forwards_publish
        for consumer in list(old.consumers):
            if isinstance(old, RemoteQueue):  # a stream's consumer goes on where it was
                consumer.arguments = old.resume_arguments(consumer)
            old.remove_consumer(consumer)
            if follow and consumer.arguments.get("x-cancel-on-ha-failover") is not True:
                # a consumer kept across the failover consumes from the promoted copy
                consumer.queue = new
                new.add_consumer(consumer)
            else:
                consumer.channel.consumer_cancelled_by_server(consumer)
        for callback in old.on_removed:
            callback(old)


__all__ = ["EXTENSION_KINDS", "ClusterQueues", "replace_queue", "start"]
