"""The barrier "every linked node applied this change" (amqpd.cluster.visibility) on
stand-in links, and the node tag of direct reply-to tokens (amqpd.broker.reply_to):
an answer for the revision asked (or a later one) ends the wait, one for another
watch or an earlier revision does not, a link that goes ends what waited on it, a
silent peer is a False after the bound; a peer answers once its watch reaches the
revision."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from amqpd.broker.reply_to import node_tag, token_node
from amqpd.cluster import link_wire as W
from amqpd.cluster.link import Link, LinkManager
from amqpd.cluster.visibility import DEFINITIONS, QUEUES, Applied, VisibilityBarrier


class FakeLink:
    def __init__(self) -> None:
        self.up = True
        self.closed = False
        self.sent: list[list[Any]] = []

    def send(self, frame: bytes) -> None:
        for kind, stream, fields in W.FrameReader().feed(frame):
            assert stream == 0
            self.sent.append([kind, *fields])


def barrier(*links: FakeLink) -> VisibilityBarrier:
    manager = type("M", (), {"links": {f"n{i}": link for i, link in enumerate(links)}})()
    return VisibilityBarrier(cast(LinkManager, manager))


def test_the_wait_ends_when_every_peer_answered_that_watch_at_or_past_the_revision() -> None:
    async def run() -> None:
        a, b = FakeLink(), FakeLink()
        bar = barrier(a, b)
        wait = asyncio.ensure_future(bar.wait(QUEUES, 7, timeout=5))
        await asyncio.sleep(0)
        assert a.sent == [[W.SYNC, QUEUES, 7]] and b.sent == [[W.SYNC, QUEUES, 7]]
        bar.answered(cast(Link, a), QUEUES, 9)
        bar.answered(cast(Link, b), DEFINITIONS, 9)  # another watch: not this wait
        bar.answered(cast(Link, b), QUEUES, 6)  # earlier than asked: not yet
        await asyncio.sleep(0.01)
        assert not wait.done()
        bar.link_down(cast(Link, b))  # the peer is gone: nothing to wait for there
        assert await wait is True
        assert bar.waits == {}
    asyncio.run(run())


def test_a_silent_peer_is_false_after_the_bound_and_no_link_is_true_at_once() -> None:
    async def run() -> None:
        a = FakeLink()
        bar = barrier(a)
        assert await bar.wait(DEFINITIONS, 3, timeout=0.05) is False
        assert bar.waits == {}
        down = FakeLink()
        down.up = False
        assert await barrier(down).wait(QUEUES, 3, timeout=5) is True
        assert down.sent == []
    asyncio.run(run())


def test_a_peer_answers_once_its_watch_reaches_the_revision() -> None:
    applied = Applied()
    answers: list[int] = []
    applied.when(5, lambda: answers.append(5))
    applied.when(8, lambda: answers.append(8))
    applied.advance(4)
    assert answers == []
    applied.advance(6)
    assert answers == [5]
    applied.advance(6)
    applied.when(2, lambda: answers.append(2))  # already applied: at once
    assert answers == [5, 2]
    applied.advance(10)
    assert answers == [5, 2, 8]


def test_reply_tokens_name_their_node() -> None:
    for node in ("amqpd@vm-w0", "rabbit@host/w1", "ü"):
        token = node_tag(node) + ".abc_-DEF"
        assert "." not in node_tag(node)
        assert token_node(token) == node
    assert token_node("abcdefABCDEF0123456789") is None  # a single node's token
    assert token_node(".x") is None
    assert token_node("!!!.x") is None
