"""Delivered chunks of a stream: cut from the stored records, built once and sent to
every subscription reading them.

A subscription builds each chunk it delivers from the records it reads (the osiris
header over simple entries cut from the stored records, :func:`next_chunk`): per
message, that is most of the broker's work of a delivery. Subscriptions of one
stream usually read the same chunks -- every one at the tail, and consumers replaying
side by side -- so each stream keeps the chunks it built last, keyed by the offset a
chunk starts at and the size limit it was cut to. A subscription at that offset sends
the cached bytes and moves its reader past them (:meth:`Reader.seek`, to the file
position the builder recorded), reading nothing.

A chunk depends only on the records from its first offset on, which never change once
written, and a stored chunk is readable whole or not at all (a flush writes whole
chunks), so a cached chunk is exactly what the subscription would have built. Memory:
at most :data:`CACHE_BYTES` per stream, the oldest chunks go first.

**Committed only.** A subscription reads only below the stream's commit point
(``upto``: what a majority of a replicated stream's members hold, on one node what is
fsynced), so no subscriber sees a record a failover or a crash may lose. The bound
costs one subtraction per read of up to :data:`READ_RECORDS` records, never a check per
record: a read asks for no more records than lie below the commit point (offsets are
contiguous from the first kept one on), so a chunk ends there when the commit point
falls inside a stored chunk. A cached chunk was built below an earlier commit point,
which only moves forward; it is checked against ``upto`` all the same (one comparison).

This module is compiled (amqpd/hotpath.py): the cutting loop below runs once per
delivered message, so it reads a record's length and flags as bytes of the stored
header (no struct call, no tuple) and copies each entry's two pieces once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from amqpd.store.stream_log import AMQP10, CHUNK_START, RECORD_SIZE, Reader
from amqpd.streamproto.codec import be32, be64, chunk_header

CACHE_BYTES: Final = 4 * 1024 * 1024
# records a subscription reads per pread at most: above what a pread of READ_BYTES
# holds of small messages, so the bytes bound decides and nothing read is left unused
READ_RECORDS: Final = 8192
MAX_ENTRIES: Final = 0xFFFF  # an osiris chunk header counts its entries in a u16


class Chunk:
    """A delivered chunk: its 48-byte osiris header and its entries (kept apart, so a
    deliver frame is joined only once, with the rest of the tick's output), the
    records it holds, and where the record after it is (segment base, file position)."""

    __slots__ = ("entries", "header", "position", "records", "segment_base")

    def __init__(self, header: bytes, entries: bytes, records: int, segment_base: int,
                 position: int) -> None:
        self.header = header
        self.entries = entries
        self.records = records
        self.segment_base = segment_base
        self.position = position

    @property
    def size(self) -> int:
        """Bytes of header and entries (what a deliver frame carries after its head)."""
        return len(self.header) + len(self.entries)


class ChunkCache:
    """One stream's recently built chunks (module docstring)."""

    __slots__ = ("_chunks", "hits", "max_bytes", "size")

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self._chunks: dict[tuple[int, int], Chunk] = {}

    def get(self, offset: int, limit: int, upto: int) -> Chunk | None:
        """The chunk cut from ``offset`` to ``limit`` bytes, if it ends at or below
        ``upto`` (the commit point)."""
        chunk = self._chunks.get((offset, limit))
        if chunk is None or offset + chunk.records > upto:
            return None
        self.hits += 1
        return chunk

    def put(self, offset: int, limit: int, chunk: Chunk) -> None:
        key = (offset, limit)
        size = chunk.size
        if key in self._chunks or size > self.max_bytes:
            return
        self._chunks[key] = chunk
        self.size += size
        while self.size > self.max_bytes:
            oldest = next(iter(self._chunks))
            self.size -= self._chunks.pop(oldest).size


class Cutter:
    """A subscription's read state: its reader, and the block of stored records it
    read last (``block`` from ``at`` to ``end`` not yet delivered, whole records; a
    partial record may follow them; it came from file position ``block_pos`` of the
    segment starting at offset ``block_seg``)."""

    __slots__ = ("at", "block", "block_pos", "block_seg", "end", "reader")

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.block = b""
        self.at = 0
        self.end = 0
        self.block_seg = -1
        self.block_pos = 0

    def clear(self) -> None:
        self.block = b""
        self.at = self.end = 0


def next_chunk(cut: Cutter, cache: ChunkCache, limit: int,
               convert: Callable[[bytes], bytes], upto: int) -> Chunk | None:
    """The readable records from the reader's position to the end of their stored
    chunk (at most about ``limit`` bytes and :data:`MAX_ENTRIES` entries: a larger
    chunk goes as several), below offset ``upto`` (the commit point), as an osiris
    chunk; None when nothing is readable. Another
    subscription of the stream may have built it already (``cache``); else its entries
    are cut from the records as stored (a record's length field is the entry's size),
    with no Python object per message but the entry's body (a run of records of one
    size shares the size field's object) and one pass over each read (taken whole: a
    record cut off at its end is read again next time). A record an AMQP
    0-9-1 publisher wrote is passed to ``convert`` (its stored payload -> an AMQP 1.0
    message)."""
    reader = cut.reader
    data, at, total = cut.block, cut.at, cut.end
    start = be64(data, at + 8) if at < total else reader.offset
    # (below the first kept offset the reader moves on to what retention kept)
    hit = cache.get(start, limit, upto) if start >= reader.log.first_offset else None
    if hit is not None:
        cut.clear()
        reader.seek(start + hit.records, hit.segment_base, hit.position)
        return hit
    parts: list[bytes] = []
    first = stamp = count = size = 0
    last_length = -1
    size_field = b""
    while True:
        if at >= total:
            # no further than the commit point: offsets run on from the first kept
            room = upto - max(reader.offset, reader.log.first_offset)
            if room > 0:
                data, _, total = reader.read_block(min(READ_RECORDS, room))
            else:
                data, total = b"", 0
            seg, end_pos = reader.where()
            cut.block, cut.at, cut.end = data, 0, total
            cut.block_seg, cut.block_pos = seg, end_pos - total
            at = 0
            if not total:
                break
        while at < total:
            length = be32(data, at + 4)
            flags = data[at + 24]
            if count and (flags & CHUNK_START or size + length > limit
                          or count >= MAX_ENTRIES):
                cut.at = at
                return _built(cut, cache, limit, first, stamp, count, parts,
                              cut.block_pos + at)
            body = at + RECORD_SIZE
            end = body + length
            if flags & AMQP10:
                if length != last_length:  # a run of equal sizes shares one object
                    last_length = length
                    size_field = data[at + 4:at + 8]
                parts.append(size_field)
                parts.append(data[body:end])
            else:
                message: bytes = convert(data[body:end])
                parts.append(len(message).to_bytes(4, "big"))
                parts.append(message)
            if not count:
                first = be64(data, at + 8)
                stamp = be64(data, at + 16)
                if stamp >= 1 << 63:
                    stamp -= 1 << 64
            count += 1
            size += length + 4
            at = end
        cut.at = at
    if not count:
        return None
    return _built(cut, cache, limit, first, stamp, count, parts, cut.block_pos)


def _built(cut: Cutter, cache: ChunkCache, limit: int, first: int, stamp: int, count: int,
           parts: list[bytes], position: int) -> Chunk:
    """A chunk cut from the records, kept for the stream's other subscriptions; the
    record after it is at ``position`` in ``cut.block_seg``."""
    entries = b"".join(parts)
    chunk = Chunk(chunk_header(first, stamp, count, count, entries), entries, count,
                  cut.block_seg, position)
    cache.put(first, limit, chunk)
    return chunk


__all__ = ["CACHE_BYTES", "Chunk", "ChunkCache", "Cutter", "next_chunk"]
