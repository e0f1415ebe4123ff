"""Quorum queues across nodes (issue 16) with three amqpd processes and one etcd on loopback.

A quorum queue declared on node A gets members on A, B and C (RabbitMQ 3.10's default
group size of 3), recorded in etcd so every node shows the same ``leader`` / ``members``
/ ``online``. A publisher with confirms on B sends persistent messages while a consumer
on C reads them; A (the leader) is killed with kill -9 at a seeded random moment; the
member with the longest log among B and C is elected; the consumer goes on from the new
leader; every confirmed message is consumed, a duplicate only with redelivered=true.
Also: one of three nodes down keeps the queue serving, two down refuse publishes with a
nack and deliver nothing, and nothing confirmed is lost when they return; the
quorum-critical health check; membership edits with amqpctl.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import body as pbody
from pamqp import commands, header

from bench.loadgen import Conn, ProtocolError
from tests.integration._http import q
from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    QueueConsumer,
    check_consumed,
    diagnose,
    free_udp_port,
    new_prefix,
    publish_killing,
    running,
    three_nodes,
    wait_for,
    wait_formed,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess
from tests.support.tcpproxy import TcpProxy
from tests.support.udpproxy import UdpRelay

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(600),
]

QUEUE = "qq"
QUORUM = {"x-queue-type": "quorum"}
TOTAL = int(os.environ.get("AMQPD_TEST_QUORUM_MESSAGES", "20000"))


def queue_info(node: ClusterNode, name: str = QUEUE) -> dict[str, Any]:
    r = node.api.get(f"/api/queues/%2F/{q(name)}")
    return r.json() if r.status == 200 else {}


def declare(node: ClusterNode, name: str = QUEUE, /, **arguments: Any) -> None:
    conn = Conn(node.url)
    try:
        conn.declare_queue(conn.open_channel(1), name, durable=True,
                           arguments={**QUORUM, **arguments})
    finally:
        conn.close()


def critical(node: ClusterNode) -> tuple[int, Any]:
    r = node.api.get("/api/health/checks/node-is-quorum-critical")
    return r.status, r.json()


def group_formed(nodes: list[ClusterNode], leader: ClusterNode) -> None:
    """Every node shows the group; the leader's members hold complete copies."""
    names = sorted(n.name for n in nodes)

    def formed() -> bool:
        for n in nodes:
            info = queue_info(n)
            if info.get("leader") != leader.name or sorted(info.get("members", [])) != names:
                return False
            if sorted(info.get("online", [])) != names:
                return False
        return True

    wait_for(formed, 30, "the group shown on every node", lambda: diagnose(nodes))


class Publisher(ConfirmPublisher):
    """Confirmed publishes to QUEUE (cluster_support.ConfirmPublisher)."""

    def __init__(self, url: str, window: int = 1000, batch: int = 100) -> None:
        super().__init__(url, QUEUE, window, batch)


class Consumer(QueueConsumer):
    """A consumer thread on QUEUE (cluster_support.QueueConsumer)."""

    def __init__(self, node: ClusterNode, prefetch: int = 500, ack: bool = True) -> None:
        super().__init__(node, QUEUE, prefetch, ack)


def consume_every_confirmed(node: ClusterNode, confirmed: set[int],
                            nodes: list[ClusterNode]) -> None:
    """A consumer on ``node`` gets every confirmed message within 60 s, a message
    delivered twice only redelivered."""
    consumer = Consumer(node)
    with running(consumer):
        wait_for(lambda: consumer.seen >= confirmed, 60, "every confirmed message",
                 lambda: f"{len(confirmed - consumer.seen)} missing\n{diagnose(nodes)}")
    check_consumed(consumer.got, confirmed)


# The failure detectors of the kill test's nodes. With the defaults a survivor whose
# event loop is starved for a second on a loaded CI machine (the election and the
# promotion of a copy of thousands of messages run on it, beside two other brokers and
# the clients) stops sending heartbeats that long (heartbeat timeout 1 s), or waits for
# a starved etcd longer than its grace (0.6 x the lease, 3 s): it, or the other
# survivor that then sees only itself, pauses (pause_minority) and closes every
# connection with 320 -- a partition, handled as one, but not what this test is about
# (seeds 993290911, 857078444, 1010016328 under load). RabbitMQ's net_ticktime is 60 s;
# these still see node-a's kill within 5 s.
KILL_TEST_HEARTBEAT_TIMEOUT = "5"
KILL_TEST_LEASE_TTL = 10.0  # etcd grace 6 s


