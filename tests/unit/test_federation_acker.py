"""The acker: out-of-order confirms become in-order multiple acks; nacks stay single."""

from __future__ import annotations

import asyncio

from plugins.federation.acker import Acker


class FakeChannel:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.sent.append(("ack", tag, multiple))

    def basic_nack(self, tag: int) -> None:
        self.sent.append(("nack", tag, False))


async def test_prefix_acked_once_out_of_order_waits() -> None:
    ch = FakeChannel()
    acker = Acker(ch.basic_ack, ch.basic_nack)
    for tag in range(1, 6):
        acker.track(tag)
    for tag in (2, 1, 3, 5):  # 4 is still in flight
        acker.settle(tag, True)
    await asyncio.sleep(0.01)
    assert ch.sent == [("ack", 3, True)]
    acker.settle(4, True)
    await asyncio.sleep(0.01)
    assert ch.sent[-1] == ("ack", 5, True)


async def test_failed_delivery_nacked_alone_in_sequence() -> None:
    ch = FakeChannel()
    acker = Acker(ch.basic_ack, ch.basic_nack)
    for tag in range(1, 5):
        acker.track(tag)
    acker.settle(1, True)
    acker.settle(2, False)
    acker.settle(3, True)
    acker.settle(4, True)
    await asyncio.sleep(0.01)
    assert ch.sent == [("ack", 1, True), ("nack", 2, False), ("ack", 4, True)]
