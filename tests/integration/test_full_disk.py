"""A full disk: publishes are nacked or blocked, nothing stored is damaged, the broker
says why (log and health endpoint), and it recovers once space returns.

The data directory lives on a small tmpfs mounted by the test (needs root, as CI has;
skipped otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.exceptions import NackError, UnroutableError

from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       check=True, capture_output=True, timeout=20)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=20)


def _health(broker: BrokerProcess) -> tuple[int, dict]:
    req = urllib.request.Request(broker.http_url + "/api/health/checks/local-alarms")
    req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_store_write_failure_nacks_and_keeps_what_was_confirmed(small_disk: Path) -> None:
    broker = BrokerProcess(small_disk / "amqpd", env={
        "AMQPD_SEGMENT_SIZE": str(256 * 1024), "AMQPD_DISK_FREE_LIMIT": "0"})
    broker.start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        blocked: list[str] = []
        conn.add_on_connection_blocked_callback(lambda *_: blocked.append("blocked"))
        ch = conn.channel()
        ch.queue_declare("full", durable=True)
        ch.confirm_delivery()
        confirmed: list[int] = []
        nacked = False
        body = b"x" * 2000
        for i in range(5000):  # ~10 MB into a 3 MB disk: must fail well before the end
            try:
                ch.basic_publish("", "full", str(i).encode() + b":" + body,
                                 pika.BasicProperties(delivery_mode=2))
                confirmed.append(i)
            except (NackError, UnroutableError):
                nacked = True  # the write failed: nacked, and the publisher is now blocked
                break
        assert nacked, "publishing into a full disk was never refused"
        assert confirmed, "nothing was confirmed before the disk filled"
        deadline = time.monotonic() + 10
        while not blocked and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert blocked, "the publisher was not blocked while the store cannot write"
        status, body_json = _health(broker)
        assert status == 503, body_json
        assert "store" in json.dumps(body_json)
    finally:
        broker.kill()
    log_text = broker.log_path.read_text(errors="replace")
    assert "No space left on device" in log_text and "alarm set" in log_text
    # space comes back: every confirmed message is there, whole, in order
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True,
                   timeout=20)
    broker.start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        got: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            method, _props, data = ch.basic_get("full", auto_ack=True)
            if method is None:
                break
            seq, rest = data.split(b":", 1)
            assert rest == body, "a stored message came back damaged"
            got.append(int(seq))
        assert set(confirmed) <= set(got), f"lost {len(set(confirmed) - set(got))} confirmed"
        assert got == sorted(got)
        ch.basic_publish("", "full", b"after", pika.BasicProperties(delivery_mode=2))
        conn.close()
    finally:
        broker.stop()


def test_disk_free_limit_blocks_publishers(small_disk: Path) -> None:
    broker = BrokerProcess(small_disk / "amqpd", env={"AMQPD_DISK_FREE_LIMIT": str(1 << 30)})
    broker.start()
    try:
        deadline = time.monotonic() + 10
        status, body = _health(broker)
        while status != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
            status, body = _health(broker)
        assert status == 503
        assert body["alarms"][0]["resource"] in ("disk", "disk space")
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        blocked: list[str] = []
        conn.add_on_connection_blocked_callback(lambda *_: blocked.append("blocked"))
        conn.channel().basic_publish("", "nowhere", b"x")
        deadline = time.monotonic() + 10
        while not blocked and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert blocked
    finally:
        broker.stop()


def test_tx_commit_is_not_acknowledged_when_the_store_cannot_write(small_disk: Path) -> None:
    broker = BrokerProcess(small_disk / "amqpd", env={
        "AMQPD_SEGMENT_SIZE": str(256 * 1024), "AMQPD_DISK_FREE_LIMIT": "0"})
    broker.start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("txfull", durable=True)
        ch.tx_select()
        committed = 0
        refused = None
        for _ in range(200):  # 50 x 20 KB per transaction into a 3 MB disk
            try:
                for i in range(50):
                    ch.basic_publish("", "txfull", b"%d:" % i + b"y" * 20000,
                                     pika.BasicProperties(delivery_mode=2))
                ch.tx_commit()
                committed += 1
            except pika.exceptions.AMQPConnectionError as exc:
                refused = exc
                break
        assert committed, "no transaction committed before the disk filled"
        assert isinstance(refused, pika.exceptions.ConnectionClosedByBroker), refused
        assert refused.reply_code == 541
    finally:
        broker.kill()
