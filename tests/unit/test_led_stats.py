"""The rate sampler's totals of the queues a node leads (amqpd.http.stats, ``led_only``):
a copy of a queue another node leads counts what it forwards and passes on, which the
leader counts too, so a workers' node sums its workers' led figures (docs/workers.md).
Driven by hand over stand-in queues (no broker, no timer)."""

from __future__ import annotations

from typing import Any

import pytest

from amqpd.http import stats as stats_module
from amqpd.http.stats import RateSampler
from tests.unit.test_exchange_stats import Clock


class Queue:
    """What the sampler reads of a queue."""

    def __init__(self, forwards: bool, publish: int, deliver: int, ready: int) -> None:
        self.forwards_publish = forwards
        self.stat_publish, self.stat_deliver = publish, deliver
        self.stat_ack = self.stat_redeliver = 0
        self.message_count, self.unacked_count = ready, 0


class API:
    def __init__(self, queues: list[Queue]) -> None:
        self.vhost = object()
        self.queue_list = queues
        self.deleted: list[Any] = []

    def vhosts(self) -> list[Any]:
        return [self.vhost]

    def queues(self, vh: Any) -> list[Any]:
        return list(self.queue_list)

    def exchanges(self, vh: Any) -> list[Any]:
        return []

    def sessions(self) -> list[Any]:
        return []

    def on_queue_deleted(self, vh: Any, callback: Any) -> None:
        self.deleted.append(callback)

    def delete(self, q: Queue) -> None:
        self.queue_list.remove(q)
        for callback in self.deleted:
            callback(q)


def test_led_totals_leave_out_copies_and_keep_deleted_led_queues(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stats_module, "time", clock)
    own, copy = Queue(False, 10, 4, 6), Queue(True, 3, 2, 9)
    api = API([own, copy])
    sampler = RateSampler(api, interval=1.0)  # type: ignore[arg-type]
    sampler.sample()
    own.stat_publish += 5  # 5/s over the next second, on the owned queue
    clock.now += 1.0
    sampler.sample()
    assert sampler.node_totals()["stat_publish"] == 18
    assert sampler.node_totals(led_only=True)["stat_publish"] == 15
    led = sampler.overview_stats(60.0, 0.0, led_only=True)
    assert (led["publish"], led["deliver_get"]) == (15, 4)
    assert led["publish_details"]["rate"] == 5.0
    assert [s["sample"] for s in led["publish_details"]["samples"]] == [15, 10]
    assert sampler.overview_stats(60.0, 0.0)["publish"] == 18
    lengths = sampler.length_samples(60.0, 0.0, led_only=True)
    assert [s["sample"] for s in lengths["messages_ready"]["samples"]] == [6, 6]
    assert sampler.length_samples(60.0, 0.0)["messages_ready"]["samples"][0]["sample"] == 15
    api.delete(own)  # its counts stay in the totals, the copy's only in the whole view
    api.delete(copy)
    assert sampler.node_totals(led_only=True)["stat_publish"] == 15
    assert sampler.node_totals()["stat_publish"] == 18


def test_ticks_fall_on_the_wall_clocks_multiples_of_the_interval() -> None:
    sampler = RateSampler(API([]), interval=5.0)  # type: ignore[arg-type]
    assert sampler.next_tick(1_000.0) == 5.0
    assert sampler.next_tick(1_001.5) == 3.5
    assert sampler.next_tick(1_004.999) == pytest.approx(5.001)  # woke early: not again
