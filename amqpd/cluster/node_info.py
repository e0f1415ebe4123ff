"""Facts each node publishes for the others to read: a small JSON document per section
(``shovels``: the dynamic shovels it runs, for ``/api/shovels``), so that any node can
answer with the whole cluster's, as RabbitMQ's nodes answer for each other over Erlang
RPC.

One etcd key per section and node, attached to the node's lease::

    {etcd_prefix}/{cluster}/info/{section}/{node}

so a node that stops or dies takes its facts with it (the readers also leave out a node
the view does not see running, whose lease has not run out yet). A node writes a section
only when its content changed, and again under a new lease. Reading is one range read
at the moment of the question: nothing is cached, nothing to keep in sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from typing import TYPE_CHECKING, Any

from amqpd.coord.etcd import EtcdClient, EtcdError

if TYPE_CHECKING:
    from amqpd.cluster.node import Cluster

log = logging.getLogger("amqpd.cluster")


class NodeInfoBoard:
    def __init__(self, cluster: Cluster, etcd: EtcdClient, root: str) -> None:
        self.cluster = cluster
        self.etcd = etcd
        self.prefix = root + "/info/"
        self.mine: dict[str, str] = {}  # section -> JSON, as last shared
        self.pending: set[str] = set()
        self.lease = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _key(self, section: str, node: str) -> str:
        return (self.prefix + urllib.parse.quote(section, safe="") + "/"
                + urllib.parse.quote(node, safe=""))

    def share(self, section: str, value: Any) -> None:
        """This node's ``section`` is ``value`` now (written to etcd if it changed)."""
        body = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        if self.mine.get(section) != body:
            self.mine[section] = body
            self.pending.add(section)
            self._wake.set()

    async def read(self, section: str) -> dict[str, Any]:
        """Every other running node's ``section``, by node name ({} while etcd is out
        of reach: the caller answers with what this node knows)."""
        out: dict[str, Any] = {}
        base = self.prefix + urllib.parse.quote(section, safe="") + "/"
        try:
            kvs = await self.etcd.get_prefix(base)
        except EtcdError as exc:
            log.warning("cluster: the other nodes' %s cannot be read: %s", section, exc)
            return out
        for kv in kvs:
            node = urllib.parse.unquote(kv.key.decode()[len(base):])
            if node == self.cluster.node_name or not self.cluster.is_running(node):
                continue
            with contextlib.suppress(ValueError):
                out[node] = kv.json()
        return out

    async def _push_loop(self) -> None:
        backoff = 0.1
        while True:
            lease = self.cluster.membership.lease_id
            if lease and lease != self.lease:
                self.pending |= set(self.mine)  # a new lease: every section again
                self.lease = lease
            if not self.pending or not lease:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                continue
            section = next(iter(self.pending))
            body = self.mine[section]
            try:
                await self.etcd.put(self._key(section, self.cluster.node_name), body,
                                    lease=lease)
            except EtcdError as exc:
                log.info("cluster: this node's %s not yet in etcd: %s", section, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            if self.mine.get(section) == body:
                self.pending.discard(section)

    def start(self) -> None:
        self._task = asyncio.create_task(self._push_loop(), name="cluster-node-info")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


__all__ = ["NodeInfoBoard"]
