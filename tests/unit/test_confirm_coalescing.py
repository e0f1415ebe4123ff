"""Publisher confirms go out coalesced without ever acking a tag twice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from pamqp import commands

from amqpd.broker.channel import Channel
from tests.unit.protocol.peer import Pair, real_broker


class ConfirmLog:
    """The confirms the client received, as ``(kind, tag, multiple)``, read off the wire."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self._frames: list[tuple[str, int, bool]] = []

    @property
    def frames(self) -> list[tuple[str, int, bool]]:
        for out in self.pair.drain():
            v = out.value
            assert isinstance(v, commands.Basic.Ack | commands.Basic.Nack), out
            kind = "ack" if isinstance(v, commands.Basic.Ack) else "nack"
            self._frames.append((kind, v.delivery_tag, bool(v.multiple)))
        return self._frames


@pytest.fixture
def idle_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A real event loop that is never run: what the channel schedules on it waits, and
    the test flushes instead, as the end of the broker's tick does."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make_channel() -> tuple[Channel, ConfirmLog]:
    """A real channel of a real session, in confirm mode, on a broker with no loop."""
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    out = pair.call(1, commands.Confirm.Select())
    assert isinstance(out[0].value, commands.Confirm.SelectOk)
    assert pair.session is not None
    ch = pair.session.channels[1]
    return ch, ConfirmLog(pair)


def confirmed(frames: list[tuple[str, int, bool]], upto: int) -> dict[int, str]:
    """What a client concludes: each tag's outcome; a second outcome is an error."""
    out: dict[int, str] = {}
    for kind, tag, multiple in frames:
        tags = [t for t in range(1, tag + 1) if t not in out] if multiple else [tag]
        for t in tags:
            assert t not in out, f"tag {t} confirmed twice"
            out[t] = kind
    assert sorted(out) == list(range(1, upto + 1))
    return out


def test_in_order_confirms_coalesce_into_one_multiple_ack(
        idle_loop: asyncio.AbstractEventLoop) -> None:
    ch, conn = make_channel()
    # a loop that never runs the scheduled flush: the test flushes, like the tick's end
    ch.session.broker._loop = idle_loop
    for seq in (1, 2, 3, 4):
        ch.confirm(seq, True)
    ch._flush_acks()
    assert conn.frames == [("ack", 4, True)]
    confirmed(conn.frames, 4)


def test_out_of_order_and_nacks_never_double_confirm(
        idle_loop: asyncio.AbstractEventLoop) -> None:
    ch, conn = make_channel()
    ch.session.broker._loop = idle_loop
    # 3 and 4 confirm first (transient), 1-2 wait for a commit, 5 is nacked, then 6-8
    for seq in (3, 4):
        ch.confirm(seq, True)
    ch._flush_acks()
    ch.confirm(5, False)
    for seq in (1, 2, 6, 7, 8):
        ch.confirm(seq, True)
    ch._flush_acks()
    outcome = confirmed(conn.frames, 8)
    assert outcome[5] == "nack"
    assert all(outcome[t] == "ack" for t in (1, 2, 3, 4, 6, 7, 8))
    # after the gap closed, later confirms coalesce again
    for seq in (9, 10, 11):
        ch.confirm(seq, True)
    ch._flush_acks()
    assert conn.frames[-1] == ("ack", 11, True)
    confirmed(conn.frames, 11)
