"""A quorum leader's deliveries wait for their checkout's commit (amqpd.cluster.handout),
without sockets: a real :class:`ReplicaSet` whose acknowledgements the test plays, and
stand-ins for the queue, the consumer and the channel that record what happens.

What must hold: nothing leaves before a majority (the leader's own log counted) holds
every record up to its checkout; what waits leaves in the order it was chosen; credit
is taken while it waits and given back exactly once; a delivery whose consumer or
channel went before it could leave comes back to the queue instead; a dropped group
sends nothing more; a basic.get whose checkout is not committed in time is answered
get-empty and its message comes back, the deliveries around it keeping their order."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqpd.cluster.handout import GET_COMMIT_WAIT, WAITING_CAP, CommitOutbox, Handouts
from amqpd.cluster.mirror_state import ReplicaSet
from amqpd.cluster.replica_core import Majority


class Entry:
    def __init__(self, n: int) -> None:
        self.n = n


class Ext:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def requeue(self, entries: list[Any]) -> None:
        self.queue.requeued += [e.n for e in entries]


class Queue:
    """Records checkouts (``delivered`` not yet leaving), settles and returns."""

    def __init__(self, rs: ReplicaSet) -> None:
        self.rs = rs
        self.name = "q"
        self.deleted = False
        self.message_count = 7
        self.recorded: list[tuple[int, int]] = []  # (entry, seq of its checkout)
        self.settled: list[int] = []
        self.returned: list[int] = []
        self.requeued: list[int] = []
        self.handouts: Any = None
        self.ext = Ext(self)

    def delivered(self, entry: Entry, acked: bool) -> None:
        assert self.handouts is not None
        if self.handouts.leaving(entry) is not None:  # as QuorumQueue.delivered
            if acked:
                self.settled.append(entry.n)
            return
        assert not acked
        self.recorded.append((entry.n, self.rs.next_seq()))  # its MHELD

    def return_checked_out(self, entries: list[Entry]) -> None:
        self.returned += [e.n for e in entries]


class Channel:
    def __init__(self) -> None:
        self.closed = False
        self.unacked_consumer_count = 0
        self.written: list[tuple[int, int]] = []  # (delivery tag, entry)
        self.gets: list[tuple[int | None, int]] = []

    def deliver(self, consumer: Consumer, queue: Queue, entry: Entry) -> None:
        self.written.append((len(self.written) + 1, entry.n))
        if not consumer.no_ack:
            consumer.unacked += 1
            self.unacked_consumer_count += 1
        queue.delivered(entry, consumer.no_ack)

    def answer_get(self, queue: Queue, entry: Entry | None, no_ack: bool,
                   count: int) -> None:
        self.gets.append((None if entry is None else entry.n, count))
        if entry is not None:
            queue.delivered(entry, no_ack)


class Consumer:
    def __init__(self, channel: Channel | None, no_ack: bool = False) -> None:
        self.local = channel
        self.no_ack = no_ack
        self.unacked = 0
        self.remote: list[int] = []

    def deliver(self, queue: Queue, entry: Entry) -> None:  # another node's: its proxy
        self.remote.append(entry.n)


def group(members: int = 3) -> tuple[ReplicaSet, Queue, Any, list[int]]:
    """A group of ``members`` (the leader's Handouts, typed Any: stand-ins go in)."""
    rs = ReplicaSet("a", [f"m{i}" for i in range(1, members)], policy=Majority.of(members))
    for m in rs.synchronised:
        rs.attach(m)
    q = Queue(rs)
    rooms: list[int] = []
    q.handouts = Handouts(rs, lambda: rooms.append(1))
    return rs, q, q.handouts, rooms


def test_a_delivery_leaves_only_once_a_majority_holds_its_checkout() -> None:
    rs, q, h, _ = group()
    ch = Channel()
    c = Consumer(ch)
    h.hand_out(q, c, Entry(1))
    assert q.recorded == [(1, 1)]
    assert ch.written == []
    # its credit is taken while it waits: the channel's prefetch counts it
    assert (c.unacked, ch.unacked_consumer_count) == (1, 1)
    h.release()
    assert ch.written == []
    rs.ack("m1", 1)  # the leader and one member of three: a majority
    h.release()
    assert ch.written == [(1, 1)]
    assert (c.unacked, ch.unacked_consumer_count) == (1, 1)  # counted once, not twice
    assert q.settled == [] and not h.local


def test_a_single_member_group_hands_out_at_once() -> None:
    _rs, q, h, _ = group(members=1)
    ch = Channel()
    h.hand_out(q, Consumer(ch), Entry(1))
    assert ch.written == [(1, 1)]


def test_what_waits_leaves_in_order_even_if_a_later_one_is_committed() -> None:
    rs, q, h, _ = group()
    ch = Channel()
    c = Consumer(ch)
    outbox = h.outbox
    remote: list[str] = []
    h.hand_out(q, c, Entry(1))
    outbox.after_commit(lambda: remote.append("x"))
    h.hand_out(q, c, Entry(2))
    rs.ack("m1", 1)
    h.release()
    assert ch.written == [(1, 1)] and remote == ["x"]
    rs.ack("m2", 2)
    h.release()
    assert ch.written == [(1, 1), (2, 2)]


def test_no_ack_is_settled_when_it_leaves_and_basic_get_waits_too() -> None:
    rs, q, h, _ = group()
    ch = Channel()
    h.hand_out(q, Consumer(ch, no_ack=True), Entry(1))
    h.get_for(q, ch, Entry(2), no_ack=True)
    assert q.settled == [] and ch.gets == []
    rs.ack("m1", 2)
    h.release()
    assert ch.written == [(1, 1)] and ch.gets == [(2, 7)]
    assert q.settled == [1, 2]


def test_another_nodes_consumer_goes_through_its_proxy() -> None:
    _rs, q, h, _ = group()
    c = Consumer(None)
    h.hand_out(q, c, Entry(1))
    assert c.remote == [1] and q.recorded == [] and not h.local


def test_a_cancelled_consumers_waiting_deliveries_come_back_with_its_credit() -> None:
    rs, q, h, _ = group()
    ch = Channel()
    c, other = Consumer(ch), Consumer(ch)
    h.hand_out(q, c, Entry(1))
    h.hand_out(q, other, Entry(2))
    h.hand_out(q, c, Entry(3))
    assert h.withdraw(c) == 2
    assert q.returned == [1, 3]
    assert (c.unacked, other.unacked, ch.unacked_consumer_count) == (0, 1, 1)
    rs.ack("m1", 3)
    h.release()
    assert ch.written == [(1, 2)]  # only the other consumer's
    assert h.withdraw(c) == 0


def test_a_closed_channels_deliveries_and_gets_come_back_when_released() -> None:
    rs, q, h, _ = group()
    ch = Channel()
    c = Consumer(ch)
    h.hand_out(q, c, Entry(1))
    h.get_for(q, ch, Entry(2), no_ack=False)
    ch.closed = True
    rs.ack("m2", 2)
    h.release()
    assert ch.written == [] and ch.gets == []
    assert q.returned == [1, 2]
    assert c.unacked == 0 and not h.local


def test_dropped_nothing_leaves_and_credit_comes_back() -> None:
    rs, q, h, _ = group()
    ch = Channel()
    c = Consumer(ch)
    remote: list[str] = []
    h.hand_out(q, c, Entry(1))
    h.outbox.after_commit(lambda: remote.append("x"))
    assert h.drop() == 2
    assert q.requeued == [1] and q.returned == []
    assert (c.unacked, ch.unacked_consumer_count) == (0, 0)
    rs.ack("m1", 5)
    h.release()
    assert ch.written == [] and remote == []


def test_a_full_outbox_asks_for_a_dispatch_once_some_left() -> None:
    rs, q, h, rooms = group()
    ch = Channel()
    c = Consumer(ch, no_ack=True)
    for n in range(WAITING_CAP):
        assert h.has_room()
        h.hand_out(q, c, Entry(n))
    assert not h.has_room()
    rs.ack("m1", 10)
    h.release()
    assert h.has_room() and rooms == [1]
    assert len(ch.written) == 10


def test_a_failing_action_does_not_hold_the_others() -> None:
    rs = ReplicaSet("a", ["b", "c"], policy=Majority(2))
    out = CommitOutbox(rs)
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("x")

    rs.next_seq()
    out.after_commit(boom)
    out.after_commit(lambda: ran.append(1))
    rs.ack("b", 1)
    assert out.release() == 2 and ran == [1] and not out.waiting


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["hand", "ack_b", "ack_c", "release"]),
                          st.integers(0, 6)), max_size=60))
