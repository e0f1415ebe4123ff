"""Process-level behaviour: SIGTERM, heartbeats, users and vhosts from the config file,
and the loopback-only guest."""

from __future__ import annotations

import signal
import socket
import time
import uuid
from pathlib import Path

import pika
import pika.exceptions as pex
import pytest
from pamqp import commands as C
from pamqp import heartbeat

from amqpd.broker.auth import AuthStore
from amqpd.config import Settings
from amqpd.server import Broker
from amqpd.session import Session
from tests.support import wire
from tests.support.brokerproc import BrokerProcess
from tests.support.wire import RawClosed, RawSocket


def uname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------- SIGTERM
def test_sigterm_closes_connections_with_320_and_exits_0(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    raw = RawSocket(fresh_broker.port)
    raw.open(channel_max=10)
    raw.open_channel(1)
    client = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = client.channel()
    q = ch.queue_declare(uname("durable-at-shutdown"), durable=True).method.queue
    ch.basic_publish("", q, b"kept", pika.BasicProperties(delivery_mode=2))
    assert fresh_broker.proc is not None
    fresh_broker.proc.send_signal(signal.SIGTERM)

    close = raw.expect(C.Connection.Close, timeout=10)
    assert close.reply_code == 320
    assert close.reply_text == ("CONNECTION_FORCED - broker forced connection closure with "
                                "reason 'shutdown'")
    raw.send(wire.method(0, C.Connection.CloseOk()))
    raw.wait_closed(10)

    with pytest.raises(pex.ConnectionClosedByBroker) as err:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            client.process_data_events(time_limit=0.1)
    assert err.value.reply_code == 320
    assert fresh_broker.proc.wait(15) == 0

    fresh_broker.restart(keep_port=False)  # and the durable message survived
    client = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    try:
        _method, _props, body = client.channel().basic_get(q, auto_ack=True)
        assert body == b"kept"
    finally:
        client.close()


def test_sigterm_does_not_hang_on_peers_that_never_answer(fresh_broker: BrokerProcess) -> None:
    """A client that ignores connection.close, or one stuck mid-handshake, cannot keep the
    broker from exiting."""
    fresh_broker.start()
    silent = RawSocket(fresh_broker.port)
    silent.open(channel_max=10)
    half = RawSocket(fresh_broker.port)
    half.send(wire.PROTOCOL_HEADER)
    half.expect(C.Connection.Start)
    assert fresh_broker.proc is not None
    started = time.monotonic()
    fresh_broker.proc.send_signal(signal.SIGTERM)
    assert silent.expect(C.Connection.Close, timeout=10).reply_code == 320
    assert fresh_broker.proc.wait(20) == 0
    assert time.monotonic() - started < 15
    silent.close()
    half.close()


# ---------------------------------------------------------------- heartbeats
def test_silent_peer_is_dropped_and_server_sends_heartbeats(broker: BrokerProcess) -> None:
    raw = RawSocket(broker.port, timeout=10)
    try:
        raw.open(channel_max=10, heartbeat_=1)
        started = time.monotonic()
        beats = 0
        with pytest.raises((RawClosed, ConnectionResetError)):
            while time.monotonic() - started < 10:
                item = raw.next(10, skip_heartbeats=False)
                beats += isinstance(item.value, heartbeat.Heartbeat)
        elapsed = time.monotonic() - started
        assert beats >= 1  # the broker sent heartbeats while it waited for ours
        assert 1.5 < elapsed < 6, elapsed  # two intervals of 1 s, checked once a second
    finally:
        raw.close()


def test_peer_that_sends_heartbeats_is_kept(broker: BrokerProcess) -> None:
    raw = RawSocket(broker.port, timeout=10)
    try:
        raw.open(channel_max=10, heartbeat_=1)
        started = time.monotonic()
        while time.monotonic() - started < 4:
            raw.send(wire.HEARTBEAT)
            time.sleep(0.3)  # pacing a heartbeat, not waiting for the broker
        raw.open_channel(1)  # still alive
    finally:
        raw.close()


def test_blocked_publisher_is_not_dropped_for_missed_heartbeats(
        fresh_broker: BrokerProcess) -> None:
    """While a resource alarm blocks a publisher the broker stops reading its socket; the
    heartbeats it keeps sending wait there, and must not count as missed (RabbitMQ)."""
    import subprocess
    import sys

    def watermark(value: str) -> None:
        subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", fresh_broker.http_url,
                        "set_vm_memory_high_watermark", value], check=True,
                       capture_output=True, timeout=30)

    fresh_broker.start()
    raw = RawSocket(fresh_broker.port, timeout=10)
    try:
        raw.open(channel_max=10, heartbeat_=1, capabilities={"connection.blocked": True})
        raw.open_channel(1)
        raw.send(wire.publish(1, "", uname("nowhere"), b"x"))  # a publisher gets blocked
        watermark("0.000001")
        raw.expect(C.Connection.Blocked)
        started = time.monotonic()
        while time.monotonic() - started < 3.5:  # well past two heartbeat intervals
            raw.send(wire.HEARTBEAT)
            time.sleep(0.3)  # pacing our heartbeats, not waiting for the broker
        watermark("0.4")
        raw.expect(C.Connection.Unblocked)
        raw.open_channel(2)
    finally:
        raw.close()


