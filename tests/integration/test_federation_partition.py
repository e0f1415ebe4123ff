"""A network partition between two federated sites: messages published during the cut
arrive once the link is restored.

Two ways, one test each: the downstream site runs in a network namespace the test
creates (:mod:`tests.support.netns`), and the cut takes its veth down (packets vanish, as
on a real WAN, and the link notices through AMQP heartbeats) — skipped with the reason
where namespaces cannot be made (no ``ip``, no privileges); and a local TCP proxy the test
controls sits between the sites and blackholes the traffic (:mod:`tests.support.tcpproxy`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.fed_support import (
    amqp_uri,
    channel,
    drain,
    links,
    set_policy,
    set_upstream,
    settle,
    site,
    wait_for,
    wait_running,
)
from tests.support import netns
from tests.support.brokerproc import BrokerProcess
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.slow
HEARTBEAT = 1  # seconds: the link notices a silent partition after a few of these


def _received(down: BrokerProcess, queue: str, n: int) -> set[int]:
    with channel(down.url) as ch:
        got = drain(ch, queue, n, timeout=40)
        bodies = {int(b) for _p, b in got}
        bodies.update(int(b) for b in settle(ch, queue, 0.3))
    return bodies


def _federate(up: BrokerProcess, down: BrokerProcess, upstream_uri: str) -> None:
    with channel(up.url) as uch:
        uch.exchange_declare("wan", "fanout", durable=True)
    with channel(down.url) as dch:
        dch.exchange_declare("wan", "fanout", durable=True)
        dch.queue_declare("wan.sink", durable=True)
        dch.queue_bind("wan.sink", "wan")
    set_upstream(down, "hq", {"uri": upstream_uri, "reconnect-delay": 1})
    set_policy(down, "wan", "^wan$", {"federation-upstream": "hq"})
    wait_running(down, timeout=30)
    # the link's queue is bound upstream: what is published from now on is kept
    wait_for(lambda: _publish_probe(up, down), 20, what="link carrying messages")


def _publish_probe(up: BrokerProcess, down: BrokerProcess) -> bool:
    with channel(up.url) as uch:
        uch.basic_publish("wan", "", b"-1")
    with channel(down.url) as dch:
        return bool(drain(dch, "wan.sink", 1, timeout=1))


def _publish(up: BrokerProcess, start: int, n: int) -> None:
    with channel(up.url) as uch:
        uch.confirm_delivery()
        for i in range(start, start + n):
            uch.basic_publish("wan", "", str(i).encode(), pika.BasicProperties(delivery_mode=2))


def _links_in_netns(ns: str, down: BrokerProcess) -> list[dict[str, Any]]:
    """/api/federation-links fetched from inside the namespace (cut off from us)."""
    script = ("import base64,sys,urllib.request as u;"
              "r=u.Request(sys.argv[1],headers={'Authorization':'Basic '+"
              "base64.b64encode(b'guest:guest').decode()});"
              "print(u.urlopen(r,timeout=5).read().decode())")
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script,
                          f"{down.http_url}/api/federation-links"],
                         check=True, capture_output=True, text=True, timeout=20).stdout
    result: list[dict[str, Any]] = json.loads(out)
    return result


def _partition_round(up: BrokerProcess, down: BrokerProcess, cut, restore,
                     status=None) -> None:
    status = status or (lambda: links(down))
    _publish(up, 0, 100)
    assert _received(down, "wan.sink", 100) == set(range(100))
    cut()
    # the link notices (heartbeats) and reports it; the upstream keeps what is published
    wait_for(lambda: any(i["status"] != "running" for i in status()), 30, interval=0.3,
             what="link leaving 'running' during the cut")
    _publish(up, 100, 200)
    time.sleep(1.0)
    restore()
    wait_running(down, timeout=40)
    assert _received(down, "wan.sink", 200) >= set(range(100, 300))


def test_partition_with_network_namespace(tmp_path: Path) -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"the cut through a network namespace: {why} (the proxy test below "
                    "cuts the same link through a TCP proxy)")
    env = {"AMQPD_PLUGINS": "federation", "AMQPD_LOOPBACK_USERS": ""}
    with netns.lab() as lab:
        branch = lab.add("branch")
        up = BrokerProcess(tmp_path / "hq", env={**env, "AMQPD_CLUSTER_NAME": "hq"},
                           bind=lab.host_address)
        down = BrokerProcess(tmp_path / "branch",
                             env={**env, "AMQPD_CLUSTER_NAME": "branch"},
                             bind=branch.address, command_prefix=branch.prefix)
        up.start()
        down.start()
        try:
            _federate(up, down, amqp_uri(up.port, host=lab.host_address,
                                         heartbeat=HEARTBEAT))
            _partition_round(up, down, lambda: lab.cut("branch"),
                             lambda: lab.restore("branch"),
                             lambda: _links_in_netns(branch.netns, down))
        finally:
            down.stop()
            up.stop()


def test_partition_through_tcp_proxy(tmp_path: Path) -> None:
    """The same scenario through the proxy, blackhole mode."""
    up, down = site(tmp_path, "hq"), site(tmp_path, "branch")
    up.start()
    down.start()
    proxy = TcpProxy("127.0.0.1", up.port).start()
    try:
        _federate(up, down, amqp_uri(proxy.port, heartbeat=HEARTBEAT))
        _partition_round(up, down, proxy.cut, proxy.restore)
    finally:
        proxy.stop()
        down.stop()
        up.stop()
