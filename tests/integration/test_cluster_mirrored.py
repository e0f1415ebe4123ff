"""Mirrored classic queues (issue 16) with three amqpd processes and one etcd on loopback.

A policy ``ha-mode: all`` mirrors a queue led by node A on B and C. A publisher with
confirms on B sends persistent messages to it while A is killed with kill -9 at a
random moment (seeded; the seed and the moment are printed). A synchronised mirror is
promoted; the publisher gets nacks for what was in flight, then confirms again; a
consumer on C then reads every confirmed message, and a message delivered twice carries
redelivered=true. Also what /api/queues and the mirror-sync health check show.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands

from bench.loadgen import Conn, ProtocolError
from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    check_consumed,
    declare_durable,
    diagnose,
    publish_killing,
    publishing_thread,
    wait_for,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(600),
]

QUEUE = "mirrored"
TOTAL = int(os.environ.get("AMQPD_TEST_MIRROR_MESSAGES", "20000"))


def queue_info(node: ClusterNode, name: str) -> dict[str, Any]:
    r = node.api.get(f"/api/queues/%2F/{q(name)}")
    return r.json() if r.status == 200 else {}


def usable(node: ClusterNode, name: str) -> bool:
    """A passive declare on ``node`` succeeds (False also while the node refuses
    connections: paused for a moment because a busy peer's heartbeats came late)."""
    try:
        conn = Conn(node.url, timeout=5)
    except ProtocolError:
        return False
    try:
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Queue.Declare(queue=name, passive=True),
                 commands.Queue.DeclareOk)
        return True
    except ProtocolError:
        return False
    finally:
        conn.sock.close()


def mirror_all(node: ClusterNode) -> None:
    r = node.api.put("/api/policies/%2F/ha-all", {
        "pattern": f"^{QUEUE}$", "apply-to": "queues", "definition": {"ha-mode": "all"}})
    assert r.status in (201, 204), r.text


def synchronised(node: ClusterNode, name: str) -> list[str]:
    return list(queue_info(node, name).get("synchronised_mirror_nodes") or [])


class Publisher(ConfirmPublisher):
    """Confirmed publishes to QUEUE (cluster_support.ConfirmPublisher)."""

    def __init__(self, url: str, window: int = 1000, batch: int = 100) -> None:
        super().__init__(url, QUEUE, window, batch)


def consume_all(node: ClusterNode, expect: set[int], quiet: float = 3.0,
                limit: float = 180.0) -> list[tuple[int, bool]]:
    """Every message of the queue read from ``node`` (acked): (number, redelivered),
    until every expected one came and the queue stayed quiet ``quiet`` seconds. A
    connection the broker closes (a node pausing for a moment under load: its
    heartbeats were late) is opened again, as a client would; what it held unacked
    comes back redelivered."""
    got: list[tuple[int, bool]] = []
    seen: set[int] = set()
    deadline = time.monotonic() + limit
    last = time.monotonic()
    reconnects = 0
    while time.monotonic() < deadline:
        try:
            last = _consume(node, got, seen, expect, quiet, deadline, last)
            return got
        except (OSError, ProtocolError) as exc:
            reconnects += 1
            assert reconnects <= 10, f"consumer on {node.name} lost too often: {exc}"
            print(f"consumer on {node.name}: {exc}; consuming again")
            wait_for(lambda: usable(node, QUEUE), 30, f"{QUEUE} usable on {node.name}",
                     node.tail)
    return got


def _consume(node: ClusterNode, got: list[tuple[int, bool]], seen: set[int],
             expect: set[int], quiet: float, deadline: float, last: float) -> float:
    conn = Conn(node.url)
    ch = conn.open_channel(1)
    conn.rpc(ch, commands.Basic.Qos(prefetch_count=2000), commands.Basic.QosOk)
    conn.rpc(ch, commands.Basic.Consume(queue=QUEUE, consumer_tag="reader"),
             commands.Basic.ConsumeOk)
    conn.sock.settimeout(0.5)
    redelivered = False
    unacked = 0
    tag = 0
    while time.monotonic() < deadline:
        try:
            _ch, fr = conn.read_frame()
        except TimeoutError:
            if seen >= expect and time.monotonic() - last >= quiet:
                break
            continue
        if isinstance(fr, commands.Basic.Deliver):
            redelivered = bool(fr.redelivered)
            assert fr.delivery_tag is not None
            tag = fr.delivery_tag
        elif isinstance(fr, pbody.ContentBody):
            number = int(fr.value)
            got.append((number, redelivered))
            seen.add(number)
            last = time.monotonic()
            unacked += 1
            if unacked >= 500:
                conn.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=True))
                unacked = 0
        elif isinstance(fr, commands.Basic.Cancel | commands.Channel.Close |
                        commands.Connection.Close):
            conn.sock.close()
            raise ProtocolError(f"consumer stopped by the broker: {fr}")
    if unacked:
        conn.send(ch, commands.Basic.Ack(delivery_tag=tag, multiple=True))
    conn.close()
    return last


