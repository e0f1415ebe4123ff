"""Decode content-property values and field tables without ever failing on a well-formed one.

pamqp turns a timestamp into a ``datetime``, which cannot hold every 64-bit value (a
publisher may send any: Go's amqp091 with ``testing/quick`` does), and decodes short
strings and table keys as strict UTF-8, which the wire does not promise. RabbitMQ treats
both as opaque and carries them through, so a broker that decodes properties (reply-to,
user-id, expiration, headers routing, priorities) must not fail on them either:

* a timestamp that ``datetime`` cannot hold stays an ``int`` (seconds, as sent);
* short strings and table keys that are not UTF-8 are decoded with ``surrogateescape``,
  so they compare unequal to any real name and still encode back to the same bytes.

Only structurally malformed data (an unknown field type, a length past the end) raises
``ValueError``; :func:`amqpd.protocol.codec.validate_properties` turns that into 502.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from typing import Any

from pamqp import decode

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def text(data: bytes) -> str:
    """A short string or key: UTF-8 when it is, the raw bytes kept otherwise."""
    return data.decode("utf-8", "surrogateescape")


def short_str(value: bytes) -> tuple[int, str]:
    if not value:
        raise ValueError("short string is missing")
    end = 1 + value[0]
    if end > len(value):
        raise ValueError("short string longer than its data")
    return end, text(value[1:end])


def timestamp(value: bytes) -> tuple[int, datetime.datetime | int]:
    if len(value) < 8:
        raise ValueError("timestamp shorter than 8 bytes")
    try:
        return decode.timestamp(value)
    except (ValueError, OverflowError, OSError):
        return 8, _U64.unpack_from(value)[0]


def _sized(value: bytes) -> tuple[int, bytes]:
    if len(value) < 4:
        raise ValueError("length prefix is missing")
    end = 4 + _U32.unpack_from(value)[0]
    if end > len(value):
        raise ValueError("length exceeds the available data")
    return end, value[4:end]


def table(value: bytes) -> tuple[int, dict[str, Any]]:
    end, data = _sized(value)
    out: dict[str, Any] = {}
    pos = 0
    while pos < len(data):
        used, key = short_str(data[pos:])
        pos += used
        used, item = embedded(data[pos:])
        pos += used
        out[key] = item
    return end, out


def array(value: bytes) -> tuple[int, list[Any]]:
    end, data = _sized(value)
    out: list[Any] = []
    pos = 0
    while pos < len(data):
        used, item = embedded(data[pos:])
        pos += used
        out.append(item)
    return end, out


_OWN: dict[bytes, Callable[[bytes], tuple[int, Any]]] = {
    b"T": timestamp, b"F": table, b"A": array,
}


def embedded(value: bytes) -> tuple[int, Any]:
    """One typed value of a table or array (type byte first)."""
    if not value:
        raise ValueError("field value is missing")
    kind = value[:1]
    decoder = _OWN.get(kind) or decode.TABLE_MAPPING.get(kind)
    if decoder is None:
        raise ValueError(f"unknown field type {kind!r}")
    used, item = decoder(value[1:])
    if 1 + used > len(value):  # pamqp's fixed-width decoders do not all check
        raise ValueError(f"field of type {kind!r} is truncated")
    return used + 1, item


def by_type(value: bytes, kind: str) -> tuple[int, Any]:
    """A property of the given spec type: shortstr, octet, table or timestamp."""
    if kind == "shortstr":
        return short_str(value)
    if kind == "table":
        return table(value)
    if kind == "timestamp":
        return timestamp(value)
    if kind == "octet":
        if not value:
            raise ValueError("octet is missing")
        return 1, _U8.unpack_from(value)[0]
    raise ValueError(f"unknown property type {kind}")


__all__ = ["array", "by_type", "embedded", "short_str", "table", "text", "timestamp"]