@pytest.fixture
def tolerant_nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """Three nodes whose failure detectors a scheduling stall under load does not reach."""
    with three_nodes(tmp_path, etcd.url, {
            "AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": KILL_TEST_HEARTBEAT_TIMEOUT},
            lease_ttl=KILL_TEST_LEASE_TTL) as started:
        yield started


@pytest.mark.slow
def test_kill_9_of_the_leader_during_confirmed_publishing_loses_nothing_confirmed(
        tolerant_nodes: list[ClusterNode]) -> None:
    nodes = tolerant_nodes
    a, b, c = nodes
    declare(a)
    group_formed(nodes, a)
    info = queue_info(b)
    assert info["type"] == "quorum"
    assert info["node"] == a.name
    # three members, all running: stopping any one node leaves a majority
    for n in nodes:
        assert critical(n)[0] == 200, critical(n)

    seed = int(os.environ.get("AMQPD_TEST_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    kill_at = rng.randrange(TOTAL // 10, TOTAL * 6 // 10)
    print(f"seed {seed}: {TOTAL} messages, node-a killed after message {kill_at}")
    consumer = Consumer(c)
    # a consumer on node-b that holds 20 deliveries unacknowledged across the kill: the
    # new leader keeps them checked out to it (RabbitMQ 3.10) and, node-b or node-c,
    # hands the holder nothing more, its window being full (node-c winning was seed
    # 704744393's "20 missing": test_holders_on_both_survivors_keep_their_windows_...)
    holder = Consumer(b, prefetch=20, ack=False)
    with running(consumer, holder):
        pub = Publisher(b.url)
        t0 = time.monotonic()
        # as a client would: back off while publishes are nacked, here until the group
        # has a new leader (polled; with this test's 5 s heartbeat timeout the rest of the
        # messages were otherwise all sent, and nacked, before it)
        killed_at_confirmed = publish_killing(
            pub, TOTAL, kill_at, a,
            backoff=lambda: wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name),
                                     30, "a new leader elected while publishing",
                                     lambda: diagnose(nodes)))
        pub.drain(60)
        elapsed = time.monotonic() - t0
        print(f"published {TOTAL} in {elapsed:.1f}s: {len(pub.confirmed)} confirmed, "
              f"{len(pub.nacked)} nacked, {len(pub.outstanding)} unanswered")
        assert not pub.outstanding, "every publish answered"
        assert killed_at_confirmed >= 0
        assert any(n > kill_at for n in pub.confirmed), "no confirm after the election"
        pub.conn.close()

        wait_for(lambda: queue_info(c).get("leader") in (b.name, c.name), 30,
                 "a new leader elected", lambda: diagnose(nodes))
        leader = queue_info(c)["leader"]
        print(f"elected: {leader}")
        wait_for(lambda: consumer.seen >= pub.confirmed - {n for n, _r in holder.got}, 180,
                 "the consumer on node-c got every confirmed message",
                 lambda: f"{len(pub.confirmed - consumer.seen)} missing; "
                         f"interruptions {consumer.interruptions}\n{diagnose(nodes)}")
    assert consumer.error is None, consumer.error
    assert holder.error is None and not holder.interruptions, holder.interruptions
    check_consumed(consumer.got, pub.confirmed - {n for n, _r in holder.got})
    # the consumer on a surviving node went on from the new leader without being stopped
    assert not consumer.interruptions, consumer.interruptions
    print(f"consumed {len(consumer.got)} ({sum(1 for _n, r in consumer.got if r)} "
          "redelivered)")
    # what came back of the lost leader's deliveries (sent to node-c but not yet handed
    # to the client there) came back once: x-delivery-count 1 (broker/quorum.py's rule:
    # every return of a delivery counts); the holder's 20 stayed its own (never
    # delivered to anyone else)
    held = {n for n, _r in holder.got}
    assert len(held) == 20 and len(holder.got) == 20, (len(held), len(holder.got))
    assert not held & consumer.seen, held & consumer.seen
    assert set(consumer.counts.values()) <= {1}, consumer.counts
    # the group has two running members of three: each of them is now critical
    new_leader = b if leader == b.name else c
    assert critical(new_leader)[0] == 503
    # the old leader returns as a member of the new leader's group
    a.start()
    wait_for(lambda: sorted(queue_info(a).get("online", [])) == sorted(n.name for n in nodes)
             and queue_info(a).get("leader") == leader, 60, "node-a back in the group",
             lambda: diagnose(nodes))
    wait_for(lambda: critical(new_leader)[0] == 200, 60, "node-a's copy complete again",
             lambda: diagnose(nodes))
    # deleted and declared again (on node-c): a new group whose streams the members,
    # which remember the old group's newer term, still accept
    assert new_leader.api.delete(f"/api/queues/%2F/{q(QUEUE)}").status == 204
    wait_for(lambda: all(not queue_info(n) for n in nodes), 30, "the queue gone everywhere")
    # (node-a, just restarted, may not be running or linked for node-c yet: it is a
    # member all the same and joins once it is, issue 28)
    declare(c)
    group_formed(nodes, c)
    # node-a's remote queue may answer before its stream to node-c is open: a publish
    # is then nacked, and sent again as a client does
    pub = Publisher(a.url)
    pub.publish_resending(0, pub.batch)
    assert pub.confirmed == set(range(pub.batch)), \
        f"{len(pub.nacked)} nacked\n{diagnose(nodes)}"
    pub.conn.close()