@pytest.mark.slow
def test_kill_9_of_the_leader_during_confirmed_publishing_loses_nothing_confirmed(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    mirror_all(a)
    declare_durable(a, QUEUE)
    wait_for(lambda: sorted(synchronised(a, QUEUE)) == [b.name, c.name], 30,
             "both mirrors synchronised", a.tail)
    # every node reads the mirror record from etcd
    wait_for(lambda: sorted(synchronised(b, QUEUE)) == [b.name, c.name], 10,
             "node-b shows the mirrors", b.tail)
    info = queue_info(b, QUEUE)
    assert info["node"] == a.name
    assert sorted(info["slave_nodes"]) == [b.name, c.name]
    assert sorted(info["synchronised_slave_nodes"]) == [b.name, c.name]
    # every mirrored queue has two synchronised copies besides A: stopping A is safe
    assert a.api.get("/api/health/checks/node-is-mirror-sync-critical").status == 200

    seed = int(os.environ.get("AMQPD_TEST_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    kill_at = rng.randrange(TOTAL // 10, TOTAL * 6 // 10)
    print(f"seed {seed}: {TOTAL} messages, node-a killed after message {kill_at}")
    pub = Publisher(b.url)
    t0 = time.monotonic()
    # as a client would: back off while publishes are nacked
    killed_at_confirmed = publish_killing(pub, TOTAL, kill_at, a,
                                          backoff=lambda: time.sleep(0.05))
    pub.drain(60)
    elapsed = time.monotonic() - t0
    print(f"published {TOTAL} in {elapsed:.1f}s: {len(pub.confirmed)} confirmed, "
          f"{len(pub.nacked)} nacked, {len(pub.outstanding)} unanswered")
    assert not pub.outstanding, "every publish answered"
    assert killed_at_confirmed >= 0
    # publishers keep getting confirms after the failover
    assert any(n > kill_at for n in pub.confirmed), "no confirm after the failover"
    pub.conn.close()

    # a mirror took over; C can use the queue
    wait_for(lambda: queue_info(c, QUEUE).get("node") in (b.name, c.name)
             and usable(c, QUEUE), 30, "the queue led by a promoted mirror",
             lambda: diagnose(nodes))
    leader = queue_info(c, QUEUE)["node"]
    print(f"promoted: {leader}")

    got = consume_all(c, pub.confirmed)
    check_consumed(got, pub.confirmed)
    numbers = {n for n, _r in got}
    assert numbers <= set(range(TOTAL))
    print(f"consumed {len(got)} ({len(got) - len(numbers)} duplicates, "
          f"{sum(1 for _n, r in got if r)} redelivered)")

    # the old leader returns: it finds the queue led elsewhere, drops its own copy and
    # becomes a synchronised mirror of the new leader
    a.start()
    new_leader = b if leader == b.name else c
    wait_for(lambda: sorted(synchronised(new_leader, QUEUE)) == sorted(
        n.name for n in nodes if n is not new_leader), 60,
        "the returning node-a synchronised as a mirror", lambda: diagnose(nodes))
    assert queue_info(a, QUEUE)["node"] == leader
    assert usable(a, QUEUE)


def sync_critical(node: ClusterNode) -> tuple[int, Any]:
    r = node.api.get("/api/health/checks/node-is-mirror-sync-critical")
    return r.status, r.json()


def test_a_returning_mirror_catches_up_in_the_background_and_holds_everything(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    # mirrored on A and B only (ha-mode nodes): C uses it remotely
    r = a.api.put("/api/policies/%2F/ha-ab", {
        "pattern": f"^{QUEUE}$", "apply-to": "queues",
        "definition": {"ha-mode": "nodes", "ha-params": [a.name, b.name],
                       "ha-sync-mode": "automatic"}})
    assert r.status in (201, 204), r.text
    declare_durable(a, QUEUE)
    wait_for(lambda: synchronised(a, QUEUE) == [b.name], 30, "node-b synchronised",
             lambda: diagnose(nodes))
    assert queue_info(a, QUEUE)["mirror_nodes"] == [b.name]
    assert sync_critical(a)[0] == 200
    pub = Publisher(a.url)
    pub.publish_range(0, 5000)
    assert len(pub.confirmed) == 5000

    # B goes: A holds the only copy, stopping it would lose data
    b.kill()
    wait_for(lambda: synchronised(a, QUEUE) == [], 30, "node-b left the set",
             lambda: diagnose(nodes))
    status, body = sync_critical(a)
    assert status == 503, body
    assert body["queues"] == [{"name": QUEUE, "vhost": "/"}]
    assert sync_critical(c)[0] == 200  # C holds no copy
    pub.publish_range(5000, 10000)  # confirmed with no mirror to wait for
    assert len(pub.confirmed) == 10000

    # B returns while a publisher runs: its copy is made in the background
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    failure: list[BaseException] = []
    thread = publishing_thread(pub, 10000, stop, failure)
    thread.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            samples.append((time.monotonic(), len(pub.confirmed)))
            time.sleep(0.1)
        before = samples[-1]
        b.start()
        restarted = (time.monotonic(), len(pub.confirmed))
        wait_for(lambda: synchronised(a, QUEUE) == [b.name], 90,
                 "the returning mirror synchronised", lambda: diagnose(nodes))
        synced = (time.monotonic(), len(pub.confirmed))
    finally:
        stop.set()
        thread.join(90)
    assert not failure, failure
    assert not pub.outstanding
    rate_before = (before[1] - samples[0][1]) / (before[0] - samples[0][0])
    rate_during = (synced[1] - restarted[1]) / (synced[0] - restarted[0])
    print(f"confirmed publishes/s: {rate_before:.0f} before node-b returned, "
          f"{rate_during:.0f} while it caught up ({synced[0] - restarted[0]:.1f}s, "
          f"{len(pub.confirmed)} confirmed in all)")
    assert synced[1] > restarted[1], "publishers stalled while the mirror caught up"
    assert sync_critical(a)[0] == 200
    pub.conn.close()
    # B kept the 5,000 it held across its restart (nothing was consumed): A sent only
    # what was published after B went (5,000 and those before B's copy restarted),
    # every frame one 10-byte message's
    line = log_of(a).split("mirror on node-b synchronised (")[-1].split(")")[0]
    print(f"node-a: mirror on node-b synchronised ({line})")
    copied, nbytes, kept = (int(w) for w in re.findall(r"\d+", line))
    assert kept == 5000, line
    assert 5000 <= copied <= len(pub.confirmed) - 5000 + pub.window, line
    assert nbytes % copied == 0 and nbytes // copied < 200, line

    # the copy made in the background holds every confirmed message: lose A, read on C
    a.kill()
    wait_for(lambda: queue_info(c, QUEUE).get("node") == b.name and usable(c, QUEUE), 30,
             "the queue led by node-b", lambda: diagnose(nodes))
    got = consume_all(c, pub.confirmed)
    missing = pub.confirmed - {n for n, _r in got}
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:10]}"


def leaver_cancelled(conns: dict[str, Conn]) -> None:
    """The consumer tagged "leaver" (x-cancel-on-ha-failover) gets basic.cancel within
    30 s of its leader's loss; its connection is taken out of ``conns`` and closed."""
    leaver = conns.pop("leaver")
    leaver.sock.settimeout(30)
    assert leaver.expect(1, commands.Basic.Cancel).consumer_tag == "leaver"
    leaver.close()


def frames_round(conns: dict[str, Conn], nodes: list[ClusterNode],
                 ) -> Iterator[tuple[str, Conn, Any]]:
    """One frame from each consumer's connection in turn, (tag, connection, frame); a
    connection with none within its socket timeout is passed over. A consumer the broker
    stops (cancel, channel or connection close) fails the test."""
    for tag, conn in conns.items():
        try:
            _ch, fr = conn.read_frame()
        except TimeoutError:
            continue
        if isinstance(fr, commands.Basic.Cancel | commands.Channel.Close |
                      commands.Connection.Close):
            raise AssertionError(f"{tag} was stopped: {fr}\n{diagnose(nodes)}")
        yield tag, conn, fr


def test_consumers_follow_the_promoted_mirror_unless_they_ask_to_be_cancelled(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    mirror_all(a)
    declare_durable(a, QUEUE)
    wait_for(lambda: sorted(synchronised(c, QUEUE)) == [b.name, c.name], 30,
             "both mirrors synchronised (as node-c reads the record)",
             lambda: diagnose(nodes))
    total = 1000
    pub = Publisher(b.url)
    pub.publish_range(0, total)
    assert len(pub.confirmed) == total
    pub.conn.close()

    # consumers on B and C through the leader A (a connection each), each holding 10
    # unacked deliveries: keepers on both (one of them will be the promoted node), one
    # that asks to be cancelled on C
    conns = {"keeper-b": Conn(b.url), "keeper-c": Conn(c.url), "leaver": Conn(c.url)}
    held: dict[str, list[int]] = {}
    last_tag: dict[str, int] = {}
    for tag, conn in conns.items():
        args: dict[str, Any] = {"x-cancel-on-ha-failover": True} if tag == "leaver" else {}
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
        conn.rpc(ch, commands.Basic.Consume(queue=QUEUE, consumer_tag=tag, arguments=args),
                 commands.Basic.ConsumeOk)
        held[tag] = []
        while len(held[tag]) < 10:
            _ch, fr = conn.read_frame()
            if isinstance(fr, commands.Basic.Deliver):
                assert fr.delivery_tag is not None
                last_tag[tag] = fr.delivery_tag
            elif isinstance(fr, pbody.ContentBody):
                held[tag].append(int(fr.value))

    a.kill()
    leaver_cancelled(conns)
    # the keepers ack what they held (those acks reach no leader: the new one has them
    # back, redelivered) and consume on from the new leader
    for tag, conn in conns.items():
        conn.sock.settimeout(0.2)
        conn.send(1, commands.Basic.Ack(delivery_tag=last_tag[tag], multiple=True))
    got: list[tuple[int, bool]] = []
    redelivered: dict[str, bool] = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and {n for n, _r in got} < set(range(total)):
        for tag, conn, fr in frames_round(conns, nodes):
            if isinstance(fr, commands.Basic.Deliver):
                redelivered[tag] = bool(fr.redelivered)
                assert fr.delivery_tag is not None
                conn.send(1, commands.Basic.Ack(delivery_tag=fr.delivery_tag))
            elif isinstance(fr, pbody.ContentBody):
                got.append((int(fr.value), redelivered[tag]))
    for conn in conns.values():
        conn.close()
    numbers = {n for n, _r in got}
    assert numbers == set(range(total)), f"{total - len(numbers)} never came to the keepers"
    # what the consumers held unacked when A died comes back redelivered
    assert {n for tag in held for n in held[tag]} <= {n for n, r in got if r}


def test_consumers_follow_a_leader_killed_the_moment_its_mirrors_are_in_sync(
        nodes: list[ClusterNode]) -> None:
    """The leader is killed right after its mirrors became synchronised: a mirror may
    not have read the queue's mirror record from etcd yet (every node reads them
    periodically) when its link to the leader goes. Its consumers are kept all the
    same (it holds a copy of the queue) and consume from the promoted mirror. CI once
    saw keeper-b cancelled in this order of events; before the fix this test failed
    that way in 1 of 4 runs (the decision itself: tests/unit/cluster/
    test_mirror_failover.py, deterministic)."""
    a, b, c = nodes
    declare_durable(a, QUEUE)
    wait_for(lambda: usable(b, QUEUE) and usable(c, QUEUE), 30, "the queue known on B, C",
             lambda: diagnose(nodes))
    conns = {"keeper-b": Conn(b.url), "keeper-c": Conn(c.url), "leaver": Conn(c.url)}
    for tag, conn in conns.items():
        args: dict[str, Any] = {"x-cancel-on-ha-failover": True} if tag == "leaver" else {}
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Basic.Consume(queue=QUEUE, consumer_tag=tag, arguments=args),
                 commands.Basic.ConsumeOk)
    mirror_all(a)
    deadline = time.monotonic() + 30
    while sorted(synchronised(c, QUEUE)) != [b.name, c.name]:  # polled closely
        assert time.monotonic() < deadline, f"mirrors not in sync\n{diagnose(nodes)}"
        time.sleep(0.01)
    a.kill()
    leaver_cancelled(conns)
    wait_for(lambda: usable(c, QUEUE), 60, "a mirror promoted", lambda: diagnose(nodes))
    total = 20
    publish_confirmed(c, 0, total)
    for conn in conns.values():
        conn.sock.settimeout(0.2)
    got: dict[str, set[int]] = {tag: set() for tag in conns}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and set().union(*got.values()) != set(range(total)):
        for tag, _conn, fr in frames_round(conns, nodes):
            if isinstance(fr, pbody.ContentBody):
                got[tag].add(int(fr.value))
    for conn in conns.values():
        conn.close()
    numbers = set().union(*got.values())
    assert numbers == set(range(total)), f"{total - len(numbers)} never came to the keepers"
    # both consume from the new leader (its consumers take turns)
    assert all(got.values()), {tag: sorted(n) for tag, n in got.items()}


def counted(node: ClusterNode) -> int:
    """QUEUE's message count on ``node``, -1 while the node refuses the declare."""
    try:
        return message_count(node, QUEUE)
    except ProtocolError:
        return -1


def message_count(node: ClusterNode, name: str) -> int:
    conn = Conn(node.url)
    try:
        return conn.message_count(conn.open_channel(1), name)
    finally:
        conn.close()


def publish_confirmed(node: ClusterNode, first: int, count: int,
                      retry_for: float = 30.0) -> None:
    """Every message confirmed; a nacked one is sent again (for ``retry_for`` seconds),
    as a client does. Right after a take-over a node's remote queue may already answer a
    passive declare while its stream to the new leader is not open yet: a publish is
    then nacked ("leader unreachable"), never acked and dropped (CI saw all 20 nacked
    within 26 ms of the promotion, 2026-12-06)."""
    pub = Publisher(node.url)
    pub.publish_resending(first, first + count, retry_for)
    assert pub.confirmed == set(range(first, first + count)), \
        f"every publish confirmed (nacked at the end: {sorted(pub.nacked)[:10]})"
    pub.conn.close()


def mirror_on_b_unsynchronised(a: ClusterNode, b: ClusterNode, nodes: list[ClusterNode],
                               old: int, new: int, extra: dict[str, Any] | None = None,
                               ) -> None:
    """``old`` messages in the queue led by A, then a mirror on B with ha-sync-mode
    manual (the default): B gets only the ``new`` messages published after it joined,
    so it stays unsynchronised while the old ones are in the queue."""
    declare_durable(a, QUEUE)
    publish_confirmed(a, 0, old)
    r = a.api.put("/api/policies/%2F/ha-ab", {
        "pattern": f"^{QUEUE}$", "apply-to": "queues",
        "definition": {"ha-mode": "nodes", "ha-params": [a.name, b.name], **(extra or {})}})
    assert r.status in (201, 204), r.text
    wait_for(lambda: queue_info(a, QUEUE).get("mirror_nodes") == [b.name], 30,
             "a mirror on node-b", lambda: diagnose(nodes))
    # once every node reads the record naming B's mirror (failover needs it)
    wait_for(lambda: queue_info(b, QUEUE).get("mirror_nodes") == [b.name], 30,
             "node-b reads the record", lambda: diagnose(nodes))
    publish_confirmed(a, old, new)
    assert synchronised(a, QUEUE) == [], "a manual mirror lacking old messages is not in sync"


def log_of(node: ClusterNode) -> str:
    assert node.proc is not None
    return node.proc.log_path.read_text(errors="replace")


def test_manual_sync_unsynchronised_mirror_promoted_on_failure_then_sync_queue(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    mirror_on_b_unsynchronised(a, b, nodes, old=300, new=100)

    # kill -9 of the leader: ha-promote-on-failure always (the default) promotes the
    # unsynchronised mirror; what it lacks (the 300 older messages) is lost, as RabbitMQ
    a.kill()
    wait_for(lambda: queue_info(c, QUEUE).get("node") == b.name and usable(c, QUEUE), 60,
             "the unsynchronised mirror on node-b promoted", lambda: diagnose(nodes))
    assert message_count(c, QUEUE) == 100

    # A returns as a mirror of B. It still holds, as its own old queue, the 100
    # messages B took over from it: B places them (MHAVE_FROM, MREKEY), so A lacks
    # nothing and is synchronised without a copy (issue 28; before, A dropped them
    # and, ha-sync-mode manual, stayed unsynchronised until an operator asked)
    a.start()
    wait_for(lambda: queue_info(b, QUEUE).get("mirror_nodes") == [a.name], 60,
             "node-a mirrors node-b's queue", lambda: diagnose(nodes))
    wait_for(lambda: synchronised(b, QUEUE) == [a.name], 60, "node-a synchronised",
             lambda: diagnose(nodes))
    assert "(0 messages, 0 bytes copied in the background; 100 it held kept)" in \
        log_of(b).split("mirror on node-a synchronised")[-1][:80]
    # sync_queue on any node (here C, which passes it to B) answers; nothing to copy
    out = c.ctl("sync_queue", "-p", "/", QUEUE)
    assert "Synchronising queue" in out.stdout
    # the management API's action answers too; a missing queue is 404 (amqpctl exit 1)
    r = c.api.post(f"/api/queues/%2F/{QUEUE}/actions", {"action": "cancel_sync"})
    assert r.status == 204, r.text
    assert c.api.post(f"/api/queues/%2F/{QUEUE}/actions", {"action": "x"}).status == 400
    assert c.ctl("sync_queue", "no-such-queue", check=False).returncode != 0
    got = consume_all(c, set(range(300, 400)))
    assert {n for n, _r in got} == set(range(300, 400))


def test_a_controlled_stop_hands_over_only_to_a_synchronised_mirror(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    mirror_on_b_unsynchronised(a, b, nodes, old=200, new=100)

    # SIGTERM of the leader's node: ha-promote-on-shutdown when-synced (the default)
    # leaves the queue down rather than promote B, which lacks 200 messages
    a.stop()
    wait_for(lambda: "stays down until node-a returns" in log_of(b), 30,
             "node-b declining to take over", lambda: diagnose(nodes))
    assert queue_info(c, QUEUE).get("node") == a.name
    assert not usable(c, QUEUE)

    # A returns with everything; B's copy (its node never went) is kept: A sends it
    # only the 200 it lacks, once asked (manual)
    a.start()
    wait_for(lambda: usable(c, QUEUE) and message_count(c, QUEUE) == 300, 60,
             "the queue back with its 300 messages", lambda: diagnose(nodes))
    wait_for(lambda: "mirror on node-b holds 100 of its messages (0 dropped), lacks 200"
             in log_of(a), 60, "node-b's copy kept", lambda: diagnose(nodes))
    a.ctl("sync_queue", QUEUE)
    wait_for(lambda: synchronised(a, QUEUE) == [b.name], 60, "node-b synchronised",
             lambda: diagnose(nodes))
    line = log_of(a).split("mirror on node-b synchronised (")[-1].split(")")[0]
    assert line.startswith("200 messages"), line
    assert line.endswith("100 it held kept"), line

    # synchronised now: a second controlled stop hands the queue over to B
    a.stop()
    wait_for(lambda: queue_info(c, QUEUE).get("node") == b.name and usable(c, QUEUE), 60,
             "node-b took over after the controlled stop", lambda: diagnose(nodes))
    # right after the take-over, a passive declare on C may meet a moment when its
    # stream to B is being opened again (404 "home node ... down"): asked until it counts
    wait_for(lambda: counted(c) == 300, 30, "300 messages counted on node-c",
             lambda: diagnose(nodes))


def test_transient_messages_and_unacked_deliveries_are_mirrored(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    declare_durable(a, QUEUE)
    publish_confirmed(a, 0, 50)
    # a consumer on A holds 10 of them unacknowledged when the policy applies
    holder = Conn(a.url)
    ch = holder.open_channel(1)
    holder.rpc(ch, commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
    holder.rpc(ch, commands.Basic.Consume(queue=QUEUE, consumer_tag="holder"),
               commands.Basic.ConsumeOk)
    held = 0
    while held < 10:
        if isinstance(holder.read_frame()[1], pbody.ContentBody):
            held += 1
    r = a.api.put("/api/policies/%2F/ha-ab", {
        "pattern": f"^{QUEUE}$", "apply-to": "queues",
        "definition": {"ha-mode": "nodes", "ha-params": [a.name, b.name],
                       "ha-sync-mode": "automatic"}})
    assert r.status in (201, 204), r.text
    wait_for(lambda: synchronised(a, QUEUE) == [b.name]
             and synchronised(b, QUEUE) == [b.name], 30, "node-b synchronised",
             lambda: diagnose(nodes))
    # 20 non-persistent messages, confirmed once B has them too
    pub = Publisher(a.url)
    pub.props = commands.Basic.Properties(delivery_mode=1)
    pub.publish(1000, 20)
    pub.drain(60)
    assert pub.confirmed == set(range(1000, 1020))
    pub.conn.close()

    a.kill()
    holder.sock.close()
    wait_for(lambda: queue_info(c, QUEUE).get("node") == b.name and usable(c, QUEUE), 60,
             "node-b promoted", lambda: diagnose(nodes))
    assert message_count(c, QUEUE) == 70
    got = consume_all(c, set(range(50)) | set(range(1000, 1020)))
    assert {n for n, _r in got} == set(range(50)) | set(range(1000, 1020))
    assert sum(1 for _n, r in got if r) >= 10  # the held ones come back redelivered


def mirror_record(etcd: EtcdProcess, node: ClusterNode, name: str) -> dict[str, Any]:
    """The queue's mirror record as etcd holds it (what every mirror decides on)."""
    key = f"{node.prefix}/{node.cluster}/mirrors/%2F/{q(name)}"
    req = urllib.request.Request(
        etcd.url + "/v3/kv/range", method="POST",
        data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.load(resp).get("kvs") or []
    return dict(json.loads(base64.b64decode(kvs[0]["value"]))) if kvs else {}


def test_promotion_when_synced_on_failure_and_always_on_shutdown(
        nodes: list[ClusterNode], etcd: EtcdProcess) -> None:
    a, b, c = nodes
    mirror_on_b_unsynchronised(a, b, nodes, old=100, new=50,
                               extra={"ha-promote-on-failure": "when-synced"})
    wait_for(lambda: mirror_record(etcd, a, QUEUE).get("promote_on_failure") == "when-synced"
             and mirror_record(etcd, a, QUEUE).get("mirrors") == [b.name], 30,
             "the record says when-synced", lambda: diagnose(nodes))

    # kill -9 with only an unsynchronised mirror, ha-promote-on-failure when-synced: the
    # queue stays down until its leader returns, with everything
    a.kill()
    wait_for(lambda: "so it is not promoted (ha-promote-on-failure when-synced)"
             in log_of(b), 30, "node-b declining", lambda: diagnose(nodes))
    assert queue_info(c, QUEUE).get("node") == a.name
    assert not usable(c, QUEUE)
    a.start()
    wait_for(lambda: usable(c, QUEUE) and message_count(c, QUEUE) == 150, 60,
             "the queue back with its 150 messages", lambda: diagnose(nodes))

    # ha-promote-on-shutdown always (on failure: always, the default): a controlled
    # stop hands over to the unsynchronised mirror; what it lacks is lost
    r = a.api.put("/api/policies/%2F/ha-ab", {
        "pattern": f"^{QUEUE}$", "apply-to": "queues",
        "definition": {"ha-mode": "nodes", "ha-params": [a.name, b.name],
                       "ha-promote-on-shutdown": "always"}})
    assert r.status in (201, 204), r.text
    wait_for(lambda: mirror_record(etcd, a, QUEUE).get("promote_on_shutdown") == "always"
             and mirror_record(etcd, a, QUEUE).get("promote_on_failure") == "always"
             and mirror_record(etcd, a, QUEUE).get("mirrors") == [b.name], 30,
             "the record says always", lambda: diagnose(nodes))
    assert synchronised(a, QUEUE) == []  # B kept its 50, lacks the 100 older ones
    a.stop()
    wait_for(lambda: queue_info(c, QUEUE).get("node") == b.name and usable(c, QUEUE), 60,
             "node-b took over after the controlled stop", lambda: diagnose(nodes))
    assert message_count(c, QUEUE) == 50
