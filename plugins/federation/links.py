"""The supervisor: which exchanges and queues are federated, and their running links.

The truth is computed, not tracked: :meth:`Supervisor.desired` walks every vhost's
exchanges and queues, reads the policy applied to each (``obj.policy``) and resolves its
``federation-upstream`` / ``federation-upstream-set`` into upstreams. :meth:`reconcile`
then starts the links that should run, stops those that should not, and restarts any
whose upstream definition changed. It runs when a federation parameter changes, when a
policy is (re)applied to an object, and once a second as a safety net (an exchange
deleted, a vhost removed). Objects that federation itself creates on an upstream
(``x-internal-purpose``, the ``x-federation-upstream`` type) are never federated.

In a cluster (issue 15) each link runs on one node, as in RabbitMQ 3.10: a federated
queue's links on the node that leads the queue (other nodes hold a remote stand-in and
skip it), a federated exchange's links on the one node :meth:`BrokerAPI.runs_here`
picks for it (a supervisor that is mirrored across the cluster in RabbitMQ); the
once-a-second reconcile moves them when a node goes or comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from plugins.federation.base import Link
from plugins.federation.exchange_link import ExchangeLink
from plugins.federation.params import (
    UPSTREAM,
    UPSTREAM_PATTERN,
    UPSTREAM_SET,
    Upstream,
    resolve,
)
from plugins.federation.queue_link import QueueLink
from plugins.federation.upstream_exchange import TYPE_NAME

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, Exchange, QueueType, VHost

log = logging.getLogger("amqpd.federation")

LinkKey = tuple[str, str, str, str]  # (kind, vhost, object name, upstream name)
RECONCILE_INTERVAL = 1.0


def _federated(policy: dict[str, Any] | None) -> bool:
    if not policy:
        return False
    return any(key in policy for key in (UPSTREAM, UPSTREAM_SET, UPSTREAM_PATTERN))


def _internal(obj: Exchange | QueueType) -> bool:
    return "x-internal-purpose" in obj.arguments or getattr(obj, "type_name", "") == TYPE_NAME


class Supervisor:
    def __init__(self, api: BrokerAPI) -> None:
        self.api = api
        self.links: dict[LinkKey, Link] = {}
        self._running = False
        self._dirty: asyncio.Event | None = None  # created in start(), inside the loop
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ triggers
    def schedule(self) -> None:
        if self._dirty is not None:
            self._dirty.set()

    def on_policy_applied(self, _vhost: VHost, obj: Exchange | QueueType) -> None:
        if _federated(obj.policy) or any(k[2] == obj.name for k in self.links):
            self.schedule()

    def on_binding_changed(self, exchange: Exchange) -> None:
        for (kind, vhost, name, _up), link in self.links.items():
            if kind == "exchange" and name == exchange.name and vhost == exchange.vhost:
                link.wake()

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        self._running = True
        self._dirty = asyncio.Event()
        self._dirty.set()
        self._task = asyncio.create_task(self._loop(), name="federation supervisor")

    async def stop(self) -> None:
        self._running = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)

    async def _loop(self) -> None:
        assert self._dirty is not None
        while self._running:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), RECONCILE_INTERVAL)
            self._dirty.clear()
            try:
                await self.reconcile()
            except Exception:
                log.exception("federation: reconcile failed")
            # what the other nodes list for this one in /api/federation-links (sent on
            # when it changed, as the shovels' statuses: amqpd/cluster/node_info.py)
            self.api.share_cluster_info("federation-links", self.status())

    # ------------------------------------------------------------------ reconcile
    def desired(self, here_only: bool = True) -> dict[LinkKey, tuple[type[Link], Upstream]]:
        """The links this node should run; with ``here_only`` False, every link of the
        cluster (a link that only moves to another node must not clean up upstream)."""
        api = self.api
        params = api.parameters
        out: dict[LinkKey, tuple[type[Link], Upstream]] = {}
        for vh in api.vhosts():
            api.on_binding_changed(vh, self.on_binding_changed)
            for ex in api.exchanges(vh):
                if ex.name and _federated(ex.policy) and not _internal(ex) \
                        and (not here_only or api.runs_here(f"federation/{vh.name}/{ex.name}")):
                    for up in resolve(params, vh.name, ex.policy):
                        out[("exchange", vh.name, ex.name, up.name)] = (ExchangeLink, up)
            for q in api.queues(vh):
                # a queue led by another node: its link runs there
                if _federated(q.policy) and not _internal(q) and \
                        (not here_only or not q.forwards_publish):
                    for up in resolve(params, vh.name, q.policy):
                        out[("queue", vh.name, q.name, up.name)] = (QueueLink, up)
        return out

    async def reconcile(self) -> None:
        desired = self.desired()
        stale = [key for key, link in self.links.items()
                 if key not in desired or desired[key][1] != link.upstream]
        anywhere = self.desired(here_only=False) if stale else {}
        for key in stale:
            link = self.links.pop(key)
            log.info("federation link stopping: %s", link.key)
            # upstream objects go only when the object is no longer federated at all: a
            # link moving to another node of the cluster leaves its upstream queue (and the
            # messages waiting there) to the node that takes it over
            await link.stop(cleanup=key not in anywhere)
        for key, (cls, upstream) in desired.items():
            if key not in self.links and self._running:
                link = cls(self, key[1], key[2], upstream)
                self.links[key] = link
                link.start()

    async def restart(self, link_id: str, vhost: str | None = None) -> bool:
        """Restart one link by its status ``id`` (RabbitMQ's restart_federation_link)."""
        for key, link in list(self.links.items()):
            if link.link_id == link_id and (vhost is None or key[1] == vhost):
                await link.stop()
                fresh = type(link)(self, key[1], key[2], link.upstream)
                if self.links.get(key) is link and self._running:
                    self.links[key] = fresh
                    fresh.start()
                return True
        return False

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [link.status_info() for key, link in sorted(self.links.items())
                if vhost is None or key[1] == vhost]
