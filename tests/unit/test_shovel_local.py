"""plugins/shovel/local.py with a stand-in broker API: one publish per queue of the route,
a refused queue alone tried again (flagged ``x-shovel-retry``), confirms by sequence
number, and the attempt given up after MAX_ATTEMPTS refusals of one message."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from amqpd.broker.api import BrokerAPI, Message, PreconditionFailed
from plugins.common import republish
from plugins.common.taken import Record
from plugins.shovel.local import LocalDestination
from plugins.shovel.params import parse
from plugins.shovel.wire import decode_properties, encode_properties


class FakeAPI:
    """Routes every message to ``queues``; ``refusing`` queues nack each publish."""

    def __init__(self, queues: list[str], refusing: set[str]) -> None:
        self.queues = queues
        self.refusing = refusing
        self.published: list[tuple[str, bytes, bytes]] = []  # (queue, properties, body)

    def vhost(self, name: str) -> str:
        return name

    def exchange(self, vhost: str, name: str) -> str:
        return name

    def alarms_active(self) -> bool:
        return False

    def route_names(self, vhost: str, exchange: str, message: Message) -> list[str]:
        return list(self.queues)

    def publish(self, vhost: str, exchange: str, message: Message, username: str | None,
                on_confirm: Any = None, only: frozenset[str] | None = None) -> list[Any]:
        targets = sorted(only) if only is not None else list(self.queues)
        refused = False
        for name in targets:
            if name in self.refusing:
                refused = True
            else:
                self.published.append((name, message.properties, message.body))
        if on_confirm is not None:
            on_confirm(PreconditionFailed("rejected by a queue's length limit")
                       if refused else None)
        return []


def destination(api: FakeAPI) -> LocalDestination:
    defn = parse("/", "s", {"src-uri": "amqp://", "src-queue": "src", "dest-uri": "amqp://",
                            "dest-exchange": "x"})
    return LocalDestination(defn, cast(BrokerAPI, api), "/")


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(republish, "RETRY_FIRST", 0.001)
    monkeypatch.setattr(republish, "RETRY_CAP", 0.005)
    monkeypatch.setattr(republish, "MAX_ATTEMPTS", 4)


async def test_a_refused_queue_alone_gets_the_message_again(
        quick: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(republish, "MAX_ATTEMPTS", 10_000)  # retries go on meanwhile
    api = FakeAPI(["healthy", "orders"], refusing={"orders"})
    dest = destination(api)
    confirms: list[tuple[int, bool, bool]] = []
    await dest.open(lambda seq, multiple, ack: confirms.append((seq, multiple, ack)))
    props = encode_properties(decode_properties(b"\x00\x00"))
    assert await dest.publish_many([("x", "k", props, b"one"), ("x", "k", props, b"two")]) == 1
    assert dest.seq == 2
    await asyncio.sleep(0.05)
    assert [q for q, _p, b in api.published if b == b"one"] == ["healthy"]
    assert not any(b == b"two" for _q, _p, b in api.published)  # waits behind "one"
    api.refusing.clear()  # orders takes messages again
    for _ in range(200):  # bounded: the retry timer is a few ms
        if len(confirms) == 2:
            break
        await asyncio.sleep(0.005)
    assert confirms == [(1, False, True), (2, False, True)]
    one = [(q, p) for q, p, b in api.published if b == b"one"]
    assert [q for q, _p in one] == ["healthy", "orders"]  # healthy once
    assert "x-shovel-retry" not in (decode_properties(one[0][1]).headers or {})
    tries = (decode_properties(one[1][1]).headers or {})["x-shovel-retry"]
    assert isinstance(tries, int) and tries >= 2
    two = sorted(q for q, _p, b in api.published if b == b"two")
    assert two == ["healthy", "orders"]
    assert not dest.closed().done()


async def test_the_attempt_ends_after_max_attempts(quick: None) -> None:
    api = FakeAPI(["healthy", "orders"], refusing={"orders"})
    dest = destination(api)
    confirms: list[tuple[int, bool, bool]] = []
    await dest.open(lambda seq, multiple, ack: confirms.append((seq, multiple, ack)))
    await dest.publish_many([("x", "k", b"\x00\x00", b"one")])
    reason = await asyncio.wait_for(dest.closed(), 5)
    assert "'orders'" in reason and "gave up after 4 tries" in reason, reason
    assert confirms == []  # never acked: the source requeues it when the attempt ends
    assert [q for q, _p, _b in api.published] == ["healthy"]
    with pytest.raises(ConnectionError, match="destination closed"):
        await dest.publish_many([("x", "k", b"\x00\x00", b"two")])


async def test_without_confirms_each_message_is_published_once(quick: None) -> None:
    api = FakeAPI(["healthy", "orders"], refusing=set())
    dest = destination(api)
    await dest.open(None)
    await dest.publish_many([("x", "k", b"\x00\x00", b"one")])
    assert sorted(q for q, _p, _b in api.published) == ["healthy", "orders"]


async def test_a_repeat_with_a_record_goes_only_where_it_is_missing(quick: None) -> None:
    """The runner hands each message's Taken record (plugins/common/taken.py): a message
    the source delivered again goes only into the queues its earlier pass missed."""
    api = FakeAPI(["healthy", "orders"], refusing=set())
    dest = destination(api)
    confirms: list[tuple[int, bool, bool]] = []
    await dest.open(lambda seq, multiple, ack: confirms.append((seq, multiple, ack)))
    had_healthy = Record(frozenset({"healthy"}))
    had_both = Record(frozenset({"healthy", "orders"}))
    await dest.publish_many([("x", "k", b"\x00\x00", b"one"), ("x", "k", b"\x00\x00", b"two"),
                             ("x", "k", b"\x00\x00", b"new"), ("x", "k", b"\x00\x00", b"again")],
                            [(had_healthy, True), (had_both, True), None, (had_both, False)])
    assert confirms == [(1, False, True), (2, False, True), (3, False, True), (4, False, True)]
    # "again" was not redelivered by the source: a message alike sent again on purpose
    assert sorted((b, q) for q, _p, b in api.published) == [
        (b"again", "healthy"), (b"again", "orders"), (b"new", "healthy"), (b"new", "orders"),
        (b"one", "orders")]
    assert had_healthy.queues == {"healthy", "orders"}
