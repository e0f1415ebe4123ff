"""Frames of replicated streams on the inter-node link (issue 30).

They ride the link of the queue streams and the mirrors (:mod:`amqpd.cluster.link_wire`:
the same head and field codes) under frame types 110 and up, which this module adds to
``link_wire.LAYOUTS`` when imported (the link module imports it, so a peer's first
``SSTART`` is never an unknown frame type). The frame's *stream* number names one
stream's replication from one leader to one member (the leader's choice).

Leader -> member: ``SSTART`` opens (or reopens) the member's copy: the stream's
identity, the leader's term, and a JSON object with the epochs (``[[term, first offset
written in that term], ...]``), the leader's first and next offset and the stream's
arguments; ``SREC`` carries records in offset order (:func:`pack_records`); ``SDROP``
ends the copy and deletes it (the stream was deleted, or the member removed).
Member -> leader: ``SHAVE`` answers ``SSTART`` with the offset the member continues
from (its log validated against the epochs); ``SACK`` says every record below an offset
is written there; ``SREFUSE`` says why it cannot hold a copy now (the leader tries
again later). ``SCOMMIT`` (leader -> member) tells the member the stream's commit
point: every record below it is written on a majority, so no failover can cut it; the
member's own consumers read up to there (:mod:`amqpd.cluster.stream_local`).
``STRACK`` (leader -> member) carries the stream's tracking
(:mod:`amqpd.streamproto.tracking`) as a JSON object: ``publishers`` (producer ->
``[publishing id, end offset]``), sent right before the ``SREC`` holding that id's
last record (the member takes it once it holds the records up to the end offset) and,
for what the member already holds, right after its ``SHAVE``; ``offsets``
(the stored consumer offsets, all of them) after ``SHAVE`` and whenever one is stored.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Final

from amqpd.broker.api import AMQP10, CHUNK_START, Record
from amqpd.cluster import link_wire as W

SSTART: Final = 110  # vhost, name, term, {"epochs", "first", "next", "arguments"}
SHAVE: Final = 111  # member -> leader: the offset it continues from
SREC: Final = 112  # leader -> member: packed records
SACK: Final = 113  # member -> leader: every record below this offset is written here
SDROP: Final = 114  # leader -> member: delete the copy
SREFUSE: Final = 115  # member -> leader: why not now
SCOMMIT: Final = 116  # leader -> member: every record below this offset is committed
STRACK: Final = 117  # leader -> member: {"publishers": {...}, "offsets": {...}}

LAYOUTS: Final[dict[int, str]] = {
    SSTART: "ssQj", SHAVE: "Q", SREC: "b", SACK: "Q", SDROP: "", SREFUSE: "s",
    SCOMMIT: "Q", STRACK: "j",
}
FIRST: Final = SSTART
LAST: Final = STRACK

W.LAYOUTS.update(LAYOUTS)

_REC = struct.Struct(">QqBI")  # offset, timestamp ms, flags, payload length


_OFFSET_ENTRY = b"\x0fx-stream-offsetl"  # the header's table entry: name, then a long
_LONG = struct.Struct(">q")


def delivered_offset(properties: bytes) -> int | None:
    """The ``x-stream-offset`` header of a stream's delivery (the leader writes it as a
    long into every record's properties), read without decoding the table; None
    when it is not there."""
    at = properties.rfind(_OFFSET_ENTRY)
    if at < 0 or at + len(_OFFSET_ENTRY) + 8 > len(properties):
        return None
    return int(_LONG.unpack_from(properties, at + len(_OFFSET_ENTRY))[0])


def is_stream_frame(kind: int) -> bool:
    return FIRST <= kind <= LAST


def pack_records(records: Iterable[Record]) -> bytes:
    """Records as one ``SREC`` field: each its offset, timestamp, flags (chunk start,
    AMQP 1.0) and payload."""
    parts: list[bytes] = []
    for r in records:
        flags = (CHUNK_START if r.chunk_start else 0) | (AMQP10 if r.amqp10 else 0)
        parts.append(_REC.pack(r.offset, r.timestamp, flags, len(r.payload)))
        parts.append(bytes(r.payload))
    return b"".join(parts)


def unpack_records(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """The records of an ``SREC`` field: (offset, timestamp, flags, payload);
    ``W.WireError`` when it is cut."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if pos + _REC.size > len(view):
            raise W.WireError("stream records cut in a record head")
        offset, timestamp, flags, length = _REC.unpack_from(view, pos)
        pos += _REC.size
        if pos + length > len(view):
            raise W.WireError("stream records cut in a payload")
        yield offset, timestamp, flags, bytes(view[pos:pos + length])
        pos += length


__all__ = ["LAYOUTS", "SACK", "SCOMMIT", "SDROP", "SHAVE", "SREC", "SREFUSE", "SSTART",
           "STRACK", "delivered_offset", "is_stream_frame", "pack_records", "unpack_records"]
