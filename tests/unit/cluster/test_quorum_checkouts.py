"""A quorum queue's deliveries held on this node across its leader's loss: the
consumer's side of RECLAIM / RECLAIMED (amqpd.cluster.remote_queue), frame by frame.

A :class:`RemoteQueue` of a quorum queue in a real broker talks to fake links that
record what it sends; the test plays the leaders' frames. What must hold: every
delivery the client still holds is named to the new leader by the lost leader's store
position; one the client acked before the new leader was known is named too and settled
as soon as it is handed back; one it requeued is not named (the leader returns it);
a reclaimed delivery is settled on the new stream by the id the leader gave it, exactly
once, while the client uses its old tag; and each settled one gives the consumer a credit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from amqpd.broker.queue import Consumer
from amqpd.broker.queue_entry import QueueEntry
from amqpd.broker.queue_type import QueueType
from amqpd.cluster import link_wire as W
from amqpd.cluster.remote_queue import RemoteQueue, remote_class
from amqpd.config import Settings
from amqpd.server import Broker


class FakeLink:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.closed = False
        self.sent: list[tuple[int, int, list[Any]]] = []

    def send(self, frame: bytes) -> None:
        self.sent += W.FrameReader().feed(frame)

    def take(self) -> list[tuple[int, list[Any]]]:
        out = [(kind, fields) for kind, _stream, fields in self.sent]
        self.sent.clear()
        return out


class FakeChannel:
    """Takes every delivery; the test settles them as a client would (by entry)."""

    closed = False

    def __init__(self) -> None:
        self.got: list[QueueEntry] = []

    def can_deliver(self, consumer: Consumer) -> bool:
        return True

    def deliver(self, consumer: Consumer, queue: QueueType, entry: QueueEntry) -> None:
        consumer.unacked += 1
        queue.delivered(entry, acked=False)
        self.got.append(entry)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        raise AssertionError("a kept consumer is never cancelled here")


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(Settings(data_dir=str(tmp_path / "b"), port=0, management=False,
                        node_name="node-b"))
    await b.start()
    yield b
    await b.stop()


def grants(frames: list[tuple[int, list[Any]]]) -> int:
    return sum(f[1] for kind, f in frames if kind == W.GRANT)


async def test_held_deliveries_are_reclaimed_by_position_and_settled_once(
        broker: Broker) -> None:
    vh = broker.vhosts["/"]
    rq = remote_class("quorum")(vh, "qq", durable=True,
                                arguments={"x-queue-type": "quorum"},
                                port=broker.api.cluster_port())
    assert isinstance(rq, RemoteQueue)
    rq.leader = "node-a"
    old = FakeLink("node-a")
    rq.attach(old, 7)  # type: ignore[arg-type]
    assert old.take() == [(W.OPEN, ["/", "qq"]), (W.RECLAIM, ["", []])]
    ch = FakeChannel()
    consumer = Consumer(ch, rq, "ctag", False, False, 5, {})
    rq.add_consumer(consumer)
    assert old.take() == [(W.CONSUME, [1, 0, 5, {"tag": "ctag", "exclusive": False,
                                                 "arguments": {}}])]
    # node-a delivers five, at its store positions 100..104 (sent as position + 1)
    for i in range(5):
        rq._deliver(1, i + 1, False, 0, "", "qq", b"", b"m%d" % i, 101 + i)
    rq.dispatch()
    e = ch.got
    assert [x.message.body for x in e] == [b"m0", b"m1", b"m2", b"m3", b"m4"]

    # node-a is lost; the consumer is kept (a quorum group elects another leader)
    rq.detach(keep_consumers=True)
    # before any new leader is known, the client acks m0 and requeues m1
    consumer.unacked -= 2
    rq.settle([e[0]])
    rq.requeue([e[1]])
    # node-c leads now: the queue opens there and names what the channel still holds,
    # by node-a's positions, the acked m0 too, not the requeued m1; the consumer may
    # have what its window has left
    rq.leader = "node-c"
    new = FakeLink("node-c")
    rq.attach(new, 8)  # type: ignore[arg-type]
    frames = new.take()
    assert frames[:2] == [(W.OPEN, ["/", "qq"]), (W.RECLAIM, ["node-a", [100, 102, 103, 104]])]
    assert frames[2][0] == W.CONSUME and frames[2][1][2] == 2  # 5 - 3 still held
    # node-c hands back m0, m2 and m4 (new delivery ids, its own positions); m3 it no
    # longer holds for this node (returned to its queue)
    rq._reclaimed("node-a", [100, 102, 103, 104], [31, 32, 0, 33], [501, 503, 0, 505])
    assert new.take() == [(W.SETTLE, [[31]])]  # m0, acked meanwhile: settled once
    # the client acks m2 and m3 by their old entries: m2 is settled on node-c by its
    # new id, m3 settles nothing (it is the queue's again); each frees a place
    consumer.unacked -= 2
    rq.settle([e[2], e[3]])
    frames = new.take()
    assert (W.SETTLE, [[32]]) in frames
    assert grants(frames) == 2
    assert rq._stale == {}  # m4 is a live delivery of node-c's stream now

    # node-c is lost too before the client settles m4: named to the next leader by
    # node-c's position (504), and its reject goes there by the id it gets there; m2's
    # and m0's settles, sent to node-c just before, are named too (node-c may never
    # have taken them: here it had, so the next leader does not hold them)
    rq.detach(keep_consumers=True)
    rq.leader = "node-b"
    third = FakeLink("node-b")
    rq.attach(third, 9)  # type: ignore[arg-type]
    frames = third.take()
    assert frames[1] == (W.RECLAIM, ["node-c", [500, 502, 504]])
    rq._reclaimed("node-c", [500, 502, 504], [0, 0, 5], [0, 0, 901])
    consumer.unacked -= 1
    rq.reject([e[4]])
    frames = third.take()
    assert (W.REJECT, [[5]]) in frames
    assert grants(frames) == 1
    assert not rq._stale and not rq._owner and not rq._held_done and not rq._renamed
    assert list(rq._recent) == [(900, W.REJECT)]  # node-b's position of m4, rejected
