"""etc/haproxy.cfg as shipped starts under Debian's and Ubuntu's default open-file
limits and routes AMQP clients to the active node (issue 34).

The file is used as it is, only its addresses rewritten (the frontend's port, each
server's ports: tests never use fixed ports); HAProxy starts under a lowered
RLIMIT_NOFILE, set in the child before exec. One warren node is active behind it, the
other server line points at ports nothing listens on (a dead node, marked down).
"""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

from devtools.rabbitmq import free_ports
from tests.integration.warren_clients import connect
from tests.support import haproxyproc
from tests.support.etcdproc import EtcdProcess
from tests.support.haproxyproc import HAProxyProcess
from tests.support.warren import WarrenNode, wait_active

pytestmark = [*haproxyproc.needs_etcd_and_haproxy(), pytest.mark.timeout(120)]

SHIPPED = Path(__file__).resolve().parents[2] / "etc" / "haproxy.cfg"



def test_shipped_config_has_the_failover_options() -> None:
    text = SHIPPED.read_text()
    assert "option redispatch" in text
    assert "on-marked-down shutdown-sessions" in text
    assert "option httpchk GET /health/active" in text


# soft 1024 under hard 4096: a Debian/Ubuntu login's default (HAProxy raises its soft
# limit up to the hard one); 20000: the machine limit issue 34 met ("Cannot raise FD limit")
@pytest.mark.parametrize("nofile", [(1024, 4096), (20000, 20000)], ids=["1024-4096", "20000"])
def test_shipped_config_serves_under_default_fd_limits(tmp_path: Path, etcd: EtcdProcess,
                                                       nofile: tuple[int, int]) -> None:
    a = WarrenNode("a", tmp_path / "a", [etcd.url], "/amqpd-test/haproxy")
    dead_amqp, dead_http = free_ports(2)
    hap: HAProxyProcess | None = None
    try:
        a.start()
        wait_active(a)
        hap = HAProxyProcess(tmp_path / "haproxy",
                             [("node-a", a.amqp_port, a.http_port),
                              ("node-b", dead_amqp, dead_http)],
                             config=SHIPPED.read_text(), nofile=nofile).start()
        assert hap.proc is not None and hap.proc.poll() is None
        url = f"amqp://guest:guest@127.0.0.1:{hap.port}/%2F"
        # the first checks may still be under way: connect retries until the deadline
        conn = connect(url, time.monotonic() + 20)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("hap-q", durable=True)
            for i in range(20):
                ch.basic_publish("", "hap-q", str(i).encode(),
                                 pika.BasicProperties(delivery_mode=2), mandatory=True)
            assert ch.queue_declare("hap-q", passive=True).method.message_count == 20
        finally:
            conn.close()
        log = hap.log_path.read_text(errors="replace")
        assert "Cannot raise FD limit" not in log, log
    finally:
        if hap is not None:
            hap.kill()
        a.kill()
