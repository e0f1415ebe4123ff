"""Cluster: one node's part in a named cluster (``broker.cluster``, ``api.cluster()``).

It is the :class:`~amqpd.cluster.view.ClusterView` the rest of the broker reads, and it
runs what feeds the view and acts on it:

* :class:`~amqpd.cluster.membership.Membership`: joining, the lease and the node's
  record, reading members and records from etcd;
* :class:`~amqpd.cluster.heartbeat.Heartbeats`: UDP heartbeats to and from the others;
* :class:`~amqpd.cluster.definitions.DefinitionMirror`: one set of definitions;
* :class:`~amqpd.cluster.transient.TransientQueues`: non-durable queues on every node;
* :class:`~amqpd.cluster.transient_defs.TransientDefinitions`: non-durable exchanges and
  bindings on every node, for one incarnation of the cluster;
* :class:`~amqpd.cluster.node_info.NodeInfoBoard`: facts a node publishes for the
  others (the dynamic shovels it runs);
* :class:`~amqpd.cluster.node_requests.NodeRequests`: requests a node makes of another
  (restart the shovel or federation link it runs);
* the partition decision, every ``DECIDE_INTERVAL`` seconds;
* :class:`~amqpd.cluster.loop_clock.LoopClock`: the clock the view measures silence on,
  which leaves out this node's own event-loop stalls.

Partition handling (RabbitMQ's ``cluster_partition_handling``): with ``pause_minority``
(the default) a node that does not see more than half of the members running, or that
has not reached etcd for ``etcd_grace`` seconds of its own running time, or whose lease
may have run out (an unreachable coordinator counts as not seeing a majority: the
definitions and the membership are etcd's), *pauses*: it closes
every AMQP connection with 320 CONNECTION_FORCED and refuses new ones at
connection.open, until it sees a majority again; it also refuses HTTP API changes
(503). With ``ignore`` it goes on serving whatever it sees. In both modes a node serves
no client before its first sync with etcd, nor after it was forgotten. Health checks
stay per node: they answer for this node whatever the cluster does.

Nothing here reaches into the broker: everything goes through
:class:`amqpd.broker.api.BrokerAPI` (the import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqpd.cluster.dedup_cache import DedupCaches, SharedDedupCache
from amqpd.cluster.definitions import KIND_BINDING, KIND_QUEUE, DefinitionMirror
from amqpd.cluster.delivery_hold import DeliveryHold
from amqpd.cluster.heartbeat import Heartbeats
from amqpd.cluster.leadership import Leadership
from amqpd.cluster.loop_clock import LoopClock
from amqpd.cluster.membership import EtcdReach, Membership, NotAllowed
from amqpd.cluster.node_info import NodeInfoBoard
from amqpd.cluster.node_requests import NodeRequests
from amqpd.cluster.periodic import cancel_all, every
from amqpd.cluster.transient import TransientQueues
from amqpd.cluster.transient_defs import TransientDefinitions
from amqpd.cluster.view import ClusterView, parse_addr
from amqpd.cluster.visibility import DEFINITIONS, QUEUES, TRANSIENT_DEFS
from amqpd.config import host_port, split_addr
from amqpd.coord.etcd import EtcdClient, EtcdError

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QuorumMembership
    from amqpd.config import Settings

log = logging.getLogger("amqpd.cluster")

DECIDE_INTERVAL = 0.1
START_DEADLINE = 10.0  # seconds start() waits for etcd before going on in the background


def _addr(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host_port(host, port)


class Cluster(ClusterView):
    def __init__(self, api: BrokerAPI, settings: Settings) -> None:
        cc = settings.cluster
        # silence is measured on a clock that does not count this loop's own stalls
        self.loop_clock = LoopClock()
        super().__init__(settings.node_name, cc.heartbeat_timeout, clock=self.loop_clock)
        self.api = api
        self.config = cc
        self.cluster_name = cc.name
        self.root = f"{cc.etcd_prefix.rstrip('/')}/{cc.name}"
        self.cookie = cc.shared_cookie(settings.data_dir)
        self.started_at = time.time()
        self.etcd_grace = max(cc.lease_ttl * 0.6, 2.0)
        self.etcd_reach = EtcdReach(self.etcd_grace, self.loop_clock)
        self.etcd = EtcdClient(cc.etcd, timeout=1.0)
        # the lease is renewed from a thread while this loop ticks (loop_hang_timeout)
        self.membership = Membership(self, self.etcd, self.root, cc.lease_ttl, self.record,
                                     settings.data_dir, cc.name, clock=self.loop_clock,
                                     progress=lambda: self.loop_clock.last_tick,
                                     hang_after=cc.loop_hang_timeout)
        self.mirror = DefinitionMirror(self, api, self.etcd, self.root, cc.definition_timeout)
        self.transient = TransientQueues(self, api, self.etcd, self.root)
        self.tdefs = TransientDefinitions(self, api, self.etcd, self.root, cc.lease_ttl,
                                          cc.definition_timeout)
        # replies wait for every linked node to apply their change (0: they do not)
        self.mirror.visible_wait = self.tdefs.visible_wait = cc.visible_wait
        self.transient.visible_wait = cc.visible_wait
        self.heard_at: dict[str, float] = {}  # node -> monotonic time of a real heartbeat
        self.info = NodeInfoBoard(self, self.etcd, self.root)  # what nodes tell each other
        self.requests = NodeRequests(self, self.etcd, self.root)  # what they ask each other
        # dedup exchanges' cluster-wide caches (amqpd/cluster/dedup_cache.py)
        self.dedup = DedupCaches(list(cc.etcd), self.root, settings.node_name,
                                 lambda: self.membership.lease_id, cc.lease_ttl)
        self.subscribe(self.transient.node_changed)  # from the first view change on
        self.heartbeats = Heartbeats(self, cc.name, self.cookie, split_addr(cc.heartbeat_listen),
                                     cc.heartbeat_interval, self.heartbeat_targets)
        # the inter-node link listener's address, once it listens (amqpd/cluster/link.py)
        self.link_address: tuple[str, int] | None = None
        # mirrored queues (amqpd.cluster.mirror.Mirrors), once serve() started them
        self.mirrors: Any = None
        # quorum queues' replica groups (amqpd.cluster.quorum_group.QuorumGroups)
        self.quorum_groups: Any = None
        # replicated streams' groups (amqpd.cluster.stream_group.StreamGroups)
        self.stream_groups: Any = None
        # stream-protocol publishes forwarded to the streams' leaders
        # (amqpd.cluster.forwarded_publish.ForwardedPublishes)
        self.forwarded_publishes: Any = None
        # questions to the other nodes over the links (amqpd.cluster.peer_ask.PeerAsk)
        self.peer_ask: Any = None
        self.pauses = 0
        # whether this node may claim the queues it holds (amqpd/cluster/leadership.py)
        self.leadership = Leadership(self.loop_clock, cc.heartbeat_timeout / 2,
                                     self._may_confirm, self.mirror.read_all)
        # while it doubts, the queues it leads deliver nothing (delivery_hold.py)
        self.delivery_hold = DeliveryHold(self._led_queues)
        self.leadership.on_doubt.append(self.delivery_hold.hold)
        self.leadership.on_confirmed.append(self.delivery_hold.release)
        self._tasks: list[asyncio.Task[None]] = []
        self._refreshes: set[asyncio.Task[None]] = set()  # refresh_queue's reads
        self._sync_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Heartbeats, then join and sync with etcd (up to START_DEADLINE; after that the
        node goes on trying in the background, paused)."""
        self._tasks.append(asyncio.create_task(self.loop_clock.run(), name="cluster-clock"))
        self._tasks.append(asyncio.create_task(self.leadership.run(),
                                               name="cluster-leadership"))
        await self.heartbeats.start()
        self._sync_task = asyncio.create_task(self._first_sync(), name="cluster-first-sync")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._sync_task), START_DEADLINE)
        self._tasks.append(asyncio.create_task(self._decide_loop(), name="cluster-decide"))
        self.decide()

    async def _first_sync(self) -> None:
        delay = 0.2
        while True:
            try:
                await self.membership.start()
                await self.mirror.initial_sync()
                break
            except EtcdError as exc:
                log.warning("cluster: cannot reach etcd to join %r yet: %s", self.cluster_name,
                            exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        # polled from here on (the lease's thread runs since start() registered), and
        # registered again if the lease is lost: deciding the incarnation may take a lease
        self._tasks.append(asyncio.create_task(self.membership.run(), name="cluster-members"))
        while True:
            try:
                await self.tdefs.join()
                break
            except EtcdError as exc:
                log.warning("cluster: cannot read the non-durable definitions yet: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        self.mirror.start()
        self.tdefs.start()
        self.transient.start()
        self.info.start()
        self.requests.start()
        log.info("cluster: node %s in cluster %r with %s", self.node_name, self.cluster_name,
                 ", ".join(sorted(self.members)))

    async def stop(self) -> None:
        await self.mirror.stop()
        await self.tdefs.stop()
        await self.info.stop()
        await self.requests.stop()
        await self.transient.stop()
        await cancel_all(self._tasks,
                         no_wait=[self._sync_task] if self._sync_task else [])
        self._tasks = []
        await self.heartbeats.stop()
        await self.membership.leave()
        await self.dedup.close()
        await self.etcd.close()

    # ------------------------------------------------------------------ records
    def record(self) -> dict[str, Any]:
        """This node's ``nodes/`` record (its fields: the etcd key table in
        docs/clustering.md, "Membership")."""
        api = self.api
        amqp = next((p for proto, _h, p in api.listeners() if proto == "amqp"), 0)
        link = self.config.link_advertise or (
            _addr(*self.link_address) if self.link_address is not None else "")
        heartbeat = self.config.heartbeat_advertise or _addr(*self.heartbeats.address)
        stream = api.stream_address()
        return {"name": self.node_name, "link": link, "heartbeat": heartbeat,
                "amqp_port": amqp, "http_port": api.http_port(), "started": self.started_at,
                # the stream listener as metadata names it ("" when off)
                "stream": _addr(*stream) if stream is not None else "",
                # the incarnation whose non-durable definitions it holds (transient_defs)
                "incarnation": self.tdefs.incarnation,
                # who holds the name: a second process with it is refused at start
                "host": socket.gethostname(), "pid": os.getpid()}

    async def publish_record(self) -> None:
        """Write this node's record again (its link listener started after joining:
        set ``link_address`` first)."""
        await self.membership.update_record()

    def heartbeat(self, node: str) -> None:
        self.heard_at[node] = time.monotonic()
        super().heartbeat(node)

    def heard_since(self, node: str, since: float) -> bool:
        """Has a heartbeat of ``node`` arrived since ``since`` (time.monotonic())?"""
        return self.heard_at.get(node, float("-inf")) >= since

    def heartbeat_targets(self) -> dict[str, tuple[str, int]]:
        out = {}
        for name, rec in self.records.items():
            if name == self.node_name:
                continue
            addr = parse_addr(rec.get("heartbeat"))
            if addr is not None:
                out[name] = addr
        return out

    # ------------------------------------------------------------------ the decision
    def etcd_reachable(self) -> bool:
        """An etcd answer within ``etcd_grace`` of this loop's running time, and the lease
        renewed within its TTL of wall time. The first excuses this node's own stalls (the
        answers waiting in the socket were not late); the second does not: etcd counts the
        lease down on its own clock, and a node whose lease may be gone must stop serving
        before the others act on it. Once lost, it counts as back only after a lease
        renewal (:class:`~amqpd.cluster.membership.EtcdReach`)."""
        m = self.membership
        return self.etcd_reach.check(m.last_ok, m.last_renewal, m.lease_ttl)

    def pause_cause(self) -> str | None:
        """Why this node must not serve clients now; None: it may."""
        if not self.mirror.synced or not self.tdefs.synced:
            return "it has not yet synchronised with the cluster through etcd"
        if self.membership.forgotten:
            return ("it was removed from the cluster (forget_cluster_node); "
                    "`amqpctl join_cluster <member>` joins it again")
        if self.config.partition_handling != "pause_minority":
            return None
        if not self.etcd_reachable():
            return "it cannot reach etcd (cluster_partition_handling = pause_minority)"
        if not self.sees_majority():
            running = [m for m in sorted(self.members) if self.is_running(m)]
            return (f"it sees {len(running)} of {len(self.members)} cluster members "
                    f"({', '.join(running)}): a minority "
                    "(cluster_partition_handling = pause_minority)")
        return None

    def _may_confirm(self) -> bool:
        return self.mirror.synced and not self.paused and self.etcd_reachable()

    def leadership_confirmed(self) -> bool:
        return self.leadership.confirmed()

    def _led_queues(self) -> list[Any]:
        """The queues this node leads as a mirrored or quorum queue's leader."""
        return [lead.q for groups in (self.mirrors, self.quorum_groups)
                if groups is not None for lead in groups.leading.values()]

    def decide(self) -> None:
        cause = self.pause_cause()
        if cause is None and not self.etcd_reachable():
            cause_for_doubt: str | None = "it cannot reach etcd"
        else:
            cause_for_doubt = cause
        if cause_for_doubt is not None:
            self.leadership.doubt(cause_for_doubt)
        if cause is not None and not self.paused:
            self.paused, self.pause_reason = True, cause
            self.pauses += 1
            log.warning("cluster: node %s pauses: %s", self.node_name, cause)
            for session in self.api.sessions():
                self.api.close_connection(session, self.refusal() or cause)
        elif cause is None and self.paused:
            self.paused, self.pause_reason = False, ""
            log.info("cluster: node %s serves clients (sees %d of %d members)",
                     self.node_name, sum(1 for m in self.members if self.is_running(m)),
                     len(self.members))
        elif cause is not None:
            self.pause_reason = cause
        self.check_changes()

    async def _decide_loop(self) -> None:
        await every(DECIDE_INTERVAL, self.decide, log, "cluster: partition decision")

    def refusal(self) -> str | None:
        if not self.paused:
            return None
        return f"node {self.node_name} is paused: {self.pause_reason}"

    # ------------------------------------------------------------------ ClusterStatus
    def records_queue(self, vhost: str, name: str) -> bool:
        return self.catalogue.get((vhost, name)) in (None, self.node_name)

    def definition_recorded(self, kind: int, key: str, body: bytes) -> None:
        self.mirror.recorded(kind, key, body)

    def runs_here(self, key: str) -> bool:
        """The running member ranked first for ``key`` by rendezvous hashing runs it:
        every node computes the same owner from the same view, owners spread over the
        nodes, and a node's loss moves only its own singletons."""
        if self.paused or not self.mirror.synced:
            return False
        running = [n for n in self.members if n == self.node_name or self.is_running(n)]
        if self.node_name not in running:
            return False

        def rank(node: str) -> bytes:
            return hashlib.sha256(f"{node}\0{key}".encode()).digest()

        return max(running, key=rank) == self.node_name

    def transient_declared(self, queue: Any) -> bool:
        return self.transient.declared(queue)

    def transient_binding(self, binding: Any, deleted: bool) -> bool:
        return self.transient.binding_changed(binding, deleted)

    def reply_queue(self, vhost: str, name: str, node: str) -> Any:
        queues = self.queues
        return queues.replies.route(vhost, name, node) if queues is not None else None

    def when_applied(self, watch: int, revision: int, answer: Callable[[], None]) -> None:
        applied = {QUEUES: self.transient.applied, DEFINITIONS: self.mirror.applied,
                   TRANSIENT_DEFS: self.tdefs.applied}.get(watch)
        if applied is not None:
            applied.when(revision, answer)
        else:  # a kind this node does not know: nothing of it to wait for
            answer()

    def node_lost(self, node: str) -> None:
        """The inter-node link to ``node`` went (remote_queue's ``on_link_down``)."""
        self.transient.node_lost(node)

    def transient_recorded(self, kind: int, key: str, body: bytes) -> bool:
        """A non-durable exchange or binding changed here: to etcd, unless the change
        is one a definition from another node caused (that node writes it)."""
        if self.mirror.applying or self.tdefs.applying or not self.tdefs.synced:
            return False
        self.tdefs.recorded(kind, key, body)
        return True

    def dedup_cache(self, vhost: str, exchange: str) -> SharedDedupCache:
        """The cluster-wide cache of a deduplication exchange (issue 32)."""
        return self.dedup.get(vhost, exchange)

    def share_info(self, section: str, value: Any) -> None:
        self.info.share(section, value)

    async def peer_info(self, section: str) -> dict[str, Any]:
        return await self.info.read(section)

    async def ask(self, node: str, kind: str, args: dict[str, Any], timeout: float) -> Any:
        """``node``'s answer to ``kind``: over the link to it when the link is up (one
        round trip, :mod:`amqpd.cluster.peer_ask`), else through etcd's request keys
        (:mod:`amqpd.cluster.node_requests`, answers polled every 50 ms: a node still
        starting, or a link not up yet). The handlers are the same either way; the log
        line is the asker's here, the answering node's through etcd. A link
        that goes down before the answer raises :class:`TimeoutError`, as a request
        unanswered through etcd does: whether the node did the work is not known."""
        asker = self.peer_ask
        if (asker is None or node == self.node_name or not self.is_running(node)
                or not asker.linked(node)):
            return await self.requests.ask(node, kind, args, timeout)
        log.info("cluster: request '%s' %s to node %s over the link", kind, args, node)
        try:
            return await asker.ask(node, kind, args, timeout)
        except ConnectionError as exc:
            raise TimeoutError(f"node '{node}' did not answer '{kind}': {exc}") from exc

    async def ask_running(self, kind: str, args: dict[str, Any], timeout: float,
                          ) -> tuple[dict[str, Any], dict[str, str]]:
        others = sorted(n for n in self.running_nodes() if n != self.node_name)
        if self.peer_ask is None:  # still starting: nobody to ask yet
            return {}, dict.fromkeys(others, "this node is starting")
        answers, missing = await self.peer_ask.ask_every(others, kind, args, timeout)
        return answers, missing

    def refresh_queue(self, vhost: str, name: str, done: Callable[[], None]) -> None:
        async def refresh() -> None:
            try:
                await asyncio.wait_for(self.mirror.refresh(KIND_QUEUE, f"{vhost}\x00{name}"),
                                       self.mirror.timeout)
            except (EtcdError, TimeoutError) as exc:
                log.warning("cluster: queue '%s' in vhost '%s': etcd's record not read "
                            "(%s); declaring it as this node sees it", name, vhost,
                            exc or "timed out")
            done()

        task = asyncio.create_task(refresh(), name="cluster-refresh-queue")
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    def after_queue_gone(self, vhost: str, name: str, callback: Any) -> None:
        self.mirror.after_gone(KIND_QUEUE, f"{vhost}\x00{name}", callback)

    def after_mirrored(self, callback: Any) -> Any:
        return self.mirror.after_mirrored(
            self.tdefs.after_mirrored(self.transient.after_visible(callback)))

    def display_name(self) -> str | None:
        return self.membership.display_name

    async def set_display_name(self, name: str) -> None:
        await self.membership.set_display_name(name)

    async def join(self, via: str) -> dict[str, Any]:
        """``amqpctl join_cluster <via>``: (re)join the cluster ``via`` is a member of."""
        await self.membership.poll()
        if via != self.node_name and via not in self.members:
            raise LookupError(f"node {via} is not a member of cluster {self.cluster_name!r} "
                              f"(members: {', '.join(sorted(self.members)) or 'none'})")
        await self.membership.join()
        await self.membership.poll()
        # etcd's definitions replace what this node held while it was out
        await self.mirror.initial_sync()
        self.decide()
        return self.status()

    async def forget(self, node: str) -> None:
        await self.membership.forget(node)

    def node_entries(self) -> list[dict[str, Any]]:
        out = []
        for name, info in self.nodes().items():
            rec = self.records.get(name, {})
            entry: dict[str, Any] = {
                "name": name, "type": "disc", "running": info.running,
                "partitions": [], "being_drained": False,
                "amqpd_member": name in self.members,
                "amqpd_addresses": {"link": rec.get("link"), "heartbeat": rec.get("heartbeat"),
                                    "amqp_port": info.amqp_port,
                                    "http_port": info.http_port},
            }
            if name == self.node_name:
                entry["partitions"] = self.partitioned_from()
                entry["amqpd_paused"] = self.paused
                entry["amqpd_pause_reason"] = self.pause_reason or None
            elif "started" in rec:
                entry["uptime"] = int((time.time() - float(rec["started"])) * 1000)
            out.append(entry)
        return out

    def status(self) -> dict[str, Any]:
        return {
            "cluster_name": self.display_name() or self.cluster_name,
            "cluster": self.cluster_name,
            "node": self.node_name,
            "disk_nodes": sorted(self.members),
            "running_nodes": self.running_nodes(),
            "partitions": {self.node_name: self.partitioned_from()}
            if self.partitioned_from() else {},
            "partition_handling": self.config.partition_handling,
            "paused": self.paused,
            "pause_reason": self.pause_reason or None,
            "etcd_reachable": self.etcd_reachable(),
            "definitions_revision": self.mirror.revision,
            "definitions_pending": len(self.mirror.pending),
            # this node's own event-loop stalls (left out of failure detection)
            "pauses": self.pauses,
            "loop_stalls": self.loop_clock.stalls,
            "longest_loop_stall": round(self.loop_clock.longest, 3),
        }

    def complete_export(self, data: dict[str, Any], vhost: str | None) -> dict[str, Any]:
        def ident(section: str, item: dict[str, Any]) -> tuple[Any, ...]:
            vh = item.get("vhost", vhost)
            if section == "queues":
                return (vh, item.get("name"))
            return (vh, *sorted((k, repr(v)) for k, v in item.items() if k != "vhost"))

        for section, kind in (("queues", KIND_QUEUE), ("bindings", KIND_BINDING)):
            have = {ident(section, item) for item in data.get(section, [])}
            for item in self.mirror.catalogue_items(kind):
                if vhost is not None and item.get("vhost") != vhost:
                    continue
                if ident(section, item) in have:
                    continue
                if vhost is not None:
                    item = {k: v for k, v in item.items() if k != "vhost"}
                data.setdefault(section, []).append(item)
        return data

    # -- the replicas' facts the management API shows (BrokerAPI asks these) ----------
    def queue_fields(self, vhost: str, name: str, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.mirrors is not None:  # a mirrored queue's mirrors (amqpd.cluster.mirror)
            out.update(self.mirrors.queue_fields(vhost, name))
        if self.quorum_groups is not None and kind == "quorum":
            out.update(self.quorum_groups.queue_fields(vhost, name))
        if self.stream_groups is not None and kind == "stream":
            out.update(self.stream_groups.queue_fields(vhost, name))
        return out

    def quorum_critical(self) -> list[tuple[str, str]]:
        groups = self.quorum_groups
        return list(groups.quorum_critical()) if groups is not None else []

    def mirror_sync_critical(self) -> list[tuple[str, str]]:
        mirrors = self.mirrors
        return list(mirrors.sync_critical()) if mirrors is not None else []

    def quorum_membership(self) -> QuorumMembership | None:
        return self.quorum_groups

    def request_mirror_sync(self, vhost: str, name: str, action: str) -> bool:
        mirrors = self.mirrors
        return mirrors is not None and mirrors.request_sync(vhost, name, action)


__all__ = ["Cluster", "NotAllowed"]
