"""A stream's own log: segment files of records addressed by offset, with sparse indexes.

A stream queue (``x-queue-type: stream``, :mod:`amqpd.broker.stream`) is read as a log:
consumers keep their own position and replay from any point, so its records cannot
live in the node's shared log, whose segments go when every queue has settled them.
Each stream gets a directory of its own (Kafka's partition directory, RabbitMQ's osiris
directory):

    <base:020d>.seg   records; ``base`` is the offset of the file's first record
    <base:020d>.idx   the sparse index of a sealed segment (written when it is sealed)

Theory of operation:

* Records are appended in offset order, 0, 1, 2, ... and never rewritten. A record is
  ``crc32 u32 | length u32 | offset u64 | timestamp i64 (ms) | flags u8 | payload``;
  the CRC covers everything after itself. Flag bit 0 marks the first record of a
  *chunk*: the records appended between two :meth:`StreamLog.flush` calls (one event
  loop tick's publishes), as osiris groups a writer batch. ``last`` consumers start at
  the last chunk's first record, as RabbitMQ's do.
* :meth:`StreamLog.append` buffers; :meth:`StreamLog.flush` writes the buffer to the
  file (from then on readers see it, and a kill -9 of the process cannot lose it: the
  kernel has it); :meth:`StreamLog.sync` fsyncs (from then on a power loss cannot lose
  it). The broker confirms a publish after the sync that covers it (one fsync per group
  commit: every record of the tick shares it). ``sync`` and ``read_shared[_raw]`` are the
  methods meant for a worker thread; every other method runs on the owner's thread
  (the event loop).
* A segment is sealed when it reaches ``max_segment_bytes`` at a chunk boundary (a
  chunk that would grow past it ends there: :meth:`StreamLog.append` flushes); its
  index is then written to ``.idx`` with a trailer (record count, end position) and
  fsynced by the next :meth:`sync`, after the segment itself. On :meth:`open` sealed
  segments with a valid ``.idx`` are trusted; the others (the active one, normally) are
  scanned record by record, their index rebuilt, and a torn or corrupt tail (short
  record, CRC mismatch, broken offset sequence) is cut off. Only the last segment may
  have a tail: a segment with a bad record followed by later segments is cut there and
  the later ones are removed (they cannot have been confirmed: syncs go in order). A
  complete earlier segment whose ``.idx`` is missing or bad is scanned and gets it
  again at the next sync; until then retention leaves it (and every segment whose
  index is not yet written) alone. A sync fsyncs every segment that holds records
  flushed since the last one, so a segment sealed while a sync was under way is
  covered by the next.
* The index is sparse (Kafka's ``OffsetIndex``/``TimeIndex`` in one): an entry
  ``(offset, position, timestamp)`` every ``index_interval`` bytes of records, kept in
  ``array('q')`` per segment, so finding an offset or a timestamp is a bisect plus a
  short scan of record headers. A :class:`Reader` holds an offset, a segment and a file
  position -- three integers -- and reads with ``os.pread`` on the segment's one shared
  file descriptor: a thousand readers far behind cost disk reads, not memory. A reader
  may also read in a worker thread (:meth:`StreamLog.read_shared` and ``read_shared_raw``,
  under the lock that retention and close take), which is how a stream's consumers
  behind read. :meth:`Reader.read_raw` hands out whole records as stored, for a reader
  that cuts messages from bytes (a stream-protocol subscription its chunk entries, an
  AMQP 0-9-1 consumer its deliveries) rather than build a :class:`Record` per message;
  :meth:`StreamLog.append_many` is the batch append of a publish frame.
* Retention (:meth:`StreamLog.retain`) deletes whole segments from the oldest, never
  the active one: by total size (``max-length-bytes``) and by age (a sealed segment
  whose newest record is older than ``max-age``). A reader inside a deleted segment
  moves on to the first record still there on its next read.
* Replication (amqpd/cluster/stream_group.py): a member appends what its leader shipped
  with :meth:`StreamLog.append_replica` (the leader's offsets, timestamps, chunk marks
  and flags), and the leader ships records read by offset (:meth:`Reader.read`); a
  member whose log is not a prefix of its leader's starts again (:meth:`reset`).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, NamedTuple

log = logging.getLogger("amqpd.stream_log")

MAGIC: Final = b"AMQPDSTR"  # first 8 bytes of a segment file, then a version byte
VERSION: Final = 1
FILE_HEADER: Final = MAGIC + bytes((VERSION,))
HEADER_SIZE: Final = len(FILE_HEADER)
RECORD: Final = struct.Struct(">IIQqB")  # crc, payload length, offset, timestamp ms, flags
RECORD_SIZE: Final = RECORD.size
CHUNK_START: Final = 1
AMQP10: Final = 2  # flag bit 1: the payload is a stream-protocol (AMQP 1.0) message as sent
MAX_RECORD: Final = 256 * 1024 * 1024  # a length above this is corruption, not a record
INDEX_ENTRY: Final = struct.Struct(">QQq")  # offset, position, timestamp
INDEX_TRAILER: Final = struct.Struct(">QQI")  # records, end position, crc of the entries
SEG: Final = ".seg"
IDX: Final = ".idx"
DEFAULT_SEGMENT_BYTES: Final = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
# 24 bytes of memory per 32 KiB of records (0.07 %): a 100 GB stream's index is 73 MB,
# not the 590 MB an entry per 4 KiB would be; a seek reads at most this much more
DEFAULT_INDEX_INTERVAL: Final = 32 * 1024
# how much of a segment a reader's seek reads at once while skipping record headers
SCAN_BYTES: Final = 64 * 1024
READ_BYTES: Final = 256 * 1024  # one pread per read call at most this much (plus one record)
# preadv's "no waiting for the disk" flag (Linux 4.14+); 0 elsewhere: nowait reads are off
_RWF_NOWAIT: Final[int] = getattr(os, "RWF_NOWAIT", 0)


class StreamLogError(Exception):
    """A stream log cannot do what was asked (bad offset order, closed log)."""


class Record(NamedTuple):
    offset: int
    timestamp: int  # ms since the epoch
    chunk_start: bool
    payload: bytes
    amqp10: bool = False  # an AMQP 1.0 message from the stream protocol (flag AMQP10)


_TAIL: Final = struct.Struct(">IQqB")  # RECORD without its crc
_LENGTH: Final = struct.Struct(">I")  # a record's payload length, 4 bytes into its header
_CRC: Final = struct.Struct(">I")


def _fast_crc32() -> Callable[[bytes | bytearray | memoryview, int], int]:
    """zlib-ng's ``crc32`` when it is installed (the ``speed`` extra), else zlib's: the
    same CRC-32 (polynomial, initial value, results), so the files do not change, but
    zlib-ng's runs with carry-less multiplication, about five times faster on a 1 KiB
    record; every record appended or recovered pays one."""
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        return zlib.crc32
    return zlib_ng.crc32


crc32: Final = _fast_crc32()


def _crc(header_tail: bytes, payload: bytes | memoryview) -> int:
    return crc32(payload, crc32(header_tail, 0)) & 0xFFFFFFFF


def encode_record(offset: int, timestamp: int, chunk_start: bool, payload: bytes,
                  flags: int = 0) -> bytes:
    """One record as written (header then payload); ``flags`` beyond the chunk mark
    (:data:`AMQP10`) are kept as given."""
    tail = _TAIL.pack(len(payload), offset, timestamp,
                      flags | (CHUNK_START if chunk_start else 0))
    return b"".join((_CRC.pack(_crc(tail, payload)), tail, payload))


def parse_records(data: bytes) -> list[Record]:
    """The records of whole stored records back to back (:meth:`Reader.read_raw`)."""
    out: list[Record] = []
    at, size, unpack = 0, len(data), RECORD.unpack_from
    while at < size:
        _, length, offset, timestamp, flags = unpack(data, at)
        end = at + RECORD_SIZE + length
        out.append(Record(offset, timestamp, bool(flags & CHUNK_START),
                          data[at + RECORD_SIZE:end], bool(flags & AMQP10)))
        at = end
    return out


def seg_name(base: int) -> str:
    return f"{base:020d}{SEG}"


class Segment:
    """One segment file: its first offset, its index, how much of it is written."""

    __slots__ = ("base", "count", "fd", "idx_offsets", "idx_positions", "idx_stamps",
                 "indexed", "last_chunk", "last_stamp", "path", "sealed", "since_index",
                 "size")

    def __init__(self, path: Path, base: int, fd: int) -> None:
        self.path = path
        self.base = base
        self.fd = fd
        self.size = HEADER_SIZE  # bytes written to the file (readable)
        self.count = 0  # records in it
        self.idx_offsets = array("q")
        self.idx_positions = array("q")
        self.idx_stamps = array("q")
        self.since_index = 0
        self.last_stamp = 0  # newest record's timestamp (0: empty)
        self.last_chunk = -1  # offset of its last chunk's first record (-1: none)
        self.sealed = False  # full: no more records (set on the owner's thread)
        self.indexed = False  # its .idx is written and fsynced (set by sync)

    @property
    def end(self) -> int:
        """The offset after its last record."""
        return self.base + self.count

    def note(self, offset: int, position: int, timestamp: int, length: int,
             chunk_start: bool, interval: int) -> None:
        """Book a record at ``position``: count, timestamps, sparse index."""
        if self.count == 0 or self.since_index >= interval:
            self.idx_offsets.append(offset)
            self.idx_positions.append(position)
            self.idx_stamps.append(max(timestamp, self.last_stamp))
            self.since_index = 0
        self.since_index += RECORD_SIZE + length
        self.count += 1
        if timestamp > self.last_stamp:
            self.last_stamp = timestamp
        if chunk_start:
            self.last_chunk = offset

    def note_all(self, pending: list[tuple[int, int, list[int], bool]], position: int,
                 interval: int) -> int:
        """:meth:`note` for batches of records written back to back from ``position``
        (each: first offset, timestamp, payload lengths, whether its first record
        starts a chunk), in one loop over locals; the position after them (a flush
        books every record of the tick here)."""
        count, since, last_stamp = self.count, self.since_index, self.last_stamp
        last_chunk = self.last_chunk
        offsets, positions, stamps = self.idx_offsets, self.idx_positions, self.idx_stamps
        for offset, timestamp, lengths, chunk_start in pending:
            if not lengths:
                continue
            if chunk_start:
                last_chunk = offset
            if timestamp > last_stamp:  # one timestamp for the batch: note's max, once
                last_stamp = timestamp
            for length in lengths:
                if count == 0 or since >= interval:
                    offsets.append(offset)
                    positions.append(position)
                    stamps.append(last_stamp)
                    since = 0
                since += RECORD_SIZE + length
                count += 1
                offset += 1
                position += RECORD_SIZE + length
        self.count, self.since_index, self.last_stamp = count, since, last_stamp
        self.last_chunk = last_chunk
        return position

    def index_bytes(self) -> bytes:
        entries = b"".join(INDEX_ENTRY.pack(o, p, t) for o, p, t in
                           zip(self.idx_offsets, self.idx_positions, self.idx_stamps,
                               strict=True))
        return entries + INDEX_TRAILER.pack(self.count, self.size,
                                            zlib.crc32(entries) & 0xFFFFFFFF)

    def load_index(self, data: bytes, file_size: int) -> bool:
        """Take a sealed segment's ``.idx``; False when it does not match the file."""
        if len(data) < INDEX_TRAILER.size:
            return False
        entries = data[:-INDEX_TRAILER.size]
        count, end, crc = INDEX_TRAILER.unpack_from(data, len(entries))
        if (len(entries) % INDEX_ENTRY.size or zlib.crc32(entries) & 0xFFFFFFFF != crc
                or end != file_size or count == 0 or not entries):
            return False
        for o, p, t in INDEX_ENTRY.iter_unpack(entries):
            self.idx_offsets.append(o)
            self.idx_positions.append(p)
            self.idx_stamps.append(t)
        self.count = count
        self.size = end
        self.last_stamp = self.idx_stamps[-1]
        self.sealed = self.indexed = True
        return True

    def position_at_or_before(self, offset: int) -> tuple[int, int]:
        """The index entry at or before ``offset``: (offset, position)."""
        i = bisect_right(self.idx_offsets, offset) - 1
        if i < 0:
            return self.base, HEADER_SIZE
        return self.idx_offsets[i], self.idx_positions[i]


