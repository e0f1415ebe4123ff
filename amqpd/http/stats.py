"""Message rates for ``message_stats``: a sampler over the brokers' plain counters.

Queues and channels only count (``stat_publish``, ``stat_deliver``, ``stat_ack``); every
``SAMPLE_INTERVAL`` seconds the sampler reads the counters and keeps the per-second rate
since the previous sample, the way RabbitMQ's management agent reports
``publish_details: {"rate": ...}``. Counters of deleted queues are folded into node totals
so the node-wide ``*_total`` metrics never go backwards. Publisher confirms are counted by
channels (``stat_confirm``); a closed channel's last sampled count is folded in the same way.

The node's totals (and its ready/unacked message counts) are also kept for the last
``HISTORY_SECONDS``, one point per sample, so the web UI's overview charts show the last
minutes as soon as it opens. They leave in RabbitMQ's shape when a request asks with
``msg_rates_age``/``lengths_age`` (seconds) and ``msg_rates_incr``/``lengths_incr``:
``publish_details: {"rate", "samples": [{"sample", "timestamp"}...] (newest first),
"avg", "avg_rate"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType

SAMPLE_INTERVAL = 5.0
HISTORY_SECONDS = 600.0  # RabbitMQ's basic rates mode keeps 10 minutes at full detail
COUNTERS = ("stat_publish", "stat_deliver", "stat_ack", "stat_redeliver", "stat_confirm")
QUEUE_COUNTERS = COUNTERS[:4]  # counted by queues; stat_confirm is counted by channels
STAT_NAMES = {"stat_publish": "publish", "stat_deliver": "deliver_get", "stat_ack": "ack",
              "stat_redeliver": "redeliver", "stat_confirm": "confirm"}


class HistoryPoint:
    __slots__ = ("counts", "ready", "timestamp_ms", "unacked")

    def __init__(self, timestamp_ms: int, counts: dict[str, int], ready: int,
                 unacked: int) -> None:
        self.timestamp_ms = timestamp_ms
        self.counts = counts
        self.ready = ready
        self.unacked = unacked


class RateSampler:
    def __init__(self, api: BrokerAPI, interval: float = SAMPLE_INTERVAL) -> None:
        self.api = api
        self.interval = interval
        self._prev: dict[int, tuple[float, dict[str, int]]] = {}
        self.rates: dict[int, dict[str, float]] = {}  # id(object) -> counter -> rate/s
        self.retired: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.node_rates: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self._node_prev: tuple[float, dict[str, int]] | None = None
        self._hooked: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._confirms_seen: dict[int, int] = {}  # id(channel) -> last sampled stat_confirm
        self.history: deque[HistoryPoint] = deque(
            maxlen=max(int(HISTORY_SECONDS / max(interval, 0.1)) + 1, 2))

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
        for name in QUEUE_COUNTERS:
            self.retired[name] += getattr(queue, name, 0)
        self._prev.pop(id(queue), None)
        self.rates.pop(id(queue), None)

    def _objects(self) -> list[Any]:
        objs: list[Any] = []
        api = self.api
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
        for key in [k for k in self._confirms_seen if k not in seen]:
            self.retired["stat_confirm"] += self._confirms_seen.pop(key)  # channel closed
        totals = self.node_totals()
        if self._node_prev is not None and now > self._node_prev[0]:
            dt = now - self._node_prev[0]
            self.node_rates = {n: max(totals[n] - self._node_prev[1][n], 0) / dt
                               for n in COUNTERS}
        self._node_prev = (now, totals)
        ready = unacked = 0
        api = self.api
        for vh in api.vhosts():
            for q in api.queues(vh):
                ready += q.message_count
                unacked += q.unacked_count
        self.history.append(HistoryPoint(int(time.time() * 1000), totals, ready, unacked))

    def node_totals(self) -> dict[str, int]:
        totals = dict(self.retired)
        api = self.api
        for vh in api.vhosts():
            for q in api.queues(vh):
                for n in QUEUE_COUNTERS:
                    totals[n] += getattr(q, n, 0)
        for session in api.sessions():
            for ch in session.channels.values():
                count = getattr(ch, "stat_confirm", 0)
                self._confirms_seen[id(ch)] = count
                totals["stat_confirm"] += count
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

    def overview_stats(self, age: float = 0.0, incr: float = 0.0) -> dict[str, Any]:
        """The node's ``message_stats``; with ``age`` > 0 each ``*_details`` also carries
        the samples of the last ``age`` seconds, one per ``incr`` seconds at most."""
        totals = self.node_totals()
        points = self._points(age, incr)
        out: dict[str, Any] = {}
        for counter, name in STAT_NAMES.items():
            out[name] = totals[counter]
            details: dict[str, Any] = {"rate": round(self.node_rates.get(counter, 0.0), 1)}
            if age > 0:
                details.update(_samples([(p.timestamp_ms, p.counts[counter])
                                         for p in points]))
            out[f"{name}_details"] = details
        out["deliver"] = out["deliver_get"]
        out["deliver_details"] = out["deliver_get_details"]
        return out

    def length_samples(self, age: float, incr: float = 0.0) -> dict[str, dict[str, Any]]:
        """``messages``/``messages_ready``/``messages_unacknowledged`` samples (for
        ``queue_totals`` when a request asks with ``lengths_age``)."""
        points = self._points(age, incr)
        return {
            "messages": _samples([(p.timestamp_ms, p.ready + p.unacked) for p in points]),
            "messages_ready": _samples([(p.timestamp_ms, p.ready) for p in points]),
            "messages_unacknowledged": _samples([(p.timestamp_ms, p.unacked)
                                                 for p in points]),
        }

    def _points(self, age: float, incr: float) -> list[HistoryPoint]:
        if age <= 0 or not self.history:
            return []
        cutoff = self.history[-1].timestamp_ms - int(age * 1000)
        step = int(max(incr, 0.0) * 1000)
        chosen: list[HistoryPoint] = []
        for p in reversed(self.history):  # newest first, as RabbitMQ lists samples
            if p.timestamp_ms < cutoff:
                break
            if step and chosen and chosen[-1].timestamp_ms - p.timestamp_ms < step:
                continue
            chosen.append(p)
        return chosen


def _samples(points: list[tuple[int, int]]) -> dict[str, Any]:
    """RabbitMQ's sample block: the points, their mean, and the mean rate across them."""
    samples = [{"sample": v, "timestamp": t} for t, v in points]
    if len(points) < 2:
        return {"samples": samples, "avg": float(points[0][1]) if points else 0.0,
                "avg_rate": 0.0}
    (t_new, v_new), (t_old, v_old) = points[0], points[-1]
    span = (t_new - t_old) / 1000
    return {"samples": samples, "avg": sum(v for _, v in points) / len(points),
            "avg_rate": round((v_new - v_old) / span, 1) if span > 0 else 0.0}
