"""devtools.rabbitmq's retry: a node whose distribution port was taken between
free_ports() and its own bind (other work on the machine picks ports too) is started
again with fresh ports instead of failing the test or benchmark that wanted it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import rabbitmq as rmq

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port with a listener on it for the duration of the test."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@pytest.mark.timeout(400)
def test_taken_dist_port_is_retried_with_fresh_ports(
        tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rmq.find_server()
    except rmq.RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    real_free_ports = rmq.free_ports
    calls: list[list[int]] = []

    def first_dist_port_taken(n: int) -> list[int]:
        ports = real_free_ports(n)
        if not calls:
            ports[1] = taken_port  # amqp, dist, epmd: the distribution port is taken
        calls.append(ports)
        return ports

    monkeypatch.setattr(rmq, "free_ports", first_dist_port_taken)
    info = rmq.start(tmp_path / "rmq")
    try:
        assert len(calls) == 2, calls
        assert info.dist_port != taken_port
        assert rmq._amqp_ready(info.amqp_port)
        out = (tmp_path / "rmq" / "server.out").read_text(errors="replace")
        assert "dist_port_already_used" in out
        assert "starting again with fresh ports" in capsys.readouterr().err
    finally:
        rmq.stop(tmp_path / "rmq")
    assert not rmq._pid_alive(info.pid)


@pytest.mark.timeout(400)
def test_no_retry_when_retries_is_zero(tmp_path: Path, taken_port: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        rmq.find_server()
    except rmq.RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    real_free_ports = rmq.free_ports

    def dist_port_taken(n: int) -> list[int]:
        ports = real_free_ports(n)
        ports[1] = taken_port
        return ports

    monkeypatch.setattr(rmq, "free_ports", dist_port_taken)
    with pytest.raises(rmq.RabbitMQError, match="exited with status"):
        rmq.start(tmp_path / "rmq", retries=0)
    info = rmq.RabbitInfo.load(tmp_path / "rmq")
    assert not rmq._pid_alive(info.pid)
    assert info.epmd_pid is not None and not rmq._pid_alive(info.epmd_pid)
