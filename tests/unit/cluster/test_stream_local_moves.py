"""A stream's consumer moving between this node's copy and the leader (issue 30's
failover: CI once saw a consumer on node-c stop 702 records short of the committed end
after the leader's kill, with nothing published after the election).

Two brokers in one process with a real link (the harness of ``test_remote_queue``): A
leads the stream, B holds a copy of it (a :class:`StreamReplica` in B's data directory,
fed here by the test as the leader's ``SREC`` / ``SCOMMIT`` would) and a consumer reads
it there. The copy is then replaced by one not told a commit point yet -- as a member's
copy is when a new leader's ``SSTART`` comes after an election -- or goes for good (the
member removed): the consumer is sent to the leader with what its prefetch window has
left. Its window was full of deliveries read from the copy, so that is nothing; the
client acks them all. The consumer must go on from the offset after its last delivery
to the committed end, once each, in order: before the fix the leader's stand-in was
given no credit for those acks (only the leader's own deliveries gave it back), and
nothing else woke the consumer, so it stopped there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aio_pika
import pytest

from amqpd.broker.api import StreamLog, StreamQueue, Tracking
from amqpd.cluster import stream_wire as S
from amqpd.cluster.remote_queue import RemoteQueue
from amqpd.cluster.stream_leading import StreamLeading
from amqpd.cluster.stream_replica import StreamReplica
from amqpd.cluster.stream_wire import pack_records
from tests.unit.cluster.test_remote_queue import (  # noqa: F401 - a fixture
    Node,
    _collect,
    _msg,
    lead,
    nodes,
    until,
)
from tests.unit.streamproto.test_tracking import _Link


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> tuple[Node, Node]:
    """A and B, linked (``test_remote_queue``'s ``nodes``)."""
    return cast(tuple[Node, Node], request.getfixturevalue("nodes"))

TOTAL = 60
PREFETCH = 10


class Copies:
    """B's copy of the stream as ``ClusterQueues.stream_copy`` hands it out."""

    def __init__(self) -> None:
        self.current: StreamReplica | None = None

    def __call__(self, vhost: str, name: str) -> StreamReplica | None:
        return self.current


def _copy_of(b: Node, leader_q: StreamQueue, rid: int, term: int) -> StreamReplica:
    """B's copy of the leader's stream, holding every record (not told a commit point)."""
    data_dir = b.broker.settings.data_dir
    copy = StreamReplica(data_dir, "a@test", rid, "/", leader_q.name, {})
    end = leader_q.log.flushed_offset
    copy.start(term, {"epochs": [[1, 0], [term, end]] if term > 1 else [[1, 0]],
                      "first": 0, "next": end})
    if copy.next_offset < end:
        copy.append(pack_records(leader_q.log.reader(copy.next_offset).read(end)))
        copy.flush()
    return copy


async def _reading_the_copy(a: Node, b: Node, name: str) -> tuple[
        RemoteQueue, StreamQueue, Copies, Any, list[aio_pika.abc.AbstractIncomingMessage]]:
    """A stream of TOTAL records led by A; B's consumer (prefetch PREFETCH, from
    ``first``) reads B's copy and holds a full window of its deliveries unacked."""
    rq = lead(a, b, name, **{"x-queue-type": "stream"})
    await until(lambda: rq.available)
    leader_q = a.broker.vhosts["/"].queues[name]
    assert isinstance(leader_q, StreamQueue)
    for i in range(TOTAL):
        a.broker.api.publish("/", "", _msg(name, i), None)
    await until(lambda: leader_q.log.flushed_offset == TOTAL)
    copies = Copies()
    b.cluster.stream_copy = copies
    copies.current = _copy_of(b, leader_q, 1, 1)
    copies.current.commit(TOTAL)
    conn = await aio_pika.connect(b.url)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=PREFETCH)
    received: list[aio_pika.abc.AbstractIncomingMessage] = []
    await (await ch.get_queue(name, ensure=False)).consume(
        _collect(received), arguments={"x-stream-offset": "first"})
    await until(lambda: len(received) == PREFETCH)
    await asyncio.sleep(0.1)  # a full window: nothing more comes
    assert len(received) == PREFETCH
    assert not leader_q.consumers, "read from B's copy, not through the leader"
    return rq, leader_q, copies, conn, received


def _offsets(received: list[aio_pika.abc.AbstractIncomingMessage]) -> list[int]:
    return [int(m.headers["x-stream-offset"]) for m in received]  # type: ignore[arg-type]


