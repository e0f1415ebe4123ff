"""plugins/common/taken.py with the per-queue LocalPublisher: a message that comes back
from the source after a failure goes only into the queues of its route that did not take
it on an earlier pass (issue 29's three copies), and not at all when all did; a message
without a ``message_id`` is not recognised (it could be a second message alike)."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest
from pamqp.commands import Basic

from amqpd.broker.api import BrokerAPI
from plugins.common import republish
from plugins.common.republish import Held, LocalPublisher
from plugins.common.taken import Taken, has_message_id
from plugins.shovel.wire import encode_properties
from tests.unit.test_shovel_local import FakeAPI

WITH_ID = encode_properties(Basic.Properties(message_id="m-1"))
WITHOUT_ID = b"\x00\x00"


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(republish, "RETRY_FIRST", 0.001)
    monkeypatch.setattr(republish, "RETRY_CAP", 0.005)
    monkeypatch.setattr(republish, "MAX_ATTEMPTS", 10_000)


def publisher(api: FakeAPI, settled: list[int], gave_up: list[str]) -> LocalPublisher:
    return LocalPublisher(cast(BrokerAPI, api), "/", "test", lambda tag, ok: settled.append(tag),
                          lambda props, _n: props, lambda _r: None, gave_up.append,
                          logging.getLogger("test"))


async def wait(cond: object, what: str) -> None:
    for _ in range(400):  # bounded: the retry timer is a few ms
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(what)


def test_message_id_flag_is_read_from_the_raw_properties() -> None:
    assert has_message_id(WITH_ID)
    assert not has_message_id(WITHOUT_ID)
    assert not has_message_id(b"")


async def test_a_repeat_goes_only_where_the_earlier_pass_did_not(
        quick: None, caplog: pytest.LogCaptureFixture) -> None:
    api = FakeAPI(["audit", "orders"], refusing={"orders"})
    taken = Taken()
    settled: list[int] = []
    gave_up: list[str] = []
    first = publisher(api, settled, gave_up)
    record = taken.record(b"fp")
    first.submit(Held(1, "x", "", WITH_ID, b"one", record=record))
    await wait(lambda: first.failures >= 2, "orders refused twice")
    first.close()  # the attempt ended (the link's connection lost): 1 never settled
    assert settled == [] and record.queues == {"audit"}
    # the source delivers it again: only orders, which refused it, is published to
    api.refusing.clear()
    second = publisher(api, settled, gave_up)
    again = taken.record(b"fp")
    assert again is record
    second.submit(Held(7, "x", "", WITH_ID, b"one", record=again, redelivered=True))
    await wait(lambda: settled == [7], "the repeat settled")
    assert [q for q, _p, _b in api.published] == ["audit", "orders"]
    assert record.queues == {"audit", "orders"}
    # a third pass (the ack lost again): every queue has it, nothing is published
    third = publisher(api, settled, gave_up)
    third.submit(Held(3, "x", "", WITH_ID, b"one", record=taken.record(b"fp"),
                      redelivered=True))
    assert settled == [7, 3] and third.skipped == 1
    assert [q for q, _p, _b in api.published] == ["audit", "orders"]
    assert gave_up == []
    with caplog.at_level(logging.INFO, logger="test"):
        third.close()  # the count of a period not logged yet is logged at the end
    assert "test: 1 redelivered message(s) already in every queue" in caplog.text


async def test_a_queue_that_joined_the_route_gets_the_repeat(quick: None) -> None:
    api = FakeAPI(["audit"], refusing=set())
    taken = Taken()
    settled: list[int] = []
    pub = publisher(api, settled, [])
    pub.submit(Held(1, "x", "", WITH_ID, b"one", record=taken.record(b"fp")))
    api.queues.append("late")
    pub.submit(Held(2, "x", "", WITH_ID, b"one", record=taken.record(b"fp"),
                    redelivered=True))
    assert settled == [1, 2]
    assert [q for q, _p, _b in api.published] == ["audit", "late"]


async def test_a_message_alike_not_redelivered_goes_everywhere(quick: None) -> None:
    """The same id and content again, first delivery at the source: a publisher may mean
    it (a fixed id on a periodic message); only a redelivery uses the record."""
    api = FakeAPI(["audit"], refusing=set())
    taken = Taken()
    settled: list[int] = []
    pub = publisher(api, settled, [])
    pub.submit(Held(1, "x", "", WITH_ID, b"one", record=taken.record(b"fp")))
    pub.submit(Held(2, "x", "", WITH_ID, b"one", record=taken.record(b"fp")))
    assert settled == [1, 2] and pub.skipped == 0
    assert [q for q, _p, _b in api.published] == ["audit", "audit"]


async def test_a_confirm_after_the_attempt_ended_is_still_recorded() -> None:
    taken = Taken()
    record = taken.record(b"fp")
    held = Held(1, "x", "", WITH_ID, b"one", record=record)
    held.missing = {"audit"}
    pub = publisher(FakeAPI(["audit"], set()), [], [])
    pub.close()
    pub._part(held, None, None)  # the confirm of the closed attempt's publish
    assert record.queues == {"audit"}


def test_records_are_bounded_oldest_first() -> None:
    taken = Taken(size=2)
    a = taken.record(b"a")
    taken.record(b"b")
    assert taken.record(b"a") is a  # used again: now the newest
    taken.record(b"c")  # b, the oldest, goes
    assert len(taken) == 2
    assert taken.record(b"a") is a
    assert taken.record(b"b").queues == set()
