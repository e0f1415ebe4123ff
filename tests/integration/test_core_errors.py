"""Raw sockets against a real amqpd: header negotiation, error codes, bad and huge frames.

Everything here is what a well-behaved client library will not send, so the frames are
built by hand (tests/support/wire.py). Assertions are on reply codes, not texts, except
that every text must start with the code's name so a person can act on it.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator

import pika
import pytest
from pamqp import commands as C

from tests.support import wire
from tests.support.brokerproc import BrokerProcess
from tests.support.wire import PROTOCOL_HEADER, RawClosed, RawSocket

NAMES = {403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
         406: "PRECONDITION_FAILED", 501: "FRAME_ERROR", 502: "SYNTAX_ERROR",
         503: "COMMAND_INVALID", 504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME",
         530: "NOT_ALLOWED", 540: "NOT_IMPLEMENTED", 541: "INTERNAL_ERROR"}


def uname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[RawSocket]:
    sock = RawSocket(broker.port)
    yield sock
    sock.close()


@pytest.fixture
def opened(raw: RawSocket) -> RawSocket:
    raw.open(channel_max=2047)
    raw.open_channel(1)
    return raw


def expect_connection_close(raw: RawSocket, code: int) -> None:
    """The next frame is connection.close(code); after our close-ok the socket closes."""
    close = raw.expect(C.Connection.Close)
    assert close.reply_code == code, close.reply_text
    assert close.reply_text.startswith(NAMES[code] + " - "), close.reply_text
    try:
        raw.send(wire.method(0, C.Connection.CloseOk()))
    except OSError:
        pass  # after a framing error the broker does not wait for close-ok
    raw.wait_closed()


def expect_channel_close(raw: RawSocket, channel: int, code: int) -> None:
    item = raw.next()
    assert item.channel == channel and isinstance(item.value, C.Channel.Close), item
    assert item.value.reply_code == code, item.value.reply_text
    assert item.value.reply_text.startswith(NAMES[code] + " - "), item.value.reply_text
    raw.send(wire.method(channel, C.Channel.CloseOk()))


# ---------------------------------------------------------------- protocol header
@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x02", b"AMQP\x00\x01\x00\x00", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01",  # a TLS ClientHello
])
def test_wrong_header_gets_091_header_and_close(raw: RawSocket, header: bytes) -> None:
    raw.send(header)
    raw.sock.settimeout(5)
    data = b""
    try:
        for _ in range(100):  # bounded: the broker must close long before
            chunk = raw.sock.recv(100)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass  # RabbitMQ resets the socket right after the header
    assert data == PROTOCOL_HEADER


def test_header_in_pieces(raw: RawSocket) -> None:
    for byte in PROTOCOL_HEADER:
        raw.send(bytes((byte,)))
    start = raw.expect(C.Connection.Start)
    assert set(start.mechanisms.split()) == {"PLAIN", "AMQPLAIN"}
    # exactly the table RabbitMQ 3.10.8 advertises, plus amqpd's one extension
    # (publish_retry_of: docs/extensions.md; clients ignore capabilities they do not know)
    assert start.server_properties["capabilities"] == {
        "publisher_confirms": True, "exchange_exchange_bindings": True, "basic.nack": True,
        "consumer_cancel_notify": True, "connection.blocked": True,
        "consumer_priorities": True, "authentication_failure_close": True,
        "per_consumer_qos": True, "direct_reply_to": True,
        "publish_retry_of": True,
    }
    for key in ("product", "version", "platform", "copyright", "information", "cluster_name"):
        assert start.server_properties.get(key), key


def test_amqplain_login(raw: RawSocket) -> None:
    from pamqp import encode

    response = encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    raw.send(PROTOCOL_HEADER, wire.method(0, C.Connection.StartOk(
        client_properties={}, mechanism="AMQPLAIN", response=response.decode(),
        locale="en_US")))
    raw.expect(C.Connection.Start)
    tune = raw.expect(C.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


def test_tune_ok_above_server_limits_is_dropped(raw: RawSocket) -> None:
    raw.send(wire.handshake(channel_max=0))  # 0 = "no limit", above 2047 (RabbitMQ)
    raw.expect(C.Connection.Start)
    raw.expect(C.Connection.Tune)
    assert not any(isinstance(o.value, C.Connection.OpenOk) for o in raw.wait_closed())


# ---------------------------------------------------------------- close both ways
def test_client_close(opened: RawSocket) -> None:
    opened.send(wire.method(0, C.Connection.Close(reply_code=200, reply_text="bye",
                                                  class_id=0, method_id=0)))
    opened.expect(C.Connection.CloseOk)
    # now it is the client's turn to close the socket (amqpd drains its end until then)


def test_channel_close_both_ways(opened: RawSocket) -> None:
    opened.send(wire.method(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                               method_id=0)))
    assert opened.next().channel == 1
    opened.open_channel(1)
    opened.send(wire.method(1, C.Queue.Declare(queue=uname("missing"), passive=True)))
    expect_channel_close(opened, 1, 404)
    opened.open_channel(1)


def test_channel_flow(opened: RawSocket) -> None:
    opened.send(wire.method(1, C.Channel.Flow(active=True)))
    assert opened.expect(C.Channel.FlowOk).active is True
    opened.send(wire.method(1, C.Channel.Flow(active=False)))  # RabbitMQ: 540
    expect_connection_close(opened, 540)


def test_server_generated_consumer_tag(opened: RawSocket) -> None:
    opened.send(wire.method(1, C.Queue.Declare(queue="", exclusive=True)))
    queue = opened.expect(C.Queue.DeclareOk).queue
    opened.send(wire.method(1, C.Basic.Consume(queue=queue)))
    tag = opened.expect(C.Basic.ConsumeOk).consumer_tag
    assert tag.startswith("amq.ctag-") and len(tag) > 15


# ---------------------------------------------------------------- channel-level errors
@pytest.mark.parametrize("code,frames", [
    (403, lambda q: wire.method(1, C.Queue.Declare(queue="amq.reserved-" + q))),
    (403, lambda q: wire.method(1, C.Exchange.Delete(exchange="amq.direct"))),
    (404, lambda q: wire.method(1, C.Queue.Declare(queue=q, passive=True))),
    (404, lambda q: wire.publish(1, "no-such-exchange-" + q, "", b"x")),
    (404, lambda q: wire.method(1, C.Queue.Bind(queue=q, exchange="amq.direct"))),
    (406, lambda q: wire.method(1, C.Basic.Ack(delivery_tag=77))),
    (406, lambda q: wire.method(1, C.Tx.Commit())),
    (406, lambda q: wire.method(1, C.Queue.Declare(queue="", arguments={"x-max-length": -1}))),
])
def test_channel_errors_close_only_the_channel(opened: RawSocket, code: int, frames) -> None:
    opened.open_channel(2)
    opened.send(frames(uname("q")))
    expect_channel_close(opened, 1, code)
    opened.send(wire.method(2, C.Queue.Declare(queue="", exclusive=True)))
    assert opened.next().channel == 2  # the other channel still works
    opened.open_channel(1)  # and the closed one can be reopened


def test_405_exclusive_queue_of_another_connection(broker: BrokerProcess,
                                                   opened: RawSocket) -> None:
    q = uname("locked")
    opened.send(wire.method(1, C.Queue.Declare(queue=q, exclusive=True)))
    opened.expect(C.Queue.DeclareOk)
    other = RawSocket(broker.port)
    try:
        other.open(channel_max=10)
        other.open_channel(1)
        other.send(wire.method(1, C.Basic.Get(queue=q)))
        expect_channel_close(other, 1, 405)
    finally:
        other.close()


# ---------------------------------------------------------------- connection-level errors
@pytest.mark.parametrize("code,frames", [
    (501, wire.raw_frame(4, 1, b"abc")),  # unknown frame type
    (501, wire.raw_frame(1, 1, b"\x00\x14\x00\x0a\x00", end=0x00)),  # bad frame end
    (501, wire.raw_frame(1, 1, b"\x00\x32\x00\x0a\x00")),  # truncated arguments
    (502, wire.method(1, C.Basic.Publish()) + wire.raw_frame(
        2, 1, b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + b"\x80\x00\x10ab")),
    (503, wire.raw_frame(1, 1, b"\x00\x3c\x00\x63")),  # unknown method
    (503, wire.method(1, C.Exchange.Declare(exchange="x-bad-type", exchange_type="nope"))),
    (504, wire.method(9, C.Queue.Declare())),  # channel not open
    (504, wire.method(1, C.Channel.Open())),  # opened twice
    (505, wire.raw_frame(3, 1, b"body")),  # body without a publish
    (505, wire.method(1, C.Basic.Publish()) + wire.method(1, C.Basic.Qos())),
    (530, wire.method(1, C.Basic.Consume(queue="", consumer_tag="same"))),
    (540, wire.method(1, C.Basic.Qos(prefetch_size=10))),
    (540, wire.method(1, C.Basic.Publish(immediate=True)) + wire.content(1, b"x")),
])
def test_connection_errors_close_the_connection(opened: RawSocket, code: int,
                                                frames: bytes) -> None:
    if code == 530:  # the same consumer tag twice on a channel
        opened.send(wire.method(1, C.Queue.Declare(queue="", exclusive=True)))
        opened.expect(C.Queue.DeclareOk)
        opened.send(frames)
        opened.expect(C.Basic.ConsumeOk)
    opened.send(frames)
    expect_connection_close(opened, code)


def test_530_channel_max_counts_open_channels(raw: RawSocket) -> None:
    raw.open(channel_max=2)
    raw.open_channel(100)  # any number is fine; RabbitMQ counts channels
    raw.open_channel(2)
    raw.send(wire.method(3, C.Channel.Open()))
    expect_connection_close(raw, 530)


def test_530_unknown_vhost(raw: RawSocket) -> None:
    raw.send(wire.handshake(vhost=uname("vhost"), channel_max=10))
    raw.expect(C.Connection.Start)
    raw.expect(C.Connection.Tune)
    close = raw.expect(C.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)


def test_403_bad_login(raw: RawSocket) -> None:
    raw.send(wire.handshake(password="wrong", channel_max=10))
    raw.expect(C.Connection.Start)
    close = raw.expect(C.Connection.Close)
    assert close.reply_code == 403 and close.reply_text.startswith("ACCESS_REFUSED - ")
    raw.wait_closed()


def test_oversize_frame_is_501(raw: RawSocket) -> None:
    raw.open(channel_max=10, frame_max=4096)
    raw.open_channel(1)
    raw.send(wire.method(1, C.Basic.Publish(routing_key="x")),
             wire.content(1, b"x" * 5000, frame_max=10_000))
    expect_connection_close(raw, 501)


def test_huge_declared_size_is_refused_without_waiting_for_it(raw: RawSocket) -> None:
    raw.open(channel_max=10)
    raw.send(b"\x03\x00\x01\xff\xff\xff\xf0")  # a 4 GiB body frame header, nothing else
    expect_connection_close(raw, 501)


# ---------------------------------------------------------------- isolation
BAD_INPUTS = [
    b"\x00" * 64,
    b"AMQP\x00\x00\x09\x01" + b"\xff" * 100,
    wire.handshake(channel_max=10) + b"\x01\x00\x01\xff\xff\xff\xff",
    wire.handshake(channel_max=10) + wire.raw_frame(1, 0, b"\x00\x0a"),
    wire.handshake(channel_max=10) + wire.raw_frame(1, 1, b"\x00\x14\x00\x0a") * 3,
    wire.handshake(channel_max=10) + wire.method(1, C.Channel.Open()) + wire.publish(
        1, "", "q", b"x")[:-3],
    wire.handshake(channel_max=10) + struct.pack(">BHI", 3, 1, 1 << 20) + b"x" * 1000,
]


def test_bad_peers_do_not_disturb_a_good_connection(broker: BrokerProcess) -> None:
    good = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = good.channel()
        ch.confirm_delivery()
        q = ch.queue_declare("", exclusive=True).method.queue
        for round_, data in enumerate(BAD_INPUTS * 3):
            bad = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
            try:
                bad.sendall(data)
                if round_ % 2:
                    bad.shutdown(socket.SHUT_WR)  # half-close mid-frame
            finally:
                bad.close()
            ch.basic_publish("", q, str(round_).encode())
        got = []
        for _ in range(len(BAD_INPUTS) * 3):
            _method, _props, body = ch.basic_get(q, auto_ack=True)
            got.append(body)
        assert got == [str(n).encode() for n in range(len(BAD_INPUTS) * 3)]
    finally:
        good.close()
    # and the broker still accepts new connections
    check = RawSocket(broker.port)
    try:
        check.open(channel_max=10)
    finally:
        check.close()


def test_client_vanishing_mid_handshake_and_mid_content(broker: BrokerProcess) -> None:
    for data in (PROTOCOL_HEADER, wire.handshake(channel_max=10)[:40],
                 wire.handshake(channel_max=10) + wire.method(1, C.Channel.Open())
                 + wire.method(1, C.Basic.Publish(routing_key="x"))):
        s = RawSocket(broker.port)
        s.send(data)
        s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
    check = RawSocket(broker.port)
    try:
        check.open(channel_max=10)
        check.open_channel(1)
    finally:
        check.close()


def test_closed_socket_reports_eof(raw: RawSocket) -> None:
    raw.send(b"HTTP/1.1")
    with pytest.raises((RawClosed, ConnectionResetError)):
        for _ in range(100):
            raw.next(5)


# ---------------------------------------------------------------- found by diffing with RabbitMQ
def test_ack_multiple_needs_the_tag_itself(opened: RawSocket) -> None:
    """RabbitMQ refuses multiple=true for a tag it never delivered, even above real ones."""
    opened.send(wire.method(1, C.Queue.Declare(queue="", exclusive=True)))
    queue = opened.expect(C.Queue.DeclareOk).queue
    opened.send(wire.publish(1, "", queue, b"a"), wire.method(1, C.Basic.Get(queue=queue)))
    assert opened.expect(C.Basic.GetOk).delivery_tag == 1
    opened.next()
    opened.next()  # header and body
    opened.send(wire.method(1, C.Basic.Ack(delivery_tag=5, multiple=True)))
    expect_channel_close(opened, 1, 406)
    opened.open_channel(1)
    opened.send(wire.method(1, C.Queue.Declare(queue=queue, passive=True)))
    assert opened.expect(C.Queue.DeclareOk).message_count == 1  # requeued, not acked


@pytest.mark.parametrize("first,second", [(False, True), (True, False)])
def test_redeclare_with_other_exclusivity_is_405(opened: RawSocket, first: bool,
                                                 second: bool) -> None:
    q = uname("excl-redeclare")
    opened.send(wire.method(1, C.Queue.Declare(queue=q, exclusive=first, auto_delete=True)))
    opened.expect(C.Queue.DeclareOk)
    opened.send(wire.method(1, C.Queue.Declare(queue=q, exclusive=second, auto_delete=True)))
    expect_channel_close(opened, 1, 405)
    opened.open_channel(1)
    opened.send(wire.method(1, C.Queue.Delete(queue=q)))
    opened.expect(C.Queue.DeleteOk)


def test_passive_declare_of_empty_name_is_404(opened: RawSocket) -> None:
    """The 'last declared queue' shortcut does not apply to queue.declare."""
    opened.send(wire.method(1, C.Queue.Declare(queue="", exclusive=True)))
    opened.expect(C.Queue.DeclareOk)
    opened.send(wire.method(1, C.Queue.Declare(queue="", passive=True)))
    expect_channel_close(opened, 1, 404)