class StreamLog:
    """The segments of one stream, in a directory it owns (module docstring)."""

    def __init__(self, directory: Path, max_segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 index_interval: int = DEFAULT_INDEX_INTERVAL) -> None:
        self.directory = Path(directory)
        self.max_segment_bytes = max_segment_bytes
        self.index_interval = index_interval
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.next_offset = 0  # offset the next append gets
        self.flushed_offset = 0  # records below this are in the file (readable)
        self.synced_offset = 0  # records below this are fsynced
        # the records not yet written, in pieces (headers, payloads and their parts as
        # they came): :meth:`flush` joins them once, where appending to one bytearray
        # copied each piece and re-allocated the buffer as it grew
        self._parts: list[bytes] = []
        self._buffered = 0  # their bytes
        # what the pieces hold, by batch: first offset, timestamp, the records' payload
        # lengths, whether the first one starts a chunk (a batch's records follow each
        # other: a publish frame's one entry, not one tuple and three ints per record)
        self._pending: list[tuple[int, int, list[int], bool]] = []
        self._chunk_open = False
        self._lock = threading.Lock()  # sync and read_shared (workers) vs. closing fds
        self.closed = True
        self.truncated_bytes = 0  # what open() cut off (a torn tail), for the log line
        self.rolls = 0  # segments sealed since open (the owner runs retention on a change)
        # reads may ask the page cache alone (Reader.read_raw ``cached``): off where
        # the platform cannot (no RWF_NOWAIT, or a file system that refuses it)
        self.nowait = _RWF_NOWAIT != 0

    # ------------------------------------------------------------------ opening
    def open(self) -> None:
        """Open the directory (created if missing), recovering what a crash left."""
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(p.name[:-len(SEG)]) for p in self.directory.glob("*" + SEG)
                       if p.name[:-len(SEG)].isdigit())
        expected: int | None = None
        for i, base in enumerate(bases):
            path = self.directory / seg_name(base)
            if expected is not None and base != expected:
                log.warning("stream %s: segment %s does not follow offset %d; it and later "
                            "segments are dropped", self.directory, path.name, expected)
                self._remove_files(bases[i:])
                break
            seg = self._open_segment(path, base, last=i == len(bases) - 1)
            if seg is None:  # unreadable header: nothing of it can be confirmed
                self._remove_files(bases[i:])
                break
            self.segments.append(seg)
            self._bases.append(base)
            expected = seg.end
            if i < len(bases) - 1 and seg.size < os.fstat(seg.fd).st_size:
                log.warning("stream %s: segment %s was cut; later segments dropped",
                            self.directory, path.name)
                os.ftruncate(seg.fd, seg.size)  # its bad tail goes, so a reopen agrees
                os.fsync(seg.fd)
                self._remove_files(bases[i + 1:])
                break
        if not self.segments:
            self._new_segment(0)
        else:
            last = self.segments[-1]
            if last.sealed:  # it was sealed but no successor was created yet
                self._new_segment(last.end)
        self.next_offset = self.flushed_offset = self.synced_offset = self.segments[-1].end
        self.closed = False

    def _open_segment(self, path: Path, base: int, last: bool) -> Segment | None:
        fd = os.open(path, os.O_RDWR)
        seg = Segment(path, base, fd)
        file_size = os.fstat(fd).st_size
        if os.pread(fd, HEADER_SIZE, 0) != FILE_HEADER:
            os.close(fd)
            log.warning("stream %s: %s has no valid header", self.directory, path.name)
            return None
        idx = path.with_suffix(IDX)
        if not last and idx.exists() and seg.load_index(idx.read_bytes(), file_size):
            self._find_last_chunk(seg)
            return seg
        seg.idx_offsets, seg.idx_positions, seg.idx_stamps = array("q"), array("q"), array("q")
        seg.count = 0
        seg.size = HEADER_SIZE
        for record, position in self._scan(fd, base, file_size):
            seg.note(record.offset, position, record.timestamp, len(record.payload),
                     record.chunk_start, self.index_interval)
            seg.size = position + RECORD_SIZE + len(record.payload)
        if seg.size < file_size:
            self.truncated_bytes += file_size - seg.size
            log.warning("stream %s: %s: %d bytes of torn or corrupt tail cut off",
                        self.directory, path.name, file_size - seg.size)
            if last:
                os.ftruncate(fd, seg.size)
                os.fsync(fd)
        if not last and seg.count:
            seg.sealed = True  # complete, but its index file was missing or bad: the
            # next sync writes it again
        return seg

    def _scan(self, fd: int, base: int, file_size: int) -> Iterator[tuple[Record, int]]:
        """Every valid record of a segment file from its start, stopping at the first
        torn or corrupt one."""
        position = HEADER_SIZE
        expected = base
        while position + RECORD_SIZE <= file_size:
            head = os.pread(fd, RECORD_SIZE, position)
            crc, length, offset, timestamp, flags = RECORD.unpack(head)
            if offset != expected or length > MAX_RECORD or \
                    position + RECORD_SIZE + length > file_size:
                return
            payload = os.pread(fd, length, position + RECORD_SIZE)
            if _crc(head[4:], payload) != crc:
                return
            yield Record(offset, timestamp, bool(flags & CHUNK_START), payload,
                         bool(flags & AMQP10)), position
            position += RECORD_SIZE + length
            expected += 1

    def _find_last_chunk(self, seg: Segment) -> None:
        """A sealed segment's last chunk start (read from its last index entry on)."""
        position = seg.idx_positions[-1]
        while position < seg.size:
            _, length, off, _ts, flags = RECORD.unpack(os.pread(seg.fd, RECORD_SIZE,
                                                                    position))
            if flags & CHUNK_START:
                seg.last_chunk = off
            position += RECORD_SIZE + length

    def _remove_files(self, bases: list[int]) -> None:
        for base in bases:
            for suffix in (SEG, IDX):
                (self.directory / f"{base:020d}{suffix}").unlink(missing_ok=True)

    def _new_segment(self, base: int) -> Segment:
        path = self.directory / seg_name(base)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FILE_HEADER)
        seg = Segment(path, base, fd)
        self.segments.append(seg)
        self._bases.append(base)
        return seg

    # ------------------------------------------------------------------ state
    @property
    def first_offset(self) -> int:
        """The oldest offset still kept (== next_offset when the stream is empty)."""
        return self.segments[0].base

    @property
    def last_offset(self) -> int:
        """The newest readable offset, -1 when there is none."""
        return self.flushed_offset - 1 if self.flushed_offset > self.first_offset else -1

    @property
    def size_bytes(self) -> int:
        return sum(seg.size for seg in self.segments)

    @property
    def last_chunk_offset(self) -> int:
        """The first record of the last readable chunk (``x-stream-offset: last``);
        ``flushed_offset`` when the stream has no readable record."""
        for seg in reversed(self.segments):
            if seg.last_chunk >= 0:
                return seg.last_chunk
        return self.flushed_offset

    def first_timestamp(self) -> int:
        """The oldest kept record's timestamp (0: none)."""
        seg = self.segments[0]
        return seg.idx_stamps[0] if seg.count else 0

    # ------------------------------------------------------------------ writing
    def append(self, payload: bytes, timestamp: int, flags: int = 0) -> int:
        """Append a record (buffered until :meth:`flush`); its offset. A chunk that
        fills the segment ends there (flushed now), so segments stay near their size.
        ``flags``: :data:`AMQP10` for a stream-protocol message."""
        offset = self.next_offset
        self._append(offset, timestamp, not self._chunk_open, payload, flags)
        self._chunk_open = True
        if self.segments[-1].size + self._buffered >= self.max_segment_bytes:
            self.flush()
        return offset

    def append_parts(self, parts: list[bytes], timestamp: int) -> int:
        """:meth:`append` of the payload ``b"".join(parts)``, without joining it: the
        parts go into the buffer one after another and the CRC runs over them in turn
        (an AMQP 0-9-1 publish's body is not copied until the flush joins the tick's
        records); its offset."""
        if self.closed:
            raise StreamLogError("stream log is closed")
        offset = self.next_offset
        chunk_start = not self._chunk_open
        length = 0
        for part in parts:
            length += len(part)
        # one struct call for the header (three int.to_bytes and a join cost more)
        tail = _TAIL.pack(length, offset, timestamp, CHUNK_START if chunk_start else 0)
        crc = crc32(tail, 0)
        for part in parts:
            crc = crc32(part, crc)
        out = self._parts
        out.append((crc & 0xFFFFFFFF).to_bytes(4, "big"))  # (less than a struct call)
        out.append(tail)
        out.extend(parts)
        self._buffered += RECORD_SIZE + length
        self._pending.append((offset, timestamp, [length], chunk_start))
        self.next_offset = offset + 1
        self._chunk_open = True
        if self.segments[-1].size + self._buffered >= self.max_segment_bytes:
            self.flush()
        return offset

    def append_many(self, payloads: list[bytes], timestamp: int, flags: int = 0) -> int:
        """:meth:`append` for a batch (a stream-protocol publish frame): the same records,
        encoded in one loop; the offset after the last one."""
        if self.closed:
            raise StreamLogError("stream log is closed")
        out, pending = self._parts, self._pending
        offset = self.next_offset
        limit = self.max_segment_bytes - self.segments[-1].size
        lengths: list[int] = []
        batch_first, batch_chunk = offset, not self._chunk_open
        for payload in payloads:
            chunk = not self._chunk_open
            self._chunk_open = True
            length = len(payload)
            lengths.append(length)
            tail = _TAIL.pack(length, offset, timestamp,
                              (flags | CHUNK_START if chunk else flags) & 0xFF)
            out.append((crc32(payload, crc32(tail, 0)) & 0xFFFFFFFF).to_bytes(4, "big"))
            out.append(tail)
            out.append(payload)
            self._buffered += RECORD_SIZE + length
            offset += 1
            if self._buffered >= limit:  # the segment is full: end the chunk there
                pending.append((batch_first, timestamp, lengths, batch_chunk))
                self.next_offset = offset
                self.flush()
                out, pending = self._parts, self._pending
                limit = self.max_segment_bytes - self.segments[-1].size
                lengths = []
                batch_first, batch_chunk = offset, True
        if lengths:
            pending.append((batch_first, timestamp, lengths, batch_chunk))
        self.next_offset = offset
        return offset

    def append_replica(self, offset: int, timestamp: int, chunk_start: bool,
                       payload: bytes, flags: int = 0) -> None:
        """Append a record a leader shipped, with the leader's offset, chunk mark and
        flags (:data:`AMQP10`)."""
        if offset != self.next_offset:
            raise StreamLogError(f"offset {offset} does not follow {self.next_offset - 1}")
        self._append(offset, timestamp, chunk_start, payload, flags & AMQP10)

    def reset(self, offset: int) -> None:
        """Drop every record and go on at ``offset``: a replica whose log is not a
        prefix of its leader's (an uncommitted tail of an older term), or lies wholly
        before what its leader still keeps, starts again from the leader's log."""
        with self._lock:
            for seg in self.segments:
                if seg.fd >= 0:
                    os.close(seg.fd)
                    seg.fd = -1
            self._remove_files(list(self._bases))
            self.segments.clear()
            self._bases.clear()
        self._parts = []
        self._buffered = 0
        self._pending = []
        self._chunk_open = False
        self._new_segment(offset)
        self.next_offset = self.flushed_offset = self.synced_offset = offset

    def _append(self, offset: int, timestamp: int, chunk_start: bool, payload: bytes,
                flags: int = 0) -> None:
        if self.closed:
            raise StreamLogError("stream log is closed")
        # encode_record's bytes, its header and payload kept apart until the flush
        tail = _TAIL.pack(len(payload), offset, timestamp,
                          (flags | (CHUNK_START if chunk_start else 0)) & 0xFF)
        out = self._parts
        out.append((crc32(payload, crc32(tail, 0)) & 0xFFFFFFFF).to_bytes(4, "big"))
        out.append(tail)
        out.append(payload)
        self._buffered += RECORD_SIZE + len(payload)
        self._pending.append((offset, timestamp, [len(payload)], chunk_start))
        self.next_offset = offset + 1

    def flush(self) -> None:
        """Write what was appended to the file (readable from now on), ending the chunk;
        seal the segment when it is full."""
        self._chunk_open = False
        if not self._pending:
            return
        seg = self.segments[-1]
        # the tick's records joined once (the pieces were not copied when appended)
        data, pending = b"".join(self._parts), self._pending
        self._parts = []
        self._buffered = 0
        self._pending = []
        os.pwrite(seg.fd, data, seg.size)
        seg.size = seg.note_all(pending, seg.size, self.index_interval)
        self.flushed_offset = self.next_offset
        if seg.size >= self.max_segment_bytes:
            seg.sealed = True
            self.rolls += 1
            self._new_segment(self.next_offset)

    def sync(self) -> int:
        """fsync everything flushed so far (sealed segments and their indexes first);
        the offset below which records are now durable. Blocks: call it in a worker
        thread, never twice at once."""
        with self._lock:
            start = self.synced_offset
            upto = self.flushed_offset
            # taken after ``upto``: every record below it is in one of these (a roll
            # on the owner's thread meanwhile only adds a segment)
            segments = list(self.segments)
            indexed = False
            for seg in segments:
                if seg.fd < 0:
                    continue
                unindexed = seg.sealed and not seg.indexed
                if (seg.base < upto and seg.end > start) or unindexed:
                    os.fsync(seg.fd)
                if unindexed:  # sealed: its index is complete; written once
                    tmp = seg.path.with_suffix(".idx.tmp")
                    tmp.write_bytes(seg.index_bytes())
                    fd = os.open(tmp, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    tmp.replace(seg.path.with_suffix(IDX))
                    seg.indexed = indexed = True
            if indexed:
                dfd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            if upto > self.synced_offset:
                self.synced_offset = upto
            return upto

    # ------------------------------------------------------------------ reading
    def segment_for(self, offset: int) -> Segment | None:
        i = bisect_right(self._bases, offset) - 1
        return self.segments[i] if i >= 0 else None

    def reader(self, offset: int) -> Reader:
        """A reader whose next record is ``offset`` (clamped to what is kept)."""
        return Reader(self, max(offset, self.first_offset))

    def offset_for_timestamp(self, timestamp: int) -> int:
        """The first record whose timestamp is at or after ``timestamp`` (ms), or the
        next offset when none is (RabbitMQ: a timestamp in the future reads from next)."""
        for seg in self.segments:
            if seg.count and seg.last_stamp >= timestamp:
                i = bisect_right(seg.idx_stamps, timestamp - 1) - 1
                offset = seg.idx_offsets[max(i, 0)] if i >= 0 else seg.base
                for record in Reader(self, offset).records(seg.end):
                    if record.timestamp >= timestamp:
                        return record.offset
        return self.flushed_offset

    def read_shared(self, reader: Reader, max_records: int, max_bytes: int) -> list[Record]:
        """:meth:`Reader.read` from a worker thread (amqpd/broker/stream_readahead.py):
        under the lock, so retention and close cannot close a file while it reads; []
        once the log is closed. The owner's thread must not use ``reader`` meanwhile."""
        with self._lock:
            if self.closed:
                return []
            return reader.read(max_records, max_bytes)

    def read_shared_raw(self, reader: Reader, max_records: int,
                        max_bytes: int) -> tuple[bytes, int]:
        """:meth:`Reader.read_raw` from a worker thread, as :meth:`read_shared` reads:
        the stored records and how many; (b"", 0) once the log is closed."""
        with self._lock:
            if self.closed:
                return b"", 0
            return reader.read_raw(max_records, max_bytes)

    # ------------------------------------------------------------------ retention
    def retain(self, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Delete whole segments from the oldest while the stream is over ``max_bytes``
        or a sealed segment's newest record is older than ``max_age_ms``; never the
        active segment. How many went (0 while a sync holds the files)."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            gone = 0
            while len(self.segments) > 1:
                oldest = self.segments[0]
                if not oldest.indexed:  # the active one, or sealed and not yet synced
                    break
                too_big = max_bytes is not None and self.size_bytes > max_bytes
                too_old = max_age_ms is not None and oldest.last_stamp < now_ms - max_age_ms
                if not (too_big or too_old):
                    break
                self.segments.pop(0)
                self._bases.pop(0)
                os.close(oldest.fd)
                oldest.fd = -1
                self._remove_files([oldest.base])
                gone += 1
            return gone
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Flush, then close every file (no fsync: :meth:`sync` first if wanted)."""
        if self.closed:
            return
        self.flush()
        with self._lock:
            for seg in self.segments:
                if seg.fd >= 0:
                    os.close(seg.fd)
                    seg.fd = -1
            self.closed = True

    def destroy(self) -> None:
        """Close and delete the whole directory (the stream was deleted)."""
        self._pending.clear()
        self._parts.clear()
        self._buffered = 0
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _read_cached(log_: StreamLog, fd: int, buf: bytearray, size: int, position: int) -> int:
    """Up to ``size`` bytes at ``position`` into ``buf``, only from the page cache: how
    many (0 or -1: none there without waiting for the disk, or the platform cannot
    say; then ``log_.nowait`` goes off for good)."""
    if not log_.nowait:
        return -1
    try:
        return os.preadv(fd, [memoryview(buf)[:size]], position, _RWF_NOWAIT)
    except BlockingIOError:
        return -1
    except (OSError, AttributeError):  # EOPNOTSUPP (a file system without it), no preadv
        log_.nowait = False
        return -1


class Reader:
    """A position in a stream: the next offset and where it is (module docstring)."""

    __slots__ = ("_position", "_segment_base", "log", "offset")

    def __init__(self, log: StreamLog, offset: int) -> None:
        self.log = log
        self.offset = offset
        self._segment_base = -1
        self._position = 0

    def _locate(self) -> Segment | None:
        """The segment holding ``offset`` and the file position there, found from the
        sparse index, then by skipping record headers."""
        log_ = self.log
        if self.offset < log_.first_offset:  # its segment was deleted: move on
            self.offset = log_.first_offset
            self._segment_base = -1
        seg = log_.segment_for(self.offset)
        if seg is None:
            return None
        if seg.base == self._segment_base:
            return seg
        offset, position = seg.position_at_or_before(self.offset)
        while offset < self.offset and position < seg.size:
            # the headers between the index entry and the record, a block at a time
            block = os.pread(seg.fd, min(SCAN_BYTES, seg.size - position), position)
            at = 0
            while offset < self.offset and at + RECORD_SIZE <= len(block):
                at += RECORD_SIZE + RECORD.unpack_from(block, at)[1]
                offset += 1
            if at == 0:  # not even a header there: the file is shorter than noted
                raise StreamLogError(f"segment {seg.base}: no record header at position "
                                     f"{position} (looking for offset {self.offset})")
            position += at
        self._segment_base = seg.base
        self._position = position
        return seg

    def where(self) -> tuple[int, int]:
        """The segment (its base offset, -1: not located yet) and file position of the
        next record, for :meth:`seek`."""
        return self._segment_base, self._position

    def seek(self, offset: int, segment_base: int, position: int) -> None:
        """Move to ``offset``, which another reader found at ``position`` in the segment
        starting at ``segment_base`` (its :meth:`where` then): no index lookup."""
        self.offset = offset
        self._segment_base = segment_base
        self._position = position

    def bytes_to_end(self) -> int | None:
        """Bytes between this reader and the end of the active segment, when it is
        positioned there; None when it is elsewhere (or not yet positioned)."""
        last = self.log.segments[-1]
        return last.size - self._position if self._segment_base == last.base else None

    def read(self, max_records: int, max_bytes: int = READ_BYTES) -> list[Record]:
        """Up to ``max_records`` readable records from ``offset`` on, in order (preads of
        about ``max_bytes``); the reader moves past them."""
        out: list[Record] = []
        while len(out) < max_records:
            data, n = self.read_raw(max_records - len(out), max_bytes)
            if not n:
                break
            out.extend(parse_records(data))
        return out

    def read_raw(self, max_records: int, max_bytes: int = READ_BYTES,
                 cached: bytearray | None = None) -> tuple[bytes, int]:
        """The next whole records as they are stored (headers and payloads, see
        :func:`parse_records`) and how many: at most ``max_records``, from one pread of
        about ``max_bytes`` within one segment (a record larger than that comes whole);
        (b"", 0) when nothing is readable. The reader moves past them. A reader that
        forwards records as bytes (the stream protocol's chunks) takes this and never
        builds a :class:`Record` per message.

        With ``cached`` (a scratch buffer of at least ``max_bytes``) the read must not
        wait for the disk: it takes only what the page cache holds (``preadv`` with
        ``RWF_NOWAIT``, into ``cached``), and answers (b"", -1) without moving when not
        one whole record is there, or when the platform cannot tell (then every later
        call on this log answers so at once): the caller reads in a worker instead."""
        seg = self._readable_segment()
        if seg is None:
            return b"", 0
        want = min(max_bytes, seg.size - self._position)
        if cached is None:
            data = os.pread(seg.fd, want, self._position)
        else:
            got = _read_cached(self.log, seg.fd, cached, want, self._position)
            if got <= 0:
                return b"", -1
            data = bytes(memoryview(cached)[:got])
        size = len(data)
        at = n = 0
        while n < max_records and at + RECORD_SIZE <= size:
            # the payload length, 4 bytes in (byte reads: no struct call per record)
            end = at + RECORD_SIZE + ((data[at + 4] << 24) | (data[at + 5] << 16)
                                      | (data[at + 6] << 8) | data[at + 7])
            if end > size:
                break
            at = end
            n += 1
        if n == 0:  # one record bigger than the read: read it whole
            if cached is not None or size < RECORD_SIZE:
                return (b"", -1) if cached is not None else (b"", 0)
            data = os.pread(seg.fd, RECORD_SIZE + _LENGTH.unpack_from(data, 4)[0],
                            self._position)
            at = size = len(data)
            n = 1
        if at < size:
            data = data[:at]
        self._position += at
        self.offset += n
        return data, n

    def peek_block(self, max_bytes: int = READ_BYTES) -> bytes:
        """The stored bytes from the reader's position on, as one pread of about
        ``max_bytes`` within one segment read them (b"" when nothing is readable),
        without moving: they begin with a whole record (one larger than the read is
        read whole) and may end inside one. For a reader that walks the records itself
        (the stream protocol's chunks), in one pass: it moves the reader past the
        records it took with :meth:`advance`."""
        seg = self._readable_segment()
        if seg is None:
            return b""
        data = os.pread(seg.fd, min(max_bytes, seg.size - self._position), self._position)
        if len(data) < RECORD_SIZE:
            return b""
        whole = RECORD_SIZE + ((data[4] << 24) | (data[5] << 16) | (data[6] << 8) | data[7])
        if whole > len(data):  # one record bigger than the read: read it whole
            data = os.pread(seg.fd, whole, self._position)
            if len(data) < whole:
                return b""
        return data

    def _readable_segment(self) -> Segment | None:
        """The segment holding the next readable record, the reader positioned in it
        (moving on past segments read to their end); None when nothing is readable."""
        log_ = self.log
        while self.offset < log_.flushed_offset:
            seg = self._locate()
            if seg is None:
                return None
            if self._position < seg.size:
                return seg
            if seg.end >= log_.flushed_offset or seg is log_.segments[-1]:
                return None
            self.offset = seg.end  # on to the next segment
            self._segment_base = -1
        return None

    def advance(self, records: int, size: int) -> None:
        """Move past ``records`` records of ``size`` bytes from the position
        :meth:`peek_block` read at."""
        self.offset += records
        self._position += size

    def records(self, until: int) -> Iterator[Record]:
        """Every readable record from ``offset`` up to (not including) ``until``."""
        while self.offset < until:
            batch = self.read(min(1024, until - self.offset))
            if not batch:
                return
            for record in batch:
                if record.offset >= until:
                    return
                yield record


__all__ = ["AMQP10", "CHUNK_START", "DEFAULT_SEGMENT_BYTES", "RECORD", "RECORD_SIZE", "Reader",
           "Record", "StreamLog", "StreamLogError", "encode_record", "parse_records"]
