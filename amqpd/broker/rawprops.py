"""Edit content-header properties and header tables in place, keeping every field type.

Decoding a headers table into Python values and encoding it again loses the wire types
(an ``l`` long 5 comes back as a ``b`` short-short 5, and pamqp sorts the keys): a Java
client that reads ``(Long) headers.get("count")`` then fails. RabbitMQ keeps the typed
values, so when amqpd must change headers (dead-lettering, BCC stripping, direct
reply-to) it edits the raw bytes: untouched fields and header values are copied byte for
byte, and new values are written with the types RabbitMQ uses (``l`` for counts, ``T``
for times, ``S`` for strings, ``A``/``F`` for arrays and tables).
"""

from __future__ import annotations

import struct

from amqpd.protocol.codec import PROPERTY_FIELDS

_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4,
          ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5,
          ord("T"): 8, ord("V"): 0}
_VARIABLE = {ord("S"), ord("x"), ord("A"), ord("F")}

Item = tuple[str, bytes]  # (key, type byte + value bytes)


def _u32(buf: bytes, pos: int) -> int:
    return int.from_bytes(buf[pos:pos + 4], "big")


def value_end(buf: bytes, pos: int) -> int:
    """End offset of the typed field value starting at ``pos`` (its type byte)."""
    kind = buf[pos]
    size = _FIXED.get(kind)
    if size is not None:
        return pos + 1 + size
    if kind in _VARIABLE:
        return pos + 5 + _u32(buf, pos + 1)
    raise ValueError(f"unknown field type {chr(kind)!r}")


def table_items(payload: bytes) -> list[Item]:
    """A table's entries (payload = the bytes after its 4-byte length)."""
    out: list[Item] = []
    pos = 0
    while pos < len(payload):
        n = payload[pos]
        key = payload[pos + 1:pos + 1 + n].decode("utf-8", "replace")
        pos += 1 + n
        end = value_end(payload, pos)
        out.append((key, payload[pos:end]))
        pos = end
    return out


def array_values(payload: bytes) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos < len(payload):
        end = value_end(payload, pos)
        out.append(payload[pos:end])
        pos = end
    return out


def encode_table(items: list[Item]) -> bytes:
    """A table with its 4-byte length (as a property field or inside an ``F`` value)."""
    body = b"".join(bytes((len(k.encode()),)) + k.encode() + v for k, v in items)
    return len(body).to_bytes(4, "big") + body


def table_value(items: list[Item]) -> bytes:
    return b"F" + encode_table(items)


def array_value(values: list[bytes]) -> bytes:
    body = b"".join(values)
    return b"A" + len(body).to_bytes(4, "big") + body


def longstr(text: str) -> bytes:
    data = text.encode()
    return b"S" + len(data).to_bytes(4, "big") + data


def long(value: int) -> bytes:
    return b"l" + struct.pack(">q", value)


def timestamp(seconds: int) -> bytes:
    return b"T" + struct.pack(">Q", seconds)


def sort_items(items: list[Item]) -> list[Item]:
    """``rabbit_misc:sort_field_table``: by key bytes."""
    return sorted(items, key=lambda kv: kv[0].encode())


def set_item(items: list[Item], key: str, value: bytes) -> None:
    """``lists:keystore``: replace in place, or append."""
    for i, (k, _v) in enumerate(items):
        if k == key:
            items[i] = (key, value)
            return
    items.append((key, value))


# ---------------------------------------------------------------------- properties
def split_properties(raw: bytes) -> dict[str, bytes]:
    """Property name -> its raw field bytes (a shortstr with its length byte, a table
    with its 4-byte length, ...), for the properties present."""
    flags = (raw[0] << 8) | raw[1]
    pos = 2
    out: dict[str, bytes] = {}
    for name, bit, kind in PROPERTY_FIELDS:
        if not flags & bit:
            continue
        if kind == "shortstr":
            end = pos + 1 + raw[pos]
        elif kind == "table":
            end = pos + 4 + _u32(raw, pos)
        elif kind == "octet":
            end = pos + 1
        elif kind == "timestamp":
            end = pos + 8
        else:  # pragma: no cover - every basic property is one of the above
            raise ValueError(f"unknown property kind {kind}")
        out[name] = raw[pos:end]
        pos = end
    return out


def join_properties(fields: dict[str, bytes]) -> bytes:
    flags = 0
    parts: list[bytes] = []
    for name, bit, _kind in PROPERTY_FIELDS:
        value = fields.get(name)
        if value is not None:
            flags |= bit
            parts.append(value)
    return flags.to_bytes(2, "big") + b"".join(parts)


def shortstr_field(text: str) -> bytes:
    data = text.encode()
    return bytes((len(data),)) + data


def header_items(fields: dict[str, bytes]) -> list[Item]:
    raw = fields.get("headers")
    return table_items(raw[4:]) if raw else []


__all__ = [
    "array_value", "array_values", "encode_table", "header_items", "join_properties",
    "long", "longstr", "set_item", "shortstr_field", "sort_items", "split_properties",
    "table_items", "table_value", "timestamp",
]
