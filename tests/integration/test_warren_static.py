"""The warren with static roles (no etcd): two real amqpd processes on loopback.

A standby catches up with what the active held before it existed (messages and
topology), follows the live tail, holds confirms back in sync mode (SIGSTOP: nacked
after insync_timeout; SIGCONT: flowing again), takes over by ``amqpctl promote`` after
a kill -9 of the active with everything confirmed and every definition, unacked
deliveries redelivered; an old active that comes back as a standby cuts its unconfirmed
tail and catches up.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pika
import pytest

from tests.integration.warren_support import (
    api,
    node,
    promote,
    publish_confirmed,
    ready,
    replication_addr,
    standby_caught_up,
    start_pair,
    status,
    wait_for,
)

pytest.importorskip("aio_pika", reason="aio-pika is not installed")


def _drain(url: str, queue: str, limit: int) -> list[tuple[bytes, bool]]:
    """(body, redelivered) of every message of ``queue``, acked, in order."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        got: list[tuple[bytes, bool]] = []
        for _ in range(limit + 1):
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got.append((body, bool(method.redelivered)))
        return got
    finally:
        conn.close()


def test_catch_up_topology_promote_redelivered(tmp_path: Path) -> None:
    n = 3000
    # min_insync_standbys = 0: the active confirms alone until the standby exists
    active = node(tmp_path / "a", "node-a", "active", min_insync_standbys=0).start()
    standby = None
    try:
        a = api(active)
        assert a.put("/api/vhosts/v2").status in (201, 204)
        assert a.put("/api/users/u2", {"password": "pw", "tags": "management"}).status \
            in (201, 204)
        assert a.put("/api/permissions/v2/u2", {"configure": ".*", "write": ".*",
                                                "read": ".*"}).status in (201, 204)
        assert a.put("/api/policies/%2F/p1", {"pattern": "^wq$", "definition":
                                              {"max-length": 100000}}).status in (201, 204)
        conn = pika.BlockingConnection(pika.URLParameters(active.url))
        ch = conn.channel()
        ch.exchange_declare("wx", "topic", durable=True)
        ch.queue_declare("wq", durable=True)
        ch.queue_bind("wq", "wx", "k.#")
        bodies = [b"m-%05d" % i for i in range(n)]
        assert all(publish_confirmed(active.url, "k.x", bodies, exchange="wx"))
        # ten deliveries held unacknowledged by a consumer that never acks
        held = []
        for _ in range(10):
            method, _p, body = ch.basic_get("wq", auto_ack=False)
            assert method is not None
            held.append(body)
        assert held == bodies[:10]

        standby = node(tmp_path / "b", "node-b", "standby", replication_addr(active)).start()
        assert ready(standby)["amqp_port"] == 0  # a standby serves no AMQP clients
        wait_for(lambda: standby_caught_up(active), what="the standby to catch up")
        sb = status(standby)
        assert sb["role"] == "standby" and sb["connected"] and sb["epoch"] == 1
        # live tail
        more = [b"t-%05d" % i for i in range(200)]
        assert all(publish_confirmed(active.url, "k.y", more, exchange="wx"))
        wait_for(lambda: standby_caught_up(active), what="the live tail")

        active.kill()  # kill -9, the consumer's ten deliveries still unacked
        try:
            conn.close()
        except Exception:  # the broker is gone: nothing to close cleanly
            pass
        result = promote(standby)
        assert result["epoch"] == 2 and result["role"] == "active"
        b = api(standby)
        assert b.get("/api/exchanges/%2F/wx").json()["type"] == "topic"
        bindings = b.get("/api/bindings/%2F/e/wx/q/wq").json()
        assert [x["routing_key"] for x in bindings] == ["k.#"]
        assert b.get("/api/policies/%2F/p1").json()["definition"] == {"max-length": 100000}
        assert b.get("/api/vhosts/v2").status == 200
        assert b.get("/api/users/u2").status == 200
        assert b.get("/api/permissions/v2/u2").status == 200
        got = _drain(standby.url, "wq", n + 200)
        assert [body for body, _ in got] == bodies + more
        redelivered = {body for body, red in got if red}
        # every delivery the old active may have made comes back redelivered (DELIVERED
        # records and the delivery journal's promises travel with the log; a promise
        # reaches a little ahead, store/marks.py, as after a crash and restart)...
        assert set(held) <= redelivered
        # ... and nothing published after those deliveries is flagged
        assert not redelivered & set(more)
    finally:
        active.kill()
        if standby is not None:
            standby.stop()


