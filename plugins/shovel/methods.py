"""Method frames with names and tables in them, encoded for the link client.

pamqp checks exchange and queue names against the 0-9-1 grammar's character classes
when it builds a frame, but RabbitMQ (and amqpd) accept any UTF-8 name up to 255 bytes,
and federation's own objects are named ``federation: X -> C``. Changing pamqp's patterns
would change them for every user of pamqp in the process, so these few methods are built
here instead: names are only checked for length.

Table values are encoded as RabbitMQ's own clients encode them: integers always as a
64-bit signed ``l`` (RabbitMQ's ``x-federation-upstream`` exchange refuses an
``x-max-hops`` of any other integer type), strings as long strings ``S``, floats as
doubles ``d``; anything else (decimals, timestamps) as pamqp encodes it.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import encode

_FRAME = struct.Struct(">BHI")
_I = struct.Struct(">I")
_q = struct.Struct(">q")
_d = struct.Struct(">d")
_END = b"\xce"


def shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"name longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


def table(value: dict[str, Any] | None) -> bytes:
    out = bytearray()
    for key, item in (value or {}).items():
        out += shortstr(key) + field_value(item)
    return _I.pack(len(out)) + out


def field_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
        return b"l" + _q.pack(value)
    if isinstance(value, float):
        return b"d" + _d.pack(value)
    if isinstance(value, str):
        raw = value.encode()
        return b"S" + _I.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray):
        return b"x" + _I.pack(len(value)) + bytes(value)
    if isinstance(value, dict):
        return b"F" + table(value)
    if isinstance(value, list | tuple):
        items = b"".join(field_value(v) for v in value)
        return b"A" + _I.pack(len(items)) + items
    if value is None:
        return b"V"
    return encode.encode_table_value(value)


def _bits(*flags: bool) -> bytes:
    return bytes((sum(1 << i for i, flag in enumerate(flags) if flag),))


def _method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + args
    return _FRAME.pack(1, channel, len(payload)) + payload + _END


def queue_declare(channel: int, queue: str, passive: bool, durable: bool, exclusive: bool,
                  auto_delete: bool, arguments: dict[str, Any] | None) -> bytes:
    return _method(channel, 50, 10, b"\x00\x00" + shortstr(queue)
                   + _bits(passive, durable, exclusive, auto_delete, False) + table(arguments))


def queue_bind(channel: int, queue: str, exchange: str, routing_key: str,
               arguments: dict[str, Any] | None) -> bytes:
    return _method(channel, 50, 20, b"\x00\x00" + shortstr(queue) + shortstr(exchange)
                   + shortstr(routing_key) + _bits(False) + table(arguments))


def queue_delete(channel: int, queue: str) -> bytes:
    return _method(channel, 50, 40, b"\x00\x00" + shortstr(queue) + _bits(False, False, False))


def exchange_declare(channel: int, exchange: str, exchange_type: str, passive: bool,
                     durable: bool, auto_delete: bool, internal: bool,
                     arguments: dict[str, Any] | None) -> bytes:
    return _method(channel, 40, 10, b"\x00\x00" + shortstr(exchange) + shortstr(exchange_type)
                   + _bits(passive, durable, auto_delete, internal, False) + table(arguments))


def exchange_delete(channel: int, exchange: str) -> bytes:
    return _method(channel, 40, 20, b"\x00\x00" + shortstr(exchange) + _bits(False, False))


def exchange_bind(channel: int, destination: str, source: str, routing_key: str,
                  arguments: dict[str, Any] | None, unbind: bool) -> bytes:
    """exchange.bind (or, with ``unbind``, exchange.unbind: the same fields)."""
    return _method(channel, 40, 40 if unbind else 30, b"\x00\x00" + shortstr(destination)
                   + shortstr(source) + shortstr(routing_key) + _bits(False)
                   + table(arguments))


def basic_consume(channel: int, queue: str, consumer_tag: str, no_ack: bool,
                  arguments: dict[str, Any] | None) -> bytes:
    return _method(channel, 60, 20, b"\x00\x00" + shortstr(queue) + shortstr(consumer_tag)
                   + _bits(False, no_ack, False, False) + table(arguments))


def basic_cancel(channel: int, consumer_tag: str) -> bytes:
    return _method(channel, 60, 30, shortstr(consumer_tag) + _bits(False))
