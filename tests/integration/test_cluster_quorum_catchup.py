"""A quorum queue's member comes back and catches up while publishers run (issue 16's
"Must show": the killed node returning, the publish rate during its catch-up measured).

Three amqpd processes and one etcd on loopback. A quorum queue declared on node A has
members A, B and C; a publisher with confirms on B builds a backlog of persistent
messages (20,000; ``AMQPD_TEST_QUORUM_BACKLOG`` for more) and C, a member that does not
lead, is killed with kill -9 at a seeded random moment of it (``AMQPD_TEST_SEED``
replays one). A and B are still a majority, so every publish is confirmed. Then C is
started again while the publisher on B keeps going: C copies the backlog in the
background (a restarted member gets a full copy: docs/clustering.md) while the group
keeps confirming. The test prints the confirmed rate before and during the catch-up
(timings are printed, never asserted) and asserts that confirms keep coming: no
:data:`WINDOW` passes without one (polled), and nothing published during the catch-up
is nacked (a commit the majority leaves unanswered for ``mirror_sync_timeout`` would
be). The catch-up is complete when the group's record in etcd lists C as
``synchronised``, every node's ``/api/queues`` shows C ``online``, and B's
quorum-critical health check answers 200. Then A, the leader, is killed with kill -9:
B or C is elected and a consumer on C gets every confirmed message, a duplicate only
redelivered.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    check_consumed,
    diagnose,
    publish_killing,
    publishing_thread,
    running,
    wait_for,
)
from tests.integration.test_cluster_quorum import (
    QUEUE,
    Consumer,
    Publisher,
    critical,
    declare,
    group_formed,
    queue_info,
)
from tests.support import etcdproc
from tests.support.warren import etcd_get

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(900),
]

BACKLOG = int(os.environ.get("AMQPD_TEST_QUORUM_BACKLOG", "20000"))
# the longest the publisher may go without a confirm while C catches up: well under
# cluster.mirror_sync_timeout (5 s), after which an unanswered commit is nacked
WINDOW = 2.0


def group_record(node: ClusterNode) -> dict[str, Any]:
    """The queue's group record in etcd (amqpd/cluster/quorum_group.py), or {}."""
    rec = etcd_get(node.etcd_url, f"{node.prefix}/{node.cluster}/quorum/%2F/{QUEUE}",
                   timeout=5)
    return rec if isinstance(rec, dict) else {}


def copied_line(leader: ClusterNode) -> str:
    """The leader's log line saying how many messages C's copy took (printed)."""
    assert leader.proc is not None
    lines = [ln for ln in leader.proc.log_path.read_text(errors="replace").splitlines()
             if "mirror on node-c synchronised" in ln]
    return lines[-1].strip() if lines else "(no line on node-c's copy)"


def node_start(node: ClusterNode, failure: list[BaseException]) -> None:
    try:
        node.start()
    except BaseException as exc:  # reported by the test thread
        failure.append(exc)


