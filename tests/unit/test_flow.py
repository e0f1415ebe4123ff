"""Credit flow: a publisher feeding a queue whose consumers fall behind is put in flow
(smaller slices per loop turn) and leaves it once the queue has caught up."""

from __future__ import annotations

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
