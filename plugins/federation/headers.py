"""The ``x-received-from`` header: loop detection, hop counting, the tables links prepend.

Every federation hop *prepends* a table to the array header ``x-received-from``
(``rabbit_basic:prepend_table_header``). ``should_forward`` is 3.10.8's
``rabbit_federation_util:should_forward/4``: a message without the header always goes;
otherwise it goes only while fewer than ``max_hops`` hops are recorded and no hop came
from the destination itself (same cluster name *and* vhost). It runs twice per hop: in
the ``x-federation-upstream`` exchange on the upstream, and in the link before it
republishes downstream (the upstream may have fallen back to a plain fanout).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import decode

from plugins.shovel import methods

ROUTING_HEADER = "x-received-from"
BINDING_HEADER = "x-bound-from"


def received_from(headers: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    value = (headers or {}).get(ROUTING_HEADER)
    if isinstance(value, list):
        return [t for t in value if isinstance(t, dict)]
    return None


def should_forward(headers: dict[str, Any] | None, max_hops: int, cluster_name: str,
                   vhost: str) -> bool:
    return forward_ok((headers or {}).get(ROUTING_HEADER), max_hops, cluster_name, vhost)


def forward_ok(received: Any, max_hops: int, cluster_name: str, vhost: str) -> bool:
    """should_forward on the decoded value of ``x-received-from`` alone."""
    if not isinstance(received, list):
        return True
    hops = [t for t in received if isinstance(t, dict)]
    if len(hops) >= max_hops:
        return False
    return not any(t.get("cluster-name") == cluster_name and t.get("vhost") == vhost
                   for t in hops)


def prepend(headers: dict[str, Any] | None, key: str, table: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` with ``table`` in front of the array at ``key``."""
    out = dict(headers or {})
    previous = out.get(key)
    out[key] = [table, *(previous if isinstance(previous, list) else [])]
    return out


# ---------------------------------------------------------------------- raw properties
# A link changes one property, ``headers``, of every message it forwards. Decoding all the
# properties and encoding them again costs ~90 us a message in pure Python and loses the
# wire types of header values nobody asked to change (an ``l`` long comes back as the
# smallest integer type). So the link edits the raw bytes instead: the properties before
# and after ``headers`` are copied as they are, header entries are kept as raw
# (key, typed value) pairs, and only the entries a link touches are decoded or written.

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS = 1 << 15, 1 << 14, 1 << 13
_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4,
          ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5,
          ord("T"): 8, ord("V"): 0}
_SIZED = frozenset(b"SxAF")

Entry = tuple[str, bytes]  # header key, type byte + value bytes as on the wire


def _value_end(buf: bytes, pos: int) -> int:
    kind = buf[pos]
    size = _FIXED.get(kind)
    if size is not None:
        return pos + 1 + size
    if kind in _SIZED:
        return pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
    raise ValueError(f"unknown field type {chr(kind)!r} in headers")


@dataclass
class RawHeaders:
    """A content header's properties split around ``headers``: edit ``entries``, then
    :meth:`encode`."""

    flags: int
    before: bytes  # content-type and content-encoding, raw
    entries: list[Entry]
    after: bytes  # every property after headers, raw

    @classmethod
    def parse(cls, raw: bytes) -> RawHeaders:
        flags = _U16.unpack_from(raw, 0)[0] if raw else 0
        if flags & 1:
            raise ValueError("property flag continuation is not 0-9-1 basic")
        pos = 2 if raw else 0
        start = pos
        for bit in (_CONTENT_TYPE, _CONTENT_ENCODING):
            if flags & bit:
                pos += 1 + raw[pos]
        before = raw[start:pos]
        entries: list[Entry] = []
        if flags & _HEADERS:
            end = pos + 4 + _U32.unpack_from(raw, pos)[0]
            p = pos + 4
            while p < end:
                n = raw[p]
                key = raw[p + 1:p + 1 + n].decode("utf-8", "surrogateescape")
                p += 1 + n
                q = _value_end(raw, p)
                entries.append((key, raw[p:q]))
                p = q
            if p != end:
                raise ValueError("headers table overruns its length")
            pos = end
        return cls(flags, before, entries, raw[pos:])

    def get(self, key: str) -> bytes | None:
        for k, v in self.entries:
            if k == key:
                return v
        return None

    def decoded(self, key: str) -> Any:
        """The value of one entry, decoded (None when absent)."""
        value = self.get(key)
        return None if value is None else decode.embedded_value(value)[1]

    def set(self, key: str, value: bytes) -> None:
        """Replace (in place) or append one entry; value is type byte + bytes."""
        for i, (k, _v) in enumerate(self.entries):
            if k == key:
                self.entries[i] = (key, value)
                return
        self.entries.append((key, value))

    def pop(self, key: str) -> bytes | None:
        for i, (k, v) in enumerate(self.entries):
            if k == key:
                del self.entries[i]
                return v
        return None

    def encode(self) -> bytes:
        table = b"".join(bytes((len(kb := k.encode("utf-8", "surrogateescape")),)) + kb + v
                         for k, v in self.entries)
        return (_U16.pack(self.flags | _HEADERS) + self.before + _U32.pack(len(table))
                + table + self.after)


def array_items(value: bytes | None) -> list[bytes]:
    """The raw elements of an ``A`` field value (empty when it is absent or not an array)."""
    if not value or value[0] != ord("A"):
        return []
    end = 5 + _U32.unpack_from(value, 1)[0]
    out = []
    p = 5
    while p < end:
        q = _value_end(value, p)
        out.append(value[p:q])
        p = q
    return out


def prepend_raw(headers: RawHeaders, key: str, table: dict[str, Any] | bytes) -> None:
    """Put ``table`` (or its encoding, ``F`` + table) in front of the array at ``key``
    (other elements kept byte for byte; a non-array value is replaced, as
    ``rabbit_basic:prepend_table_header`` does)."""
    first = table if isinstance(table, bytes) else methods.field_value(table)
    items = [first, *array_items(headers.get(key))]
    body = b"".join(items)
    headers.set(key, b"A" + _U32.pack(len(body)) + body)


def first_hop_redelivered(properties: bytes) -> bytes:
    """``properties`` with ``redelivered`` true in the first ``x-received-from`` table
    (the hop this link added). A refused (nacked) local publish may still have reached
    its queue -- a quorum queue whose leader was lost after the message was replicated
    -- so publishing it again can make a second copy: the copy says so the way any repeat
    from a link does. Unchanged when there is no such table or it cannot be read."""
    try:
        headers = RawHeaders.parse(properties)
        items = array_items(headers.get(ROUTING_HEADER))
        if not items or items[0][:1] != b"F":
            return properties
        table = decode.embedded_value(items[0])[1]
        if not isinstance(table, dict) or table.get("redelivered") is True:
            return properties
        items[0] = methods.field_value({**table, "redelivered": True})
        body = b"".join(items)
        headers.set(ROUTING_HEADER, b"A" + _U32.pack(len(body)) + body)
        return headers.encode()
    except (ValueError, IndexError, struct.error):
        return properties