def test_holders_on_both_survivors_keep_their_windows_across_the_election(
        tolerant_nodes: list[ClusterNode]) -> None:
    """The kill test's node-c case made certain (issue 16: "20 missing", seed 704744393).
    A consumer kept across the election on the member that is NOT elected follows the
    new leader on the other node while its channel still holds the lost leader's
    deliveries unacked; the new leader keeps those messages checked out to it
    (RabbitMQ 3.10) and may hand that consumer only what its prefetch has left.
    Which survivor wins depends on whose log is longer at the kill, so both hold
    deliveries here: whichever is elected, the other one's holder takes that path (and
    the elected one's holder follows the promoted copy on its own node)."""
    nodes = tolerant_nodes
    a, b, c = nodes
    declare(a)
    group_formed(nodes, a)
    pub = Publisher(a.url)
    pub.publish_range(0, 500)
    assert len(pub.confirmed) == 500, f"{len(pub.nacked)} nacked"
    pub.conn.close()
    holders = [Consumer(n, prefetch=20, ack=False) for n in (b, c)]
    consumer = Consumer(b, prefetch=100)
    try:
        for h in holders:
            h.start()
        wait_for(lambda: all(len(h.got) == 20 for h in holders), 30,
                 "each holder has its prefetch", lambda: diagnose(nodes))
        consumer.start()
        wait_for(lambda: len(consumer.seen) == 460, 60, "the consumer got the rest",
                 lambda: diagnose(nodes))
        a.kill()
        wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name), 30,
                 "a new leader elected", lambda: diagnose(nodes))
        leader = queue_info(b)["leader"]
        print(f"elected: {leader}")
        elected = b if leader == b.name else c
        wait_for(lambda: queue_info(c).get("leader") == leader, 30,
                 "every survivor names the new leader", lambda: diagnose(nodes))
        pub = Publisher(elected.url)
        pub.publish(500, pub.batch)
        pub.drain(60)
        assert len(pub.confirmed) == pub.batch, f"{len(pub.nacked)} nacked"
        pub.conn.close()
        held = {n for h in holders for n, _r in h.got}
        assert len(held) == 40, held
        expected = set(range(500 + pub.batch))
        wait_for(lambda: consumer.seen >= expected - held, 60,
                 "the consumer got every message the holders do not hold",
                 lambda: f"{len(expected - held - consumer.seen)} missing: "
                         f"{sorted(expected - held - consumer.seen)[:40]}; holders got "
                         f"{[len(h.got) for h in holders]}\n{diagnose(nodes)}")
    finally:
        consumer.stopped.set()
        for h in holders:
            h.stopped.set()
        consumer.join(30)
        for h in holders:
            h.join(30)
    assert consumer.error is None, consumer.error
    assert not consumer.interruptions, consumer.interruptions
    check_consumed(consumer.got, expected - held)
    for h in holders:
        assert h.error is None and not h.interruptions, h.interruptions
        # its window stayed full of the lost leader's deliveries: nothing more came
        assert len(h.got) == 20, (h.node.name, len(h.got))
    assert not held & consumer.seen, held & consumer.seen  # still the holders' own


