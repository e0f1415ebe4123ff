"""A deduplication exchange's disk cache follows the warren's log to the standby.

The standby follows the active's whole log; the cache is records in that log, so the
promoted standby rebuilds it and recognises a publisher's retries after a kill -9 of the
active. (One failover of a static pair; the etcd-elected warren behind HAProxy with
repeated kill cycles is not covered here: see docs/dedup.md.)
"""

from __future__ import annotations

from pathlib import Path

import pika

from tests.integration.ext_support import drain
from tests.integration.warren_support import promote, standby_caught_up, start_pair, wait_for


def _publish_all(url: str, start: int, stop: int, prefix: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(start, stop):
            ch.basic_publish("wdx", "", f"{prefix}{i}".encode(), pika.BasicProperties(
                headers={"x-deduplication-header": f"msg-{i}"}, delivery_mode=2))
    finally:
        conn.close()


def test_promoted_standby_recognises_retries(tmp_path: Path) -> None:
    # min_insync_standbys = 0: once promoted, the lone node confirms alone
    active, standby = start_pair(tmp_path, min_insync_standbys=0)
    try:
        wait_for(lambda: standby_caught_up(active), what="the standby in sync")
        conn = pika.BlockingConnection(pika.URLParameters(active.url))
        ch = conn.channel()
        ch.exchange_declare("wdx", "x-message-deduplication", durable=True, arguments={
            "x-cache-size": 10_000, "x-cache-persistence": "disk"})
        ch.queue_declare("wdq", durable=True)
        ch.queue_bind("wdq", "wdx")
        conn.close()
        _publish_all(active.url, 0, 200, "m")  # every one confirmed: the standby has it
        wait_for(lambda: standby_caught_up(active), what="the standby caught up")
        active.kill()  # kill -9
        promote(standby)
        _publish_all(standby.url, 0, 250, "retry")  # the 200 again, then 50 new
        conn = pika.BlockingConnection(pika.URLParameters(standby.url))
        try:
            got = drain(conn.channel(), "wdq")
        finally:
            conn.close()
        assert got == [f"m{i}".encode() for i in range(200)] + \
            [f"retry{i}".encode() for i in range(200, 250)]
    finally:
        standby.stop()
        active.stop()
