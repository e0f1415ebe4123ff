"""The checkpoint file: a snapshot of :class:`LiveIndex` so restart time is bounded.

Choice: a separate file ``checkpoint`` in the log directory, replaced atomically
(write ``checkpoint.tmp``, fsync, rename, fsync the directory), plus a CHECKPOINT
marker record in the log at the covered position (for followers reading the log).
A separate file keeps recovery to "read one file, then replay the log from
``covered``" without scanning for the latest marker.

The snapshot describes the state after applying every record *before* ``covered``;
it is written by the writer thread only after the log is durable up to ``covered``,
so it never mentions a record that a crash could take away.

Layout (little-endian; arrays are raw ``array('q')`` bytes, so loading a million
entries is a memcpy, not a million objects)::

    +-------+---------+--------+-----------+----------------------------------------+
    | "AMQC"| version | crc32  | body_len  | body                                   |
    | 4     | u16     | u32    | u64       |                                        |
    +-------+---------+--------+-----------+----------------------------------------+
    body:
      covered i64 | sequence i64 | nsegments u32 | (base, live, total) i64 * 3 * n
      | nqueues u32 | per queue: name str | count i64 | positions i64*count
      |                           | sizes i64*count | ndelivered i64 | positions i64*nd
      | nreloc i64 | stable i64*nreloc | current i64*nreloc | refs i64*nreloc
    version 2 adds, per queue after ``sizes``: stamps i64*count | extra i64*count
    (index.QueueIndex), and at the end the carried settles (index.py):
      | ncarry u32 | per segment: base i64 | nqueues u32 | per queue: name str
      |                           | n i64 | stables i64*n | currents i64*n
      | definitions: every durable definition, encoded as one DEFINITION payload of
        puts (``format.encode_definition_changes``)
    A version 1 file (written before) still loads: stamps and extra are then 0
    ("unknown"), nothing is carried and there are no definitions.

The index part is encoded on the event-loop thread (arrays copy fast); the definitions
part, which grows with the topology (about 30 MB at 100,000 queues and bindings), is
encoded by the writer thread from a copy of the entries (:func:`finish`).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from amqpd.store.format import (
    BIG_ENDIAN_HOST,
    DefinitionChange,
    FormatError,
    decode_definition_changes,
    encode_definition_changes,
)
from amqpd.store.index import LiveIndex, QueueIndex
from amqpd.store.segment import fsync_directory

log = logging.getLogger("amqpd.store")

MAGIC = b"AMQC"
VERSION = 2
READABLE = (1, 2)
FILE_NAME = "checkpoint"
_HEAD = struct.Struct("<4sHIQ")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_SEG = struct.Struct("<qqq")


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be used."""


@dataclass(slots=True)
class Checkpoint:
    covered: int
    sequence: int
    definitions: list[DefinitionChange] = field(default_factory=list)


def _arr_bytes(values: array[int]) -> bytes:
    if BIG_ENDIAN_HOST:
        values = array("q", values)
        values.byteswap()
    return values.tobytes()


def _arr(data: memoryview, offset: int, count: int) -> tuple[array[int], int]:
    end = offset + 8 * count
    if count < 0 or end > len(data):
        raise CheckpointError("array runs past the end")
    out = array("q")
    out.frombytes(data[offset:end])
    if BIG_ENDIAN_HOST:
        out.byteswap()
    return out, end


def encode(covered: int, sequence: int, index: LiveIndex,
           definitions: dict[tuple[int, str], bytes] | None = None) -> bytes:
    """The whole file (tests and tools; the log splits it between two threads)."""
    return finish(encode_index(covered, sequence, index), definitions or {})


def finish(index_body: bytes, definitions: dict[tuple[int, str], bytes]) -> bytes:
    """Add the definitions section and the header (run on the writer thread)."""
    defs = encode_definition_changes(
        [(kind, key, body) for (kind, key), body in definitions.items()])
    crc = zlib.crc32(defs, zlib.crc32(index_body))
    return b"".join((_HEAD.pack(MAGIC, VERSION, crc, len(index_body) + len(defs)),
                     index_body, defs))