def test_pika_heartbeat_negotiation(broker: BrokerProcess) -> None:
    p = pika.URLParameters(broker.url)
    p.heartbeat = 1
    c = pika.BlockingConnection(p)
    try:
        assert c._impl.params.heartbeat == 1
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:  # pika answers heartbeats: stays open
            c.process_data_events(time_limit=0.25)
        assert c.is_open
    finally:
        c.close()


# ---------------------------------------------------------------- config file
CONFIG = """
vhosts = ["{vhost}"]

[[users]]
name = "app"
password = "s3cret"
tags = ["management"]

[[users]]
name = "reader"
password = "r3ad"

[[permissions]]
user = "app"
vhost = "{vhost}"
configure = "^app\\\\."
write = ".*"
read = ".*"

[[permissions]]
user = "reader"
vhost = "{vhost}"
configure = ""
write = ""
read = ".*"
"""


def connect(broker: BrokerProcess, user: str, password: str, vhost: str,
            host: str = "127.0.0.1") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=broker.port, virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password), connection_attempts=1))


def test_users_vhosts_permissions_from_config(tmp_path: Path) -> None:
    vhost = uname("staging")
    config = tmp_path / "amqpd.toml"
    config.write_text(CONFIG.format(vhost=vhost))
    proc = BrokerProcess(tmp_path / "data", extra_args=["--config", str(config)])
    proc.start()
    try:
        app = connect(proc, "app", "s3cret", vhost)
        ch = app.channel()
        ch.queue_declare("app.orders")
        with pytest.raises(pex.ChannelClosedByBroker) as err:
            ch.queue_declare("not-app")
        assert err.value.reply_code == 403
        ch = app.channel()
        ch.basic_publish("", "app.orders", b"o1")
        app.close()

        reader = connect(proc, "reader", "r3ad", vhost)
        ch = reader.channel()
        assert ch.basic_get("app.orders", auto_ack=True)[2] == b"o1"
        ch.basic_publish("", "app.orders", b"no write")
        with pytest.raises(pex.ChannelClosedByBroker) as err:
            ch.queue_declare("app.orders", passive=True)
        assert err.value.reply_code == 403
        reader.close()

        with pytest.raises(pex.ProbableAuthenticationError):
            connect(proc, "app", "wrong", vhost)
        with pytest.raises(pex.ProbableAccessDeniedError):  # no permission on '/'
            connect(proc, "app", "s3cret", "/")
        with pytest.raises(pex.ProbableAccessDeniedError):  # guest has none on the vhost
            connect(proc, "guest", "guest", vhost)
        connect(proc, "guest", "guest", "/").close()  # the default user is still there
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------- guest is loopback-only
def non_loopback_ipv4() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.254", 9))  # no packet is sent for a UDP connect
        addr = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if addr.startswith("127.") else addr


def test_guest_refused_from_a_non_loopback_address(tmp_path: Path) -> None:
    addr = non_loopback_ipv4()
    if addr is None:
        pytest.skip("no non-loopback IPv4 address on this host")
    config = tmp_path / "amqpd.toml"
    config.write_text('[[users]]\nname = "remote"\npassword = "pw"\n\n'
                      '[[permissions]]\nuser = "remote"\nvhost = "/"\n')
    proc = BrokerProcess(tmp_path / "data", extra_args=["--config", str(config),
                                                         "--bind", addr])
    proc.start()
    try:
        with pytest.raises(pex.ProbableAuthenticationError):
            connect(proc, "guest", "guest", "/", host=addr)
        raw = RawSocket(proc.port, host=addr)
        try:
            raw.send(wire.handshake(channel_max=10))
            raw.expect(C.Connection.Start)
            close = raw.expect(C.Connection.Close)
            assert close.reply_code == 403
            assert close.reply_text == ("ACCESS_REFUSED - user 'guest' can only connect via "
                                        "localhost")
        finally:
            raw.close()
        connect(proc, "remote", "pw", "/", host=addr).close()
    finally:
        proc.stop()


@pytest.mark.parametrize("peer,loopback", [
    (("127.0.0.1", 1), True), (("127.1.2.3", 1), True), (("::1", 1), True),
    (("::ffff:127.0.0.1", 1), True), (("10.0.0.1", 1), False), (("192.0.2.2", 1), False),
    (("::ffff:10.0.0.1", 1), False), (("fd00::2", 1), False), (("1270::1", 1), False),
])
def test_loopback_check(peer: tuple[str, int], loopback: bool) -> None:
    broker = Broker(Settings(persistence=False))
    session = Session(broker, peer, broker.limits())
    assert session.peer_is_loopback is loopback
    auth: AuthStore = broker.auth
    assert (auth.authenticate("guest", "guest", session.peer_is_loopback) is not None) is loopback
