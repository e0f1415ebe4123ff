"""The shovel plugin: move messages from a source to a destination, reliably.

Dynamic shovels are ``shovel`` runtime parameters (HTTP API, ``amqpctl set_parameter``,
definitions); static ones come from ``[[shovels]]`` tables in the config file (same keys,
plus ``name`` and ``vhost``). Each runs as one :class:`~plugins.shovel.runner.ShovelRunner`
task; see docs/shovel.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import NotFound
from plugins.shovel import http as shovel_http
from plugins.shovel.params import parse, validate
from plugins.shovel.runner import ShovelRunner

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI
    from amqpd.http.core import Router

log = logging.getLogger("amqpd.shovel")

PLACE_INTERVAL = 0.5  # seconds between checks of which dynamic shovels run here


class ShovelPlugin:
    name = "shovel"

    def __init__(self, api: BrokerAPI) -> None:
        self.api = api
        self.started = False
        self.dynamic: dict[tuple[str, str], ShovelRunner] = {}
        self.static: dict[tuple[str, str], ShovelRunner] = {}
        self._static_started = False
        self._stopping: set[asyncio.Task[None]] = set()
        self._placer: asyncio.Task[None] | None = None
        api.parameters.register("shovel", validate, on_set=self._on_set,
                                   on_clear=self._on_clear)
        api.serve_node_requests("shovel-restart", self.restart_request)
        for i, table in enumerate(getattr(api.settings, "shovels", None) or []):
            spec = dict(table)
            name = str(spec.pop("name", f"static-{i + 1}"))
            vhost = str(spec.pop("vhost", "/"))
            try:
                defn = parse(vhost, name, spec, type_="static")
            except ValueError as exc:
                raise ValueError(f"static shovel {name!r}: {exc}") from None
            self.static[(vhost, name)] = self._runner(defn)

    def _runner(self, defn: Any) -> ShovelRunner:
        s = self.api.settings
        return ShovelRunner(defn, local_uri=self.api.local_uri, node=s.node_name,
                            cluster_name=s.effective_cluster_name,
                            on_completed=self._completed, api=self.api)

    # ------------------------------------------------------------------ parameters
    def _on_set(self, vhost: str, name: str, value: Any) -> None:
        defn = parse(vhost, name, value)
        old = self.dynamic.get((vhost, name))
        alive = old is not None and old.task is not None and not old.task.done()
        if old is not None and old.defn == defn and (alive or not self.started):
            return  # the same definition again (definitions import): leave it running
        runner = self._runner(defn)
        if old is not None:
            # the same shovel, redefined: what it forwarded lately, and which queues
            # took it, still describe the destination's queues (plugins.common.taken)
            runner.seen, runner.taken = old.seen, old.taken
        self._retire(self.dynamic.pop((vhost, name), None))
        self.dynamic[(vhost, name)] = runner
        if self.started and self._placed_here(defn):
            runner.start()

    def _on_clear(self, vhost: str, name: str, value: Any) -> None:
        self._retire(self.dynamic.pop((vhost, name), None))

    def _retire(self, runner: ShovelRunner | None) -> None:
        if runner is None or runner.task is None:
            return
        task = asyncio.get_running_loop().create_task(runner.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _completed(self, runner: ShovelRunner) -> None:
        """src-delete-after reached: a dynamic shovel deletes its parameter (RabbitMQ)."""
        d = runner.defn
        if d.type != "dynamic" or self.dynamic.get((d.vhost, d.name)) is not runner:
            return

        def clear() -> None:
            self.api.parameters.clear("shovel", d.vhost, d.name)  # saved by the store

        asyncio.get_running_loop().call_soon(clear)

    # ------------------------------------------------------------------ cluster
    def _placed_here(self, defn: Any) -> bool:
        """In a cluster one node runs each dynamic shovel (RabbitMQ 3.10 runs dynamic
        shovels under a mirrored supervisor: one node of the cluster, another one when
        that node goes); static shovels are each node's own configuration."""
        return defn.type != "dynamic" or self.api.runs_here(
            f"shovel/{defn.vhost}/{defn.name}")

    async def _place_loop(self) -> None:
        """Follow the cluster's membership: start the dynamic shovels this node now
        runs, stop the ones another node runs now (PLACE_INTERVAL apart)."""
        while self.started:
            self._start_static()
            for runner in list(self.dynamic.values()):
                here = self._placed_here(runner.defn)
                if here and runner.task is None:
                    log.info("shovel '%s' in vhost '%s' runs on this node",
                             runner.defn.name, runner.defn.vhost)
                    runner.start()
                elif not here and runner.task is not None:
                    log.info("shovel '%s' in vhost '%s' runs on another node now",
                             runner.defn.name, runner.defn.vhost)
                    self._retire(runner)  # drains (at most 3 s) without holding the rest
            # what the others list for this node in /api/shovels (written when it changes)
            self.api.share_cluster_info("shovels", [
                r.status() for r in self.dynamic.values() if r.task is not None])
            await asyncio.sleep(PLACE_INTERVAL)

    def _start_static(self) -> None:
        """Start the static shovels once this node serves clients: in a cluster (and
        on a node of several workers, whose workers form one) the node refuses
        connections (320) until it has synchronised, and a static shovel with
        ``reconnect-delay = 0`` would stop for good at that first refusal."""
        if self._static_started or not self.api.serves_clients():
            return
        self._static_started = True
        for runner in self.static.values():
            runner.start()

    # ------------------------------------------------------------------ lookups
    def all_runners(self) -> list[ShovelRunner]:
        """This node's shovels: its static ones and the dynamic ones it runs (in a
        cluster the other nodes' dynamic ones come from ``api.cluster_info``)."""
        return [*self.static.values(),
                *(r for r in self.dynamic.values()
                  if r.task is not None or not self.api.clustered())]

    def find(self, vhost: str, name: str) -> ShovelRunner | None:
        return self.dynamic.get((vhost, name)) or self.static.get((vhost, name))

    async def restart_request(self, args: dict[str, Any]) -> bool:
        """Another node was asked to restart a shovel this node runs (RabbitMQ's
        restart from any node): 404 if it does not run here (any more)."""
        vhost, name = str(args.get("vhost")), str(args.get("name"))
        runner = self.find(vhost, name)
        if runner is None or runner.task is None:
            raise NotFound(f"shovel '{name}' in vhost '{vhost}' does not run on node "
                           f"'{self.api.node_name()}'")
        log.info("shovel '%s' in vhost '%s': restarted at another node's request", name,
                 vhost)
        await runner.restart()
        return True

    # ------------------------------------------------------------------ life cycle
    def http_routes(self, router: Router) -> None:
        shovel_http.routes(router, self)

    async def start(self) -> None:
        self.started = True
        self._start_static()  # a single node: now; in a cluster: from the placement loop
        for runner in self.dynamic.values():
            if self._placed_here(runner.defn):
                runner.start()
        if self.api.clustered():
            self._placer = asyncio.get_running_loop().create_task(
                self._place_loop(), name="shovel placement")

    async def stop(self) -> None:
        self.started = False
        if self._placer is not None:
            self._placer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._placer
            self._placer = None
        await asyncio.gather(*(r.stop() for r in [*self.static.values(),
                                                  *self.dynamic.values()]),
                             *self._stopping, return_exceptions=True)


def create_plugin(api: BrokerAPI) -> ShovelPlugin:
    return ShovelPlugin(api)
