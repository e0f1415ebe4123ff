"""A node whose own process stalls (SIGSTOP, then SIGCONT: what a starved or frozen
process looks like from inside) does not pause itself when it wakes.

While it is stopped the others stop hearing it and count it down after
``heartbeat_timeout`` (1 s): that is failure detection doing its job. When it resumes, the
heartbeats and etcd answers that arrived meanwhile wait unread in its sockets; measured on
the wall clock every peer would look silent for the whole stall and etcd out of reach, and
under pause_minority the node would close every client connection with 320 although
nothing was wrong with the others. The stall is shorter than the etcd lease (5 s), so its
lease is intact and it must go on serving its clients (amqpd/cluster/loop_clock.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration.cluster_support import ClusterNode, three_nodes, wait_for, wait_formed
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(180),
]

STALL = 2.5  # seconds: over heartbeat_timeout (1 s) and the etcd grace (3 s) minus the
# poll interval, under the lease (5 s) less one renewal period (5/3 s)


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[list[ClusterNode]]:
    """The product's 1 s heartbeat timeout (the shared fixture's nodes wait 3 s): the
    others must count the stopped node down well inside its lease."""
    with three_nodes(tmp_path, etcd.url, {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "1"}) as started:
        yield started


def test_a_node_that_stalled_shorter_than_its_lease_keeps_its_clients(
        nodes: list[ClusterNode]) -> None:
    a, b, _c = nodes
    assert a.proc is not None and a.proc.proc is not None
    pid = a.proc.proc.pid
    params = pika.URLParameters(a.url)
    params.heartbeat = 0  # the client's own heartbeats must not be what ends the connection
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("stall-q", durable=True)
        ch.basic_publish("", "stall-q", b"before", pika.BasicProperties(delivery_mode=2))

        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            # the others notice the silence (polled, while a is stopped)
            wait_for(lambda: a.name not in b.status()["running_nodes"], 30,
                     "node-b counts the stopped node-a as not running")
            left = STALL - (time.monotonic() - stopped_at)
            if left > 0:
                # hold the stop for the whole STALL: this wait is the stall under test,
                # not a synchronisation
                time.sleep(left)
        finally:
            os.kill(pid, signal.SIGCONT)
        stalled = time.monotonic() - stopped_at
        assert stalled < 4.5, f"the stop lasted {stalled:.1f}s: past the lease's margin"
        wait_formed(nodes, timeout=30)

        # the client connection of node-a survived, and node-a serves it
        ch.basic_publish("", "stall-q", b"after", pika.BasicProperties(delivery_mode=2))
        got = [ch.basic_get("stall-q", auto_ack=True)[2] for _ in range(2)]
        assert got == [b"before", b"after"]
        status = a.status()
        assert status["pauses"] == 0, status
        assert status["loop_stalls"] >= 1 and status["longest_loop_stall"] >= 1.0, status
    finally:
        if conn.is_open:
            conn.close()
