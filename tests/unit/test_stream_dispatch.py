"""A stream's dispatch rounds (amqpd.broker.stream.StreamQueue.dispatch): one round hands
the stream's consumers at most ``DISPATCH_BYTES`` of stored records, whatever their
number and credit, so the deliveries a node holds between two writes do not grow with
the consumers; the next round follows on the loop, starts one consumer further on,
and every consumer still gets every record once, in offset order.

A broker built in the process with a running loop, no sockets; the consumers' channel
notes each delivery's offset.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from amqpd.broker.api import Consumer, QueueType
from amqpd.broker.stream import DISPATCH_BYTES, READ_BATCH, StreamQueue
from amqpd.config import Settings
from amqpd.server import Broker
from tests.unit.test_queue_type import Channel, message

RECORDS = 3000
BODY = 1000


class OffsetChannel(Channel):
    """Notes (consumer tag, offset) of every delivery."""

    def __init__(self) -> None:
        super().__init__([])
        self.got: list[tuple[str, int]] = []

    def deliver(self, consumer: Consumer, queue: QueueType, entry: Any) -> None:
        self.got.append((consumer.tag, entry.seq))
        super().deliver(consumer, queue, entry)


def test_a_round_is_bounded_and_every_consumer_gets_everything(tmp_path: Path) -> None:
    async def run() -> None:
        broker = Broker(Settings(data_dir=str(tmp_path), persistence=False))
        broker._loop = asyncio.get_running_loop()
        q = broker.api.declare_queue("/", "s", durable=True,
                                     arguments={"x-queue-type": "stream"})
        assert isinstance(q, StreamQueue)
        for _ in range(RECORDS):
            q.enqueue(message(b"x" * BODY))
        q.flush()
        assert q.message_count == RECORDS
        ch = OffsetChannel()
        tags = [f"c{i}" for i in range(4)]
        for tag in tags:  # credit for the whole stream each: only the budget stops them
            q.add_consumer(Consumer(ch, q, tag, False, False, RECORDS,
                                    {"x-stream-offset": "first"}))
        q.dispatch()
        first_round = len(ch.got)
        # a round stops once its bytes are spent (a batch may end past the budget)
        assert 0 < first_round * BODY <= DISPATCH_BYTES + READ_BATCH * (BODY + 100), \
            first_round
        assert {t for t, _ in ch.got} == {"c0"}  # the budget ended the round in c0's turn
        for _ in range(10_000):  # bounded: every turn of the loop is a round
            if len(ch.got) >= RECORDS * len(tags):
                break
            await asyncio.sleep(0)
        for tag in tags:
            assert [o for t, o in ch.got if t == tag] == list(range(RECORDS)), tag
        # the rounds after the first did not all start with c0
        second = ch.got[first_round][0]
        assert second == "c1", second

    asyncio.run(run())


def test_records_of_one_tick_share_their_chunks_timestamp(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A tick's AMQP 0-9-1 publishes become one chunk stamped once, when its first
    record came (RabbitMQ's streams stamp a chunk, not its entries): the clock is not
    read per record. The next tick's chunk gets the time of its own first record."""
    clock = iter(range(1000, 2000))
    monkeypatch.setattr("amqpd.broker.stream._now_ms", lambda: next(clock))

    async def run() -> None:
        broker = Broker(Settings(data_dir=str(tmp_path), persistence=False))
        broker._loop = asyncio.get_running_loop()
        q = broker.api.declare_queue("/", "s", durable=True,
                                     arguments={"x-queue-type": "stream"})
        assert isinstance(q, StreamQueue)
        for _ in range(5):
            q.enqueue(message(b"x"))
        for _ in range(20):  # bounded: the flush runs at the end of this tick
            if q.log.flushed_offset == 5:
                break
            await asyncio.sleep(0)
        for _ in range(3):
            q.enqueue(message(b"y"))
        q.flush()
        records = list(q.log.reader(0).records(10))
        stamps = [r.timestamp for r in records]
        assert len(set(stamps[:5])) == 1 and len(set(stamps[5:])) == 1, stamps
        assert len(stamps) == 8 and stamps[0] < stamps[5], stamps
        assert [r.chunk_start for r in records] == [True] + [False] * 4 + [True, False, False]

    asyncio.run(run())