def get_one(node: ClusterNode) -> int | None:
    """basic.get (acked) on ``node``: the message number, or None when empty."""
    conn = Conn(node.url)
    try:
        ch = conn.open_channel(1)
        conn.send(ch, commands.Basic.Get(queue=QUEUE, no_ack=True))
        while True:
            _ch, fr = conn.read_frame()
            if isinstance(fr, commands.Basic.GetEmpty):
                return None
            if isinstance(fr, pbody.ContentBody):
                return int(fr.value)
    finally:
        conn.close()


@pytest.fixture
def ignoring(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """Three nodes with ``partition_handling = ignore``: a node that sees only itself
    keeps running (with pause_minority it would pause, and so would its queues), so
    what a quorum queue's group does without its majority shows."""
    with three_nodes(tmp_path, etcd.url, partition_handling="ignore") as started:
        yield started


def tx_publish(node: ClusterNode, number: int) -> str:
    """One persistent message in a transaction on ``node``: "commit-ok", or how the
    broker refused (the connection or channel close)."""
    conn = Conn(node.url)
    try:
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Tx.Select(), commands.Tx.SelectOk)
        data = b"%010d" % number
        conn.send(ch, commands.Basic.Publish(exchange="", routing_key=QUEUE),
                  header.ContentHeader(0, len(data), commands.Basic.Properties(delivery_mode=2)),
                  pbody.ContentBody(data))
        conn.rpc(ch, commands.Tx.Commit(), commands.Tx.CommitOk)
        return "commit-ok"
    except ProtocolError as exc:
        return str(exc)
    finally:
        conn.sock.close()


def test_one_node_down_serves_two_down_refuse_and_nothing_confirmed_is_lost(
        ignoring: list[ClusterNode]) -> None:
    nodes = ignoring
    a, b, c = nodes
    declare(a)
    group_formed(nodes, a)
    pub = Publisher(a.url)
    pub.publish_range(0, 1000)
    assert len(pub.confirmed) == 1000

    # C goes: A and B are a majority of three; the queue keeps serving
    c.kill()
    wait_for(lambda: critical(a)[0] == 503, 30, "node-a quorum-critical",
             lambda: diagnose(nodes))
    status, body = critical(a)
    assert status == 503
    assert body["status"] == "failed"
    assert body["reason"] == ("There are quorum queues that would lose their quorum if "
                              "the target node is shut down")
    assert body["queues"] == [{"name": QUEUE, "virtual_host": "/", "type": "quorum",
                               "readable_name": f"queue '{QUEUE}' in vhost '/'"}]
    assert sorted(queue_info(a)["online"]) == [a.name, b.name]
    pub.publish_range(1000, 2000)
    assert len(pub.confirmed) == 2000, f"{len(pub.nacked)} nacked with one node down"
    assert tx_publish(a, 2500) == "commit-ok"  # tx.commit-ok after the majority's acks
    pub.confirmed.add(2500)

    # B goes too: A alone is no majority; publishes are refused, nothing is delivered
    b.kill()
    wait_for(lambda: sorted(queue_info(a)["online"]) == [a.name], 30, "only node-a online",
             lambda: diagnose(nodes))
    pub.publish_range(2000, 2100)
    assert not pub.outstanding
    refused = {n for n in range(2000, 2100) if n in pub.nacked}
    assert refused == set(range(2000, 2100)), \
        f"{len(pub.confirmed & set(range(2000, 2100)))} confirmed without a majority"
    assert get_one(a) is None, "delivered without a majority"
    # a transaction is not made durable on a majority: its connection is closed (541),
    # never a commit-ok
    refusal = tx_publish(a, 2600)
    assert refusal.startswith("connection.close 541"), refusal
    # refusals, not a failing disk: no store alarm
    assert a.api.get("/api/health/checks/local-alarms").status == 200

    # both return: the group has its majority again, every confirmed message is there
    b.start()
    c.start()
    wait_for(lambda: critical(a)[0] == 200, 90, "the group complete again",
             lambda: diagnose(nodes))
    assert queue_info(b)["leader"] == a.name
    pub.publish_range(3000, 3500)
    assert set(range(3000, 3500)) <= pub.confirmed
    pub.conn.close()
    consume_every_confirmed(b, pub.confirmed, nodes)


