"""The end of a closed log: where it stops (``scan_tail``) and cutting it (``truncate_after``).

Replication (amqpd/replication/) needs both without opening the log (no recovery, no
writer thread): a standby says which sequence it holds and where its log ends before it
follows an active, and a node that returns after losing leadership cuts the tail the
new active never had (those records were never confirmed: a confirm waits for the
in-sync standbys, and the new active was one). Only whole, CRC-valid records count: a
torn record at the end is cut off here as recovery would cut it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from amqpd.store import checkpoint
from amqpd.store import format as fmt
from amqpd.store.segment import fsync_directory, parse_segment_name

log = logging.getLogger("amqpd.store")


@dataclass(frozen=True)
class Tail:
    last_seq: int  # sequence of the last whole record (0: none)
    base: int  # base of the last segment (0 with no segment)
    size: int  # its size up to the end of its last whole record (0: no segment)


def segments(directory: Path) -> dict[int, Path]:
    """base -> path of every segment file, in log order."""
    found: dict[int, Path] = {}
    if directory.is_dir():
        for entry in directory.iterdir():
            base = parse_segment_name(entry.name)
            if base is not None:
                found[base] = entry
    return dict(sorted(found.items()))


def _walk(data: bytes) -> tuple[int, int, int]:
    """(last seq, end of the last whole record, first seq) of one segment's bytes."""
    if len(data) < fmt.FILE_HEADER_SIZE:
        return 0, 0, 0
    try:
        fmt.check_file_header(data)
    except (fmt.FormatError, ValueError):
        return 0, 0, 0
    off, last, first = fmt.FILE_HEADER_SIZE, 0, 0
    while off < len(data):
        try:
            _, seq, _, end = fmt.decode_record(data, off)
        except fmt.FormatError:
            break
        last, off = seq, end
        first = first or seq
    return last, off, first


def scan_tail(directory: Path, *, repair: bool = False) -> Tail:
    """Where the log in ``directory`` ends. With ``repair``, torn bytes after the last
    whole record of the last segment are cut off (and files too short to hold a segment
    header removed), so appending at ``size`` continues the log exactly."""
    segs = segments(directory)
    bases = list(segs)
    last_seq = 0
    for base in reversed(bases):
        path = segs[base]
        data = path.read_bytes()
        seq, end, _ = _walk(data)
        if base == bases[-1]:
            if end == 0:
                if repair:
                    path.unlink()
                    bases.pop()
                continue
            if repair and end < len(data):
                log.warning("replication: cutting %d torn bytes at the end of %s",
                            len(data) - end, path)
                _truncate(path, end)
        if seq:
            last_seq = seq
            break
    if not bases:
        return Tail(0, 0, 0)
    last = bases[-1]
    size = segs[last].stat().st_size
    return Tail(last_seq, last, size)


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())


def truncate_after(directory: Path, seq: int) -> int:
    """Cut every record with a sequence number above ``seq``; return the bytes cut.

    The store must be closed. A checkpoint that covers a cut record is removed (the
    next start replays the whole log instead), and segments that only held cut records
    are deleted. Never cuts at or below ``seq``."""
    cut = 0
    segs = segments(directory)
    cut_at: int | None = None  # global position where the kept log ends
    for base, path in segs.items():
        if cut_at is not None:
            cut += path.stat().st_size
            path.unlink()
            continue
        data = path.read_bytes()
        last, end, first = _walk(data)
        if first and first > seq:
            cut_at = base
            cut += len(data)
            path.unlink()
            continue
        if last <= seq:
            continue
        off = fmt.FILE_HEADER_SIZE
        while off < end:
            _, rseq, _, rend = fmt.decode_record(data, off)
            if rseq > seq:
                break
            off = rend
        cut_at = base + off
        cut += len(data) - off
        _truncate(path, off)
    if cut_at is not None:
        loaded = checkpoint.load(directory)
        if loaded is not None and loaded[0].covered >= cut_at:
            (directory / checkpoint.FILE_NAME).unlink()
            log.warning("replication: removed the checkpoint at %d, past the cut at %d",
                        loaded[0].covered, cut_at)
        fsync_directory(directory)
        log.warning("replication: cut %d bytes of log after sequence %d (a tail the active "
                    "never had: never confirmed)", cut, seq)
    return cut
