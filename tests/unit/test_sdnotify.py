"""amqpd.sdnotify: one datagram to $NOTIFY_SOCKET, never an error that stops the broker."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from amqpd import sdnotify


def test_sends_the_state_to_a_socket_path(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        assert sdnotify.notify("READY=1\nSTATUS=up", {"NOTIFY_SOCKET": str(path)})
        assert sock.recv(100) == b"READY=1\nSTATUS=up"


def test_an_abstract_socket_name_starts_with_at() -> None:
    name = f"amqpd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(100) == b"READY=1"


def test_nothing_without_a_notify_socket() -> None:
    assert not sdnotify.notify("READY=1", {})
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": ""})


@pytest.mark.parametrize("value", ["relative/path", "vsock:2:1234", "@"])
def test_an_unsupported_address_is_logged_not_raised(
        value: str, caplog: pytest.LogCaptureFixture) -> None:
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": value})
    assert "not a unix socket address" in caplog.text


def test_an_unreachable_socket_is_logged_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert "cannot notify the service manager" in caplog.text
