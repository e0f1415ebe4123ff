"""A quorum member that acknowledged records and was restarted can be elected (issue 28).

Found by the replica model (tests/unit/cluster/test_replica_core_model.py): a member whose
acknowledgement made a record committed, killed and started again, read its copy back
from disk with nothing it could offer in an election (-1: "incomplete") until its copy
had resynchronised; if the leader was lost before that and the third member never had
the record, the third member was elected and the confirmed message was gone. Raft lets
such a member lead, its log being durable; amqpd now keeps a durable "complete up to"
mark in the copy's map (amqpd/cluster/mirror_map.py).

Three nodes and etcd on loopback. A quorum queue declared on node-a (members a, b, c);
300 confirmed messages reach all three. node-c is stopped (SIGSTOP), and 300 more are
confirmed by node-a and node-b. node-b and then node-a are killed with kill -9, so no
leader is left to resynchronise node-b's copy; node-b starts again, node-c is woken
(SIGCONT). node-c's copy is complete but lacks the second 300; node-b's holds all 600.
node-b must be elected, and a consumer on it gets every confirmed message. (Before the
mark node-c was elected with 300 of the 600.)
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.cluster_support import ClusterNode, diagnose, wait_for
from tests.integration.test_cluster_quorum import (
    consume_every_confirmed,
    declare,
    group_formed,
    queue_info,
)
from tests.integration.test_cluster_quorum_catchup import group_record
from tests.integration.test_cluster_quorum_down_member import BATCH, publish_until_confirmed
from tests.support import etcdproc

pytestmark = [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
              pytest.mark.timeout(300)]


def test_a_restarted_member_that_acknowledged_records_is_elected(
        nodes: list[ClusterNode]) -> None:
    a, b, c = nodes
    declare(a)
    group_formed(nodes, a)
    wait_for(lambda: group_record(a).get("synchronised") == [b.name, c.name], 30,
             "the record lists node-b and node-c synchronised", lambda: diagnose(nodes))
    confirmed = publish_until_confirmed(a, 0, BATCH, nodes)  # on every member

    assert c.proc is not None and c.proc.proc is not None
    pid_c = c.proc.proc.pid
    os.kill(pid_c, signal.SIGSTOP)
    stopped = True
    try:
        # node-a and node-b are the majority: these are on node-a and node-b only
        confirmed |= publish_until_confirmed(a, 10_000, BATCH, nodes)
        b.kill()  # node-b's copy: complete up to the last record it acknowledged
        a.kill()  # the leader: nobody is left to resynchronise node-b's copy
        b.start()
        os.kill(pid_c, signal.SIGCONT)
        stopped = False
        survivors = [b, c]
        wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name) and
                 queue_info(c).get("leader") == queue_info(b).get("leader"), 90,
                 "a new leader elected and shown on node-b and node-c",
                 lambda: diagnose(survivors))
    finally:
        if stopped:
            os.kill(pid_c, signal.SIGCONT)
    elected = queue_info(b)["leader"]
    print(f"elected: {elected}; {len(confirmed)} confirmed")
    assert elected == b.name, (
        f"{elected} elected, which lacks the second {BATCH} confirmed messages\n"
        f"{diagnose(survivors)}")
    consume_every_confirmed(b, confirmed, survivors)
