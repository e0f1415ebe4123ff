"""Credit flow: a publisher feeding a queue whose consumers fall behind is put in flow
(smaller slices per loop turn) and leaves it once the queue has caught up."""

from __future__ import annotations

from pathlib import Path

from pamqp import commands as C

from amqpd.broker.channel import FLOW_BACKLOG
from amqpd.protocol.connection import FLOW_FRAME_BUDGET, FRAME_BUDGET
from tests.support import wire
from tests.unit.protocol.peer import Pair, real_broker


def publishes(n: int, queue: str) -> bytes:
    one = wire.publish(1, "", queue, b"m")
    return one * n


def test_flow_follows_the_backlog_of_queues_with_consumers() -> None:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    pair.open_channel(2)
    pair.call(1, C.Queue.Declare(queue="fq"))
    pair.call(1, C.Queue.Declare(queue="idle"))
    conn = pair.server
    assert pair.session is not None

    # a backlog without consumers is not a reason to slow anybody down
    pair.send(publishes(FLOW_BACKLOG + 10, "idle"))
    for _ in range(100):
        if not conn.has_pending:
            break
        conn.process_pending(FRAME_BUDGET)
    assert not conn.in_flow
    assert pair.session.info()["state"] == "running"

    # a consumer that has taken its prefetch and acks nothing: the queue falls behind
    pair.call(2, C.Basic.Qos(prefetch_count=1))
    pair.call(2, C.Basic.Consume(queue="fq", consumer_tag="slow"))
    pair.send(publishes(FLOW_BACKLOG + 10, "fq"))
    for _ in range(1000):
        if not conn.has_pending:
            break
        conn.process_pending(FLOW_FRAME_BUDGET if conn.in_flow else FRAME_BUDGET)
    pair.drain()
    assert conn.in_flow
    assert pair.session.info()["state"] == "flow"

    # once the queue has caught up (here: purged), the next publish leaves flow
    pair.call(1, C.Queue.Purge(queue="fq"))
    pair.send(publishes(1, "fq"))
    assert not conn.in_flow
    assert pair.session.info()["state"] == "running"


def test_a_stream_weighs_how_far_its_consumers_lag_not_what_it_keeps(tmp_path: Path) -> None:
    """A stream keeps every record: 12,000 records with a consumer at its end is no
    backlog (the publisher stays running); a consumer 12,000 records behind is."""
    pair = Pair(broker=real_broker(persistence=True, data_dir=str(tmp_path)))
    pair.open()
    for ch in (1, 2, 3):
        pair.open_channel(ch)
    pair.call(1, C.Queue.Declare(queue="s", durable=True,
                                 arguments={"x-queue-type": "stream"}))
    conn = pair.server
    assert pair.session is not None

    def publish(n: int) -> None:
        pair.send(publishes(n, "s"))
        for _ in range(1000):
            if not conn.has_pending:
                break
            conn.process_pending(FLOW_FRAME_BUDGET if conn.in_flow else FRAME_BUDGET)
        pair.drain()

    publish(FLOW_BACKLOG + 2000)  # no consumer yet
    assert not conn.in_flow
    # a consumer at the end: nothing to catch up
    pair.call(2, C.Basic.Qos(prefetch_count=10))
    pair.call(2, C.Basic.Consume(queue="s", consumer_tag="tail",
                                 arguments={"x-stream-offset": "next"}))
    publish(1)
    assert not conn.in_flow, "a stream read at its end put its publisher in flow"
    assert pair.session.info()["state"] == "running"

    # a consumer that starts at the first record and acks nothing lags the whole stream
    pair.call(3, C.Basic.Qos(prefetch_count=1))
    pair.call(3, C.Basic.Consume(queue="s", consumer_tag="behind",
                                 arguments={"x-stream-offset": "first"}))
    publish(1)
    assert conn.in_flow
    assert pair.session.info()["state"] == "flow"