@pytest.mark.slow
def test_a_returning_member_catches_up_while_publishers_get_confirms(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    names = sorted(n.name for n in nodes)
    declare(a)
    group_formed(nodes, a)
    wait_for(lambda: group_record(a).get("synchronised") == [b.name, c.name], 30,
             "the record lists B and C synchronised", lambda: diagnose(nodes))

    seed = int(os.environ.get("AMQPD_TEST_SEED", str(random.randrange(1 << 30))))
    kill_at = random.Random(seed).randrange(BACKLOG // 10, BACKLOG * 9 // 10)
    print(f"seed {seed}: backlog {BACKLOG} messages, node-c killed after message {kill_at}")

    # the backlog, with C killed in the middle of it: A and B confirm everything
    pub = Publisher(b.url)
    publish_killing(pub, BACKLOG, kill_at, c)  # kill -9, with the publisher's window full
    pub.drain(60)
    assert not pub.outstanding, "every publish answered"
    assert len(pub.confirmed) == BACKLOG, \
        f"{len(pub.nacked)} nacked with a majority running\n{diagnose(nodes)}"
    wait_for(lambda: sorted(queue_info(a).get("online", [])) == [a.name, b.name], 30,
             "node-c offline", lambda: diagnose(nodes))
    wait_for(lambda: c.name not in group_record(a).get("synchronised", []), 30,
             "node-c's copy no longer counted", lambda: diagnose(nodes))
    # two of three running: stopping B loses the majority. B counts C down on its own
    # clock, which leaves out B's event-loop stalls (amqpd/cluster/view.py), so on a
    # busy machine B may see C running a moment after A no longer does: polled
    wait_for(lambda: critical(b)[0] == 503, 30, "node-b quorum-critical",
             lambda: f"{critical(b)}\n{diagnose(nodes)}")

    # C returns while the publisher on B keeps going
    stop = threading.Event()
    failure: list[BaseException] = []

    def complete() -> bool:
        return (c.name in group_record(a).get("synchronised", []) and
                all(sorted(queue_info(n).get("online", [])) == names for n in nodes))

    samples: list[tuple[float, int]] = []  # (time, confirmed) every poll
    thread = publishing_thread(pub, BACKLOG, stop, failure)
    starter: threading.Thread | None = None
    thread.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            samples.append((time.monotonic(), len(pub.confirmed)))
            time.sleep(0.05)
        before = samples[-1]
        rate_before = (before[1] - samples[0][1]) / (before[0] - samples[0][0])
        nacked_before = len(pub.nacked)
        # C starts in a thread of its own, so the polling below covers its start too
        starter = threading.Thread(target=lambda: node_start(c, failure))
        starter.start()
        restarted = (time.monotonic(), len(pub.confirmed))
        # until C's copy is complete: a confirm in every WINDOW, polled
        last_change = restarted
        longest_gap = 0.0
        next_check = 0.0
        deadline = restarted[0] + 300
        synced: tuple[float, int] | None = None
        while synced is None:
            now = time.monotonic()
            count = len(pub.confirmed)
            if count > last_change[1]:
                longest_gap = max(longest_gap, now - last_change[0])
                last_change = (now, count)
            assert not failure, failure
            assert now - last_change[0] <= WINDOW, (
                f"no confirm for {now - last_change[0]:.1f}s while node-c caught up "
                f"({count} confirmed)\n{diagnose(nodes)}")
            assert now < deadline, f"node-c's copy not complete in 300s\n{diagnose(nodes)}"
            if now >= next_check:
                next_check = now + 0.5
                try:
                    if complete():
                        synced = (time.monotonic(), len(pub.confirmed))
                except OSError:
                    pass  # C's HTTP not answering yet: polled again
            time.sleep(0.05)
        nacked_during = len(pub.nacked) - nacked_before
    finally:
        stop.set()
        thread.join(90)
        if starter is not None:
            starter.join(60)
    assert not failure, failure
    assert not thread.is_alive()
    assert synced is not None
    assert not pub.outstanding, "every publish answered"
    rate_during = (synced[1] - restarted[1]) / (synced[0] - restarted[0])
    print(f"confirmed publishes/s: {rate_before:.0f} before node-c returned, "
          f"{rate_during:.0f} while it caught up ({synced[0] - restarted[0]:.1f}s; "
          f"longest gap between confirms {longest_gap:.2f}s); {len(pub.confirmed)} "
          f"confirmed in all, {len(pub.nacked)} nacked")
    print(f"node-a's log: {copied_line(a)}")
    assert synced[1] > restarted[1], "no confirm while node-c caught up"
    assert nacked_during == 0, f"{nacked_during} publishes nacked while node-c caught up"
    wait_for(lambda: critical(b)[0] == 200, 30, "node-b no longer quorum-critical",
             lambda: diagnose(nodes))
    pub.conn.close()

    # the group with C's new copy loses nothing confirmed when the leader is killed
    a.kill()
    wait_for(lambda: queue_info(c).get("leader") in (b.name, c.name), 60,
             "a new leader elected", lambda: diagnose(nodes))
    print(f"elected after node-a's kill: {queue_info(c)['leader']}")
    consumer = Consumer(c)
    with running(consumer):
        wait_for(lambda: consumer.seen >= pub.confirmed or consumer.error is not None, 300,
                 "the consumer on node-c got every confirmed message",
                 lambda: f"{len(pub.confirmed - consumer.seen)} missing; "
                         f"interruptions {consumer.interruptions}\n{diagnose(nodes)}")
    assert consumer.error is None, consumer.error
    check_consumed(consumer.got, pub.confirmed)
    print(f"consumed {len(consumer.got)} on node-c "
          f"({sum(1 for _n, r in consumer.got if r)} redelivered)")
