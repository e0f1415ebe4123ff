"""Non-durable exchanges and non-durable bindings, cluster-wide (RabbitMQ 3.10 keeps them
in RAM tables replicated to every node).

What RabbitMQ does, and so what this does: an exchange declared with ``durable=false``
on any node is known on every node (passive declare, publish through it, bind to and
from it, ``/api/exchanges``); it stays while **any** node of the cluster runs (the loss
of the node that declared it changes nothing; auto-delete still applies) and is gone
after a restart of the whole cluster. A binding that is not durable (its source or
destination is a non-durable exchange) is cluster-wide the same way and goes with its
exchange. Definitions export leaves them out, as RabbitMQ does. (A binding *to* a
non-durable or exclusive queue travels with that queue instead, under its node's lease:
:mod:`amqpd.cluster.transient`.)

How: the same machinery as the durable definitions (:class:`DefinitionMirror`: ordered
pushes, guarded creates, echo suppression, read-then-watch), under keys of their own::

    {etcd_prefix}/{cluster}/tdefs/incarnation             the cluster's incarnation (N)
    {etcd_prefix}/{cluster}/tdefs/{N:012d}/{kind}/{key}   the entries of incarnation N

They cannot hang off one node's lease (they must outlive the declaring node), so what
ends them is the **incarnation**: a node that starts while no node of the current
incarnation runs starts a new one (a guarded increment of ``incarnation``) and deletes
the entries of every older one; a node that finds a node of the current incarnation
running joins it and reads its entries. "Running" is judged from the other nodes'
records (``nodes/``, under their leases; each names the incarnation its node is in):
a heartbeat from one of them (a record of this host whose process is gone counts as
dead at once), else the record staying in etcd longer than a lease (a node whose
heartbeats cannot reach us but that keeps its lease alive runs). So a full restart,
after a clean stop or a ``kill -9`` of every node, finds nothing; a rolling restart
keeps everything. Two nodes starting at once race on the guarded increment: the loser
joins the winner's incarnation.

A node that learns of a newer incarnation while running (it was cut off from every
other node and etcd while the rest of the cluster restarted) drops what it holds of the
old one and follows.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

from amqpd.cluster.definitions import (
    KIND_EXCHANGE,
    DefinitionMirror,
    Ident,
)
from amqpd.cluster.membership import _pid_alive
from amqpd.cluster.visibility import TRANSIENT_DEFS
from amqpd.coord.etcd import Compare, EtcdError, Put, WatchCompacted

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.cluster.node import Cluster
    from amqpd.coord.etcd import EtcdClient

log = logging.getLogger("amqpd.cluster.definitions")

JOIN_TRIES = 5


def _incarnation_dir(n: int) -> str:
    return f"{n:012d}"  # zero-padded: etcd's key order is the incarnations' order


class TransientDefinitions(DefinitionMirror):
    watch = TRANSIENT_DEFS  # its kind in a SYNC (amqpd.cluster.visibility)

    def __init__(self, cluster: Cluster, api: BrokerAPI, etcd: EtcdClient, root: str,
                 lease_ttl: float, timeout: float | None = None) -> None:
        super().__init__(cluster, api, etcd, root, timeout)
        self.cluster = cluster
        self.root = root
        self.base = root + "/tdefs/"
        self.incarnation_key = self.base + "incarnation"  # after every "<digits>/" key
        self.lease_ttl = lease_ttl
        self.incarnation: int | None = None  # None until join() decided
        self.prefix = self.base + "unset/"

    def local_entries(self) -> dict[Ident, bytes]:
        return self.api.transient_definition_entries()

    # ------------------------------------------------------------------ incarnation
    def _use(self, n: int) -> None:
        self.incarnation = n
        self.prefix = self.base + _incarnation_dir(n) + "/"

    async def join(self) -> None:
        """Join the running cluster's incarnation, or start a new one (module
        docstring), then read its entries."""
        for _ in range(JOIN_TRIES):
            kv = await self.etcd.get(self.incarnation_key)
            current = int(kv.value) if kv is not None and kv.value.isdigit() else 0
            if await self._incarnation_runs(current):
                self._use(current)
                log.info("cluster: joining incarnation %d of the cluster (its non-durable "
                         "exchanges and bindings are kept)", current)
                break
            guard = (Compare("mod", self.incarnation_key, "==", kv.mod_revision)
                     if kv is not None else Compare("create", self.incarnation_key, "==", 0))
            # this node's record names the new incarnation in the same transaction, so
            # a node that starts next sees it running there (and does not start yet
            # another incarnation)
            record = dict(self.cluster.record(), incarnation=current + 1)
            result = await self.etcd.txn([guard], [
                Put(self.incarnation_key, str(current + 1)),
                Put(self.root + "/nodes/" + self.cluster.node_name, json.dumps(record),
                    lease=self.cluster.membership.lease_id)])
            if result.succeeded:
                self._use(current + 1)
                # every older incarnation's entries go (etcd key order = number order)
                await self.etcd.call("kv/deleterange", {
                    "key": base64.b64encode(self.base.encode()).decode(),
                    "range_end": base64.b64encode(self.prefix.encode()).decode()})
                log.info("cluster: no node of incarnation %d runs: this node starts "
                         "incarnation %d (non-durable exchanges and bindings of the "
                         "previous run are gone)", current, current + 1)
                break
            # another node started a new incarnation just now: join it
            kv = await self.etcd.get(self.incarnation_key)
            if kv is not None and kv.value.isdigit():
                self._use(int(kv.value))
                break
        if self.incarnation is None:
            raise EtcdError("cluster: the incarnation kept changing while joining")
        await self.cluster.publish_record()  # the record names the incarnation now
        revision, kvs = await self.etcd.range_prefix(self.prefix)
        self._resync(revision, kvs, first=not self.synced)
        self.synced = True

    async def _incarnation_runs(self, n: int) -> bool:
        """Does a node of incarnation ``n`` (other than this one) run?"""
        me = self.cluster.node_name
        records_key = self.root + "/nodes/"

        async def candidates() -> set[str]:
            out = set()
            for kv in await self.etcd.get_prefix(records_key):
                name = kv.key.decode().rsplit("/", 1)[-1]
                try:
                    rec = kv.json()
                except ValueError:
                    continue
                if name == me or not isinstance(rec, dict) or rec.get("incarnation") != n:
                    continue
                if rec.get("host") == socket.gethostname() and isinstance(rec.get("pid"), int) \
                        and rec["pid"] != os.getpid() and not _pid_alive(rec["pid"]):
                    continue  # a process of this host that is gone (its lease lingers)
                out.add(name)
            return out

        if n == 0:
            return False
        started = time.monotonic()
        left = await candidates()
        deadline = started + self.lease_ttl + 1.0
        next_read = started + 0.5
        while left:
            if any(self.cluster.heard_since(node, started) for node in left):
                return True
            now = time.monotonic()
            if now >= deadline:
                # their leases are kept alive although no heartbeat reaches us: they run
                log.warning("cluster: nodes %s of incarnation %d keep their etcd leases "
                            "but send no heartbeat here; taking them as running",
                            ", ".join(sorted(left)), n)
                return True
            if now >= next_read:
                left = await candidates()
                next_read = now + 0.5
            await asyncio.sleep(0.05)
        return False

    # ------------------------------------------------------------------ etcd -> local
    def _apply_remote(self, ident: Ident, value: bytes | None, rev: int) -> None:
        super()._apply_remote(ident, value, rev)
        if ident[0] == KIND_EXCHANGE and value:
            vhost, _, name = ident[1].partition("\x00")
            # bindings of the others' non-durable queues waiting for this exchange
            self.cluster.transient.exchange_known(vhost, name)

    async def _watch_loop(self) -> None:
        """Watch the incarnation's entries and the incarnation key (a newer incarnation:
        follow it, dropping what this node holds of the old one)."""
        while True:
            try:
                async for events in self.etcd.watch_prefix(self.base, self.revision + 1):
                    for ev in events:
                        key = ev.kv.key
                        if key == self.incarnation_key.encode():
                            if self._incarnation_changed(ev.kv.value):
                                raise _NewIncarnation
                            continue
                        ident = self.parse_key(key)
                        if ident is not None:
                            self._event(ident, None if ev.deleted else ev.kv.value,
                                        ev.kv.mod_revision)
                    self.revision = max(self.revision, events[-1].kv.mod_revision)
                    self.applied.advance(self.revision)
            except asyncio.CancelledError:
                raise
            except _NewIncarnation:
                pass  # read the new one (what it does not hold is dropped here)
            except (EtcdError, ValueError) as exc:
                if not isinstance(exc, WatchCompacted):
                    log.info("cluster: non-durable definitions watch ended (%s); reading "
                             "etcd again", exc)
            await asyncio.sleep(0.2)
            with contextlib.suppress(EtcdError):
                kv = await self.etcd.get(self.incarnation_key)
                if kv is not None and kv.value:
                    self._incarnation_changed(kv.value)
                revision, kvs = await self.etcd.range_prefix(self.prefix)
                self._resync(revision, kvs, first=False)

    def _incarnation_changed(self, value: bytes) -> bool:
        if not value.isdigit() or int(value) == self.incarnation:
            return False
        log.warning("cluster: the cluster started incarnation %s without this node: its "
                    "non-durable exchanges and bindings of incarnation %s are dropped",
                    value.decode(), self.incarnation)
        self._use(int(value))  # (changes still pending here go to the new one)
        asyncio.get_running_loop().create_task(self.cluster.publish_record())
        return True


class _NewIncarnation(Exception):
    """The watch saw a newer incarnation: read it whole."""


__all__ = ["TransientDefinitions"]
