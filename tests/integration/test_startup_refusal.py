"""Start-up refuses half a broker: a port that is already taken (HTTP API, amqps) stops
the start with a clear error and a non-zero exit, as RabbitMQ does, instead of serving
AMQP without its API or its TLS listener."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.integration._http import Api
from tests.integration.test_tls import make_pki
from tests.support.brokerproc import BrokerProcess


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port with a listener on it (ours, for the test's duration)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def _refused(proc: BrokerProcess) -> tuple[int, str]:
    with pytest.raises(RuntimeError, match="exited with"):
        proc.start(timeout=30)
    assert proc.proc is not None
    return int(proc.proc.returncode), proc.log_path.read_text(errors="replace")


def test_http_port_in_use_stops_the_start(tmp_path: Path, taken_port: int) -> None:
    proc = BrokerProcess(tmp_path / "data", env={"AMQPD_HTTP_PORT": str(taken_port)})
    try:
        code, log = _refused(proc)
    finally:
        proc.kill()
    assert code != 0
    assert f"HTTP API cannot listen on 127.0.0.1:{taken_port}" in log
    assert "cannot start" in log
    # every listener is bound before the start-up line: AMQP never said it was listening
    assert "listening on" not in log


def test_tls_port_in_use_stops_the_start(tmp_path: Path, taken_port: int) -> None:
    pki = make_pki(tmp_path)
    proc = BrokerProcess(tmp_path / "data", extra_args=["--tls-port", str(taken_port)], env={
        "AMQPD_TLS_CERT": str(pki["server_cert"]), "AMQPD_TLS_KEY": str(pki["server_key"]),
        "AMQPD_TLS_CA": str(pki["ca"])})
    try:
        code, log = _refused(proc)
    finally:
        proc.kill()
    assert code != 0
    assert f"amqps listener cannot listen on 127.0.0.1:{taken_port}" in log


def test_the_store_is_closed_cleanly_after_a_refused_start(tmp_path: Path,
                                                           taken_port: int) -> None:
    """The refused start undid itself: the next start finds a cleanly closed store (no
    delivery journal left behind) and runs."""
    data = tmp_path / "data"
    proc = BrokerProcess(data, env={"AMQPD_HTTP_PORT": str(taken_port)})
    try:
        _refused(proc)
    finally:
        proc.kill()
    assert not (data / "log" / "delivered.journal").exists()
    ok = BrokerProcess(data).start()
    try:
        assert ok.proc is not None and ok.proc.poll() is None
    finally:
        assert ok.stop() == 0


def test_ipv6_addresses_are_logged_in_brackets(tmp_path: Path) -> None:
    """Issue 33: ``http://:::24012`` read as an address; ``[::1]:port`` does not."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback on this machine: {exc}")
    proc = BrokerProcess(tmp_path / "data", bind="::1").start(timeout=30)
    try:
        log = proc.log_path.read_text(errors="replace")
        conn = pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:guest@[::1]:{proc.port}/%2F"))
        try:
            names = [c["name"] for c in Api(f"http://[::1]:{proc.http_port}")
                     .get("/api/connections").json()]
        finally:
            conn.close()
    finally:
        assert proc.stop() == 0
    assert f"listening on amqp [::1]:{proc.port}" in log
    assert f"HTTP API listening on http://[::1]:{proc.http_port}" in log
    # the connection's name writes both ends as RabbitMQ does: [::1]:PORT -> [::1]:PORT
    assert len(names) == 1 and names[0].startswith("[::1]:"), names
    assert names[0].endswith(f" -> [::1]:{proc.port}"), names
