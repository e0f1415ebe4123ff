"""Rebuild the live index at startup: checkpoint + replay of the tail.

Theory of operation::

    segments:  [ 0000...0000.log ][ 0000...6710.log ][ ...active... ]
                                        ^ covered (CHECKPOINT record)
    1. load ``checkpoint`` (index as of ``covered``); check that the log really has
       a CHECKPOINT record at ``covered``, else ignore the file (full replay)
    2. replay every record from ``covered`` (or from the first segment) to the end,
       CRC-checking each one
    3. the first torn or corrupt record ends its segment: the file is truncated there
       and the loss is logged with its size; replay goes on with the next segment
       (segments are self-describing by name, and a later segment can only exist
       because the writer rolled after a write error, so it holds later records)
    4. forget index entries whose segment file is gone (cannot happen unless files
       were removed by hand; logged as an error)
    5. a full replay over a log with a hole (segments deleted between survivors, and
       the checkpoint lost): settles are carried forward on deletion (index.py), but
       to be safe with logs from before that, messages before the hole come back
       marked redelivered, with a warning

Durable definitions come back the same way: the checkpoint's snapshot of them, then
every DEFINITION record after ``covered`` applied in log order. A DEFINITION record is
one CRC-checked unit, so a torn one is cut with the tail and none of its changes apply.

Restart time is therefore bounded by ``checkpoint_every_bytes`` of replay plus a
memcpy of the checkpoint arrays, not by history. Records *before* ``covered`` are not
read, so damage there is only found when the message is read (``read`` raises
StoreError) - the same trade Kafka makes for flushed segments.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from amqpd.store import checkpoint
from amqpd.store import format as fmt
from amqpd.store.api import StoreError
from amqpd.store.defs import DefinitionState
from amqpd.store.index import LiveIndex
from amqpd.store.segment import parse_segment_name

log = logging.getLogger("amqpd.store")

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I64_U16 = struct.Struct("<qH")


@dataclass(slots=True)
class Recovered:
    index: LiveIndex
    segments: dict[int, Path]  # base -> file, after truncation
    end: int  # next free position
    sequence: int
    truncated_bytes: int
    replayed_bytes: int
    covered: int  # checkpoint position used, -1 for a full replay
    definitions: DefinitionState


def _list_segments(directory: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for path in directory.iterdir():
        base = parse_segment_name(path.name)
        if base is not None and path.is_file():
            found[base] = path
    return dict(sorted(found.items()))


def _checkpoint_is_in_log(segments: dict[int, Path], covered: int) -> bool:
    """A checkpoint is trusted only if its CHECKPOINT marker is in the log."""
    owner = None
    for base in segments:
        if base <= covered:
            owner = base
    if owner is None:
        return False
    with open(segments[owner], "rb") as f:
        f.seek(covered - owner)
        data = f.read(fmt.HEADER_SIZE + 8)
    try:
        rtype, _, p, e = fmt.decode_record(data, 0)
        return rtype == fmt.CHECKPOINT and fmt.decode_checkpoint(data[p:e]) == covered
    except fmt.FormatError:
        return False


def recover(directory: Path) -> Recovered:
    segments = _list_segments(directory)
    truncated = 0
    for base, path in list(segments.items()):
        size = path.stat().st_size
        if size < fmt.FILE_HEADER_SIZE:
            # Created but its header never made it: no records can be in it.
            log.warning("removing %s: %d bytes, shorter than a segment header", path, size)
            truncated += size
            path.unlink()
            del segments[base]

    loaded = checkpoint.load(directory)
    covered = -1
    sequence = 0
    index = LiveIndex()
    defs = DefinitionState()
    if loaded is not None:
        cp, cindex = loaded
        if _checkpoint_is_in_log(segments, cp.covered):
            index, covered, sequence = cindex, cp.covered, cp.sequence
            defs.apply(cp.definitions)
        else:
            log.warning(
                "checkpoint at %d has no matching record in the log; replaying everything",
                cp.covered,
            )
    for base in segments:
        index.add_segment(base)

    replayed = 0
    for base, path in list(segments.items()):
        size = path.stat().st_size
        if base + size <= covered:
            continue
        data = path.read_bytes()
        try:
            fmt.check_file_header(data)
        except fmt.FormatError as exc:
            log.warning("removing %s (%d bytes): %s", path, len(data), exc)
            truncated += len(data)
            path.unlink()
            del segments[base]
            index.remove_segment(base)
            continue
        except ValueError as exc:
            raise StoreError(f"{path}: {exc}") from None
        start = max(covered - base, fmt.FILE_HEADER_SIZE)
        good, seq = _replay(data, start, base, index, defs)
        sequence = max(sequence, seq)
        replayed += good - start
        if good < len(data):
            lost = len(data) - good
            truncated += lost
            log.warning(
                "truncating %s at offset %d: dropped %d bytes of torn/corrupt log tail",
                path,
                good,
                lost,
            )
            with open(path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())

    _forget_missing_segments(index, segments)
    if covered < 0:
        _mark_before_gaps(index, segments)
    if segments:
        last = next(reversed(segments))
        end = last + segments[last].stat().st_size
    else:
        end = 0
    if covered >= 0:
        end = max(end, covered + fmt.HEADER_SIZE + 8)
    return Recovered(index, segments, end, sequence, truncated, replayed, covered, defs)


def _replay(data: bytes, offset: int, base: int, index: LiveIndex,
            defs: DefinitionState) -> tuple[int, int]:
    """Apply records from ``offset``; return (offset of the first bad byte, last seq)."""
    size = len(data)
    view = memoryview(data)
    decode_record = fmt.decode_record
    u16 = _U16.unpack_from
    qcache: dict[bytes, list[str]] = {}
    seq = 0
    while offset < size:
        try:
            rtype, seq_here, p, e = decode_record(view, offset)
            if rtype == fmt.ENQUEUE or rtype == fmt.ENQUEUE_META:
                stamp = extra = 0
                if rtype == fmt.ENQUEUE_META:
                    flags, prio, published, expires = fmt.decode_meta(view[:e], p)
                    stamp = published << 1 | (flags & fmt.FLAG_TRANSIENT)
                    extra = expires << 8 | prio
                    p += fmt.META_SIZE
                origin, n = _I64_U16.unpack_from(view, p)
                q = p + 10
                for _ in range(n):
                    q += 2 + u16(view, q)[0]
                raw = bytes(view[p + 10 : q])
                queues = qcache.get(raw)
                if queues is None:
                    queues = qcache[raw] = fmt.decode_enqueue_index(view, p, e)[1]
                q += 2 + u16(view, q)[0]  # exchange
                q += 2 + u16(view, q)[0]  # routing key
                q += 4 + _U32.unpack_from(view, q)[0]  # properties
                if q > e:
                    raise fmt.CorruptRecord("ENQUEUE fields run past the payload")
                if origin == 0:
                    index.enqueue(queues, base + offset, e - q, base, stamp, extra)
                else:
                    index.relocate(origin, queues, base + offset, e - q, base, stamp, extra)
            elif rtype == fmt.SETTLE:
                queue, positions = fmt.decode_settle(view[p:e])
                index.note_carry(base, queue, positions)
                index.settle(queue, positions)
            elif rtype == fmt.DELIVERED:
                queue, positions = fmt.decode_delivered(view[p:e])
                for position in positions:
                    index.delivered(queue, position)
            elif rtype == fmt.DROP_QUEUE:
                _drop_carrying(index, base, fmt.decode_drop_queue(view[p:e]))
            elif rtype == fmt.DEFINITION:
                for queue in defs.apply(fmt.decode_definition(view[p:e])):
                    _drop_carrying(index, base, queue)
        except (fmt.FormatError, struct.error, UnicodeDecodeError):
            break
        seq = seq_here
        offset = e
    return offset, seq


def _mark_before_gaps(index: LiveIndex, segments: dict[int, Path]) -> None:
    """A full replay (no usable checkpoint) over a log with a hole: segments deleted
    between surviving ones may have held SETTLE and DELIVERED records of messages that
    lie before the hole. Settles are carried forward when a segment is deleted (see
    index.py), but a log written before that existed did not; so every message before
    the last hole comes back marked redelivered, and the start-up log says so."""
    bases = list(segments)
    hole = -1
    for here, after in itertools.pairwise(bases):
        if here + segments[here].stat().st_size < after:
            hole = after
    if hole < 0:
        return
    marked = 0
    for q in index.queues.values():
        for position in q.range(-1, hole):
            if position not in q.delivered:
                q.delivered.add(position)
                marked += 1
    if marked:
        log.warning(
            "no usable checkpoint and segments before %d were deleted: their settle and "
            "delivery records may be gone, so %d messages stored before it come back "
            "marked redelivered", hole, marked)


def _forget_missing_segments(index: LiveIndex, segments: dict[int, Path]) -> None:
    stale = [b for b in index.bases if b not in segments]
    if not stale:
        return
    lost = sum(index.seg_live.get(b, 0) for b in stale)
    if lost:
        log.error("segments %s are gone but held %d live messages; dropping them", stale, lost)
        for name, q in list(index.queues.items()):
            gone = []
            for stable in q.live_positions():
                cur = index.current(stable)
                try:
                    if index.segment_of(cur) in stale:
                        gone.append(stable)
                except KeyError:
                    gone.append(stable)
            index.settle(name, gone)
    for b in stale:
        index.remove_segment(b)


def _drop_carrying(index: LiveIndex, base: int, name: str) -> None:
    """Drop a deleted queue's entries, first noting those in older segments as carried
    settles (index.py), so a later loss of the checkpoint cannot bring them back."""
    dq = index.queues.get(name)
    if dq is not None:
        index.note_carry(base, name, [x for x in dq.live_positions() if x < base])
    index.drop(name)
