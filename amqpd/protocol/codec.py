"""Method and content codec.

Two speeds, on purpose (see DESIGN.md "Hot path"):

* The five hot methods, basic.publish / content header / body / basic.deliver /
  basic.ack, are parsed and built here with ``struct`` directly: no per-frame objects,
  property bytes kept raw.
* Every other method goes through pamqp, whose cost does not matter at their rate.
  Outgoing methods that carry names are built here too, because pamqp's ``marshal``
  validates names against the spec's strict pattern, which RabbitMQ itself does not apply.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from pamqp import commands, encode
from pamqp.base import Frame as PamqpFrame

from amqpd.protocol import fields
from amqpd.protocol.constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_RETURN,
    CHANNEL_CLOSE,
    CLASS_BASIC,
    CONNECTION_CLOSE,
    FLAG_APP_ID,
    FLAG_CLUSTER_ID,
    FLAG_CONTENT_ENCODING,
    FLAG_CONTENT_TYPE,
    FLAG_CONTINUATION,
    FLAG_CORRELATION_ID,
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_MESSAGE_ID,
    FLAG_PRIORITY,
    FLAG_REPLY_TO,
    FLAG_TIMESTAMP,
    FLAG_TYPE,
    FLAG_USER_ID,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    class_of,
    method_of,
)
from amqpd.protocol.errors import CommandInvalid, FrameError, SyntaxError_
from amqpd.protocol.frames import FRAME_END_BYTE

# RabbitMQ's own table encoding picks 'I' for 32-bit and 'l' for 64-bit integers.
encode.support_deprecated_rabbitmq(True)

_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
_FRAME_HDR: Final = struct.Struct(">BHI")
_METHOD_HDR: Final = struct.Struct(">BHII")  # frame header + method index (class, method)
_CONTENT_HDR: Final = struct.Struct(">BHIHHQ")  # frame header + class, weight, body size

# (property name, flag bit, pamqp type) in wire order
PROPERTY_FIELDS: tuple[tuple[str, int, str], ...] = (
    ("content_type", FLAG_CONTENT_TYPE, "shortstr"),
    ("content_encoding", FLAG_CONTENT_ENCODING, "shortstr"),
    ("headers", FLAG_HEADERS, "table"),
    ("delivery_mode", FLAG_DELIVERY_MODE, "octet"),
    ("priority", FLAG_PRIORITY, "octet"),
    ("correlation_id", FLAG_CORRELATION_ID, "shortstr"),
    ("reply_to", FLAG_REPLY_TO, "shortstr"),
    ("expiration", FLAG_EXPIRATION, "shortstr"),
    ("message_id", FLAG_MESSAGE_ID, "shortstr"),
    ("timestamp", FLAG_TIMESTAMP, "timestamp"),
    ("type", FLAG_TYPE, "shortstr"),
    ("user_id", FLAG_USER_ID, "shortstr"),
    ("app_id", FLAG_APP_ID, "shortstr"),
    ("cluster_id", FLAG_CLUSTER_ID, "shortstr"),
)


# --------------------------------------------------------------------------- decoding
def _ids(index: int) -> tuple[int, int]:
    return class_of(index), method_of(index)


def method_id(payload: bytes) -> int:
    """``class_id << 16 | method_id`` of a method frame payload."""
    if len(payload) < 4:
        raise SyntaxError_("method frame too short")
    return int.from_bytes(payload[:4], "big")


def decode_method(payload: bytes) -> PamqpFrame:
    """Decode a (non-hot) method with pamqp. Unknown methods are 540/503 as RabbitMQ."""
    index = method_id(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise CommandInvalid(
            f"unknown method class {class_of(index)} method {method_of(index)}")
    method = cls.__new__(cls)  # type: ignore[call-overload]
    try:
        method.unmarshal(payload[4:])
    except (struct.error, IndexError) as exc:  # ran out of bytes: a truncated frame
        raise FrameError(
            f"method frame {cls.__name__} is truncated", class_of(index), method_of(index)
        ) from exc
    except Exception as exc:
        if "unpack" in str(exc) or "not enough" in str(exc).lower():
            raise FrameError(
                f"method frame {cls.__name__} is truncated", class_of(index), method_of(index)
            ) from exc
        # RabbitMQ answers any undecodable method arguments with 501, never 502.
        text = ("Malformed UTF-8 in shortstr" if isinstance(exc, UnicodeDecodeError)
                else f"cannot decode {cls.__name__} arguments: {exc}")
        raise FrameError(text, class_of(index), method_of(index)) from exc
    return method


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """basic.publish args: (exchange, routing_key, mandatory, immediate). Payload includes ids."""
    try:
        pos = 6  # class, method, reserved-1 (ticket)
        n = payload[pos]
        exchange = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        bits = payload[pos]
    except (IndexError, UnicodeDecodeError) as exc:
        raise SyntaxError_("malformed basic.publish method frame", *_ids(BASIC_PUBLISH)) from exc
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_publish_at(buf: bytes, start: int, end: int,
                      names: dict[bytes, str]) -> tuple[str, str, bool, bool]:
    """:func:`decode_publish` of the method payload at ``buf[start:end]``, read in place
    (the connection's publish fast path: no slice of the method frame).

    ``names`` maps the raw bytes of exchange names and routing keys already seen to their
    ``str``: publishers repeat a few names, so every queued message shares one string
    instead of holding a copy (the caller owns and bounds the map).
    """
    pos = start + 6  # class, method, reserved-1 (ticket)
    try:
        if pos >= end:
            raise IndexError
        n = buf[pos]
        stop = pos + 1 + n
        if stop >= end:
            raise IndexError
        raw = buf[pos + 1:stop]
        exchange = names.get(raw)
        if exchange is None:
            exchange = names[raw] = raw.decode()
        n = buf[stop]
        pos = stop + 1 + n
        if pos >= end:
            raise IndexError
        raw = buf[stop + 1:pos]
        routing_key = names.get(raw)
        if routing_key is None:
            routing_key = names[raw] = raw.decode()
        bits = buf[pos]
    except (IndexError, UnicodeDecodeError) as exc:
        raise SyntaxError_("malformed basic.publish method frame", *_ids(BASIC_PUBLISH)) from exc
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """basic.ack args: (delivery_tag, multiple)."""
    if len(payload) < 13:
        raise SyntaxError_("malformed basic.ack method frame", *_ids(BASIC_ACK))
    return _U64.unpack_from(payload, 4)[0], bool(payload[12] & 1)


def decode_content_header(payload: bytes) -> tuple[int, int, bytes]:
    """(class_id, body_size, raw property bytes) of a content header frame."""
    if len(payload) < 14:
        raise SyntaxError_("malformed content header frame")
    class_id = _U16.unpack_from(payload, 0)[0]
    body_size = _U64.unpack_from(payload, 4)[0]
    return class_id, body_size, payload[12:]


def decode_properties(raw: bytes) -> dict[str, Any]:
    """Decode raw property bytes into a dict of the properties present."""
    if not raw:
        return {}
    flags = _U16.unpack_from(raw, 0)[0]
    pos = 2
    while flags & FLAG_CONTINUATION:  # more flag words (never used by 0-9-1 basic, but legal)
        flags = _U16.unpack_from(raw, pos)[0]
        pos += 2
    flags = _U16.unpack_from(raw, 0)[0]
    data = raw[pos:]
    out: dict[str, Any] = {}
    for name, bit, kind in PROPERTY_FIELDS:
        if flags & bit:
            # fields.by_type, not pamqp's: any well-formed value decodes (see fields.py)
            used, value = fields.by_type(data, kind)
            if used > len(data):
                raise ValueError(f"property {name} is truncated")
            out[name] = value
            data = data[used:]
    return out


def encode_properties(props: dict[str, Any]) -> bytes:
    """Encode a dict of properties (as :func:`decode_properties` returns) to raw bytes."""
    flags = 0
    parts: list[bytes] = []
    for name, bit, kind in PROPERTY_FIELDS:
        value = props.get(name)
        if value is None:
            continue
        flags |= bit
        if kind == "timestamp" and isinstance(value, int):  # one datetime cannot hold
            parts.append(_U64.pack(value))
        elif kind == "shortstr" and isinstance(value, str):  # maybe not UTF-8 (fields.text)
            data = value.encode("utf-8", "surrogateescape")
            parts.append(bytes((len(data),)) + data)
        else:
            parts.append(encode.by_type(value, kind))
    return _U16.pack(flags) + b"".join(parts)


def delivery_mode(raw: bytes) -> int:
    """The delivery-mode property without decoding the others (1 when absent)."""
    if len(raw) < 2:
        return 1
    flags = (raw[0] << 8) | raw[1]
    if not flags & FLAG_DELIVERY_MODE:
        return 1
    pos = 2
    try:
        if flags & FLAG_CONTENT_TYPE:
            pos += 1 + raw[pos]
        if flags & FLAG_CONTENT_ENCODING:
            pos += 1 + raw[pos]
        if flags & FLAG_HEADERS:
            pos += 4 + int.from_bytes(raw[pos : pos + 4], "big")
        return raw[pos]
    except IndexError:
        return 1


_FIXED_WIDTH = {"octet": 1, "timestamp": 8}


def validate_properties(raw: bytes) -> None:
    """Raise 502 unless the property bytes are well-formed (checked once per publish).

    Walks the field lengths instead of decoding: only a headers table is decoded, since
    its inner structure is the only part a length walk cannot vouch for.
    """
    if len(raw) < 2:
        raise SyntaxError_("malformed content header properties: no property flags")
    flags = (raw[0] << 8) | raw[1]
    if flags & FLAG_CONTINUATION:
        raise SyntaxError_("malformed content header properties: continuation flags")
    pos, end = 2, len(raw)
    try:
        for _name, bit, kind in PROPERTY_FIELDS:
            if not flags & bit:
                continue
            if kind == "shortstr":
                pos += 1 + raw[pos]
            elif kind == "table":
                size = int.from_bytes(raw[pos:pos + 4], "big")
                fields.table(raw[pos:pos + 4 + size])
                pos += 4 + size
            else:
                pos += _FIXED_WIDTH[kind]
            if pos > end:
                raise ValueError("property data shorter than its flags say")
    except Exception as exc:
        raise SyntaxError_(f"malformed content header properties: {exc}") from exc


# --------------------------------------------------------------------------- encoding
def shortstr(value: str) -> bytes:
    data = value.encode()
    if len(data) > 255:
        raise ValueError("short string longer than 255 bytes")
    return bytes((len(data),)) + data


def table(value: dict[str, Any] | None) -> bytes:
    return encode.field_table(value or {})


def method_frame(channel: int, index: int, args: bytes = b"") -> bytes:
    """One method frame around already-encoded arguments; ``index`` is a method id of
    :mod:`amqpd.protocol.constants` (class and method in one u32)."""
    return (
        _METHOD_HDR.pack(FRAME_METHOD, channel, len(args) + 4, index)
        + args
        + FRAME_END_BYTE
    )


def pamqp_frame(channel: int, method: PamqpFrame) -> bytes:
    """Encode a method object with pamqp (for methods with no names in them)."""
    return method_frame(channel, method.index, method.marshal())  # type: ignore[attr-defined]


def content_frames(
    channel: int, class_id: int, properties: bytes, body: bytes, frame_max: int
) -> bytes:
    """Content header + body frames, the body split to fit ``frame_max``."""
    header = (
        _CONTENT_HDR.pack(FRAME_HEADER, channel, 12 + len(properties), class_id, 0,
                          len(body))
        + properties
        + FRAME_END_BYTE
    )
    if not body:
        return header
    chunk = frame_max - 8 if frame_max else len(body)
    if len(body) <= chunk:
        return header + _FRAME_HDR.pack(FRAME_BODY, channel, len(body)) + body + FRAME_END_BYTE
    parts = [header]
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        parts.append(_FRAME_HDR.pack(FRAME_BODY, channel, len(piece)) + piece + FRAME_END_BYTE)
    return b"".join(parts)


_SHORTSTR_CACHE: Final[dict[str, bytes]] = {}


def shortstr_cached(value: str) -> bytes:
    """shortstr() for names that recur (exchanges, routing keys): encoded once."""
    data = _SHORTSTR_CACHE.get(value)
    if data is None:
        if len(_SHORTSTR_CACHE) >= 8192:  # many distinct keys: start over, stay bounded
            _SHORTSTR_CACHE.clear()
        data = _SHORTSTR_CACHE[value] = shortstr(value)
    return data


_DELIVER_HDR: Final = struct.Struct(">BHII")
_DELIVER_TAG: Final = struct.Struct(">QB")


def deliver_frames(
    channel: int, consumer_tag: bytes, delivery_tag: int, redelivered: bool,
    exchange: str, routing_key: str, properties: bytes, body: bytes, frame_max: int,
) -> bytes:
    """basic.deliver + content header + body, joined once (the delivery hot path)."""
    ex = shortstr_cached(exchange)
    rk = shortstr_cached(routing_key)
    size = len(body)
    method_size = 4 + len(consumer_tag) + 9 + len(ex) + len(rk)
    if size and size <= frame_max - 8:
        return b"".join((
            _DELIVER_HDR.pack(FRAME_METHOD, channel, method_size, BASIC_DELIVER), consumer_tag,
            _DELIVER_TAG.pack(delivery_tag, 1 if redelivered else 0), ex, rk, FRAME_END_BYTE,
            _CONTENT_HDR.pack(FRAME_HEADER, channel, 12 + len(properties), CLASS_BASIC, 0, size),
            properties,
            FRAME_END_BYTE, _FRAME_HDR.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE,
        ))
    return b"".join((
        _DELIVER_HDR.pack(FRAME_METHOD, channel, method_size, BASIC_DELIVER), consumer_tag,
        _DELIVER_TAG.pack(delivery_tag, 1 if redelivered else 0), ex, rk, FRAME_END_BYTE,
        content_frames(channel, CLASS_BASIC, properties, body, frame_max),
    ))


_DELIVER_INDEX: Final = BASIC_DELIVER.to_bytes(4, "big")
_BASIC_WEIGHT: Final = (CLASS_BASIC << 16).to_bytes(4, "big")  # content class, weight 0
_NOT_REDELIVERED: Final = b"\x00"
_REDELIVERED: Final = b"\x01"
_END_BODY: Final = bytes((FRAME_END, FRAME_BODY))  # header's frame-end, body frame type


class DeliveryFrames:
    """basic.deliver + content header + body for one channel, from the parts that repeat.

    A channel's deliveries differ from one another in the delivery tag, the redelivered
    flag, the property bytes and the body; the rest (the method frame up to the tag,
    exchange and routing key, the content header's frame header and class) is the same
    as long as the consumer tag, exchange, routing key and the length of the properties
    are. Those bytes are kept from the last delivery (the names are shared strings, so
    an identity test nearly always settles it), and a delivery costs three small integer
    encodings instead of four ``struct`` packs (each a method call by name, its
    arguments parsed from a tuple). :meth:`append_to` adds the parts to the
    connection's output list, not one joined copy: the body is copied once, when the
    tick's output is joined for the socket.
    """

    __slots__ = ("channel", "consumer_tag", "exchange", "head", "middle", "props_len",
                 "routing_key")

    def __init__(self, channel: int) -> None:
        self.channel = channel
        self.consumer_tag = b""
        self.exchange = ""
        self.routing_key = ""
        self.props_len = -1
        self.head = b""  # method frame header, class and method, consumer tag
        self.middle = b""  # exchange, routing key, frame-end, content header to its size

    def _refresh(self, consumer_tag: bytes, exchange: str, routing_key: str,
                 props_len: int) -> None:
        ex = shortstr_cached(exchange)
        rk = shortstr_cached(routing_key)
        channel = self.channel
        method_size = 4 + len(consumer_tag) + 9 + len(ex) + len(rk)
        self.head = ((FRAME_METHOD << 48 | channel << 32 | method_size).to_bytes(7, "big")
                     + _DELIVER_INDEX + consumer_tag)
        self.middle = (ex + rk + FRAME_END_BYTE
                       + (FRAME_HEADER << 48 | channel << 32 | 12 + props_len).to_bytes(7, "big")
                       + _BASIC_WEIGHT)
        self.consumer_tag = consumer_tag
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_len = props_len

    def append_to(self, out: list[bytes], consumer_tag: bytes, delivery_tag: int,
                  redelivered: bool, exchange: str, routing_key: str, properties: bytes,
                  body: bytes, frame_max: int) -> int:
        """Append one delivery's frames to ``out``; the number of bytes appended."""
        size = len(body)
        if not size or size > frame_max - 8:  # empty, or split over several body frames
            data = deliver_frames(self.channel, consumer_tag, delivery_tag, redelivered,
                                  exchange, routing_key, properties, body, frame_max)
            out.append(data)
            return len(data)
        if (consumer_tag is not self.consumer_tag or exchange is not self.exchange
                or routing_key is not self.routing_key
                or len(properties) != self.props_len):
            if (consumer_tag != self.consumer_tag or exchange != self.exchange
                    or routing_key != self.routing_key or len(properties) != self.props_len):
                self._refresh(consumer_tag, exchange, routing_key, len(properties))
            else:  # equal, not the same objects: compare by identity next time
                self.consumer_tag = consumer_tag
                self.exchange = exchange
                self.routing_key = routing_key
        head = self.head
        middle = self.middle
        out.append(head)
        out.append(delivery_tag.to_bytes(8, "big"))
        out.append(_REDELIVERED if redelivered else _NOT_REDELIVERED)
        out.append(middle)
        out.append(size.to_bytes(8, "big"))
        out.append(properties)
        out.append(_END_BODY)
        out.append((self.channel << 32 | size).to_bytes(6, "big"))
        out.append(body)
        out.append(FRAME_END_BYTE)
        return len(head) + len(middle) + len(properties) + size + 26


def deliver_method(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
) -> bytes:
    """basic.deliver; tag, exchange and routing key are pre-encoded short strings."""
    args = b"".join(
        (consumer_tag, _U64.pack(delivery_tag), b"\x01" if redelivered else b"\x00",
         exchange, routing_key)
    )
    return method_frame(channel, BASIC_DELIVER, args)


def get_ok_method(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
) -> bytes:
    args = b"".join(
        (_U64.pack(delivery_tag), b"\x01" if redelivered else b"\x00",
         shortstr(exchange), shortstr(routing_key), struct.pack(">I", message_count))
    )
    return method_frame(channel, BASIC_GET_OK, args)


def return_method(channel: int, code: int, text: str, exchange: str, routing_key: str) -> bytes:
    args = struct.pack(">H", code) + shortstr(text) + shortstr(exchange) + shortstr(routing_key)
    return method_frame(channel, BASIC_RETURN, args)


def ack_method(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    flag = b"\x01" if multiple else b"\x00"
    return method_frame(channel, BASIC_ACK, _U64.pack(delivery_tag) + flag)


def nack_method(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    bits = 0x02 | (1 if multiple else 0)  # requeue=true, as RabbitMQ sends
    return method_frame(channel, BASIC_NACK, _U64.pack(delivery_tag) + bytes((bits,)))


def close_method(channel: int, code: int, text: str, class_id: int, method_id_: int) -> bytes:
    """connection.close on channel 0, channel.close otherwise."""
    args = struct.pack(">H", code) + shortstr(text[:255]) + struct.pack(">HH", class_id, method_id_)
    return method_frame(channel, CONNECTION_CLOSE if channel == 0 else CHANNEL_CLOSE, args)
