"""AMQPConnection fed with bytes: handshake, channels, content assembly, errors, timers."""

from __future__ import annotations

import pytest
from pamqp import commands as C
from pamqp import encode

from amqpd.protocol.connection import Limits, State
from amqpd.protocol.errors import InternalError, NotFound, PreconditionFailed
from amqpd.protocol.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER
from tests.support import wire
from tests.unit.protocol.peer import FakeDelegate, Pair, last_close, real_broker


# ---------------------------------------------------------------- protocol header
def test_header_gets_connection_start() -> None:
    pair = Pair()
    (start,) = pair.send(PROTOCOL_HEADER)
    assert isinstance(start.value, C.Connection.Start)
    assert (start.value.version_major, start.value.version_minor) == (0, 9)
    assert set(start.value.mechanisms.split()) == {"PLAIN", "AMQPLAIN"}
    capabilities = start.value.server_properties["capabilities"]
    assert isinstance(capabilities, dict)
    assert capabilities["publisher_confirms"] is True


def test_header_in_single_bytes() -> None:
    pair = Pair()
    for i in range(7):
        assert pair.send(PROTOCOL_HEADER[i:i + 1]) == []
    (start,) = pair.send(PROTOCOL_HEADER[7:])
    assert isinstance(start.value, C.Connection.Start)


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x02", b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n", b"\x00" * 8,
    b"XYZ",
])
def test_wrong_header_gets_ours_back_and_close(header: bytes) -> None:
    pair = Pair()
    pair.server.receive_data(header)
    assert pair.server.data_to_send() == PROTOCOL_HEADER
    assert pair.server.should_close_transport
    assert pair.server.state is State.CLOSED
    pair.server.receive_data(b"more bytes after the refusal")
    assert pair.server.data_to_send() == b""


def test_connection_start_follows_a_new_cluster_name() -> None:
    """connection.start is encoded once per properties dict (a cache): a renamed
    cluster gets a new dict, and the next connection announces the new name."""
    broker = real_broker(cluster_name="first")
    assert broker.server_properties() is broker.server_properties()
    (start,) = Pair(broker=broker).send(PROTOCOL_HEADER)
    assert start.value.server_properties["cluster_name"] == "first"
    (again,) = Pair(broker=broker).send(PROTOCOL_HEADER)
    assert again.value.server_properties == start.value.server_properties
    broker.settings.cluster_name = "second"  # what BrokerAPI.set_cluster_name does
    (renamed,) = Pair(broker=broker).send(PROTOCOL_HEADER)
    assert renamed.value.server_properties["cluster_name"] == "second"
    assert set(renamed.value.mechanisms.split()) == {"PLAIN", "AMQPLAIN"}


# ---------------------------------------------------------------- start / tune / open
def test_full_handshake_plain() -> None:
    pair = Pair()
    _start, tune, _open_ok = pair.open()
    assert (tune.value.channel_max, tune.value.frame_max, tune.value.heartbeat) == (
        2047, 131072, 60)
    assert pair.server.is_open and pair.server.vhost == "/"
    assert pair.delegate.named("authenticate") == [("authenticate", "PLAIN", wire.plain())]


def test_amqplain_with_real_session() -> None:
    pair = Pair(broker=real_broker())
    response = encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    out = pair.send(
        PROTOCOL_HEADER,
        wire.method(0, C.Connection.StartOk(client_properties={}, mechanism="AMQPLAIN",
                                            response=response.decode(), locale="en_US")),
    )
    assert [o.name for o in out] == ["Connection.Start", "Connection.Tune"]


def test_non_ascii_password_survives_pamqp_string_decoding() -> None:
    broker = real_broker()
    broker.auth.add_user("jürgen", "pässwörd")
    broker.auth.set_permissions("jürgen", "/", ".*", ".*", ".*")
    pair = Pair(broker=broker)
    pair.open(user="jürgen", password="pässwörd")


def test_bad_password_is_403_with_authentication_failure_close() -> None:
    pair = Pair()
    out = pair.send(wire.handshake(password="wrong", channel_max=10))
    close = last_close(out)
    assert close.reply_code == 403
    assert "PLAIN" in close.reply_text
    assert pair.server.should_close_transport


