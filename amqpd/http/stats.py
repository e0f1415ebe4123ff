"""Message rates for ``message_stats``: a sampler over the brokers' plain counters.

Queues and channels only count (``stat_publish``, ``stat_deliver``, ``stat_ack``); every
``SAMPLE_INTERVAL`` seconds the sampler reads the counters and keeps the per-second rate
since the previous sample, the way RabbitMQ's management agent reports
``publish_details: {"rate": ...}``. Counters of deleted queues are folded into node totals
so the node-wide ``*_total`` metrics never go backwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.broker.api import Broker, QueueType

SAMPLE_INTERVAL = 5.0
COUNTERS = ("stat_publish", "stat_deliver", "stat_ack", "stat_redeliver")
STAT_NAMES = {"stat_publish": "publish", "stat_deliver": "deliver_get", "stat_ack": "ack",
              "stat_redeliver": "redeliver"}


class RateSampler:
    def __init__(self, broker: Broker, interval: float = SAMPLE_INTERVAL) -> None:
        self.broker = broker
        self.interval = interval
        self._prev: dict[int, tuple[float, dict[str, int]]] = {}
        self.rates: dict[int, dict[str, float]] = {}  # id(object) -> counter -> rate/s
        self.retired: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.node_rates: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self._node_prev: tuple[float, dict[str, int]] | None = None
        self._hooked: set[int] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    def _queue_deleted(self, queue: QueueType) -> None:
        for name in COUNTERS:
            self.retired[name] += getattr(queue, name, 0)
        self._prev.pop(id(queue), None)
        self.rates.pop(id(queue), None)

    def _objects(self) -> list[Any]:
        objs: list[Any] = []
        api = self.broker.api
        for vh in api.vhosts():
            if id(vh) not in self._hooked:
                self._hooked.add(id(vh))
                api.on_queue_deleted(vh, self._queue_deleted)
            objs.extend(api.queues(vh))
        for session in api.sessions():
            objs.extend(session.channels.values())
        return objs

    def sample(self) -> None:
        now = time.monotonic()
        seen: set[int] = set()
        for obj in self._objects():
            key = id(obj)
            counts = {n: getattr(obj, n, 0) for n in COUNTERS}
            prev = self._prev.get(key)
            if prev is None and not any(counts.values()):
                continue  # idle since it was made: no entry (100,000 idle queues cost 0)
            seen.add(key)
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                self.rates[key] = {n: max(counts[n] - prev[1][n], 0) / dt for n in COUNTERS}
            self._prev[key] = (now, counts)
        for key in list(self._prev):
            if key not in seen:
                del self._prev[key]
                self.rates.pop(key, None)
        totals = self.node_totals()
        if self._node_prev is not None and now > self._node_prev[0]:
            dt = now - self._node_prev[0]
            self.node_rates = {n: max(totals[n] - self._node_prev[1][n], 0) / dt
                               for n in COUNTERS}
        self._node_prev = (now, totals)

    def node_totals(self) -> dict[str, int]:
        totals = dict(self.retired)
        api = self.broker.api
        for vh in api.vhosts():
            for q in api.queues(vh):
                for n in COUNTERS:
                    totals[n] += getattr(q, n, 0)
        return totals

    def message_stats(self, obj: Any) -> dict[str, Any]:
        rates = self.rates.get(id(obj), {})
        out: dict[str, Any] = {}
        for counter, name in STAT_NAMES.items():
            if not hasattr(obj, counter):
                continue
            out[name] = getattr(obj, counter)
            out[f"{name}_details"] = {"rate": round(rates.get(counter, 0.0), 1)}
        if "deliver_get" in out:
            out["deliver"] = out["deliver_get"]
            out["deliver_details"] = out["deliver_get_details"]
        return out

    def overview_stats(self) -> dict[str, Any]:
        totals = self.node_totals()
        out: dict[str, Any] = {}
        for counter, name in STAT_NAMES.items():
            out[name] = totals[counter]
            out[f"{name}_details"] = {"rate": round(self.node_rates.get(counter, 0.0), 1)}
        out["deliver"] = out["deliver_get"]
        out["deliver_details"] = out["deliver_get_details"]
        return out
