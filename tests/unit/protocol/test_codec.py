"""The hand-written hot-path codec, checked against pamqp in both directions."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, exceptions, frame

from amqpd.protocol import codec
from amqpd.protocol.errors import AMQPError, CommandInvalid, FrameError, SyntaxError_
from tests.support import wire
from tests.support.wire import ClientCodec, RawContentHeader


def payload_of(data: bytes) -> bytes:
    """The payload of the single frame in ``data``."""
    size = struct.unpack_from(">I", data, 3)[0]
    assert data[7 + size] == 0xCE and len(data) == size + 8
    return data[7:7 + size]


def parse(data: bytes) -> list:
    out = ClientCodec().feed(data)
    return [o.value for o in out]


def test_method_id() -> None:
    assert codec.method_id(b"\x00\x3c\x00\x28rest") == (60 << 16) | 40
    with pytest.raises(SyntaxError_):
        codec.method_id(b"\x00\x3c")


@pytest.mark.parametrize("method", [
    commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 5}),
    commands.Exchange.Declare(exchange="x", exchange_type="topic"),
    commands.Basic.Qos(prefetch_count=10, global_=True),
    commands.Basic.Consume(queue="q", consumer_tag="t", no_ack=True),
    commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
])
def test_decode_method_matches_pamqp(method) -> None:
    decoded = codec.decode_method(payload_of(wire.method(1, method)))
    assert type(decoded) is type(method)
    assert dict(decoded) == dict(method)


def test_unknown_method_is_503() -> None:
    with pytest.raises(CommandInvalid) as err:
        codec.decode_method(struct.pack(">HH", 60, 99))
    assert err.value.reply_code == 503


def test_truncated_method_is_501() -> None:
    with pytest.raises(FrameError) as err:
        codec.decode_method(struct.pack(">HH", 50, 10) + b"\x00")
    assert (err.value.reply_code, err.value.class_id, err.value.method_id) == (501, 50, 10)


def test_every_truncation_of_a_method_raises_an_amqp_error() -> None:
    payload = payload_of(wire.method(1, commands.Queue.Bind(
        queue="q", exchange="x", routing_key="rk", arguments={"a": 1})))
    for cut in range(len(payload)):
        with pytest.raises(AMQPError):
            codec.decode_method(payload[:cut])


def test_decode_publish() -> None:
    payload = payload_of(wire.method(1, commands.Basic.Publish(
        exchange="ex", routing_key="a.b", mandatory=True)))
    assert codec.decode_publish(payload) == ("ex", "a.b", True, False)
    with pytest.raises(SyntaxError_):
        codec.decode_publish(payload[:8])


def test_decode_ack() -> None:
    payload = payload_of(wire.method(1, commands.Basic.Ack(delivery_tag=2**40, multiple=True)))
    assert codec.decode_ack(payload) == (2**40, True)
    with pytest.raises(SyntaxError_):
        codec.decode_ack(payload[:-1])


def test_content_header() -> None:
    data = wire.content(1, b"", content_type="text/plain", delivery_mode=2)
    class_id, size, raw = codec.decode_content_header(payload_of(data))
    assert (class_id, size) == (60, 0)
    assert codec.decode_properties(raw) == {"content_type": "text/plain", "delivery_mode": 2}
    assert codec.delivery_mode(raw) == 2


props_strategy = st.fixed_dictionaries({}, optional={
    "content_type": st.text(max_size=20),
    "content_encoding": st.text(max_size=5),
    "headers": st.dictionaries(st.text(min_size=1, max_size=8),
                               st.integers(-2**31, 2**31 - 1) | st.text(max_size=8), max_size=3),
    "delivery_mode": st.sampled_from([1, 2]),
    "priority": st.integers(0, 9),
    "correlation_id": st.text(max_size=10),
    "reply_to": st.text(max_size=10),
    "expiration": st.integers(0, 10**6).map(str),
    "message_id": st.text(max_size=10),
    "type": st.text(max_size=10),
    "app_id": st.text(max_size=10),
})


@settings(max_examples=150, deadline=None)
@given(props_strategy)
def test_properties_round_trip(props) -> None:
    raw = codec.encode_properties(props)
    assert codec.decode_properties(raw) == props
    assert codec.delivery_mode(raw) == props.get("delivery_mode", 1)
    # and pamqp reads what we wrote
    header = wire.raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + raw)
    (value,) = parse(header)
    for key, want in props.items():
        attr = "message_type" if key == "type" else key  # pamqp's name for 'type'
        assert getattr(value.properties, attr) == want


@pytest.mark.parametrize("frame_max,size,frames", [
    (4096, 0, 1), (4096, 4088, 2), (4096, 4089, 3), (4096, 10000, 4), (131072, 5, 2)])
def test_content_frames_split_to_frame_max(frame_max: int, size: int, frames: int) -> None:
    body = bytes(range(256)) * (size // 256 + 1)
    body = body[:size]
    data = codec.content_frames(1, 60, codec.encode_properties({}), body, frame_max)
    values = parse(data)
    assert len(values) == frames
    assert b"".join(v.value for v in values[1:]) == body
    pos = 0
    while pos < len(data):  # no frame is larger than frame_max
        size_ = struct.unpack_from(">I", data, pos + 3)[0]
        assert size_ + 8 <= frame_max
        pos += size_ + 8


def test_deliver_method_parses_with_pamqp() -> None:
    (m,) = parse(codec.deliver_method(3, codec.shortstr("ctag"), 7, True, codec.shortstr("ex"),
                                      codec.shortstr("rk")))
    assert isinstance(m, commands.Basic.Deliver)
    assert (m.consumer_tag, m.delivery_tag, m.redelivered, m.exchange, m.routing_key) == (
        "ctag", 7, True, "ex", "rk")


def test_get_ok_return_ack_nack_close() -> None:
    values = parse(
        codec.get_ok_method(1, 5, False, "", "q", 9)
        + codec.return_method(1, 312, "NO_ROUTE", "ex", "rk")
        + codec.ack_method(1, 4, True)
        + codec.nack_method(1, 6, False)
        + codec.close_method(1, 404, "NOT_FOUND - x", 50, 10)
        + codec.close_method(0, 320, "CONNECTION_FORCED - y", 0, 0)
    )
    get_ok, ret, ack, nack, ch_close, conn_close = values
    assert (get_ok.delivery_tag, get_ok.routing_key, get_ok.message_count) == (5, "q", 9)
    assert (ret.reply_code, ret.reply_text, ret.exchange) == (312, "NO_ROUTE", "ex")
    assert (ack.delivery_tag, ack.multiple) == (4, True)
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (6, False, True)
    assert isinstance(ch_close, commands.Channel.Close)
    assert (ch_close.reply_code, ch_close.class_id, ch_close.method_id) == (404, 50, 10)
    assert isinstance(conn_close, commands.Connection.Close)
    assert conn_close.reply_code == 320


def test_close_text_is_capped_at_255_bytes() -> None:
    (m,) = parse(codec.close_method(1, 406, "x" * 400, 0, 0))
    assert m.reply_text == "x" * 255


def test_names_rabbitmq_accepts_but_the_spec_does_not() -> None:
    """Names with characters outside the spec's pattern still encode (RabbitMQ allows them)."""
    (m,) = parse(codec.get_ok_method(1, 1, False, "ex/with space", "rk#*é", 0))
    assert (m.exchange, m.routing_key) == ("ex/with space", "rk#*é")
    assert frame  # pamqp's frame module is what the client side uses