def test_bad_password_without_the_capability_just_drops() -> None:
    pair = Pair()
    out = pair.send(wire.handshake(password="wrong", channel_max=10,
                                   capabilities={"authentication_failure_close": False}))
    assert [o.name for o in out] == ["Connection.Start"]
    assert pair.server.should_close_transport
    assert pair.server.state is State.CLOSED


def test_unknown_mechanism_with_real_session() -> None:
    pair = Pair(broker=real_broker())
    pair.send(PROTOCOL_HEADER)
    out = pair.send(wire.method(0, C.Connection.StartOk(
        client_properties={}, mechanism="EXTERNAL", response="", locale="en_US")))
    assert out == []  # RabbitMQ: a handshake error, dropped without connection.close
    assert pair.server.should_close_transport


def test_tune_ok_values_are_adopted() -> None:
    pair = Pair()
    pair.open(channel_max=10, frame_max=4096, heartbeat_=5)
    assert (pair.server.channel_max, pair.server.frame_max, pair.server.heartbeat) == (10, 4096, 5)
    assert pair.server.reader.frame_max == 4096


@pytest.mark.parametrize("kwargs", [
    {"channel_max": 0},  # "no limit" is above the server's 2047, as RabbitMQ reads it
    {"channel_max": 4000},
    {"channel_max": 10, "frame_max": 0},
    {"channel_max": 10, "frame_max": 1000},
    {"channel_max": 10, "frame_max": 1 << 20},
])
def test_tune_ok_outside_the_limits_is_dropped_silently(kwargs) -> None:
    """RabbitMQ sends no close frame for a failed negotiation; it drops the socket."""
    pair = Pair()
    out = pair.send(wire.handshake(**kwargs))
    assert [o.name for o in out] == ["Connection.Start", "Connection.Tune"]
    assert pair.server.should_close_transport
    assert pair.server.state is State.CLOSED
    assert pair.delegate.named("on_connection_closed")


def test_tune_ok_zero_is_fine_when_the_server_has_no_limit() -> None:
    pair = Pair(limits=Limits(channel_max=0, frame_max=0))
    pair.open(channel_max=0, frame_max=0)
    assert pair.server.frame_max == 0 or pair.server.frame_max >= 4096


def test_open_unknown_vhost_is_530() -> None:
    pair = Pair()
    out = pair.send(wire.handshake(vhost="nope", channel_max=10))
    close = last_close(out)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)


def test_open_before_tune_ok_drops() -> None:
    pair = Pair()
    pair.send(PROTOCOL_HEADER, wire.method(0, C.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response=wire.plain().decode(),
        locale="en_US")))
    out = pair.send(wire.method(0, C.Connection.Open(virtual_host="/")))
    assert not pair.server.is_open
    assert pair.server.should_close_transport
    assert all(o.name == "Connection.Close" for o in out)


def test_frames_on_a_channel_before_open_are_refused() -> None:
    pair = Pair()
    pair.send(PROTOCOL_HEADER)
    out = pair.send(wire.method(1, C.Channel.Open()))
    assert not pair.server.is_open
    assert out == [] or last_close(out).reply_code in (503, 504, 505)


# ---------------------------------------------------------------- close
def test_client_close_gets_close_ok() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    out = pair.call(0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                          method_id=0))
    assert [o.name for o in out] == ["Connection.CloseOk"]
    assert pair.server.state is State.CLOSED
    assert ("channel_closed", 1) in pair.delegate.calls
    assert pair.delegate.named("on_connection_closed")


def test_server_close_waits_for_close_ok_and_ignores_the_rest() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.server.close(320, "CONNECTION_FORCED - broker forced connection closure with reason "
                           "'shutdown'")
    close = last_close(pair.drain())
    assert close.reply_code == 320
    assert close.reply_text == ("CONNECTION_FORCED - broker forced connection closure with "
                                "reason 'shutdown'")
    assert pair.server.state is State.CLOSING
    # anything but close-ok is ignored meanwhile
    assert pair.send(wire.publish(1, "", "q", b"x"), wire.method(1, C.Basic.Qos())) == []
    assert pair.call(0, C.Connection.CloseOk()) == []
    assert pair.server.state is State.CLOSED
    assert pair.server.should_close_transport


