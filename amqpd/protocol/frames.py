"""Frame splitting: bytes in, ``(type, channel, payload)`` tuples out. No sockets here.

A frame on the wire::

    +------+---------+----------+-------------+-----------+
    | type | channel |   size   |   payload   | frame-end |
    |  u8  |   u16   |   u32    | size octets |   0xCE    |
    +------+---------+----------+-------------+-----------+

The reader keeps one growing ``bytearray`` and scans every complete frame in it in one
call, so a socket read of 64 KiB full of small publishes costs one call, not one per frame.
"Need more bytes" is simply an empty result: it must never be confused with a malformed
frame, which raises :class:`FrameError` (501).
"""

from __future__ import annotations

import struct

from amqpd.protocol.constants import FRAME_BODY, FRAME_END, FRAME_HEARTBEAT
from amqpd.protocol.errors import FrameError

FRAME_END_BYTE = bytes((FRAME_END,))
FRAME_OVERHEAD = 8  # 7-byte header + frame-end
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

_HEADER = struct.Struct(">BHI")
HEARTBEAT_FRAME = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))

Frame = tuple[int, int, bytes]


class FrameReader:
    """Accumulates bytes and yields complete frames.

    ``frame_max`` is the negotiated maximum frame size *including* the 8 bytes of
    overhead (AMQP's definition); before tune it is the pre-handshake limit.
    """

    __slots__ = ("_buf", "frame_max", "salvaged")

    def __init__(self, frame_max: int) -> None:
        self._buf = b""
        self.frame_max = frame_max
        # On FrameError: the complete frames that preceded the bad one, still to be handled.
        self.salvaged: list[Frame] = []

    def feed(self, data: bytes) -> list[Frame]:
        """Append ``data`` and return every complete frame now available.

        Works on immutable bytes: usually the read starts on a frame boundary, so frames
        are sliced straight out of ``data`` (one allocation each) and only a partial
        last frame is kept for the next call.
        """
        buf = self._buf + data if self._buf else data
        frames: list[Frame] = []
        append = frames.append
        pos = 0
        end = len(buf)
        unpack = _HEADER.unpack_from
        # RabbitMQ 3.10 refuses only payloads larger than frame_max itself (8 octets more
        # than the spec allows) and clients rely on it, so the same leniency applies here.
        limit = self.frame_max or 0xFFFFFFFF
        while end - pos >= 7:
            ftype, channel, size = unpack(buf, pos)
            stop = pos + 7 + size
            if size > limit:
                self._fail(buf, pos, frames)
                raise FrameError(
                    f"frame size {size + FRAME_OVERHEAD} exceeds negotiated frame_max "
                    f"{self.frame_max}"
                )
            if stop >= end:
                break
            if buf[stop] != FRAME_END or not ftype or (
                    ftype > FRAME_BODY and ftype != FRAME_HEARTBEAT):
                self._fail(buf, pos, frames)
                if buf[stop] != FRAME_END:
                    raise FrameError(
                        f"invalid frame end byte 0x{buf[stop]:02x} (expected 0xce)"
                    )
                raise FrameError(f"unknown frame type {ftype}")
            append((ftype, channel, buf[pos + 7 : stop]))
            pos = stop + 1
        self._buf = buf[pos:] if pos < end else b""
        return frames

    def _fail(self, buf: bytes, pos: int, frames: list[Frame]) -> None:
        self._buf = buf[pos:]
        self.salvaged = frames

    @property
    def buffered(self) -> int:
        return len(self._buf)
