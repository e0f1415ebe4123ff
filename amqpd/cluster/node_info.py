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

from amqpd.cluster.leased_push import LeasedPush
from amqpd.cluster.periodic import cancel_all
from amqpd.coord.etcd import EtcdClient, EtcdError

if TYPE_CHECKING:
    from amqpd.cluster.node import Cluster

log = logging.getLogger("amqpd.cluster")


class NodeInfoBoard(LeasedPush[str]):
    def __init__(self, cluster: Cluster, etcd: EtcdClient, root: str) -> None:
        self.cluster = cluster
        self.etcd = etcd
        self.prefix = root + "/info/"
        self.mine: dict[str, str] = {}  # section -> JSON, as last shared
        self.pending: dict[str, str | None] = {}
        self.lease = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _key(self, section: str, node: str) -> str:
        return (self.prefix + urllib.parse.quote(section, safe="") + "/"
                + urllib.parse.quote(node, safe=""))

    def share(self, section: str, value: Any) -> None:
        """This node's ``section`` is ``value`` now (written to etcd if it changed)."""
        self._keep(section, json.dumps(value, sort_keys=True, separators=(",", ":"),
                                       default=str))

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

    def _etcd_key(self, section: str) -> str:
        return self._key(section, self.cluster.node_name)

    def _not_written(self, section: str, exc: EtcdError) -> None:
        log.info("cluster: this node's %s not yet in etcd: %s", section, exc)

    def start(self) -> None:
        self._task = asyncio.create_task(self._push_loop(), name="cluster-node-info")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None


__all__ = ["NodeInfoBoard"]
