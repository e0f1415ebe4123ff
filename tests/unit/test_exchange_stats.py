"""The rate sampler's view of exchanges (amqpd.http.stats): RabbitMQ 3.10.8's shape of
``message_stats`` for an exchange, and the history points it keeps, driven by hand over
real exchange objects and a stand-in for the broker API (no broker, no timer)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from amqpd.broker.exchanges.direct import DirectExchange
from amqpd.http import stats as stats_module
from amqpd.http.stats import RateSampler


class Clock:
    """Stands in for the ``time`` module the sampler reads: moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now


class FakeAPI:
    """What the sampler asks of BrokerAPI, over one vhost's exchanges and nothing else."""

    def __init__(self, exchanges: list[Any]) -> None:
        self.vhost = object()
        self.exchange_list = exchanges

    def vhosts(self) -> list[Any]:
        return [self.vhost]

    def queues(self, vh: Any) -> list[Any]:
        return []

    def exchanges(self, vh: Any) -> list[Any]:
        return list(self.exchange_list)

    def sessions(self) -> list[Any]:
        return []

    def on_queue_deleted(self, vh: Any, callback: Any) -> None:
        pass


def test_an_exchange_never_published_to_has_no_stats_and_no_history() -> None:
    idle = DirectExchange("/", "idle")
    sampler = RateSampler(FakeAPI([idle]), interval=1.0)  # type: ignore[arg-type]
    sampler.sample()
    sampler.sample()
    assert sampler.exchange_stats(idle) is None
    assert len(sampler.objects) == 0
    view: dict[str, Any] = {}
    sampler.add_samples(idle, view, (60.0, 0.0))
    assert view == {}


def test_publish_in_and_out_with_rates_and_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stats_module, "time", clock)
    x = DirectExchange("/", "x")
    api = FakeAPI([x])
    sampler = RateSampler(api, interval=1.0)  # type: ignore[arg-type]
    x.stat_publish_in = 4  # routed nowhere yet: publish_out stays out, as on RabbitMQ
    sampler.sample()
    stats = sampler.exchange_stats(x)
    assert stats == {"publish_in": 4, "publish_in_details": {"rate": 0.0}}
    x.stat_publish_in, x.stat_publish_out = 10, 12
    clock.now += 2.0
    sampler.sample()  # two seconds after the first: 3/s in, 6/s out
    stats = sampler.exchange_stats(x)
    assert stats is not None
    assert (stats["publish_in"], stats["publish_out"]) == (10, 12)
    assert stats["publish_in_details"]["rate"] == 3.0
    assert stats["publish_out_details"]["rate"] == 6.0
    view = {"message_stats": stats}
    sampler.add_samples(x, view, (60.0, 0.0), names=("publish_in", "publish_out"))
    assert [p["sample"] for p in stats["publish_in_details"]["samples"]] == [10, 4]
    assert [p["sample"] for p in stats["publish_out_details"]["samples"]] == [12, 0]
    assert [p["timestamp"] for p in stats["publish_in_details"]["samples"]] == \
        [1_800_001_002_000, 1_800_001_000_000]  # newest first, unix ms
    # a deleted exchange's history goes at the next tick
    api.exchange_list.clear()
    sampler.sample()
    assert len(sampler.objects) == 0 and id(x) not in sampler.counted_rates


def test_ticks_woken_late_still_stamp_points_an_interval_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer stamps each point with the tick's due time (a multiple of the interval):
    with points stamped at wake-up, a tick a hair late made two points 499 ms apart, and
    msg_rates_incr equal to the interval (0.5 s) dropped the older one (CI saw a chart
    with one point where there were two)."""
    clock = Clock()
    monkeypatch.setattr(stats_module, "time", clock)
    x = DirectExchange("/", "x")
    sampler = RateSampler(FakeAPI([x]), interval=0.5)  # type: ignore[arg-type]
    woken = []
    for late in (0.0031, 0.0002, 0.0049):  # how late each timer wakes
        delay = sampler.next_tick(clock.time())
        clock.now += delay + late
        x.stat_publish_in += 3
        sampler.sample(at=clock.time() - late)  # what _run passes: the due time
        woken.append(clock.time())
    stats = sampler.exchange_stats(x)
    assert stats is not None
    view = {"message_stats": stats}
    sampler.add_samples(x, view, (60.0, 0.5), names=("publish_in",))
    points = stats["publish_in_details"]["samples"]
    assert [p["sample"] for p in points] == [9, 6, 3]
    stamps = [p["timestamp"] for p in points]
    assert all(t % 500 == 0 for t in stamps), stamps
    assert [a - b for a, b in itertools.pairwise(stamps)] == [500, 500]
    # stamped at wake-up instead, the first two ticks (woken 3.1 ms and 0.2 ms late) are
    # less than 500 ms apart: the window would keep only one of them
    assert round(woken[1] * 1000) - round(woken[0] * 1000) < 500
