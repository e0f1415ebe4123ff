"""A new active with a large backlog stays active (issue 34, must-show 3).

Real processes: a private etcd and two amqpd nodes electing through it (synchronous:
each names the other in ``peers``). A backlog of persistent messages is queued on the
active with no consumer and replicated to the standby; the active is killed -9; the
standby takes over, loads the backlog, and must still be the active 60 s later at the
same epoch (the leader key in etcd says so too, and it never fenced), with every
message in its queue.

The backlog's size is ``AMQPD_TEST_BACKLOG`` (default 1,000,000, the issue's figure).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pika
import pytest

from tests.integration.warren_clients import connect
from tests.support import etcdproc
from tests.support.etcdproc import EtcdProcess
from tests.support.warren import (
    WarrenNode,
    etcd_get,
    wait_active,
    wait_for,
    wait_insync_standby,
)

BACKLOG = int(os.environ.get("AMQPD_TEST_BACKLOG", "1000000"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(1800),
]

PREFIX = "/amqpd-test/backlog"
QUEUE = "backlog-q"
STAY = 60.0  # seconds the new active must stay active



def _fill(url: str, n: int) -> None:
    """``n`` persistent messages, then confirm mode and one last message: its confirm
    means every earlier one is durable and replicated (the log commits in order)."""
    conn = connect(url, time.monotonic() + 20)
    try:
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        props = pika.BasicProperties(delivery_mode=2)
        for i in range(n):
            ch.basic_publish("", QUEUE, b"%d" % i, props)
            if i % 5000 == 4999:
                conn.process_data_events(0)  # flow control and heartbeats
        ch.confirm_delivery()
        ch.basic_publish("", QUEUE, b"%d" % n, props)  # raises if nacked
    finally:
        conn.close()


def _count(url: str) -> int:
    conn = connect(url, time.monotonic() + 20)
    try:
        return int(conn.channel().queue_declare(QUEUE, durable=True, passive=True)
                   .method.message_count)
    finally:
        conn.close()


def test_new_active_with_a_backlog_stays_active(tmp_path: Path, etcd: EtcdProcess) -> None:
    a = WarrenNode("a", tmp_path / "a", [etcd.url], PREFIX)
    b = WarrenNode("b", tmp_path / "b", [etcd.url], PREFIX)
    a.peers, b.peers = [b.repl_addr], [a.repl_addr]
    nodes = [a, b]
    try:
        a.start()
        wait_active(a)
        b.start()
        wait_insync_standby(a, b, etcd.url)
        t0 = time.monotonic()
        _fill(a.url, BACKLOG)
        filled = time.monotonic() - t0
        assert _count(a.url) == BACKLOG + 1
        wait_for(lambda: b.health("standby")[1].get("replication", {}).get("lag_records")
                 == 0, 300, "b holds the whole backlog", b.tail)

        a.kill()
        t0 = time.monotonic()
        wait_active(b, timeout=300)
        took = time.monotonic() - t0
        epoch = int(b.health("active")[1]["epoch"])
        assert epoch == 2
        # active, at the same epoch, for STAY seconds: polled, never once otherwise
        until = time.monotonic() + STAY
        polls = 0
        while time.monotonic() < until:
            status, body = b.health("active", timeout=5.0)
            assert status == 200 and body.get("epoch") == epoch, (status, body, b.tail())
            leader = etcd_get(etcd.url, f"{PREFIX}/leader", timeout=5.0)
            assert leader is not None and leader["node"] == "b" and leader["epoch"] == epoch
            polls += 1
            time.sleep(0.5)
        log = b.proc.log_path.read_text()  # type: ignore[union-attr]
        assert "fencing this node" not in log, b.tail()
        assert _count(b.url) == BACKLOG + 1
        # the head of the queue, in order
        conn = connect(b.url, time.monotonic() + 20)
        try:
            ch = conn.channel()
            for i in range(100):
                method, _props, body = ch.basic_get(QUEUE, auto_ack=False)
                assert method is not None and body == b"%d" % i
        finally:
            conn.close()
        recovered = re.findall(r"recovered .* messages in \d+ queues in [\d.]+s", log)
        print(f"backlog {BACKLOG}: filled in {filled:.1f}s; b active {took:.1f}s after "
              f"the kill ({recovered[-1] if recovered else '?'}); still active at epoch "
              f"{epoch} after {STAY:.0f}s ({polls} polls)")
    finally:
        for n in nodes:
            n.kill()