def _deliveries() -> list[tuple]:
    """(consumer tag, delivery tag, redelivered, exchange, routing key, properties, body,
    frame_max): runs that keep and change each repeated part, names equal but not the
    same objects, empty and multi-frame bodies, a tag and a size past 32 bits."""
    tag_a, tag_b = codec.shortstr("ctag-a"), codec.shortstr("another-tag")
    props_1 = codec.encode_properties({"delivery_mode": 2})
    props_2 = codec.encode_properties({"content_type": "text/plain", "priority": 3})
    ex_copy = "".join(["amq.", "direct"])  # equal to "amq.direct", another object
    return [
        (tag_a, 1, False, "", "q", props_1, b"x" * 16, 131072),
        (tag_a, 2, True, "", "q", props_1, b"y" * 16, 131072),
        (tag_a, 3, False, "amq.direct", "q", props_1, b"z" * 100, 131072),
        (tag_a, 4, False, ex_copy, "q", props_1, b"z" * 100, 131072),
        (tag_a, 5, False, ex_copy, "q", props_2, b"w" * 7, 131072),
        (tag_b, 6, False, ex_copy, "q", props_2, b"w" * 7, 131072),
        (tag_b, 7, False, ex_copy, "other.key", props_2, b"", 131072),
        (tag_b, 8, True, ex_copy, "other.key", props_2, b"v" * 5000, 4096),
        (tag_b, 9, False, ex_copy, "other.key", props_2, b"v" * 4088, 4096),
        (tag_b, 10, False, ex_copy, "other.key", props_2, b"v" * 4089, 4096),
        (tag_b, 2**40, False, ex_copy, "other.key", b"\x00\x00", b"u", 0),
        (tag_b, 2**40 + 1, False, ex_copy, "other.key", b"\x00\x00", b"u", 131072),
    ]


@pytest.mark.parametrize("channel", [1, 2047, 65535])
def test_delivery_frames_match_deliver_frames(channel: int) -> None:
    """The parts DeliveryFrames appends, joined, are the bytes deliver_frames builds,
    whatever changed since the channel's previous delivery."""
    frames = codec.DeliveryFrames(channel)
    for ctag, tag, redelivered, exchange, rk, props, body, frame_max in _deliveries():
        out: list[bytes] = [b"before"]
        n = frames.append_to(out, ctag, tag, redelivered, exchange, rk, props, body,
                             frame_max)
        expected = codec.deliver_frames(channel, ctag, tag, redelivered, exchange, rk,
                                        props, body, frame_max)
        assert out[0] == b"before"
        assert b"".join(out[1:]) == expected
        assert n == len(expected)
    ctag, tag, redelivered, exchange, rk, props, body, frame_max = _deliveries()[1]
    out = []
    frames.append_to(out, ctag, tag, redelivered, exchange, rk, props, body, frame_max)
    deliver, header, content = parse(b"".join(out))
    assert deliver.delivery_tag == 2 and deliver.redelivered and deliver.routing_key == "q"
    assert header.body_size == 16 and content.value == b"y" * 16


def test_client_codec_keeps_a_non_utf8_content_header_raw() -> None:
    """The broker copies a publisher's property bytes through; the test client must read
    a header table whose key is not UTF-8 (found by test_fuzz) without failing."""
    props = b"\x20\x00" + b"\x00\x00\x00\x04" + b"\x01\x80V\x00"  # headers {b"\x80": void}
    payload = struct.pack(">HHQ", 60, 0, 5) + props
    frame_bytes = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    (out,) = ClientCodec().feed(frame_bytes)
    assert out.channel == 1
    assert out.value == RawContentHeader(60, 5, props)


def test_client_codec_still_refuses_a_malformed_method() -> None:
    payload = b"\x00\x28\x00\x0a" + b"\x00\x00\x01\x80"  # exchange.declare, cut short
    frame_bytes = struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"
    with pytest.raises(exceptions.UnmarshalingException):
        ClientCodec().feed(frame_bytes)
