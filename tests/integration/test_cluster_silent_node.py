"""No silent node (issue 28): a node whose store commits wait on a mirror that neither
answers nor can be dropped (etcd, which must record the drop first, is stopped too)
refuses them after ``mirror_sync_timeout + definition_timeout`` -- a publisher nack and
a 541 for a declare, with a log line naming the queue and the mirror -- instead of
answering nothing for as long as etcd is away (the 11 minutes of the issue). While a
declare waits, /api/health/checks/node-can-declare says so.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from pamqp import commands

from bench.loadgen import Conn, ProtocolError
from tests.integration.cluster_support import (
    ClusterNode,
    ConfirmPublisher,
    new_prefix,
    private_etcd,
    wait_for,
    wait_formed,
)
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(180),
]

ENV = {"AMQPD_CLUSTER_MIRROR_SYNC_TIMEOUT": "2", "AMQPD_CLUSTER_DEFINITION_TIMEOUT": "3"}
LIMIT = 5.0  # mirror_sync_timeout + definition_timeout


def _pid(node: ClusterNode) -> int:
    assert node.proc is not None and node.proc.proc is not None
    return node.proc.proc.pid


SYNCHRONISED = re.compile(
    r"mirror on node-b (synchronised|starting \(.*synchronised from the start)")


def test_a_commit_held_by_an_undroppable_mirror_ends_in_a_nack_and_a_541(
        tmp_path: Path) -> None:
    with private_etcd(tmp_path) as etcd:
        assert etcd.proc is not None
        prefix = new_prefix()
        a = ClusterNode("node-a", tmp_path / "a", etcd.url, prefix,
                        partition_handling="ignore", extra_env=dict(ENV))
        b = ClusterNode("node-b", tmp_path / "b", etcd.url, prefix,
                        partition_handling="ignore", extra_env=dict(ENV))
        stopped: list[int] = []
        try:
            a.start()
            b.start()
            wait_formed([a, b])
            r = a.api.put("/api/policies/%2F/all", {"pattern": "^m$", "apply-to": "queues",
                                                     "definition": {"ha-mode": "all"}})
            assert r.status in (201, 204), r.text
            conn = Conn(a.url)
            ch = conn.open_channel(1)
            conn.declare_queue(ch, "m", durable=True)
            assert a.proc is not None
            log = a.proc.log_path
            # synchronised by a sync, or from the start (a mirror started with the
            # queue, before its first message, holds everything at once)
            wait_for(lambda: SYNCHRONISED.search(log.read_text()) is not None, 30,
                     "node-b's mirror synchronised", a.tail)
            pub = ConfirmPublisher(a.url, "m", window=10, batch=1)
            pub.publish_range(0, 1)
            assert pub.confirmed == {0}
            # the mirror answers nothing, and etcd cannot record that it left
            for pid in (etcd.proc.pid, _pid(b)):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            t0 = time.monotonic()
            pub.publish(1, 1)
            pub.drain(LIMIT + 20)
            took = time.monotonic() - t0
            assert pub.nacked == {1}, (pub.confirmed, pub.nacked, a.tail())
            assert took < LIMIT + 10, took
            # a declare made now waits behind the node's commits: a 541, not silence;
            # the health check fails while it waits (definition_timeout 3 s)
            conn.send(ch, commands.Exchange.Declare(exchange="after", exchange_type="direct",
                                                    durable=True))
            wait_for(lambda: a.api.get("/api/health/checks/node-can-declare").status == 503,
                     LIMIT + 5, "node-can-declare failing while the declare waits", a.tail)
            body = a.api.get("/api/health/checks/node-can-declare").json()
            conn.sock.settimeout(LIMIT + 20)
            with pytest.raises(ProtocolError, match="541"):
                conn.expect(ch, commands.Exchange.DeclareOk)
            text = log.read_text()
            assert "were refused" in text and "queue 'm' in vhost '/'" in text, a.tail()
            assert "node-b" in text
            assert body["status"] == "failed" and body["waits"], body
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
            b.stop()
            a.stop()