def test_nothing_leaves_before_a_majority_holds_it_and_order_is_kept(
        ops: list[tuple[str, int]]) -> None:
    rs, q, h, _ = group()
    ch = Channel()
    c = Consumer(ch, no_ack=True)
    n = 0
    for op, k in ops:
        if op == "hand":
            n += 1
            h.hand_out(q, c, Entry(n))
        elif op.startswith("ack"):
            node = "m1" if op == "ack_b" else "m2"
            rs.ack(node, min(rs.seq, rs.acked.get(node, 0) + k))  # in order
        else:
            h.release()
        # every delivery written had its checkout held by a majority (leader + 1)
        seqs = dict(q.recorded)
        for _tag, e in ch.written:
            assert max(rs.acked.values()) >= seqs[e]
        assert [e for _t, e in ch.written] == sorted(e for _t, e in ch.written)


def test_a_get_whose_checkout_is_not_committed_in_time_is_answered_get_empty(
        caplog: pytest.LogCaptureFixture) -> None:
    rs, q, h, _ = group()
    ch, getter = Channel(), Channel()
    c = Consumer(ch)
    h.hand_out(q, c, Entry(1))
    h.get_for(q, getter, Entry(2), False)
    h.hand_out(q, c, Entry(3))
    assert len(h.outbox) == 3 and getter.gets == []
    soon = time.monotonic() + GET_COMMIT_WAIT / 2
    assert h.expire(soon) == 0 and getter.gets == []  # not yet
    later = time.monotonic() + GET_COMMIT_WAIT + 1
    with caplog.at_level(logging.WARNING, logger="amqpd.cluster.quorum"):
        assert h.expire(later) == 1
    assert getter.gets == [(None, 0)]  # get-empty
    assert q.returned == [2]  # back to the queue, as a returned checkout
    assert "answered get-empty" in caplog.text
    assert [x.entry.n for x in h.local.values()] == [1, 3] and len(h.outbox) == 2
    # the deliveries around it are untouched and leave in order once committed
    rs.ack("m1", rs.seq)
    h.release()
    assert [n for _tag, n in ch.written] == [1, 3]
    assert getter.gets == [(None, 0)]  # answered once, never a get-ok after
    assert h.expire(later + GET_COMMIT_WAIT) == 0


def test_a_get_committed_in_time_is_answered_and_does_not_expire() -> None:
    rs, q, h, _ = group()
    getter = Channel()
    h.get_for(q, getter, Entry(5), True)
    rs.ack("m1", rs.seq)
    h.release()
    assert getter.gets == [(5, 7)]
    assert h.expire(time.monotonic() + 2 * GET_COMMIT_WAIT) == 0
    assert getter.gets == [(5, 7)] and q.returned == [] and not h.outbox.expiring


def test_an_expired_get_on_a_closed_channel_only_comes_back() -> None:
    _rs, q, h, _ = group()
    getter = Channel()
    h.get_for(q, getter, Entry(4), False)
    getter.closed = True
    assert h.expire(time.monotonic() + GET_COMMIT_WAIT + 1) == 1
    assert getter.gets == [] and q.returned == [4]
