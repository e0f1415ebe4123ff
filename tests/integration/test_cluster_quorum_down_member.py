"""A node that is down when a quorum queue is declared is a member all the same (issue 28).

RabbitMQ 3.10 picks a new quorum queue's members among every node of the cluster,
running or not (``rabbit_mnesia:cluster_nodes(all)``); a member that is down catches up
from the leader when it is back. amqpd used to pick among the running nodes only, so a
node restarting at that moment (CI: "link from node-a: not accepted now") was left out
of the group for ever.

Three nodes and etcd on loopback: node-a is killed with kill -9; a quorum queue (the
default group size, 3) is declared on node-c; every node shows node-a among its
``members`` (not ``online``); 300 confirmed messages go in. node-a starts again: it is
``online`` on every node and its copy is complete -- shown by killing node-b and
publishing 300 more, which only node-a's acknowledgement can confirm (a majority of
three is two). Then node-c (the leader) is killed and node-b restarted: node-b missed the
second 300, so the election must pick node-a (the longest log), which serves every
confirmed message.
"""

from __future__ import annotations

import pytest

from tests.integration.cluster_support import (
    ClusterNode,
    diagnose,
    wait_for,
    wait_formed,
)
from tests.integration.test_cluster_quorum import (
    Publisher,
    consume_every_confirmed,
    declare,
    group_formed,
    queue_info,
)
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

BATCH = 300


def members(node: ClusterNode) -> list[str]:
    return sorted(queue_info(node).get("members", []))


def running_nodes(node: ClusterNode) -> list[str]:
    return list(node.status()["running_nodes"])


def publish_until_confirmed(node: ClusterNode, first: int, count: int,
                            nodes: list[ClusterNode]) -> set[int]:
    """``count`` messages confirmed through ``node``, numbered from ``first``. A batch
    the leader nacks (a majority not complete yet: its copy still catching up) is sent
    again under new numbers, as a client re-sends, for at most 60 s; the numbers
    confirmed."""
    pub = Publisher(node.url)
    try:
        number = first
        confirmed: set[int] = set()
        for _round in range(60):
            want = count - len(confirmed)
            if want <= 0:
                break
            pub.publish(number, want)
            pub.drain(30)
            assert not pub.outstanding, f"unanswered publishes\n{diagnose(nodes)}"
            confirmed = set(pub.confirmed)
            number += want
        assert len(confirmed) >= count, \
            f"{len(pub.nacked)} nacked, {len(confirmed)} confirmed\n{diagnose(nodes)}"
        print(f"through {node.name}: {len(confirmed)} confirmed, {len(pub.nacked)} nacked "
              "and sent again")
        return confirmed
    finally:
        pub.conn.close()


def test_a_member_down_at_declare_joins_catches_up_and_can_lead(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    everyone = sorted(n.name for n in nodes)

    a.kill()
    wait_for(lambda: running_nodes(b) == [b.name, c.name] ==
             running_nodes(c), 30, "node-a seen down by node-b and node-c",
             lambda: diagnose(nodes))
    declare(c)
    # node-a is a member (RabbitMQ: every cluster node, running or not), not online
    # (until the group record is read a node shows the queue's own node alone)
    wait_for(lambda: members(b) == members(c) == everyone, 30,
             "every node a member, shown on node-b and node-c",
             lambda: f"{queue_info(b)}\n{queue_info(c)}\n{diagnose(nodes)}")
    for n in (b, c):
        info = queue_info(n)
        assert info["leader"] == c.name, info
        assert sorted(info["online"]) == [b.name, c.name], info
    confirmed = publish_until_confirmed(b, 0, BATCH, nodes)

    # node-a is back: a member online on every node
    a.start()
    wait_formed(nodes)
    group_formed(nodes, c)

    # node-b goes: node-c and node-a are the majority, so a confirm now needs node-a's
    # copy complete (the first 300 caught up) and its acknowledgement
    b.kill()
    wait_for(lambda: sorted(queue_info(c).get("online", [])) == [a.name, c.name], 30,
             "node-b seen down", lambda: diagnose(nodes))
    second = publish_until_confirmed(c, 10_000, BATCH, nodes)
    confirmed |= second

    # the leader goes and node-b returns: node-b lacks the second batch, node-a holds
    # everything, so node-a is elected
    c.kill()
    b.start()
    wait_for(lambda: queue_info(a).get("leader") == a.name and
             queue_info(b).get("leader") == a.name, 60,
             "node-a elected leader", lambda: diagnose(nodes))
    survivors = [a, b]
    consume_every_confirmed(b, confirmed, survivors)