def encode_index(covered: int, sequence: int, index: LiveIndex) -> bytes:
    """Serialise the index (called on the event-loop thread: arrays copy fast)."""
    parts: list[bytes] = [_I64.pack(covered), _I64.pack(sequence), _U32.pack(len(index.bases))]
    for base in index.bases:
        parts.append(_SEG.pack(base, index.seg_live[base], index.seg_total[base]))
    live_queues = [(name, q) for name, q in index.queues.items() if len(q)]
    parts.append(_U32.pack(len(live_queues)))
    for name, q in live_queues:
        raw = name.encode()
        positions, sizes = q.live()
        parts.append(struct.pack("<H", len(raw)) + raw + _I64.pack(len(positions)))
        parts.append(_arr_bytes(positions))
        parts.append(_arr_bytes(sizes))
        stamps, extra = q.live_meta()
        parts.append(_arr_bytes(stamps))
        parts.append(_arr_bytes(extra))
        parts.append(_I64.pack(len(q.delivered)))
        parts.append(_arr_bytes(array("q", sorted(q.delivered))))
    parts.append(_I64.pack(len(index.reloc)))
    parts.append(_arr_bytes(array("q", index.reloc.keys())))
    parts.append(_arr_bytes(array("q", index.reloc.values())))
    parts.append(_arr_bytes(array("q", (index.reloc_refs[k] for k in index.reloc))))
    parts.append(_U32.pack(len(index.carry)))
    for base, per_queue in index.carry.items():
        parts.append(_I64.pack(base) + _U32.pack(len(per_queue)))
        for name, (stables, currents) in per_queue.items():
            raw = name.encode()
            parts.append(struct.pack("<H", len(raw)) + raw + _I64.pack(len(stables)))
            parts.append(_arr_bytes(stables))
            parts.append(_arr_bytes(currents))
    return b"".join(parts)


def write_atomic(directory: Path, data: bytes, *, sync: bool = True) -> None:
    """tmp file, fsync, rename over the old one, fsync the directory."""
    tmp = directory / (FILE_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / FILE_NAME)
    if sync:
        fsync_directory(directory)


def load(directory: Path) -> tuple[Checkpoint, LiveIndex] | None:
    """The checkpoint and the index it describes; None if there is no usable file.

    A damaged file is logged and ignored: recovery then replays the whole log, which
    is slower but loses nothing."""
    path = directory / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        index = LiveIndex()
        return _decode(memoryview(data), index), index
    except (CheckpointError, struct.error, UnicodeDecodeError) as exc:
        log.warning("ignoring unusable checkpoint %s (%s); replaying the whole log", path, exc)
        return None


def _decode(data: memoryview, index: LiveIndex) -> Checkpoint:
    if len(data) < _HEAD.size:
        raise CheckpointError("shorter than its header")
    magic, version, crc, length = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version not in READABLE:
        raise CheckpointError(f"bad magic/version {magic!r}/{version}")
    body = data[_HEAD.size :]
    if len(body) != length:
        raise CheckpointError(f"body is {len(body)} bytes, header says {length}")
    if zlib.crc32(body) != crc:
        raise CheckpointError("CRC mismatch")
    covered, sequence = struct.unpack_from("<qq", body, 0)
    (nseg,) = _U32.unpack_from(body, 16)
    off = 20
    for _ in range(nseg):
        base, live, total = _SEG.unpack_from(body, off)
        off += _SEG.size
        index.add_segment(base)
        index.seg_live[base] = live
        index.seg_total[base] = total
    (nq,) = _U32.unpack_from(body, off)
    off += 4
    for _ in range(nq):
        (nlen,) = struct.unpack_from("<H", body, off)
        name = bytes(body[off + 2 : off + 2 + nlen]).decode()
        off += 2 + nlen
        (count,) = _I64.unpack_from(body, off)
        q = QueueIndex()
        q.positions, off = _arr(body, off + 8, count)
        q.sizes, off = _arr(body, off, count)
        if version >= 2:
            q.stamps, off = _arr(body, off, count)
            q.extra, off = _arr(body, off, count)
        else:
            q.stamps, q.extra = array("q", bytes(8 * count)), array("q", bytes(8 * count))
        (nd,) = _I64.unpack_from(body, off)
        delivered, off = _arr(body, off + 8, nd)
        q.delivered = set(delivered)
        index.queues[name] = q
        index.live_pairs += count
    (nr,) = _I64.unpack_from(body, off)
    stables, off = _arr(body, off + 8, nr)
    currents, off = _arr(body, off, nr)
    refs, off = _arr(body, off, nr)
    index.reloc = dict(zip(stables, currents, strict=True))
    index.reloc_refs = dict(zip(stables, refs, strict=True))
    definitions: list[DefinitionChange] = []
    if version >= 2:
        off = _decode_carry(body, off, index)
        try:
            definitions, off = decode_definition_changes(body, off)
        except FormatError as exc:
            raise CheckpointError(f"definitions section: {exc}") from None
    if off != len(body):
        raise CheckpointError("trailing bytes")
    return Checkpoint(covered, sequence, definitions)


def _decode_carry(body: memoryview, off: int, index: LiveIndex) -> int:
    (nbases,) = _U32.unpack_from(body, off)
    off += 4
    for _ in range(nbases):
        base, nq = struct.unpack_from("<qI", body, off)
        off += 12
        per_queue = index.carry.setdefault(base, {})
        for _ in range(nq):
            (nlen,) = struct.unpack_from("<H", body, off)
            name = bytes(body[off + 2 : off + 2 + nlen]).decode()
            (n,) = _I64.unpack_from(body, off + 2 + nlen)
            stables, off = _arr(body, off + 10 + nlen, n)
            currents, off = _arr(body, off, n)
            per_queue[name] = (stables, currents)
    return off
