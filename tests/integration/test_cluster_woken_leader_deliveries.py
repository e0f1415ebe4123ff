"""A leader woken from SIGSTOP delivers nothing more until etcd says it still leads (issue 28).

A mirrored (``ha-mode: all``) or quorum queue led by node-a holds a backlog; a slow
consumer on node-a (prefetch 20, acks after 0.3 s idle) works through it. node-a is
stopped (SIGSTOP) -- its lease (15 s here) outlives the stop, so it keeps its clients --
until another node leads the queue; a consumer on the new leader's node then takes and
acks everything (the backlog, and messages published through that survivor while
node-a is stopped). Then node-a is woken (SIGCONT). The consumer on node-a sent an ack
during the stop; the woken node reads it first, and before this fix its old local queue
handed that consumer 20 more messages at once, from a backlog the new leader had
already delivered and settled, without ``redelivered`` (RabbitMQ delivers a message
from the one leader only: the consumer moves to the new leader, or is cancelled if it
asked for ``x-cancel-on-ha-failover``). Every message is counted: each confirmed one
delivered, and one delivered again only with ``redelivered``.

For a quorum queue the deposed leader's deliveries already waited for a majority's
acknowledgement of their checkout (``amqpd.cluster.handout``), which the members that
elected a new leader refuse; it runs here to show the same for both kinds.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    QueueConsumer,
    check_consumed,
    declare_durable,
    diagnose,
    three_nodes,
    wait_for,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

QUEUE = "wakedeliver.q"
BACKLOG = 2000  # messages in the queue before node-a's consumer starts
DURING = 300  # messages published through a survivor while node-a is stopped
AFTER = 200  # messages published through a survivor once node-a is woken
WATCH = 3.0  # seconds node-a's consumer is watched after SIGCONT before the next batch


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """The product's 1 s heartbeat timeout (the others replace the stopped leader in
    about a second) and a 15 s lease (node-a's outlives its stop: it keeps its clients,
    the case under test; a longer stop makes it pause and close them)."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "1"},
                     lease_ttl=15.0) as started:
        yield started


def _leader(node: ClusterNode) -> str | None:
    r = node.api.get(f"/api/queues/%2F/{QUEUE}")
    return str(r.json().get("node")) if r.status == 200 else None


def _publish(node: ClusterNode, first: int, count: int) -> set[int]:
    """``count`` confirmed persistent messages numbered from ``first`` through
    ``node``; the numbers confirmed (every one, or the test fails here)."""
    pub = ConfirmPublisher(node.url, QUEUE, window=500, batch=100)
    try:
        pub.publish_range(first, first + count)
    finally:
        pub.conn.sock.close()
    assert len(pub.confirmed) == count, \
        f"{count - len(pub.confirmed)} of {count} not confirmed ({len(pub.nacked)} nacked)"
    return pub.confirmed


def _in_time_order(*consumers: QueueConsumer) -> list[tuple[int, bool]]:
    """What the consumers got, merged in the order it arrived."""
    timed = [(at, got) for c in consumers for at, got in zip(c.at, c.got, strict=True)]
    return [got for _at, got in sorted(timed, key=lambda pair: pair[0])]


@pytest.mark.parametrize("kind", ["mirrored", "quorum"])
def test_a_woken_leader_delivers_nothing_the_new_leader_delivers(
        nodes: list[ClusterNode], kind: str) -> None:
    a, b, _c = nodes
    if kind == "mirrored":
        r = a.api.put("/api/policies/%2F/ha-wakedeliver", {
            "pattern": "^wakedeliver\\.", "apply-to": "queues",
            "definition": {"ha-mode": "all"}})
        assert r.status in (201, 204), r.text
    declare_durable(a, QUEUE, {"x-queue-type": "quorum"} if kind == "quorum" else None)
    wait_for(lambda: all(_leader(n) == a.name for n in nodes), 20,
             "every node sees node-a lead the queue", lambda: diagnose(nodes))
    if kind == "mirrored":
        def synchronised() -> bool:
            r = a.api.get(f"/api/queues/%2F/{QUEUE}")
            return r.status == 200 and \
                len(r.json().get("synchronised_slave_nodes") or []) == 2
        wait_for(synchronised, 30, "2 mirrors synchronised", lambda: diagnose(nodes))
    confirmed = _publish(a, 0, BACKLOG)

    assert a.proc is not None and a.proc.proc is not None
    pid = a.proc.proc.pid
    on_a = QueueConsumer(a, QUEUE, prefetch=20)
    on_new: QueueConsumer | None = None
    on_a.start()
    try:
        wait_for(lambda: len(on_a.got) >= 60, 30, "node-a's consumer under way",
                 lambda: diagnose(nodes))
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _leader(b) not in (None, a.name), 60,
                     "another node leads while node-a is stopped", lambda: diagnose(nodes))
            new = _leader(b)
            new_node = next(n for n in nodes if n.name == new)
            on_new = QueueConsumer(new_node, QUEUE, prefetch=200)
            on_new.start()
            confirmed |= _publish(new_node, BACKLOG, DURING)
            consumer = on_new
            # the new leader delivered (and its consumer acked) everything by now: the
            # backlog node-a's old queue still holds is settled there
            wait_for(lambda: confirmed <= on_a.seen | consumer.seen, 60,
                     "the new leader delivered every message", lambda: diagnose(nodes))
            stopped_got = len(on_a.got)
        finally:
            os.kill(pid, signal.SIGCONT)
        woken_at = time.monotonic()
        wait_for(lambda: _leader(a) == new, 30, f"node-a sees {new} lead",
                 lambda: diagnose(nodes))
        wait_for(lambda: time.monotonic() - woken_at > WATCH, WATCH + 1, "watching node-a")
        woken_got = on_a.got[stopped_got:]
        # node-a's consumer consumes on (moved to the new leader): so do both
        confirmed |= _publish(new_node, BACKLOG + DURING, AFTER)
        wait_for(lambda: confirmed <= on_a.seen | consumer.seen, 60,
                 "every confirmed message delivered",
                 lambda: f"{len(confirmed - on_a.seen - consumer.seen)} missing\n"
                 f"{diagnose(nodes)}")
    finally:
        on_a.stopped.set()
        if on_new is not None:
            on_new.stopped.set()
            on_new.join(30)
        on_a.join(30)
    assert on_a.error is None, on_a.error
    assert on_new.error is None, on_new.error
    fresh_again = {n for n, redelivered in woken_got if not redelivered} & on_new.seen
    print(f"{kind}: {len(confirmed)} confirmed; node-a's consumer got {len(on_a.got)} "
          f"({len(woken_got)} in the {WATCH:.0f} s after SIGCONT, {len(fresh_again)} of "
          f"those unflagged and delivered by the new leader too), the new leader's "
          f"{len(on_new.got)}; node-a's consumer interrupted: {on_a.interruptions}")
    assert not fresh_again, (
        f"the woken node-a delivered {len(fresh_again)} messages the new leader "
        f"delivered too, without redelivered, e.g. {sorted(fresh_again)[:10]}")
    check_consumed(_in_time_order(on_a, on_new), confirmed)
