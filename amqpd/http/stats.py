"""Message rates for ``message_stats``: a sampler over the brokers' plain counters.

Queues and channels only count (``stat_publish``, ``stat_deliver``, ``stat_ack``); every
``SAMPLE_INTERVAL`` seconds the sampler reads the counters and keeps the per-second rate
since the previous sample, the way RabbitMQ's management agent reports
``publish_details: {"rate": ...}``. Counters of deleted queues are folded into node totals
so the node-wide ``*_total`` metrics never go backwards. Publisher confirms are counted by
channels (``stat_confirm``); a closed channel's last sampled count is folded in the same way.
Exchanges count what was published to them (``stat_publish_in``) and what they routed out
(``stat_publish_out``, one per queue reached), RabbitMQ's ``publish_in``/``publish_out``;
connections their bytes sent and received (``send_oct``/``recv_oct``).

The node's totals (and its ready/unacked message counts) are also kept for the last
``HISTORY_SECONDS``, one point per sample, so the web UI's overview charts show the last
minutes as soon as it opens. They leave in RabbitMQ's shape when a request asks with
``msg_rates_age``/``lengths_age`` (seconds) and ``msg_rates_incr``/``lengths_incr``:
``publish_details: {"rate", "samples": [{"sample", "timestamp"}...] (newest first),
"avg", "avg_rate"}``. Each queue, channel and connection keeps its own last minute the
same way (:mod:`amqpd.http.object_history`), recorded on the same timer tick.

The node's totals are kept twice: over every queue this process has, and over only the
queues it leads (``led``), leaving out its copies of queues another member leads (a
copy counts a publish it forwards and a delivery it passes on, which the leader counts
too). A workers' node (docs/workers.md) sums its workers' ``led`` figures, so each
message is counted once, by the worker that owns its queue. The timer ticks on the
wall clock's multiples of the interval and stamps each point with that multiple (not the
moment it woke), so the workers' samples carry the same timestamps, the node's HTTP front
can add them up point by point, and consecutive points are exactly an interval apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from amqpd.http.object_history import ObjectHistory, sample_block, window

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI, QueueType

SAMPLE_INTERVAL = 5.0
HISTORY_SECONDS = 600.0  # RabbitMQ's basic rates mode keeps 10 minutes at full detail
COUNTERS = ("stat_publish", "stat_deliver", "stat_ack", "stat_redeliver", "stat_confirm")
QUEUE_COUNTERS = COUNTERS[:4]  # counted by queues; stat_confirm is counted by channels
STAT_NAMES = {"stat_publish": "publish", "stat_deliver": "deliver_get", "stat_ack": "ack",
              "stat_redeliver": "redeliver", "stat_confirm": "confirm"}
COUNTER_NAMES = tuple(STAT_NAMES[c] for c in COUNTERS)
# what an object's history point holds after its timestamp: the counters, then (queues)
# ready and unacked messages, or (connections) bytes sent and received; an exchange's
# point holds its two counters
LENGTHS = ("messages_ready", "messages_unacknowledged")
BYTE_FIELDS = ("send_oct", "recv_oct")
CONN_FIELDS = (*COUNTERS, *BYTE_FIELDS)
EXCHANGE_FIELDS = ("stat_publish_in", "stat_publish_out")
EXCHANGE_NAMES = ("publish_in", "publish_out")  # RabbitMQ's names, in EXCHANGE_FIELDS order


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
        self.retired_led: dict[str, int] = dict.fromkeys(COUNTERS, 0)  # of led queues
        self.node_rates: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self.led_rates: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self._node_prev: tuple[float, dict[str, int], dict[str, int]] | None = None
        self._hooked: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._confirms_seen: dict[int, int] = {}  # id(channel) -> last sampled stat_confirm
        points = max(int(HISTORY_SECONDS / max(interval, 0.1)) + 1, 2)
        self.history: deque[HistoryPoint] = deque(maxlen=points)
        self.led_history: deque[HistoryPoint] = deque(maxlen=points)  # led queues only
        self.objects = ObjectHistory(interval)
        # connections and exchanges: id -> (when, CONN_FIELDS or EXCHANGE_FIELDS values)
        self._counted_prev: dict[int, tuple[float, tuple[int, ...]]] = {}
        self.counted_rates: dict[int, dict[str, float]] = {}  # id -> field -> rate/s

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
            now = time.time()
            delay = self.next_tick(now)
            await asyncio.sleep(delay)
            # stamped with the moment the tick was due (a multiple of the interval), not
            # when the timer woke: ticks woken a hair late would stamp points an interval
            # less a millisecond apart, and a window whose msg_rates_incr is the interval
            # (object_history.window) would then drop every other point
            self.sample(at=now + delay)

    def next_tick(self, now: float) -> float:
        """Seconds until the next multiple of the interval on the wall clock, so every
        worker of a node samples at the same moments (module docstring); at least half
        an interval, so a timer that wakes a hair early does not sample twice at once
        (two points a moment apart would fill the history and make a rate of noise)."""
        delay = self.interval - now % self.interval
        return delay + self.interval if delay < self.interval / 2 else delay

    def _queue_deleted(self, queue: QueueType) -> None:
        for name in QUEUE_COUNTERS:
            self.retired[name] += getattr(queue, name, 0)
            if not queue.forwards_publish:
                self.retired_led[name] += getattr(queue, name, 0)
        self._prev.pop(id(queue), None)
        self.rates.pop(id(queue), None)
        self.objects.forget(id(queue))

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

    def sample(self, at: float | None = None) -> None:
        """One tick: every object's counters, rates and history point, the point stamped
        ``at`` (unix seconds; the tick's due time) or now."""
        now = time.monotonic()
        stamp = round((time.time() if at is None else at) * 1000)
        seen: set[int] = set()
        for obj in self._objects():
            key = id(obj)
            counts = {n: getattr(obj, n, 0) for n in COUNTERS}
            lengths = (getattr(obj, "message_count", 0), getattr(obj, "unacked_count", 0))
            prev = self._prev.get(key)
            if prev is None and not any(counts.values()) and not any(lengths):
                continue  # idle and empty since it was made: no entry (100,000 cost 0)
            seen.add(key)
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                self.rates[key] = {n: max(counts[n] - prev[1][n], 0) / dt for n in COUNTERS}
            self._prev[key] = (now, counts)
            self.objects.record(key, stamp, (*counts.values(), *lengths))
        for key in list(self._prev):
            if key not in seen:
                del self._prev[key]
                self.rates.pop(key, None)
        seen |= self._sample_counted(now, stamp)
        self.objects.retain(seen)
        for key in [k for k in self._confirms_seen if k not in seen]:
            self.retired["stat_confirm"] += self._confirms_seen.pop(key)  # channel closed
        totals, led = self.node_totals(), self.node_totals(led_only=True)
        if self._node_prev is not None and now > self._node_prev[0]:
            dt = now - self._node_prev[0]
            self.node_rates = {n: max(totals[n] - self._node_prev[1][n], 0) / dt
                               for n in COUNTERS}
            self.led_rates = {n: max(led[n] - self._node_prev[2][n], 0) / dt
                              for n in COUNTERS}
        self._node_prev = (now, totals, led)
        ready = unacked = led_ready = led_unacked = 0
        api = self.api
        for vh in api.vhosts():
            for q in api.queues(vh):
                ready += q.message_count
                unacked += q.unacked_count
                if not q.forwards_publish:
                    led_ready += q.message_count
                    led_unacked += q.unacked_count
        self.history.append(HistoryPoint(stamp, totals, ready, unacked))
        self.led_history.append(HistoryPoint(stamp, led, led_ready, led_unacked))

    def _sample_counted(self, now: float, stamp: int) -> set[int]:
        """A point per connection (its channels' counters summed, bytes sent and
        received) and per exchange that was ever published to (in and out)."""
        seen: set[int] = set()
        api = self.api
        for session in api.sessions():
            seen.add(id(session))
            self._record_counted(id(session), now, stamp, CONN_FIELDS,
                                 self.connection_counts(session))
        prev = self._counted_prev
        for vh in api.vhosts():
            for ex in api.exchanges(vh):
                key = id(ex)
                values = (ex.stat_publish_in, ex.stat_publish_out)
                if key not in prev and not values[0]:
                    continue  # never published to: no entry, as for idle queues
                seen.add(key)
                self._record_counted(key, now, stamp, EXCHANGE_FIELDS, values)
        for key in [k for k in prev if k not in seen]:
            del prev[key]
            self.counted_rates.pop(key, None)
        return seen

    def _record_counted(self, key: int, now: float, stamp: int, fields: tuple[str, ...],
                        values: tuple[int, ...]) -> None:
        prev = self._counted_prev.get(key)
        if prev is not None and now > prev[0]:
            dt = now - prev[0]
            self.counted_rates[key] = {n: max(v - prev[1][i], 0) / dt
                                       for i, (n, v) in enumerate(zip(fields, values,
                                                                      strict=True))}
        self._counted_prev[key] = (now, values)
        self.objects.record(key, stamp, values)

    @staticmethod
    def connection_counts(session: Any) -> tuple[int, ...]:
        """CONN_FIELDS of a connection: its open channels' counters, then bytes sent
        and received."""
        channels = list(session.channels.values())
        conn = getattr(session, "conn", None)
        return (*(sum(getattr(ch, n, 0) for ch in channels) for n in COUNTERS),
                getattr(conn, "sent_bytes", 0), getattr(conn, "received_bytes", 0))

    def connection_stats(self, session: Any) -> dict[str, Any]:
        """A connection's ``send_oct``, ``recv_oct`` and ``message_stats`` (its channels'
        sums: amqpd's own, RabbitMQ's connections carry only byte counts), each with its
        rate."""
        rates = self.counted_rates.get(id(session), {})
        values = dict(zip(CONN_FIELDS, self.connection_counts(session), strict=True))
        stats: dict[str, Any] = {}
        for counter in ("stat_publish", "stat_deliver", "stat_ack", "stat_confirm"):
            name = STAT_NAMES[counter]
            stats[name] = values[counter]
            stats[f"{name}_details"] = {"rate": round(rates.get(counter, 0.0), 1)}
        out: dict[str, Any] = {"message_stats": stats}
        for field in BYTE_FIELDS:
            out[field] = values[field]
            out[f"{field}_details"] = {"rate": round(rates.get(field, 0.0), 1)}
        return out

    def exchange_stats(self, exchange: Any) -> dict[str, Any] | None:
        """An exchange's ``message_stats`` as RabbitMQ 3.10.8 gives them: ``publish_in``
        once something was published to it, ``publish_out`` once it routed something
        (each with its rate); None for an exchange never published to (RabbitMQ leaves
        the key out then)."""
        rates = self.counted_rates.get(id(exchange), {})
        out: dict[str, Any] = {}
        for field, name in zip(EXCHANGE_FIELDS, EXCHANGE_NAMES, strict=True):
            count = getattr(exchange, field)
            if count:
                out[name] = count
                out[f"{name}_details"] = {"rate": round(rates.get(field, 0.0), 1)}
        return out or None

    def add_samples(self, obj: Any, view: dict[str, Any], rates: tuple[float, float],
                    lengths: tuple[float, float] = (0.0, 0.0),
                    data: tuple[float, float] = (0.0, 0.0),
                    names: tuple[str, ...] = COUNTER_NAMES) -> None:
        """Put an object's history into its JSON ``view`` as RabbitMQ does: ``rates``
        (``msg_rates_age``, ``msg_rates_incr``) into ``message_stats.*_details`` (the
        counters of its points, by their RabbitMQ ``names``: EXCHANGE_NAMES for an
        exchange), ``lengths`` (``lengths_age``, ``lengths_incr``) into a queue's
        ``messages*_details``, ``data`` (``data_rates_age``, ``data_rates_incr``) into a
        connection's ``send_oct_details`` and ``recv_oct_details``."""
        key = id(obj)
        stats = view.get("message_stats")
        if rates[0] > 0 and isinstance(stats, dict):
            for i, name in enumerate(names):
                details = stats.get(f"{name}_details")
                if isinstance(details, dict):
                    details.update(self.objects.samples(key, i, *rates))
        if data[0] > 0:
            for field in BYTE_FIELDS:
                if f"{field}_details" in view:
                    view[f"{field}_details"].update(
                        self.objects.samples(key, CONN_FIELDS.index(field), *data))
        if lengths[0] > 0 and "messages_ready_details" in view:
            ready = self.objects.samples(key, len(COUNTERS), *lengths)
            unacked = self.objects.samples(key, len(COUNTERS) + 1, *lengths)
            view["messages_ready_details"].update(ready)
            view["messages_unacknowledged_details"].update(unacked)
            total = [(r["timestamp"], r["sample"] + u["sample"])
                     for r, u in zip(ready["samples"], unacked["samples"], strict=True)]
            view["messages_details"].update(sample_block(total))

    def node_totals(self, led_only: bool = False) -> dict[str, int]:
        """The node's counters: its queues' (``led_only``: the queues it leads, see the
        module docstring), deleted ones' included, and its channels' confirms."""
        totals = dict(self.retired_led if led_only else self.retired)
        api = self.api
        for vh in api.vhosts():
            for q in api.queues(vh):
                if led_only and q.forwards_publish:
                    continue
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

    def overview_stats(self, age: float = 0.0, incr: float = 0.0,
                       led_only: bool = False) -> dict[str, Any]:
        """The node's ``message_stats``; with ``age`` > 0 each ``*_details`` also carries
        the samples of the last ``age`` seconds, one per ``incr`` seconds at most;
        ``led_only``: of the queues this node leads (module docstring)."""
        totals = self.node_totals(led_only)
        points = self._points(age, incr, led_only)
        rates = self.led_rates if led_only else self.node_rates
        out: dict[str, Any] = {}
        for counter, name in STAT_NAMES.items():
            out[name] = totals[counter]
            details: dict[str, Any] = {"rate": round(rates.get(counter, 0.0), 1)}
            if age > 0:
                details.update(sample_block([(p.timestamp_ms, p.counts[counter])
                                         for p in points]))
            out[f"{name}_details"] = details
        out["deliver"] = out["deliver_get"]
        out["deliver_details"] = out["deliver_get_details"]
        return out

    def length_samples(self, age: float, incr: float = 0.0,
                       led_only: bool = False) -> dict[str, dict[str, Any]]:
        """``messages``/``messages_ready``/``messages_unacknowledged`` samples (for
        ``queue_totals`` when a request asks with ``lengths_age``)."""
        points = self._points(age, incr, led_only)
        return {
            "messages": sample_block([(p.timestamp_ms, p.ready + p.unacked) for p in points]),
            "messages_ready": sample_block([(p.timestamp_ms, p.ready) for p in points]),
            "messages_unacknowledged": sample_block([(p.timestamp_ms, p.unacked)
                                                 for p in points]),
        }

    def _points(self, age: float, incr: float, led_only: bool = False) -> list[HistoryPoint]:
        history = self.led_history if led_only else self.history
        return window(reversed(history), age, incr, lambda p: p.timestamp_ms)
