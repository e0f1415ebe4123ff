"""Membership through etcd: who joined the cluster, who runs now, what the cluster is called.

Keys under ``{etcd_prefix}/{cluster name}/``:

* ``members/<node>``: the node has joined (JSON ``{"name", "joined"}``, no lease). Written
  when a node first starts in the cluster or by ``amqpctl join_cluster``; deleted only
  by ``amqpctl forget_cluster_node`` (refused while that node runs). The members are
  what a majority is counted over.
* ``nodes/<node>``: the node's record (``{name, link, heartbeat, amqp_port, http_port,
  stream, started, ...}``: ``stream`` is its stream protocol listener as metadata
  names it) attached to its lease (``lease_ttl``). Present = the process runs and
  reaches etcd. Revoked on a clean stop, so the others see the node go at once; after
  a kill -9 it expires with the lease (the heartbeats tell sooner).

The lease is renewed every sixth of its TTL from a thread of its own
(:class:`~amqpd.coord.lease.LeaseKeeper`, as the warren's active renews its leader
lease), not from the broker's event loop: a loop starved or busy for longer than the
TTL (issue 28: ~35 s in a quadratic catch-up) let the lease run out, the node paused,
and the others promoted unsynchronised mirrors of the queues it led (a mirror waits
for the lost leader's lease, not only its heartbeats). The thread renews only while
the loop shows progress (``progress``: the ``LoopClock``'s last tick): a loop that ran
nothing for ``hang_after`` seconds (``cluster.loop_hang_timeout``) is hung, not slow,
and its node must not stay present forever while it serves nothing; renewals stop
(logged) and the lease runs out a TTL after the last one. A lease found gone (by the
thread, or by a poll that misses this node's record) is replaced by a new one: the
node registers again.
* ``meta/cluster_name``: the name ``set_cluster_name`` gave the cluster.

A node that once joined keeps a marker (``<data_dir>/cluster.json``). Finding the marker
but not its ``members/`` key at start means it was forgotten while it was down; it then
stays paused (serves no client) until ``amqpctl join_cluster`` makes it a member again,
as a forgotten RabbitMQ node must be reset and joined again.

:meth:`Membership.poll` reads members and records every ``poll_interval``; each answer
refreshes :attr:`last_ok`, as does every other successful etcd call of the node (under
load three sequential reads may each take most of a second: only the gaps between
answers matter). It is kept on the node's ``LoopClock`` (this loop's own stalls are not
etcd's silence); with :attr:`last_renewal` (wall time of the send of the last renewal
that succeeded: the lease is counted down on etcd's clock) it is what "this node
reaches etcd" means to the pause decision. Every etcd call has a deadline (the client's
``timeout``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amqpd.cluster.view import ClusterView
from amqpd.coord.etcd import EtcdClient, EtcdError, Get
from amqpd.coord.lease import LeaseKeeper

log = logging.getLogger("amqpd.cluster.membership")


class EtcdReach:
    """Whether this node may count on etcd (the pause decision's "reaches etcd").

    Reachable: an etcd answer within ``grace`` on the node's loop clock (its own stalls
    excused), and the lease renewed within its TTL of wall time (etcd counts it down on
    its own clock). Once that failed, it holds again only after a lease renewal that
    came after the failure: answers to other calls alone would let a node that was cut
    off serve again on a lease about to run out (its renewal waiting behind a call
    still hanging on the cut), pause again a moment later, and serve again after the
    renewal -- clients would see it flap."""

    def __init__(self, grace: float, clock: Callable[[], float],
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self.clock = clock
        self.wall = wall
        self.lost_at: float | None = None  # wall time of the first failed check

    def check(self, last_ok: float, last_renewal: float, lease_ttl: float) -> bool:
        leased = last_renewal != float("-inf")
        ok = self.clock() - last_ok <= self.grace and (
            not leased or self.wall() - last_renewal <= lease_ttl)
        if ok and self.lost_at is not None and leased and last_renewal <= self.lost_at:
            ok = False  # back, but the lease not yet renewed since it was lost
        if ok:
            self.lost_at = None
        elif self.lost_at is None:
            self.lost_at = self.wall()
        return ok


class NotAllowed(RuntimeError):
    """An operation the cluster's state refuses (the message says why)."""


