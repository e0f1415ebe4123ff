"""Frame splitting: received bytes in, complete frames found in place. No sockets here.

A frame on the wire::

    +------+---------+----------+-------------+-----------+
    | type | channel |   size   |   payload   | frame-end |
    |  u8  |   u16   |   u32    | size octets |   0xCE    |
    +------+---------+----------+-------------+-----------+

The reader keeps the received bytes (usually one socket read, as it came) and says where
each complete frame ends; the connection reads the frames in place, so a read of 64 KiB
full of small publishes costs no tuple and no slice per frame, only the property and body
bytes each message keeps. "Need more bytes" is simply -1 (or an empty list from
:meth:`FrameReader.feed`): it must never be confused with a malformed frame, which raises
:class:`FrameError` (501).
"""

from __future__ import annotations

from typing import Final

from amqpd.protocol.constants import FRAME_BODY, FRAME_END, FRAME_HEARTBEAT
from amqpd.protocol.errors import FrameError

FRAME_END_BYTE: Final = bytes((FRAME_END,))
FRAME_OVERHEAD: Final = 8  # 7-byte header + frame-end
PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"

HEARTBEAT_FRAME: Final = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))

Frame = tuple[int, int, bytes]


class FrameReader:
    """Holds received bytes and finds the complete frames in them.

    ``frame_max`` is the negotiated maximum frame size *including* the 8 bytes of
    overhead (AMQP's definition); before tune it is the pre-handshake limit.

    The connection walks :attr:`data` itself, from :attr:`pos`, with :meth:`frame_end`:
    a publish (method, header, body) is read straight out of the buffer, so no tuple and
    no payload slice is made for frames whose payload is only looked at in place.
    :meth:`feed` is the simple interface (a list of ``(type, channel, payload)``).
    """

    __slots__ = ("data", "frame_max", "pos", "salvaged")

    def __init__(self, frame_max: int) -> None:
        self.data = b""  # received bytes; everything before ``pos`` is handled
        self.pos = 0
        self.frame_max = frame_max
        # On FrameError in feed(): the complete frames before the bad one, to be handled.
        self.salvaged: list[Frame] = []

    def append(self, data: bytes) -> None:
        """Add received bytes (and drop the handled ones).

        Usually a read starts on a frame boundary and everything before it was handled,
        so ``data`` simply becomes the buffer: no copy.
        """
        pos = self.pos
        if pos < len(self.data):
            self.data = self.data[pos:] + data
        else:
            self.data = data
        self.pos = 0

    def clear(self) -> None:
        self.data = b""
        self.pos = 0

    def frame_end(self, pos: int, strict: bool = True) -> int:
        """Index of the frame-end octet of the complete frame at ``pos``, -1 if it is
        not all here yet; a malformed frame raises :class:`FrameError` (501), or gives
        -1 when not ``strict`` (a look-ahead that will meet the frame again later).

        RabbitMQ 3.10 refuses only payloads larger than frame_max itself (8 octets more
        than the spec allows) and clients rely on it, so the same leniency applies here.
        The size is checked as soon as the header is in, not once the frame is complete.
        """
        buf = self.data
        end = len(buf)
        if end - pos < 7:
            return -1
        size = (buf[pos + 3] << 24) | (buf[pos + 4] << 16) | (buf[pos + 5] << 8) | buf[pos + 6]
        limit = self.frame_max
        if limit and size > limit:
            if not strict:
                return -1
            raise FrameError(
                f"frame size {size + FRAME_OVERHEAD} exceeds negotiated frame_max "
                f"{self.frame_max}"
            )
        stop = pos + 7 + size
        if stop >= end:
            return -1
        ftype = buf[pos]
        if buf[stop] != FRAME_END or not ftype or (
                ftype > FRAME_BODY and ftype != FRAME_HEARTBEAT):
            if not strict:
                return -1
            if buf[stop] != FRAME_END:
                raise FrameError(f"invalid frame end byte 0x{buf[stop]:02x} (expected 0xce)")
            raise FrameError(f"unknown frame type {ftype}")
        return stop

    def feed(self, data: bytes) -> list[Frame]:
        """Append ``data`` and return every complete frame now available."""
        self.append(data)
        buf = self.data
        frames: list[Frame] = []
        pos = 0
        try:
            while True:
                stop = self.frame_end(pos)
                if stop < 0:
                    break
                frames.append((buf[pos], (buf[pos + 1] << 8) | buf[pos + 2],
                               buf[pos + 7:stop]))
                pos = stop + 1
        except FrameError:
            self.pos = pos
            self.salvaged = frames
            raise
        self.pos = pos
        return frames

    @property
    def buffered(self) -> int:
        return len(self.data) - self.pos