def members(node: ClusterNode) -> list[str]:
    return sorted(queue_info(node).get("members", []))


def test_members_are_added_and_removed_with_amqpctl_and_a_new_one_catches_up(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    declare(a, **{"x-quorum-initial-group-size": 2})
    wait_for(lambda: all(members(n) == [a.name, b.name] for n in nodes), 30,
             "two members shown everywhere", lambda: diagnose(nodes))
    # two members, both running: stopping either loses the majority (RabbitMQ: 2 =< 2)
    wait_for(lambda: critical(a)[0] == 503, 30, "node-a critical")
    assert critical(c)[0] == 200  # no member on node-c
    pub = Publisher(a.url)
    pub.publish_range(0, 2000)
    assert len(pub.confirmed) == 2000

    # refusals, as rabbitmq-queues gives them
    out = b.ctl("add_member", QUEUE, "node-x", check=False)
    assert out.returncode != 0 and "not a member of the cluster" in out.stdout + out.stderr
    out = b.ctl("add_member", QUEUE, b.name, check=False)
    assert out.returncode != 0 and "already a member" in out.stdout + out.stderr
    out = b.ctl("delete_member", "no-such-queue", b.name, check=False)
    assert out.returncode != 0
    # add node-c from another node than the leader: it copies the backlog in the background
    b.ctl("add_member", QUEUE, c.name)
    wait_for(lambda: all(members(n) == sorted([a.name, b.name, c.name]) for n in nodes), 30,
             "node-c a member everywhere", lambda: diagnose(nodes))
    wait_for(lambda: critical(a)[0] == 200, 30, "three members: node-a not critical")
    # node-b leaves (shrink): [a, c] is a group of two, so a confirm now needs node-c's
    # copy complete and its acknowledgement
    rows = c.ctl_json("shrink", b.name)
    assert rows == [{"vhost": "/", "name": QUEUE, "size": 2, "result": "ok"}]
    wait_for(lambda: all(members(n) == sorted([a.name, c.name]) for n in nodes), 30,
             "node-b removed everywhere", lambda: diagnose(nodes))
    pub.publish_range(2000, 2500)
    assert set(range(2000, 2500)) <= pub.confirmed, \
        f"{len(pub.nacked)} nacked: node-c's copy never completed\n{diagnose(nodes)}"
    # the leader's member cannot be deleted on request (amqpd moves no leader)
    out = c.ctl("delete_member", QUEUE, a.name, check=False)
    assert out.returncode != 0 and "leads the group" in out.stdout + out.stderr
    # grow node-b on queues with an even number of members: back to three
    rows = a.ctl_json("grow", b.name, "even")
    assert rows == [{"vhost": "/", "name": QUEUE, "size": 3, "result": "ok"}]
    wait_for(lambda: members(a) == sorted(n.name for n in nodes), 30, "node-b back")
    pub.conn.close()
    consume_every_confirmed(c, pub.confirmed, nodes)


@pytest.fixture
def cut_off(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """Three nodes with ``partition_handling = ignore``, each reaching etcd through a TCP
    proxy and getting its heartbeats through a UDP relay the test controls
    (tests/integration/test_cluster_partition.py's controls): a node cut off keeps
    serving its clients, so a deposed leader's behaviour shows."""
    prefix = new_prefix()
    started: list[ClusterNode] = []
    try:
        for name in ("a", "b", "c"):
            hb_port = free_udp_port()
            relay = UdpRelay(("127.0.0.1", hb_port)).start()
            proxy = TcpProxy("127.0.0.1", etcd.client_port).start()
            started.append(ClusterNode(f"node-{name}", tmp_path / name, etcd.url, prefix,
                                       partition_handling="ignore", etcd_proxy=proxy,
                                       relay=relay, hb_port=hb_port))
        for n in started:
            n.start()
        wait_formed(started)
        yield started
    finally:
        for n in started:
            n.stop()
            if n.relay is not None:
                n.relay.stop()
            if n.etcd_proxy is not None:
                n.etcd_proxy.stop()


def test_a_cut_off_leader_confirms_nothing_while_the_majority_elects_another(
        cut_off: list[ClusterNode]) -> None:
    """The leader A loses etcd and the heartbeats (partition_handling = ignore: it keeps
    its clients); B and C elect a new leader; whatever A's publisher sends meanwhile is
    refused (nack), B's publisher gets confirms: never two leaders accepting publishes.
    After the heal A follows the new leader, and every confirmed message is there."""
    from tests.integration.test_cluster_partition import heal, isolate

    nodes = cut_off
    a, b, c = nodes
    declare(a)
    group_formed(nodes, a)
    pub_a = Publisher(a.url)
    pub_a.publish_range(0, 500)
    assert len(pub_a.confirmed) == 500

    isolate(a, [b, c])
    wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name), 60,
             "B and C elect a new leader", lambda: diagnose(nodes))
    new_leader = queue_info(b)["leader"]
    print(f"elected during the partition: {new_leader}")
    # A still has its clients; what they publish to its old copy is never confirmed
    pub_a.publish_range(10000, 10200)
    assert not pub_a.outstanding
    during = set(range(10000, 10200))
    assert not pub_a.confirmed & during, \
        f"{len(pub_a.confirmed & during)} confirmed by the cut-off old leader"
    # refusals, not a failing disk: no store alarm
    assert a.api.get("/api/health/checks/local-alarms").status == 200
    # the majority's side confirms
    # through node-b: when node-c was elected, node-b's stream to it may not be open
    # yet and its first publishes are nacked; they are sent again as a client does
    pub_b = Publisher(b.url)
    pub_b.publish_resending(20000, 20500)
    assert pub_b.confirmed == set(range(20000, 20500)), \
        f"{len(pub_b.nacked)} nacked on the majority"
    pub_a.conn.close()
    pub_b.conn.close()

    heal(a, [b, c])
    wait_formed(nodes, timeout=60)
    wait_for(lambda: queue_info(a).get("leader") == new_leader and
             sorted(queue_info(a).get("online", [])) == sorted(n.name for n in nodes), 60,
             "node-a follows the new leader", lambda: diagnose(nodes))
    consume_every_confirmed(a, pub_a.confirmed | pub_b.confirmed, nodes)


def test_a_leader_locator_puts_the_leader_elsewhere(nodes: list[ClusterNode]) -> None:
    """A ``queue-master-locator: min-masters`` policy: node-a already leads a queue, so
    a quorum queue declared on node-a is led by node-b, which creates the group."""
    a, b, _c = nodes
    conn = Conn(a.url)
    try:
        conn.declare_queue(conn.open_channel(1), "filler", durable=True)
    finally:
        conn.close()
    r = a.api.put("/api/policies/%2F/locate", {
        "pattern": f"^{QUEUE}$", "apply-to": "queues",
        "definition": {"queue-master-locator": "min-masters"}})
    assert r.status in (201, 204), r.text
    wait_for(lambda: all(any(p["name"] == "locate" for p in n.api.get("/api/policies").json())
                         for n in nodes), 30, "the policy everywhere")
    declare(a)
    group_formed(nodes, b)
    pub = Publisher(a.url)
    pub.publish(0, pub.batch)
    pub.drain(60)
    assert len(pub.confirmed) == pub.batch, f"{len(pub.nacked)} nacked\n{diagnose(nodes)}"
    pub.conn.close()
