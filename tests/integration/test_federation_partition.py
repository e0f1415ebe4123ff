"""A network partition between two federated sites: messages published during the cut
arrive once the link is restored.

Preferred set-up: the downstream site runs in a network namespace the test creates, joined
to the host by a veth pair; the cut is ``ip link set <veth> down`` (packets vanish, as on
a real WAN, and the link notices through AMQP heartbeats). Where namespaces cannot be
created (no ``ip``, no privileges), a local TCP proxy the test controls sits between the
sites and blackholes the traffic instead (:mod:`tests.support.tcpproxy`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
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
from tests.support.brokerproc import BrokerProcess
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.slow
HEARTBEAT = 1  # seconds: the link notices a silent partition after a few of these


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def veth_namespace() -> Iterator[tuple[str, str, str, str] | None]:
    """(netns, host-side interface, host address, namespace address), or None."""
    if shutil.which("ip") is None:
        yield None
        return
    tag = f"{os.getpid() % 100000}"
    ns, host_if, ns_if = f"amqpdfed{tag}", f"vfh{tag}", f"vfn{tag}"
    net = f"10.213.{os.getpid() % 250}"
    try:
        _ip("netns", "add", ns)
    except (subprocess.CalledProcessError, OSError):
        yield None
        return
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{net}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", ns_if)
        _ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_if, f"{net}.1", f"{net}.2"
    finally:
        with contextlib.suppress(Exception):
            _ip("link", "del", host_if)
        with contextlib.suppress(Exception):
            _ip("netns", "del", ns)


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


def test_partition_with_network_namespace_or_proxy(tmp_path: Path) -> None:
    env = {"AMQPD_PLUGINS": "federation", "AMQPD_LOOPBACK_USERS": ""}
    with veth_namespace() as net:
        if net is not None:
            ns, host_if, host_addr, ns_addr = net
            up = BrokerProcess(tmp_path / "hq", env={**env, "AMQPD_CLUSTER_NAME": "hq"},
                               bind=host_addr)
            down = BrokerProcess(tmp_path / "branch",
                                 env={**env, "AMQPD_CLUSTER_NAME": "branch"}, bind=ns_addr,
                                 command_prefix=["ip", "netns", "exec", ns])
            up.start()
            down.start()
            try:
                _federate(up, down, amqp_uri(up.port, host=host_addr, heartbeat=HEARTBEAT))
                _partition_round(up, down, lambda: _ip("link", "set", host_if, "down"),
                                 lambda: _ip("link", "set", host_if, "up"),
                                 lambda: _links_in_netns(ns, down))
            finally:
                down.stop()
                up.stop()
            return
    _partition_through_proxy(tmp_path)  # fallback: a TCP proxy between the sites


def test_partition_through_tcp_proxy(tmp_path: Path) -> None:
    """The same scenario through the proxy, blackhole mode, wherever namespaces exist."""
    _partition_through_proxy(tmp_path)


def _partition_through_proxy(tmp_path: Path) -> None:
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
