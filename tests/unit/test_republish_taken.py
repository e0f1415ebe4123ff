"""plugins/common/taken.py with the per-queue LocalPublisher: a message that comes back
from the source after a failure goes only into the queues of its route that did not take
it on an earlier pass (issue 29's three copies), and not at all when all did; a message
without a ``message_id`` is not recognised (it could be a second message alike)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from pamqp.commands import Basic

from amqpd.broker.api import BrokerAPI, Message, PreconditionFailed
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
    record.sending({"audit"})
    pub._part(held, None, frozenset({"audit"}), None)  # the closed attempt's confirm
    assert record.queues == {"audit"} and record.pending is None


def test_records_are_bounded_oldest_first() -> None:
    taken = Taken(size=2)
    a = taken.record(b"a")
    taken.record(b"b")
    assert taken.record(b"a") is a  # used again: now the newest
    taken.record(b"c")  # b, the oldest, goes
    assert len(taken) == 2
    assert taken.record(b"a") is a
    assert taken.record(b"b").queues == set()


class SlowAPI(FakeAPI):
    """Publishes to ``slow`` queues are confirmed only when the test says so."""

    def __init__(self, queues: list[str], slow: set[str]) -> None:
        super().__init__(queues, refusing=set())
        self.slow = slow
        self.unanswered: list[Any] = []

    def publish(self, vhost: str, exchange: str, message: Message, username: str | None,
                on_confirm: Any = None, only: frozenset[str] | None = None) -> list[Any]:
        if only is not None and only <= self.slow:
            self.published.append((next(iter(only)), message.properties, message.body))
            self.unanswered.append(on_confirm)
            return []
        return super().publish(vhost, exchange, message, username, on_confirm, only)


@pytest.mark.parametrize("answer", ["confirm", "refusal"])
async def test_a_redelivery_waits_for_the_answer_its_earlier_pass_is_owed(
        quick: None, answer: str) -> None:
    """The attempt that published it ended before audit answered; the message comes
    again: it waits for that answer (and what follows waits behind it), then goes only
    where no pass put it: nowhere after a confirm, to audit again after a refusal."""
    api = SlowAPI(["audit", "orders"], slow={"audit"})
    taken = Taken()
    settled: list[int] = []
    first = publisher(api, settled, [])
    first.submit(Held(1, "x", "", WITH_ID, b"one", record=taken.record(b"fp")))
    first.close()  # its attempt ended: audit's answer is still owed
    second = publisher(api, settled, [])
    second.submit(Held(7, "x", "", WITH_ID, b"one", record=taken.record(b"fp"),
                       redelivered=True))
    second.submit(Held(8, "x", "", WITH_ID, b"two", record=taken.record(b"fp2")))
    await asyncio.sleep(0.02)
    assert settled == [] and [b for _q, _p, b in api.published] == [b"one", b"one"]
    api.slow.clear()
    api.unanswered.pop()(None if answer == "confirm" else PreconditionFailed("no leader"))
    await wait(lambda: settled == [7, 8], "the repeat, then the next message, settled")
    ones = sorted(q for q, _p, b in api.published if b == b"one")
    assert ones == (["audit", "orders"] if answer == "confirm"
                    else ["audit", "audit", "orders"])
    assert sorted(q for q, _p, b in api.published if b == b"two") == ["audit", "orders"]
    assert second.skipped == (1 if answer == "confirm" else 0)


async def test_a_redelivery_waits_for_an_owed_answer_at_most_pending_wait(
        quick: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(republish, "PENDING_WAIT", 0.05)
    api = SlowAPI(["audit", "orders"], slow={"audit"})
    taken = Taken()
    settled: list[int] = []
    first = publisher(api, settled, [])
    first.submit(Held(1, "x", "", WITH_ID, b"one", record=taken.record(b"fp")))
    first.close()
    api.slow.clear()  # audit answers at once from now on; the first answer never comes
    second = publisher(api, settled, [])
    second.submit(Held(7, "x", "", WITH_ID, b"one", record=taken.record(b"fp"),
                       redelivered=True))
    await wait(lambda: settled == [7], "the repeat settled after the wait")
    assert sorted(q for q, _p, _b in api.published) == ["audit", "audit", "orders"]
