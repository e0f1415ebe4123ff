"""The default listener is on every interface, IPv4 and IPv6, as RabbitMQ's is: a client
that resolves ``localhost`` to ``::1`` reaches the broker on the same port as one that
uses 127.0.0.1. Skipped where the machine has no IPv6 loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from amqpd.config import Settings
from tests.support.brokerproc import BrokerProcess


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def default_bind(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "amqpd", bind="")  # "" is the configured default
    proc.start()
    yield proc
    proc.stop()


def _round_trip(host: str, port: int) -> bytes:
    params = pika.ConnectionParameters(host=host, port=port, connection_attempts=1,
                                       socket_timeout=5)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, f"via {host}".encode())
        for _ in range(100):
            method, _props, body = ch.basic_get(q, auto_ack=True)
            if method is not None:
                return bytes(body)
            conn.sleep(0.02)
        raise AssertionError("message not delivered")
    finally:
        conn.close()


def test_default_listener_takes_ipv4_and_ipv6_on_one_port(default_bind: BrokerProcess
                                                          ) -> None:
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    port = default_bind.port
    listeners = {(host, p) for proto, host, p in default_bind.info["listeners"]
                 if proto == "amqp"}
    assert listeners == {("0.0.0.0", port), ("::", port)}
    assert _round_trip("127.0.0.1", port) == b"via 127.0.0.1"
    assert _round_trip("::1", port) == b"via ::1"


def test_every_interface_is_the_default() -> None:
    assert Settings().bind == ""


def test_explicit_ipv4_bind_stays_ipv4_only(broker: BrokerProcess) -> None:
    """An explicit address is taken as given (the test brokers bind 127.0.0.1)."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    with pytest.raises(OSError):
        socket.create_connection(("::1", broker.port), timeout=2).close()
