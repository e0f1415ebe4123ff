"""A quorum queue replicates from its declare-ok on (issue 28).

The group of a new quorum queue (its etcd record naming the members, the leader's
replication streams) used to be set up by the next reconciliation, a moment after the
declare was answered. Publishes in that moment were confirmed from the leader's disk
alone, and a leader lost before it wrote the group record left the queue with no group
its members could elect from: on main, a leader stopped right after its declare was not
replaced for as long as it stayed stopped (over 60 s, test_cluster_leadership_claims),
and what it had confirmed was on no other node.

Three nodes and etcd on loopback. A quorum queue is declared on node-a and 50 persistent
messages are published with confirms at once; node-a is killed (kill -9) as soon as the
last confirm arrives and is not started again. Another member must be elected, and a
consumer on it gets every confirmed message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.cluster_support import ConfirmPublisher, diagnose, three_nodes, wait_for
from tests.integration.test_cluster_quorum import (
    QUEUE,
    consume_every_confirmed,
    declare,
    queue_info,
)
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
              pytest.mark.timeout(300)]

COUNT = 50


def test_messages_confirmed_right_after_the_declare_survive_the_leaders_loss(
        tmp_path: Path, etcd: EtcdProcess) -> None:
    with three_nodes(tmp_path, etcd.url) as nodes:
        a, b, c = nodes
        declare(a)
        pub = ConfirmPublisher(a.url, QUEUE, batch=COUNT)
        pub.publish_range(0, COUNT)
        confirmed = set(pub.confirmed)
        assert confirmed == set(range(COUNT)), f"nacked: {sorted(pub.nacked)}"
        a.kill()
        wait_for(lambda: queue_info(b).get("leader") in (b.name, c.name), 60,
                 "a surviving member elected", lambda: diagnose([b, c]))
        leader = b if queue_info(b).get("leader") == b.name else c
        consume_every_confirmed(leader, confirmed, [b, c])