class NodeNameInUse(ValueError):
    """Another running process holds this node's name in the cluster: refused at start
    (node names must be distinct, as Erlang distribution makes them in RabbitMQ)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Membership:
    def __init__(self, view: ClusterView, etcd: EtcdClient, root: str, lease_ttl: float,
                 record: Callable[[], dict[str, Any]], data_dir: str,
                 cluster_name: str, clock: Callable[[], float] = time.monotonic,
                 progress: Callable[[], float] | None = None,
                 hang_after: float = math.inf) -> None:
        self.view = view
        self.clock = clock  # what last_ok is measured on (LoopClock in a running node)
        self.etcd = etcd
        self.root = root
        self.lease_ttl = lease_ttl
        self.record = record  # this node's nodes/ record, built when written
        self.marker = Path(data_dir) / "cluster.json"
        self.cluster_name = cluster_name
        self.poll_interval = min(0.5, lease_ttl / 6)
        self.lease_id = 0
        self.last_ok = float("-inf")  # clock() of the last etcd answer (any caller's)
        etcd.on_answer = self._answered
        # the loop's last sign of life (time.monotonic()) and how long it may show none
        # before the lease thread stops renewing (None: no such check)
        self.progress = progress
        self.hang_after = hang_after
        self.display_name: str | None = None
        self.forgotten = False
        self._last_error_log = 0.0
        self._registering = asyncio.Lock()
        self._keeper: LeaseKeeper | None = None  # renews lease_id from its thread
        self._lease_lost = False  # the keeper found the lease gone: register again

    def key(self, section: str, name: str = "") -> str:
        return f"{self.root}/{section}/{name}"

    # ------------------------------------------------------------------ joining
    def _marker_says_joined(self) -> bool:
        try:
            data = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("cluster") == self.cluster_name

    def _write_marker(self) -> None:
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cluster": self.cluster_name,
                                   "node": self.view.node_name, "joined": time.time()}))
        tmp.replace(self.marker)

    async def start(self) -> None:
        """Join on first start (or find out that this node was forgotten), register."""
        me = self.view.node_name
        held = await self.etcd.get(self.key("nodes", me))
        if held is not None:
            self._check_name_free(held.json() if held.value else {})
        existing = await self.etcd.get(self.key("members", me))
        if existing is None and self._marker_says_joined():
            self.forgotten = True
            log.error("cluster: this node was removed from cluster %r (forget_cluster_node) "
                      "while it was down; it serves no client until `amqpctl join_cluster "
                      "<member>` joins it again", self.cluster_name)
        elif existing is None:
            await self.join()
        else:
            self._write_marker()
        await self.register()
        await self.poll()

    def _check_name_free(self, rec: dict[str, Any]) -> None:
        """A record of this name under a live lease: ours from before a kill -9 (same
        host, that process gone: its lease just has not run out), or another process's."""
        if not isinstance(rec, dict):
            return
        host, pid = rec.get("host"), rec.get("pid")
        if host == socket.gethostname() and isinstance(pid, int) \
                and (pid == os.getpid() or not _pid_alive(pid)):
            return
        raise NodeNameInUse(
            f"node name {self.view.node_name!r} is in use in cluster {self.cluster_name!r} "
            f"by a running node (host {host}, pid {pid}); every node needs a distinct "
            "node_name")

    async def join(self) -> None:
        me = self.view.node_name
        await self.etcd.put(self.key("members", me),
                            json.dumps({"name": me, "joined": time.time()}))
        self._write_marker()
        self.forgotten = False
        log.info("cluster: node %s joined cluster %r", me, self.cluster_name)

    @property
    def last_renewal(self) -> float:
        """``time.monotonic()`` at the send of the last grant or renewal of the lease that
        succeeded (-inf before the first): etcd cannot expire it before ``lease_ttl``
        after that."""
        keeper = self._keeper
        return keeper.renewed_at if keeper is not None else float("-inf")

    async def register(self) -> None:
        """A fresh lease, its renewal thread, and this node's record under it (one at a
        time: a start, a poll and a record update may each find the lease gone)."""
        async with self._registering:
            sent = time.monotonic()
            # etcd takes whole seconds: rounded up, so that it cannot expire the lease
            # before the ``lease_ttl`` this node counts from its last renewal
            lease = await self.etcd.grant(max(math.ceil(self.lease_ttl), 2))
            self._stop_keeper()
            self.lease_id = lease.id
            self._lease_lost = False
            self._keeper = LeaseKeeper(
                self.etcd.endpoints, lease.id, self.lease_ttl, self.lease_ttl, sent,
                time.monotonic, asyncio.get_running_loop(),
                functools.partial(self._lost, lease.id), what="cluster",
                progress=self.progress, hang_after=self.hang_after).start()
            await self.etcd.put(self.key("nodes", self.view.node_name),
                                json.dumps(self.record()), lease=lease.id)

    def _lost(self, lease: int, reason: str) -> None:
        """The lease thread's report, on the loop: the next poll registers again."""
        if lease != self.lease_id:
            return  # left, or registered again, meanwhile
        log.warning("cluster: this node's etcd lease is lost (%s); registering again",
                    reason)
        self._lease_lost = True

    def _stop_keeper(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()

    async def update_record(self) -> None:
        """Write this node's record again under its lease (an address changed)."""
        if not self.lease_id:
            await self.register()
            return
        await self.etcd.put(self.key("nodes", self.view.node_name),
                            json.dumps(self.record()), lease=self.lease_id)

    async def forget(self, node: str) -> None:
        """Remove a stopped node from the members (RabbitMQ's forget_cluster_node)."""
        if node == self.view.node_name:
            raise NotAllowed("a node cannot forget itself; run forget_cluster_node on "
                             "another member")
        if self.view.is_running(node) or node in self.view.records:
            raise NotAllowed(f"node {node} is running; stop it first")
        if await self.etcd.get(self.key("members", node)) is None:
            raise LookupError(f"node {node} is not a member of cluster {self.cluster_name!r}")
        await self.etcd.delete(self.key("members", node))
        log.warning("cluster: node %s forgotten (removed from the members)", node)
        await self.poll()

    # ------------------------------------------------------------------ the loop
    def _answered(self) -> None:
        self.last_ok = self.clock()

    async def poll(self) -> None:
        members = await self.etcd.get_prefix(self.key("members"))
        records = await self.etcd.get_prefix(self.key("nodes"))
        meta = await self.etcd.txn([], [Get(self.key("meta", "cluster_name"))])
        names = {kv.key.decode().rsplit("/", 1)[-1] for kv in members}
        recs: dict[str, dict[str, Any]] = {}
        for kv in records:
            try:
                rec = kv.json()
            except ValueError:
                continue
            if isinstance(rec, dict):
                recs[kv.key.decode().rsplit("/", 1)[-1]] = rec
        found = meta.responses[0] if meta.responses else []
        self.display_name = found[0].value.decode() if found and found[0].value else None
        self.last_ok = self.clock()
        self.view.update(names, recs)
        if self.lease_id and (self._lease_lost or self.view.node_name not in recs):
            # our lease ran out (etcd out of reach longer than it, or the loop hung):
            # a new one
            if not self._lease_lost:
                log.warning("cluster: this node's etcd lease expired; registering again")
            await self.register()

    async def run(self) -> None:
        """Poll every ``poll_interval`` (the lease is renewed by its thread)."""
        while True:
            try:
                await self.poll()
            except EtcdError as exc:
                self._etcd_error(exc)
            await asyncio.sleep(self.poll_interval)

    def _etcd_error(self, exc: EtcdError) -> None:
        now = time.monotonic()
        if now - self._last_error_log > 5:
            self._last_error_log = now
            log.warning("cluster: etcd out of reach: %s", exc)

    async def set_display_name(self, name: str) -> None:
        await self.etcd.put(self.key("meta", "cluster_name"), name)
        self.display_name = name

    async def leave(self) -> None:
        """A clean stop: revoke the lease, so the record goes at once (still a member)."""
        self._stop_keeper()
        if self.lease_id:
            try:
                await self.etcd.revoke(self.lease_id, timeout=1.0)
            except EtcdError as exc:
                log.info("cluster: lease not revoked (%s); it expires by itself", exc)
            self.lease_id = 0


__all__ = ["Membership", "NotAllowed"]
