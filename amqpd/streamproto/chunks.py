"""Delivered chunks of a stream, built once and sent to every subscription reading them.

A subscription builds each chunk it delivers from the records it reads (the osiris
header over simple entries cut from the stored records, :mod:`amqpd.streamproto.connection`):
per message, that is most of the broker's work of a delivery. Subscriptions of one
stream usually read the same chunks -- every one at the tail, and consumers replaying
side by side -- so each stream keeps the chunks it built last, keyed by the offset a
chunk starts at and the size limit it was cut to. A subscription at that offset sends
the cached bytes and moves its reader past them (:meth:`Reader.seek`, to the file
position the builder recorded), reading nothing.

A chunk depends only on the records from its first offset on, which never change once
written, and a stored chunk is readable whole or not at all (a flush writes whole
chunks), so a cached chunk is exactly what the subscription would have built. Memory:
at most :data:`CACHE_BYTES` per stream, the oldest chunks go first.
"""

from __future__ import annotations

from typing import NamedTuple

CACHE_BYTES = 4 * 1024 * 1024


class Chunk(NamedTuple):
    """A delivered chunk: header and entries, the records it holds, and where the
    record after it is (segment base, file position)."""

    data: bytes
    records: int
    segment_base: int
    position: int


class ChunkCache:
    """One stream's recently built chunks (module docstring)."""

    __slots__ = ("_chunks", "hits", "max_bytes", "size")

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self._chunks: dict[tuple[int, int], Chunk] = {}

    def get(self, offset: int, limit: int) -> Chunk | None:
        chunk = self._chunks.get((offset, limit))
        if chunk is not None:
            self.hits += 1
        return chunk

    def put(self, offset: int, limit: int, chunk: Chunk) -> None:
        key = (offset, limit)
        if key in self._chunks or len(chunk.data) > self.max_bytes:
            return
        self._chunks[key] = chunk
        self.size += len(chunk.data)
        while self.size > self.max_bytes:
            oldest = next(iter(self._chunks))
            self.size -= len(self._chunks.pop(oldest).data)


__all__ = ["CACHE_BYTES", "Chunk", "ChunkCache"]
