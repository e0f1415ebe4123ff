"""A member that never had a copy still votes in its group's election (issue 28).

A quorum queue's election needs offers from a majority of its members; a member whose
copy was never started (its node was down while the queue was declared and the leader
was lost before it came back) offers nothing it holds, but its vote (-1: "nothing of the
lost leader's log") is what lets the member with the complete copy reach a majority.
amqpd counted only members holding a copy, so the group waited for its lost leader.
RabbitMQ's Raft counts every member's vote, log or not.

Three nodes and etcd on loopback: node-a is killed with kill -9; a quorum queue (the
default group size, 3: node-a a member though down) is declared on node-c; 300
confirmed messages go in (node-c and node-b, a majority). node-c (the leader) is killed
and node-a started: node-a never had a copy, node-b holds every confirmed message, so
node-b must be elected with node-a's vote and serve all 300.
"""

from __future__ import annotations

import pytest

from tests.integration import test_cluster_quorum_down_member as down
from tests.integration.cluster_support import ClusterNode, diagnose, wait_for
from tests.integration.test_cluster_quorum import consume_every_confirmed, declare, queue_info
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]


def test_a_member_that_never_had_a_copy_votes_for_the_complete_one(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    everyone = sorted(n.name for n in nodes)

    a.kill()
    wait_for(lambda: down.running_nodes(b) == [b.name, c.name] == down.running_nodes(c), 30,
             "node-a seen down by node-b and node-c", lambda: diagnose(nodes))
    declare(c)
    wait_for(lambda: down.members(b) == down.members(c) == everyone, 30,
             "every node a member, shown on node-b and node-c",
             lambda: f"{queue_info(b)}\n{queue_info(c)}\n{diagnose(nodes)}")
    confirmed = down.publish_until_confirmed(b, 0, down.BATCH, nodes)

    # the leader goes before node-a is back: node-a's copy is never started (node-a
    # and node-b are a majority of the cluster, so neither pauses)
    c.kill()
    a.start()
    wait_for(lambda: down.running_nodes(a) == [a.name, b.name] == down.running_nodes(b), 30,
             "node-a and node-b running, node-c down", lambda: diagnose(nodes))
    wait_for(lambda: queue_info(a).get("leader") == b.name and
             queue_info(b).get("leader") == b.name, 60,
             "node-b elected leader with node-a's vote", lambda: diagnose(nodes))
    consume_every_confirmed(a, confirmed, [a, b])