async def _ack_as_they_come(received: list[aio_pika.abc.AbstractIncomingMessage],
                            want: int, timeout: float = 10.0) -> None:
    """Ack every delivery not acked yet as it arrives until ``want`` came (or the time
    is up)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        for message in list(received):
            if not message.processed:
                await message.ack()
        if len(received) >= want:
            return
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("told_later", [True, False])
async def test_a_consumer_whose_copy_is_replaced_goes_on_to_the_committed_end(
        pair: tuple[Node, Node], told_later: bool) -> None:
    """The copy is replaced by one not told a commit point yet (a new leader's
    ``SSTART``): the consumer goes to the leader with an empty window, and every ack of
    its deliveries from the copy must give that window a place back. ``told_later``:
    the new copy is told the commit point afterwards (the election's usual end), else
    never (its leader never got to it): either way the consumer reaches the end."""
    a, b = pair
    rq, leader_q, copies, conn, received = await _reading_the_copy(a, b, "s-moved")
    try:
        old = copies.current
        assert old is not None
        copies.current = _copy_of(b, leader_q, 2, 2)  # same files, committed -1
        old.close()  # wakes its reader: the consumer cannot read the new copy yet
        await until(lambda: len(leader_q.consumers) == 1)  # sent to the leader
        if told_later:
            # the client acks what it holds before the commit point comes (what CI's
            # run did: its acks beat the new leader's SCOMMIT back to node-c)
            await _ack_as_they_come(received, PREFETCH)
            await asyncio.sleep(0.1)
            copies.current.commit(TOTAL)
        await _ack_as_they_come(received, TOTAL)
        assert _offsets(received) == list(range(TOTAL)), _offsets(received)
        assert [int(m.body) for m in received] == list(range(TOTAL))
        await asyncio.sleep(0.1)
        assert len(received) == TOTAL  # no repeat afterwards
        if told_later:  # back on the copy: the leader's stand-in is cancelled
            await until(lambda: not leader_q.consumers)
            assert [s.local is not None for s in rq._cons.values()] == [True]
    finally:
        await conn.close()
        if copies.current is not None:
            copies.current.close()


async def test_a_consumer_whose_copy_goes_for_good_reads_on_through_the_leader(
        pair: tuple[Node, Node]) -> None:
    """This node is no member any more (its copy is deleted, none comes back): the
    consumer goes on through the leader from the offset after its last delivery, its
    window given back as the client acks what the copy gave it."""
    a, b = pair
    _rq, leader_q, copies, conn, received = await _reading_the_copy(a, b, "s-gone")
    try:
        old = copies.current
        assert old is not None
        copies.current = None
        old.destroy()
        await until(lambda: len(leader_q.consumers) == 1)
        await _ack_as_they_come(received, TOTAL)
        assert _offsets(received) == list(range(TOTAL)), _offsets(received)
        await asyncio.sleep(0.1)
        assert len(received) == TOTAL
        # and what is published from now on comes too
        a.broker.api.publish("/", "", _msg("s-gone", TOTAL), None)
        await _ack_as_they_come(received, TOTAL + 1)
        assert _offsets(received) == list(range(TOTAL + 1))
    finally:
        await conn.close()


async def test_a_consumer_whose_copy_is_promoted_here_goes_on_in_the_new_stream(
        pair: tuple[Node, Node]) -> None:
    """This node won the election: its copy becomes the stream (``_promote``: the copy
    closed, a :class:`StreamQueue` on its files in the remote queue's place,
    :func:`replace_queue` moving the consumer onto it at the offset after its last
    delivery). Its window is full of the copy's deliveries, settled through the remote
    queue they came from: each must let the new stream deliver again."""
    from amqpd.cluster.cluster_queues import replace_queue

    a, b = pair
    rq, _leader_q, copies, conn, received = await _reading_the_copy(a, b, "s-here")
    try:
        old = copies.current
        assert old is not None
        copies.current = None
        old.close()
        vh = b.broker.vhosts["/"]
        new = StreamQueue(vh, "s-here", durable=True, auto_delete=False,
                          arguments=dict(rq.arguments))
        replace_queue(b.cluster, vh, rq, new)
        assert new.consumers and new.log.flushed_offset == TOTAL
        await asyncio.sleep(0.1)  # its first dispatch found the window full
        assert len(received) == PREFETCH
        await _ack_as_they_come(received, TOTAL)
        assert _offsets(received) == list(range(TOTAL)), _offsets(received)
        await asyncio.sleep(0.1)
        assert len(received) == TOTAL
    finally:
        await conn.close()


def test_a_new_leader_tells_a_returning_copy_the_commit_point_with_nothing_published(
        tmp_path: Path) -> None:
    """The other reading of CI's failure, ruled out: a member elected leader starts
    with ``told`` = 0 and its commit point moves only when a member acknowledges; a
    copy that refused its first ``SSTART`` (an election still under way there) and
    continues from the end of the log on the next one is told the whole log committed
    at once, with nothing published after the election."""
    log = StreamLog(tmp_path / "b")
    log.open()
    for _ in range(30):
        log.append(b"m", 1000)
    log.flush()
    tracking = Tracking(tmp_path / "b")
    q = SimpleNamespace(name="s", log=log, arguments={}, consumers=[], watchers=[],
                        commit_gate=None, read_limit=None, commit_moved=lambda: None,
                        stream_tracking=lambda: tracking)
    # node-b won term 2 after the loss of node-a, every record of term 1 in its log
    lead = StreamLeading("node-b", "/", cast(Any, q), ["node-a", "node-b", "node-c"], 2,
                         [[1, 0], [2, 30]], iter(range(1, 100)).__next__, 30.0)
    link = _Link("node-c")
    lead.connect(lambda member: cast(Any, link) if member == "node-c" else None)
    assert lead.commit_point() == 0  # node-b alone is no majority of three
    lead.forget("node-c")  # node-c: SREFUSE "an election is under way here"
    link.frames.clear()
    lead.connect(lambda member: cast(Any, link) if member == "node-c" else None)
    assert [f[0] for f in link.frames] == [S.SSTART]
    rid = link.frames[0][1]
    # node-c's copy, fed by node-a in term 1 (node-b's copy of the same log)
    replica = StreamReplica(str(tmp_path / "c"), "node-b", rid, "/", "s", {})
    replica.start(1, {"epochs": [[1, 0]], "first": 0, "next": 30})
    replica.append(pack_records(log.reader(0).read(30)))
    replica.flush()
    assert replica.start(2, link.frames[0][2][3]) == 30
    link.frames.clear()
    lead.have("node-c", 30)
    for kind, _rid, fields in link.frames:
        if kind == S.SCOMMIT:
            replica.commit(int(fields[0]))
    assert replica.committed == 30 and lead.told == 30
    assert q.read_limit() == 30  # the leader's own consumers read it all too
    lead.stop()
    replica.close()
    log.close()
