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
costs one subtraction per read and one integer comparison per record: a read may give
no more records than lie below the commit point (offsets are contiguous from the
first kept one on), so a chunk ends there when the commit point falls inside a stored
chunk. A cached chunk was built below an earlier commit point,
which only moves forward; it is checked against ``upto`` all the same (one comparison).

This module is compiled (amqpd/hotpath.py): the cutting loop below runs once per
delivered message, so it reads a record's length and flags as bytes of the stored
header (no struct call, no tuple), walks each read once (the records' lengths are read
there, not by the reader beforehand) and copies each entry's body once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from amqpd.store.stream_log import AMQP10, CHUNK_START, RECORD_SIZE, Reader
from amqpd.streamproto.codec import be32, be64, chunk_header

CACHE_BYTES: Final = 4 * 1024 * 1024
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
    read last (:meth:`Reader.peek_block`, from file position ``block_pos`` of the
    segment starting at offset ``block_seg``). While a block is kept (``block`` not
    empty) a whole record not yet delivered starts at ``at``; ``taken`` records of the
    block were delivered, at most ``left`` may be (the commit point), and the reader
    stays at the block's start until the cutter is done with it (:meth:`Reader.advance`
    past what it took)."""

    __slots__ = ("at", "block", "block_pos", "block_seg", "left", "reader", "taken")

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.block = b""
        self.at = 0
        self.taken = 0
        self.left = 0
        self.block_seg = -1
        self.block_pos = 0

    def clear(self) -> None:
        """Drop the block (the reader is then moved by :meth:`Reader.seek`)."""
        self.block = b""
        self.at = self.taken = self.left = 0


def next_chunk(cut: Cutter, cache: ChunkCache, limit: int,
               convert: Callable[[bytes], bytes], upto: int) -> Chunk | None:
    """The readable records from the reader's position to the end of their stored
    chunk (at most about ``limit`` bytes and :data:`MAX_ENTRIES` entries: a larger
    chunk goes as several), below offset ``upto`` (the commit point), as an osiris
    chunk; None when nothing is readable. Another
    subscription of the stream may have built it already (``cache``); else its entries
    are cut from the records as stored (a record's length field is the entry's size),
    in one pass over each read (:meth:`Reader.peek_block`: no scan of it beforehand, no
    copy of it cut down to whole records), with no Python object per message but the
    entry's body (a run of records of one size shares the size field's object). A
    record an AMQP 0-9-1 publisher wrote is passed to ``convert`` (its stored payload
    -> an AMQP 1.0 message)."""
    reader = cut.reader
    data, at = cut.block, cut.at
    start = be64(data, at + 8) if data else reader.offset
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
    total, taken, left = len(data), cut.taken, cut.left
    length = be32(data, at + 4) if data else 0
    while True:
        if not data:
            # no further than the commit point: offsets run on from the first kept
            room = upto - max(reader.offset, reader.log.first_offset)
            data = reader.peek_block() if room > 0 else b""
            cut.block_seg, cut.block_pos = reader.where()
            if not data:
                cut.clear()
                break
            total, at, taken, left = len(data), 0, 0, room
            length = be32(data, 4)
            cut.block, cut.left = data, left
        # a whole record of ``length`` starts at ``at``
        flags = data[at + 24]
        if count and (flags & CHUNK_START or size + length > limit or count >= MAX_ENTRIES):
            cut.at, cut.taken = at, taken
            return _built(cut, cache, limit, first, stamp, count, parts, cut.block_pos + at)
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
        taken += 1
        # the next record: whole in this read, and below the commit point?
        if taken < left and at + RECORD_SIZE <= total:
            length = be32(data, at + 4)
            if at + RECORD_SIZE + length <= total:
                continue
        # done with the read: the reader moves past what was taken
        reader.advance(taken, at)
        cut.block_pos += at
        cut.clear()
        data = b""
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