def test_sync_confirms_wait_for_the_standby(tmp_path: Path) -> None:
    # min_insync_standbys = 1: no confirm without the standby (the degraded mode's default
    # 0 would drop it from the set and confirm alone: tests/unit/replication/test_shipping.py)
    active, standby = start_pair(tmp_path, max_lag=0.5, insync_timeout=1.5,
                                 min_insync_standbys=1)
    try:
        wait_for(lambda: standby_caught_up(active), what="the standby in sync")
        url = active.url
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare("sq", durable=True)
        conn.close()
        assert all(publish_confirmed(url, "sq", [b"a-%d" % i for i in range(300)]))
        before = status(active)["standbys"][0]["acked_seq"]
        assert standby.proc is not None
        os.kill(standby.proc.pid, signal.SIGSTOP)
        try:
            # the standby cannot acknowledge: no confirm may be an ack
            outcome = publish_confirmed(url, "sq", [b"b-%d" % i for i in range(20)])
            assert outcome == [False] * 20
            s = status(active)
            assert s["insync_count"] == 0 and s["nacked_total"] >= 1
            assert s["standbys"][0]["acked_seq"] == before
            assert "left the in-sync set" in active.log_path.read_text()
        finally:
            os.kill(standby.proc.pid, signal.SIGCONT)
        wait_for(lambda: standby_caught_up(active), what="the standby back in sync")
        assert all(publish_confirmed(url, "sq", [b"c-%d" % i for i in range(300)]))
        metrics = api(active).get("/metrics").text
        assert "amqpd_replication_standby_in_sync" in metrics
        assert "amqpd_replication_left_insync_total 1" in metrics
        nodes = api(active).get("/api/nodes").json()
        assert nodes[0]["replication"]["role"] == "active"
    finally:
        active.kill()
        standby.stop()


def test_old_active_returns_as_standby_and_cuts_its_unconfirmed_tail(tmp_path: Path) -> None:
    active, standby = start_pair(tmp_path, max_lag=0.5, insync_timeout=1.0,
                                 min_insync_standbys=1)
    try:
        wait_for(lambda: standby_caught_up(active), what="the standby in sync")
        conn = pika.BlockingConnection(pika.URLParameters(active.url))
        conn.channel().queue_declare("tq", durable=True)
        conn.close()
        confirmed = [b"ok-%d" % i for i in range(100)]
        assert all(publish_confirmed(active.url, "tq", confirmed))
        wait_for(lambda: standby_caught_up(active), what="the standby to hold them")
        standby.kill()
        # written on the active, never on the standby: nacked, an unconfirmed tail
        assert publish_confirmed(active.url, "tq", [b"lost-%d" % i for i in range(50)]) \
            == [False] * 50
        active.kill()

        standby.start()  # comes back as a standby of a dead active...
        promote(standby)  # ... and is made active by hand (epoch 2)
        new_addr = replication_addr(standby)
        old = node(active.data_dir, "node-a", "standby", new_addr, max_lag=0.5,
                   insync_timeout=1.0).start()
        active = old
        wait_for(lambda: standby_caught_up(standby), what="the old active to follow")
        log_text = old.log_path.read_text()
        assert "cut" in log_text and "never confirmed" in log_text
        assert status(old)["epoch"] == 2
        # the old node's log is now the new active's: make it active again and look
        standby.kill()
        promote(old)
        got = _drain(old.url, "tq", 200)
        assert [body for body, _ in got] == confirmed
    finally:
        active.kill()
        standby.kill()
