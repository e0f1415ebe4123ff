"""The delivery journal: what a crash must not forget about deliveries.

A consumer uses the redelivered flag to decide whether to look for a duplicate, so
every message that may have reached a consumer before a crash must come back with
redelivered=true. DELIVERED records in the log are not enough for that: the broker
gathers them per tick and the writer thread writes them some time later, while the
delivery itself leaves on the socket at the end of the tick. A kill -9 in between
(seen: up to 171 messages per crash) loses the marks of messages that did go out.

So before a message of a stored queue is handed out, the log's loop thread makes a
*promise* here, synchronously, with one ``write(2)`` (the kernel keeps it across a
kill -9; it is not fsync'd, so a power loss may still lose the last promises): "in
queue Q, every message up to log position U may have been delivered". U is chosen a
little ahead (``AHEAD`` bytes of log past the message, never past the log's end), so
a consumer draining a backlog costs one write per ``AHEAD`` bytes of log and one that
keeps up costs at most one per tick and queue. On recovery after a crash, each
recovered message at or below its queue's promise comes back redelivered: a message
never delivered may get the flag too (only within the window), one delivered never
misses it. A clean close has exact DELIVERED records in the log and removes the file.

Layout: records back to back, each ``crc32 u32 | name_len u16 | name | upto i64``
(little-endian; crc over everything after it). A torn last record is ignored. When the
file passes ``ROTATE_BYTES`` it is replaced by one holding only the latest promise of
each queue (every promise covers all earlier positions, so nothing is lost).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from pathlib import Path

log = logging.getLogger("amqpd.store")

FILE_NAME = "delivered.journal"
AHEAD = 1 << 20  # bytes of log a promise reaches past the message being delivered
ROTATE_BYTES = 1 << 20
_HEAD = struct.Struct("<IH")
_I64 = struct.Struct("<q")


def _record(queue: str, upto: int) -> bytes:
    raw = queue.encode()
    body = struct.pack("<H", len(raw)) + raw + _I64.pack(upto)
    return struct.pack("<I", zlib.crc32(body)) + body


def read(directory: Path) -> dict[str, int]:
    """The latest promise per queue in the journal (empty if there is none)."""
    try:
        data = (directory / FILE_NAME).read_bytes()
    except FileNotFoundError:
        return {}
    out: dict[str, int] = {}
    off = 0
    while off + _HEAD.size <= len(data):
        crc, n = _HEAD.unpack_from(data, off)
        end = off + _HEAD.size + n + 8
        if end > len(data) or zlib.crc32(data[off + 4 : end]) != crc:
            log.warning("delivery journal: ignoring %d bytes of torn tail", len(data) - off)
            break
        try:
            name = data[off + 6 : off + 6 + n].decode()
        except UnicodeDecodeError:
            break
        (upto,) = _I64.unpack_from(data, end - 8)
        out[name] = max(upto, out.get(name, -1))
        off = end
    return out


class DeliveryJournal:
    """Promises made by the loop thread; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self.promised: dict[str, int] = {}
        self._fd: int | None = None
        self._size = 0
        self.writes = 0

    def open(self) -> None:
        """Start a fresh journal (recovery has read the old one) holding the promises
        still standing (none at start-up; those of this run after a re-open)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                           0o644)
        data = b"".join(_record(q, u) for q, u in self.promised.items())
        if data:
            os.write(self._fd, data)
        self._size = len(data)

    def promise(self, queue: str, position: int, log_end: int) -> None:
        """Message ``position`` of ``queue`` is about to be delivered."""
        if position <= self.promised.get(queue, -1) or self._fd is None:
            return
        upto = min(position + AHEAD, log_end)
        if upto < position:
            upto = position
        rec = _record(queue, upto)
        try:
            os.write(self._fd, rec)
        except OSError as exc:  # a failing disk: the store's own alarm handles it
            log.warning("delivery journal not written: %s", exc)
            return
        self.writes += 1
        self.promised[queue] = upto
        self._size += len(rec)
        if self._size >= ROTATE_BYTES:
            self._rotate()

    def forget(self, queue: str) -> None:
        """The queue was deleted: no promise of it is needed any more."""
        self.promised.pop(queue, None)

    def _rotate(self) -> None:
        data = b"".join(_record(q, u) for q, u in self.promised.items())
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)

    def close(self, *, remove: bool) -> None:
        """Close; ``remove`` after a clean close (the log then has exact marks)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
