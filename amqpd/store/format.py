"""Byte layout of the shared log: pure ``struct`` encode/decode, no I/O.

Kept apart from the file handling (py-caskdb's split) so the layout can be tested
alone: round trips, truncation at every byte, bit flips.

Every segment file starts with an 8-byte file header, then records back to back::

    segment file <base:020d>.log   (base = global log position of byte 0)
    +-------+---------+----------+--------------+--------------+-----
    | MAGIC | VERSION | reserved | record       | record       | ...
    | "AMQL"| u16     | u16      |              |              |
    +-------+---------+----------+--------------+--------------+-----
      0       4         6          8

    record (all little-endian)
    +--------+--------+----------+------+----------------------+
    | crc32  | length | sequence | type | payload (length B)   |
    | u32    | u32    | u64      | u8   |                      |
    +--------+--------+----------+------+----------------------+
      crc32 = zlib.crc32 of everything after the crc field: length, sequence, type, payload

A record's *position* is the global offset of its first (crc) byte. The sequence number
grows by one per record over the node's lifetime so a log-shipping follower can say
exactly how far it is.

Payloads (str = u16 length + UTF-8; positions are i64)::

    ENQUEUE     origin i64 | nqueues u16 | str * nqueues | exchange str | routing_key str
                | props_len u32 | props | body (the rest of the payload)
                origin = 0 for a fresh publish; for a copy made by compaction it is the
                stable position (the one the broker knows) of the message it replaces.
    SETTLE      queue str | count u32 | position i64 * count
    DELIVERED   queue str | count u32 | positions i64[count]
    DROP_QUEUE  queue str
    CHECKPOINT  covered i64   (marker: a checkpoint file covering the log up to here)
    DEFINITION  count u32 | count * (kind u8 | key str32 | body str32)   (str32 = u32 + bytes)
                durable topology changes (issue 22), applied in order and all or nothing
                (one record, one CRC). ``kind`` is one of the DEF_* constants; ``key``
                names the object (for DEF_QUEUE it is the queue key, so deleting a
                queue's definition also settles its messages); ``body`` is the object
                as compact JSON in RabbitMQ's definitions shape, empty when deleted.
    ENQUEUE_META  flags u8 | priority u8 | published_ms i64 | expires_ms i64
                | the ENQUEUE payload
                what recovery needs without reading the message: ``published_ms``
                (wall clock, so queue TTLs keep counting across a restart),
                ``expires_ms`` (absolute per-message expiry, 0 = none), the priority,
                and flag TRANSIENT (a transient message paged out under memory
                pressure: recovery drops it, as RabbitMQ drops transient messages).

The body is written once however many queues the message was routed to. Record types
only ever get added (ENQUEUE_META came after ENQUEUE, as type 20): a log written
before ENQUEUE_META existed is read as it always was.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from typing import Final

from amqpd.store.api import StoredMessage

MAGIC: Final = b"AMQL"
VERSION: Final = 1

FILE_HEADER: Final = struct.Struct("<4sHH")
FILE_HEADER_SIZE: Final = FILE_HEADER.size  # 8

RECORD_HEADER: Final = struct.Struct("<IIQB")
HEADER_SIZE: Final = RECORD_HEADER.size  # 17
_HEADER_TAIL: Final = struct.Struct("<IQB")  # the crc-covered part of the header

# A record longer than this is treated as garbage (a flipped length byte), not as a
# request to allocate gigabytes during recovery.
MAX_PAYLOAD: Final = 1 << 30

ENQUEUE: Final = 1
SETTLE: Final = 2
DELIVERED: Final = 3
DROP_QUEUE: Final = 4
CHECKPOINT: Final = 5
ENQUEUE_META: Final = 20
# Definition records start at 32 so message-side kinds can grow below without a clash.
DEFINITION: Final = 32
BIG_ENDIAN_HOST: Final = sys.byteorder == "big"  # arrays are stored little-endian

RECORD_TYPES: Final = frozenset({ENQUEUE, SETTLE, DELIVERED, DROP_QUEUE, CHECKPOINT, ENQUEUE_META,
                          DEFINITION})
ENQUEUE_TYPES: Final = frozenset({ENQUEUE, ENQUEUE_META})

META: Final = struct.Struct("<BBqq")
META_SIZE: Final = META.size  # 18
FLAG_TRANSIENT: Final = 0x01
# Kinds of object a DEFINITION change names (never renumber: they are on disk).
DEF_VHOST = 1
DEF_USER = 2
DEF_PERMISSION = 3
DEF_TOPIC_PERMISSION = 4
DEF_POLICY = 5
DEF_PARAMETER = 6
DEF_GLOBAL_PARAMETER = 7
DEF_VHOST_LIMITS = 8
DEF_EXCHANGE = 9
DEF_QUEUE = 10
DEF_BINDING = 11
DEF_KINDS = frozenset(range(DEF_VHOST, DEF_BINDING + 1))

_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_I64: Final = struct.Struct("<q")
_I64_U16: Final = struct.Struct("<qH")
_I64_U32: Final = struct.Struct("<qI")
_DEF_HEAD: Final = struct.Struct("<BI")


class FormatError(Exception):
    """Bytes that are not a valid record."""


class TornRecord(FormatError):
    """The buffer ends inside a record: a write that did not finish."""


class CorruptRecord(FormatError):
    """CRC mismatch, unknown type or an absurd length: the bytes were damaged."""


def file_header() -> bytes:
    """The 8 bytes every segment file starts with."""
    return FILE_HEADER.pack(MAGIC, VERSION, 0)


def check_file_header(data: bytes) -> None:
    """Raise TornRecord if short, CorruptRecord if not ours, ValueError if too new."""
    if len(data) < FILE_HEADER_SIZE:
        raise TornRecord("segment shorter than its file header")
    magic, version, _ = FILE_HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptRecord(f"bad segment magic {magic!r}")
    if version != VERSION:
        # Not damage: a newer (or older) layout we must not "repair" by truncating.
        raise ValueError(f"segment version {version}, this build reads {VERSION}")


# zlib.crc32 once: a compiled module reads another module's attribute by name per call
_crc32: Final = zlib.crc32


def encode_record(rtype: int, seq: int, payload: bytes) -> bytes:
    """Frame a payload: header with CRC32 over length, sequence, type and payload."""
    tail = _HEADER_TAIL.pack(len(payload), seq, rtype)
    crc: int = _crc32(payload, _crc32(tail))
    return b"".join((crc.to_bytes(4, "little"), tail, payload))


def decode_record(buf: bytes | memoryview, offset: int = 0) -> tuple[int, int, int, int]:
    """Check the record at ``offset``; return (type, sequence, payload_offset, end).

    The payload is ``buf[payload_offset:end]``; ``end`` is where the next record starts.
    """
    size = len(buf)
    if size - offset < HEADER_SIZE:
        raise TornRecord(f"{size - offset} bytes left, a header needs {HEADER_SIZE}")
    crc, length, seq, rtype = RECORD_HEADER.unpack_from(buf, offset)
    if length > MAX_PAYLOAD:
        raise CorruptRecord(f"record length {length} exceeds {MAX_PAYLOAD}")
    end = offset + HEADER_SIZE + length
    if end > size:
        raise TornRecord(f"record needs {end - offset} bytes, {size - offset} left")
    if zlib.crc32(memoryview(buf)[offset + 4 : end]) != crc:
        raise CorruptRecord(f"CRC mismatch at offset {offset}")
    if rtype not in RECORD_TYPES:
        raise CorruptRecord(f"unknown record type {rtype}")
    return rtype, seq, offset + HEADER_SIZE, end


def check_run(buf: bytes, offset: int, last_seq: int) -> tuple[int, int]:
    """Check every whole record of ``buf`` from ``offset`` on, as :func:`decode_record`
    does, and that sequence numbers grow from ``last_seq``; return (sequence of the last
    whole record, or ``last_seq``; where the first torn record or the end begins).

    One call for a run of records: a standby checks every byte it receives (about 500
    records per frame at full rate), and a call per record cost its event loop about a
    millisecond per frame, on every synchronous confirm's path. Compiled, the header is
    read byte by byte with native integer operations. Raises CorruptRecord."""
    size = len(buf)
    seq = last_seq
    while size - offset >= HEADER_SIZE:
        length = (buf[offset + 4] | buf[offset + 5] << 8 | buf[offset + 6] << 16
                  | buf[offset + 7] << 24)
        if length > MAX_PAYLOAD:
            raise CorruptRecord(f"record length {length} exceeds {MAX_PAYLOAD}")
        end = offset + HEADER_SIZE + length
        if end > size:
            break
        crc = buf[offset] | buf[offset + 1] << 8 | buf[offset + 2] << 16 | buf[offset + 3] << 24
        if _crc32(buf[offset + 4 : end]) != crc:
            raise CorruptRecord(f"CRC mismatch at offset {offset}")
        if buf[offset + 16] not in RECORD_TYPES:
            raise CorruptRecord(f"unknown record type {buf[offset + 16]}")
        rseq = (buf[offset + 8] | buf[offset + 9] << 8 | buf[offset + 10] << 16
                | buf[offset + 11] << 24 | buf[offset + 12] << 32 | buf[offset + 13] << 40
                | buf[offset + 14] << 48 | buf[offset + 15] << 56)
        if rseq <= seq:
            raise CorruptRecord(f"sequence went from {seq} to {rseq}")
        seq = rseq
        offset = end
    return seq, offset


# -- payloads -----------------------------------------------------------------------


def _str(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise struct.error("string longer than 65535 bytes")
    return len(raw).to_bytes(2, "little") + raw


def _read_str(buf: bytes | memoryview, offset: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(buf, offset)
    start = offset + 2
    end = start + n
    if end > len(buf):
        raise CorruptRecord("string runs past the payload")
    return bytes(buf[start:end]).decode(), end


def encode_queues(queues: Sequence[str]) -> bytes:
    """The queue-list part of an ENQUEUE payload (cacheable: fan-outs repeat)."""
    return _U16.pack(len(queues)) + b"".join(_str(q) for q in queues)


def encode_enqueue(
    origin: int, queues: Sequence[str] | bytes, message: StoredMessage
) -> bytes:
    """ENQUEUE payload. ``queues`` may be pre-encoded with :func:`encode_queues`."""
    qbytes = queues if isinstance(queues, bytes) else encode_queues(queues)
    props = message.properties
    return b"".join(
        (
            origin.to_bytes(8, "little", signed=True),
            qbytes,
            _str(message.exchange),
            _str(message.routing_key),
            len(props).to_bytes(4, "little"),
            props,
            message.body,
        )
    )


def decode_enqueue_index(
    payload: bytes | memoryview, start: int = 0, end: int | None = None
) -> tuple[int, list[str], int]:
    """Just what recovery needs: (origin, queues, body size); the body is not copied."""
    if end is None:
        end = len(payload)
    origin, n = _I64_U16.unpack_from(payload, start)
    off = start + 10
    queues = []
    for _ in range(n):
        q, off = _read_str(payload, off)
        queues.append(q)
    for _ in range(2):  # exchange, routing key
        (slen,) = _U16.unpack_from(payload, off)
        off += 2 + slen
    (plen,) = _U32.unpack_from(payload, off)
    off += 4 + plen
    if off > end:
        raise CorruptRecord("ENQUEUE fields run past the payload")
    return origin, queues, end - off


def encode_meta(message: StoredMessage) -> bytes:
    """The ENQUEUE_META header for ``message`` (see the module docstring)."""
    flags = FLAG_TRANSIENT if message.transient else 0
    return META.pack(flags, message.priority, message.published, message.expires)


def has_meta(message: StoredMessage) -> bool:
    """Whether the message needs an ENQUEUE_META record (else a plain ENQUEUE does)."""
    return bool(message.published or message.transient or message.priority
                or message.expires)


def decode_meta(payload: bytes | memoryview, start: int = 0) -> tuple[int, int, int, int]:
    """(flags, priority, published_ms, expires_ms) of an ENQUEUE_META payload."""
    if len(payload) - start < META_SIZE:
        raise CorruptRecord("ENQUEUE_META shorter than its header")
    flags, priority, published, expires = META.unpack_from(payload, start)
    return int(flags), int(priority), int(published), int(expires)


def decode_any_enqueue(rtype: int, payload: bytes | memoryview
                       ) -> tuple[int, list[str], StoredMessage]:
    """Full decode of an ENQUEUE or ENQUEUE_META payload: (origin, queues, message)."""
    if rtype != ENQUEUE_META:
        return decode_enqueue(payload)
    flags, priority, published, expires = decode_meta(payload)
    origin, queues, m = decode_enqueue(memoryview(payload)[META_SIZE:])
    m.transient = bool(flags & FLAG_TRANSIENT)
    m.priority, m.published, m.expires = priority, published, expires
    return origin, queues, m


def decode_enqueue(payload: bytes | memoryview) -> tuple[int, list[str], StoredMessage]:
    """Full decode of a plain ENQUEUE payload: (origin, queues, message)."""
    try:
        origin, n = _I64_U16.unpack_from(payload, 0)
        off = 10
        queues = []
        for _ in range(n):
            q, off = _read_str(payload, off)
            queues.append(q)
        exchange, off = _read_str(payload, off)
        routing_key, off = _read_str(payload, off)
        (plen,) = _U32.unpack_from(payload, off)
        off += 4
        if off + plen > len(payload):
            raise CorruptRecord("properties run past the payload")
        props = bytes(payload[off : off + plen])
        body = bytes(payload[off + plen :])
    except struct.error as exc:
        raise CorruptRecord(f"short ENQUEUE payload: {exc}") from None
    return origin, queues, StoredMessage(exchange, routing_key, props, body)


def encode_settle(queue: str, positions: Sequence[int]) -> bytes:
    arr = positions if isinstance(positions, array) and positions.typecode == "q" else None
    if arr is None or BIG_ENDIAN_HOST:
        arr = array("q", positions)
        if BIG_ENDIAN_HOST:
            arr.byteswap()
    return b"".join((_str(queue), _U32.pack(len(arr)), arr.tobytes()))


def decode_settle(payload: bytes | memoryview) -> tuple[str, array[int]]:
    try:
        queue, off = _read_str(payload, 0)
        (count,) = _U32.unpack_from(payload, off)
    except struct.error as exc:
        raise CorruptRecord(f"short SETTLE payload: {exc}") from None
    off += 4
    if off + 8 * count != len(payload):
        raise CorruptRecord("SETTLE count does not match its length")
    positions = array("q")
    positions.frombytes(bytes(payload[off:]))
    if BIG_ENDIAN_HOST:
        positions.byteswap()
    return queue, positions


def encode_delivered(queue: str, positions: Sequence[int]) -> bytes:
    """DELIVERED marks for many messages of one queue (same layout as SETTLE)."""
    return encode_settle(queue, positions)


def decode_delivered(payload: bytes | memoryview) -> tuple[str, array[int]]:
    try:
        return decode_settle(payload)
    except CorruptRecord as exc:
        raise CorruptRecord(str(exc).replace("SETTLE", "DELIVERED")) from None


def encode_drop_queue(queue: str) -> bytes:
    return _str(queue)


def decode_drop_queue(payload: bytes | memoryview) -> str:
    try:
        queue, off = _read_str(payload, 0)
    except struct.error as exc:
        raise CorruptRecord(f"short DROP_QUEUE payload: {exc}") from None
    if off != len(payload):
        raise CorruptRecord("DROP_QUEUE payload has trailing bytes")
    return queue


def encode_checkpoint(covered: int) -> bytes:
    return _I64.pack(covered)


def decode_checkpoint(payload: bytes | memoryview) -> int:
    if len(payload) != 8:
        raise CorruptRecord("CHECKPOINT payload must be 8 bytes")
    return int(_I64.unpack_from(payload, 0)[0])


# A change: (kind, key, body); body b"" = the object was deleted.
DefinitionChange = tuple[int, str, bytes]


def encode_definition_changes(changes: Sequence[DefinitionChange]) -> bytes:
    """DEFINITION payload (also the checkpoint's snapshot of every definition)."""
    parts = [_U32.pack(len(changes))]
    for kind, key, body in changes:
        raw = key.encode()
        parts.append(_DEF_HEAD.pack(kind, len(raw)))
        parts.append(raw)
        parts.append(_U32.pack(len(body)))
        parts.append(body)
    return b"".join(parts)


def decode_definition_changes(
    payload: bytes | memoryview, offset: int = 0, end: int | None = None
) -> tuple[list[DefinitionChange], int]:
    """(changes, offset after them); ``end`` bounds the read (default: the payload)."""
    if end is None:
        end = len(payload)
    try:
        (count,) = _U32.unpack_from(payload, offset)
        off = offset + 4
        changes: list[DefinitionChange] = []
        for _ in range(count):
            kind, klen = _DEF_HEAD.unpack_from(payload, off)
            off += _DEF_HEAD.size
            key = bytes(payload[off : off + klen]).decode()
            off += klen
            (blen,) = _U32.unpack_from(payload, off)
            off += 4
            body = bytes(payload[off : off + blen])
            off += blen
            if off > end:
                raise CorruptRecord("DEFINITION change runs past the payload")
            if kind not in DEF_KINDS:
                raise CorruptRecord(f"unknown definition kind {kind}")
            changes.append((kind, key, body))
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"short or bad DEFINITION payload: {exc}") from None
    return changes, off


def decode_definition(payload: bytes | memoryview) -> list[DefinitionChange]:
    changes, off = decode_definition_changes(payload)
    if off != len(payload):
        raise CorruptRecord("DEFINITION payload has trailing bytes")
    return changes
