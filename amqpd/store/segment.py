"""One segment file of the shared log: ``<base:020d>.log``.

``base`` is the global log position of the file's byte 0, so a position maps to
(segment, offset) with one bisect and the file name alone says where a file sits in
the log (Kafka's ``[base_offset].log``). Segments are "fixed-size-ish": the log rolls
to a new file once the next record would cross ``segment_size``, but a single record
larger than that still goes whole into one file.

Threading: only the writer thread calls :meth:`append`, :meth:`truncate` and
:meth:`fsync`; any thread may call :meth:`read` (``os.pread`` needs no shared file
offset). Writes use ``os.pwrite`` at an explicit offset so that a failed write can be
cut back with ``ftruncate`` and retried at the same place.
"""

from __future__ import annotations

import os
from pathlib import Path

from amqpd.store import format as fmt

SUFFIX = ".log"


def segment_name(base: int) -> str:
    return f"{base:020d}{SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The base of a segment file name, or None if the name is not one of ours."""
    if not name.endswith(SUFFIX):
        return None
    stem = name[: -len(SUFFIX)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def fsync_directory(directory: Path) -> None:
    """Make file creations/renames/unlinks in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """An open segment file. ``size`` is the number of bytes written so far."""

    __slots__ = ("base", "fd", "path", "size")

    def __init__(self, path: Path, base: int, fd: int, size: int) -> None:
        self.path = path
        self.base = base
        self.fd = fd
        self.size = size

    @classmethod
    def create(cls, directory: Path, base: int) -> Segment:
        """Create a new file holding just the file header (not yet fsync'd)."""
        path = directory / segment_name(base)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg = cls(path, base, fd, 0)
        try:
            seg.append(fmt.file_header())
        except BaseException:
            # No header-less file may stay behind to confuse recovery.
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return seg

    @classmethod
    def open(cls, path: Path, base: int) -> Segment:
        """Open an existing (already recovered) file for reads and appends."""
        fd = os.open(path, os.O_RDWR)
        return cls(path, base, fd, os.fstat(fd).st_size)

    @property
    def end(self) -> int:
        """Global position just past the last written byte."""
        return self.base + self.size

    def append(self, data: bytes) -> None:
        """Write ``data`` at the end. On error the file is cut back to its old size
        (best effort) so no half record stays behind, and the error propagates."""
        start = self.size
        view = memoryview(data)
        done = 0
        try:
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], start + done)
        except BaseException:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass  # recovery recognises the torn record by its length/CRC
            raise
        self.size = start + done

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at file ``offset`` (short only at end of file)."""
        return os.pread(self.fd, size, offset)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size

    def fsync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unlink(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