def test_server_close_text_without_prefix() -> None:
    pair = Pair()
    pair.open()
    pair.server.close(320, "Closed via management plugin")
    assert last_close(pair.drain()).reply_text == "CONNECTION_FORCED - Closed via management plugin"


def test_bytes_after_closed_are_ignored() -> None:
    pair = Pair()
    pair.open()
    pair.call(0, C.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert pair.send(b"\x01garbage" * 10) == []


# ---------------------------------------------------------------- channels
def test_channel_open_close_both_ways() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.open_channel(2)
    out = pair.call(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert [(o.channel, o.name) for o in out] == [(1, "Channel.CloseOk")]
    # server-side close: a channel error from the delegate
    pair.delegate.fail_with = NotFound("no queue 'q' in vhost '/'")
    out = pair.call(2, C.Queue.Declare(queue="q", passive=True))
    close = last_close(out)
    assert (out[-1].channel, close.reply_code, close.class_id, close.method_id) == (2, 404, 50, 10)
    assert close.reply_text == "NOT_FOUND - no queue 'q' in vhost '/'"
    # until close-ok the channel ignores everything (including content)
    assert pair.send(wire.publish(2, "", "q", b"x"), wire.method(2, C.Basic.Qos())) == []
    assert pair.call(2, C.Channel.CloseOk()) == []
    pair.open_channel(2)  # and the number can be reused


def test_channel_error_leaves_other_channels_alone() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.open_channel(2)
    pair.delegate.fail_with = PreconditionFailed("unknown delivery tag 5")
    pair.call(1, C.Basic.Reject(delivery_tag=5))
    pair.call(2, C.Basic.Qos(prefetch_count=1))
    assert isinstance(pair.delegate.calls[-1][2], C.Basic.Qos)
    assert pair.server.is_open and 2 in pair.server.channels


def test_many_channels() -> None:
    pair = Pair()
    pair.open()
    out = pair.send(b"".join(wire.method(n, C.Channel.Open()) for n in range(1, 201)))
    assert [o.channel for o in out] == list(range(1, 201))
    assert all(o.name == "Channel.OpenOk" for o in out)


def test_channel_max_counts_open_channels() -> None:
    """RabbitMQ accepts any channel number but refuses the (channel_max+1)th open channel."""
    pair = Pair()
    pair.open(channel_max=2)
    pair.open_channel(7)
    pair.open_channel(2000)
    out = pair.call(3, C.Channel.Open())
    assert last_close(out).reply_code == 530
    assert isinstance(out[-1].value, C.Connection.Close)


def test_channel_max_closed_channels_free_their_slot() -> None:
    pair = Pair()
    pair.open(channel_max=1)
    pair.open_channel(1)
    pair.call(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    pair.open_channel(2)


@pytest.mark.parametrize("frames,code", [
    (wire.method(5, C.Queue.Declare()), 504),  # channel not open
    (wire.method(1, C.Channel.Open()), 504),  # second open
    (wire.raw_frame(8, 1, b""), 505),  # heartbeat on a channel
    (wire.raw_frame(3, 1, b"abc"), 505),  # body without a publish
    (wire.content(1, b"abc"), 505),  # header without a publish
    (wire.method(1, C.Basic.Publish()) + wire.method(1, C.Basic.Qos()), 505),
    (wire.raw_frame(3, 0, b"abc"), 505),  # content on channel 0
    (wire.raw_frame(1, 1, b"\x00\x3c\x00\x63"), 503),  # unknown method
    (wire.raw_frame(1, 1, b"\x00\x32\x00\x0a\x00"), 501),  # truncated queue.declare
    (wire.raw_frame(4, 1, b"abc"), 501),  # unknown frame type
    (wire.raw_frame(1, 1, b"\x00\x14\x00\x0a\x00", end=0), 501),  # bad frame end
    (wire.method(1, C.Basic.Publish(immediate=True)) + wire.content(1, b"x"), 540),
    (wire.method(1, C.Channel.CloseOk()), 503),  # close-ok without a close
    (wire.method(0, C.Connection.CloseOk()), 504),  # close-ok without a close
    (wire.method(0, C.Connection.Blocked(reason="x")), 504),  # only servers send it
    (wire.method(0, C.Basic.Qos()), 504),  # channel method on channel 0
    (wire.method(0, C.Connection.Open(virtual_host="/")), 504),  # second open
    # undecodable arguments are 501 in RabbitMQ (bad UTF-8, unknown field-table type)
    (wire.raw_frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\x02\xff\xfe\x00\x00\x00\x00\x00"), 501),
    (wire.raw_frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\x02qq\x00\x00\x00\x00\x06\x01kZabc"), 501),
    # content header whose properties run past the frame
    (wire.method(1, C.Basic.Publish()) + wire.raw_frame(
        2, 1, b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + b"\x80\x00\x10ab"), 502),
])
def test_connection_errors(frames: bytes, code: int) -> None:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    out = pair.send(frames)
    close = last_close(out)
    assert isinstance(close, C.Connection.Close)
    assert close.reply_code == code
    assert close.reply_text.split(" - ")[0].isupper()  # "NAME - explanation"
    assert pair.server.state is State.CLOSING


def test_body_larger_than_declared_is_505() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    out = pair.send(wire.method(1, C.Basic.Publish()),
                    wire.raw_frame(2, 1, b"\x00\x3c\x00\x00" + (2).to_bytes(8, "big") + b"\0\0"),
                    wire.raw_frame(3, 1, b"abc"))
    assert last_close(out).reply_code == 505


def test_oversize_frame_is_501() -> None:
    pair = Pair()
    pair.open(frame_max=4096)
    pair.open_channel(1)
    out = pair.send(wire.method(1, C.Basic.Publish()),
                    wire.content(1, b"x" * 5000, frame_max=10000))
    assert last_close(out).reply_code == 501


def test_frames_before_a_bad_frame_are_processed() -> None:
    pair = Pair()
    pair.open()
    out = pair.send(wire.method(1, C.Channel.Open()), wire.raw_frame(4, 1, b""))
    assert [o.name for o in out] == ["Channel.OpenOk", "Connection.Close"]


def test_internal_error_is_541_and_does_not_raise() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.delegate.fail_with = ZeroDivisionError()
    out = pair.call(1, C.Basic.Qos())
    assert last_close(out).reply_code == InternalError.reply_code


# ---------------------------------------------------------------- content assembly
def test_publish_assembled_from_many_body_frames() -> None:
    pair = Pair()
    pair.open(frame_max=4096)
    pair.open_channel(1)
    body = bytes(range(256)) * 50
    assert pair.send(wire.publish(1, "ex", "rk", body, mandatory=True, frame_max=4096)) == []
    assert pair.delegate.named("on_publish") == [("on_publish", 1, "ex", "rk", True, body)]


def test_publish_with_empty_body_has_no_body_frame() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.send(wire.publish(1, "", "q", b""))
    assert pair.delegate.named("on_publish") == [("on_publish", 1, "", "q", False, b"")]


def test_publish_split_at_every_byte() -> None:
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    data = wire.publish(1, "", "q", b"hello") + wire.method(1, C.Basic.Ack(delivery_tag=3))
    for i in range(len(data)):
        assert pair.send(data[i:i + 1]) == []
    assert pair.delegate.named("on_publish") == [("on_publish", 1, "", "q", False, b"hello")]
    assert pair.delegate.named("on_ack") == [("on_ack", 1, 3, False)]


def test_message_over_max_size_is_406_on_the_channel() -> None:
    pair = Pair(limits=Limits(max_message_size=10))
    pair.open()
    pair.open_channel(1)
    out = pair.send(wire.publish(1, "", "q", b"x" * 11))
    close = last_close(out)
    assert (out[-1].channel, close.reply_code) == (1, 406)


# ---------------------------------------------------------------- heartbeats and timeouts
def test_server_sends_heartbeats_when_idle() -> None:
    """The sender runs every heartbeat/2 s and beats unless something else went out since
    its last run (RabbitMQ: a heartbeat every half interval on an idle connection)."""
    pair = Pair()
    pair.open(heartbeat_=4)
    pair.server.data_to_send()
    pair.server.heartbeat_send()  # the first run always beats
    assert pair.server.data_to_send() == HEARTBEAT_FRAME
    pair.server.heartbeat_send()  # only our own heartbeat went out since
    assert pair.server.data_to_send() == HEARTBEAT_FRAME
    pair.call(0, C.Connection.UpdateSecret(new_secret="s", reason="r"))  # traffic
    pair.server.heartbeat_send()
    assert pair.server.data_to_send() == b""
    assert pair.server.is_open


def test_silent_peer_is_dropped_at_the_second_silent_check() -> None:
    pair = Pair()
    pair.open(heartbeat_=2)
    pair.clock.now += 1
    pair.server.receive_data(HEARTBEAT_FRAME)
    pair.clock.now += 1
    pair.server.heartbeat_check(pair.clock.now)  # a heartbeat arrived since the start
    pair.clock.now += 2
    pair.server.heartbeat_check(pair.clock.now)  # silent once: still alive
    assert pair.server.is_open
    pair.clock.now += 2
    pair.server.heartbeat_check(pair.clock.now)
    assert pair.server.state is State.CLOSED
    assert pair.server.should_close_transport
    assert pair.delegate.named("on_connection_closed")


def test_any_inbound_traffic_counts_as_life() -> None:
    pair = Pair()
    pair.open(heartbeat_=1)
    for _ in range(10):
        pair.clock.now += 1
        pair.server.receive_data(wire.method(0, C.Connection.UpdateSecret(
            new_secret="s", reason="r")))  # no heartbeat frame, but traffic
        pair.server.heartbeat_check(pair.clock.now)
    assert pair.server.is_open


def test_heartbeat_zero_disables_both_directions() -> None:
    pair = Pair()
    pair.open(heartbeat_=0)
    pair.clock.now += 10_000
    pair.server.tick(pair.clock.now)
    assert pair.server.is_open
    assert pair.server.data_to_send() == b""


def test_handshake_timeout() -> None:
    pair = Pair(limits=Limits(handshake_timeout=10))
    pair.send(PROTOCOL_HEADER)
    pair.clock.now += 11
    pair.server.tick(pair.clock.now)
    assert pair.server.should_close_transport


# ---------------------------------------------------------------- with the real broker
def test_session_publish_get_consume_ack() -> None:
    broker = real_broker()
    pair = Pair(broker=broker)
    pair.open()
    pair.open_channel(1)
    (ok,) = pair.call(1, C.Queue.Declare(queue="", exclusive=True))
    queue = ok.value.queue
    assert queue.startswith("amq.gen-")
    pair.send(wire.publish(1, "", queue, b"one"), wire.publish(1, "", queue, b"two"))
    get_ok, _header, body = pair.call(1, C.Basic.Get(queue=queue))
    assert (get_ok.value.message_count, body.value.value) == (1, b"one")
    out = pair.call(1, C.Basic.Consume(queue=queue, consumer_tag="c1"))
    assert [o.name for o in out] == ["Basic.ConsumeOk", "Basic.Deliver", "ContentHeader",
                                     "ContentBody"]
    assert out[1].value.delivery_tag == 2 and out[3].value.value == b"two"
    pair.call(1, C.Basic.Ack(delivery_tag=2, multiple=True))
    assert broker.vhosts["/"].queues[queue].unacked_count == 0
    out = pair.call(1, C.Basic.Ack(delivery_tag=99))
    assert last_close(out).reply_code == 406


def test_session_mandatory_return() -> None:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    out = pair.send(wire.publish(1, "amq.direct", "nowhere", b"x", mandatory=True))
    assert [o.name for o in out] == ["Basic.Return", "ContentHeader", "ContentBody"]
    assert (out[0].value.reply_code, out[0].value.reply_text) == (312, "NO_ROUTE")


def test_delegate_fake_is_a_connection_delegate() -> None:
    assert FakeDelegate().named("x") == []


def test_frame_error_closes_the_socket_without_waiting_for_close_ok() -> None:
    """After a framing error the stream cannot be read, so close-ok could never be found."""
    pair = Pair()
    pair.open()
    out = pair.send(wire.raw_frame(4, 0, b"x"))
    assert last_close(out).reply_code == 501
    assert pair.server.should_close_transport


def test_peer_that_never_sends_close_ok_is_dropped() -> None:
    pair = Pair()
    pair.open()
    pair.server.close(320, "bye")
    pair.drain()
    pair.clock.now += 29
    pair.server.tick(pair.clock.now)
    assert pair.server.state is State.CLOSING
    pair.clock.now += 2
    pair.server.tick(pair.clock.now)
    assert pair.server.state is State.CLOSED and pair.server.should_close_transport


def test_access_request_is_granted_like_rabbitmq() -> None:
    """access.request left the spec in 0-9-1; RabbitMQ still answers it with ticket 1."""
    pair = Pair()
    pair.open()
    pair.open_channel(1)
    pair.server.receive_data(wire.raw_frame(1, 1, b"\x00\x1e\x00\x0a\x01/\x00"))
    assert pair.server.data_to_send() == wire.raw_frame(1, 1, b"\x00\x1e\x00\x0b\x00\x01")
    assert pair.server.is_open


@pytest.mark.parametrize("mechanism,response", [
    ("PLAIN", "no-nul-separators"), ("AMQPLAIN", "\x05junk"), ("AMQPLAIN", ""),
])
def test_unparseable_login_response_is_dropped(mechanism: str, response: str) -> None:
    pair = Pair(broker=real_broker())
    pair.send(PROTOCOL_HEADER)
    out = pair.send(wire.method(0, C.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism=mechanism, response=response, locale="en_US")))
    assert out == []
    assert pair.server.should_close_transport and pair.server.state is State.CLOSED


@pytest.mark.parametrize("header_payload,body,code", [
    # complete publish triplets in one read (the fast path) that must still be refused
    (b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + b"\x80\x00\x10ab", b"x", 502),
    (b"\x00\x3c\x00\x00" + (2).to_bytes(8, "big") + b"\x00\x00", b"xyz", 505),
    (b"\x00\x32\x00\x00" + (1).to_bytes(8, "big") + b"\x00\x00", b"x", 505),
])
def test_bad_publish_triplets_in_one_read(header_payload: bytes, body: bytes, code: int) -> None:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    out = pair.send(wire.method(1, C.Basic.Publish(routing_key="q")),
                    wire.raw_frame(2, 1, header_payload), wire.raw_frame(3, 1, body))
    assert last_close(out).reply_code == code


def test_good_publish_triplets_in_one_read_reach_the_queue() -> None:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    (ok,) = pair.call(1, C.Queue.Declare(queue="", exclusive=True))
    queue = ok.value.queue
    pair.send(b"".join(wire.publish(1, "", queue, b"m%d" % n, content_type="t") for n in range(50)))
    (ok,) = pair.call(1, C.Queue.Declare(queue=queue, passive=True))
    assert ok.value.message_count == 50


def test_no_heartbeat_timeout_while_the_transport_is_not_reading() -> None:
    """A blocked publisher (resource alarm) is not read from, so its heartbeats wait in the
    socket: RabbitMQ pauses its heartbeat monitor meanwhile, and so must we."""
    pair = Pair()
    pair.open(heartbeat_=1)
    pair.server.reading_paused = True
    for _ in range(10):
        pair.clock.now += 1
        pair.server.heartbeat_check(pair.clock.now)
    assert pair.server.is_open
    pair.server.reading_paused = False
    for _ in range(2):
        pair.clock.now += 1
        pair.server.heartbeat_check(pair.clock.now)
    assert pair.server.state is State.CLOSED
