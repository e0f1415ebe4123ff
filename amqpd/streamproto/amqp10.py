"""Just enough of the AMQP 1.0 message format for one store shared by both protocols.

Stream clients publish AMQP 1.0 encoded messages (sections: header, properties,
application-properties, data / amqp-value ...). A stream keeps them as they came, so a
stream client reads back exactly what was published; an AMQP 0-9-1 consumer of the
same stream gets the message's body (its data sections, or a binary/string
amqp-value) as the body. The other way round, a message published over AMQP 0-9-1 is
read by stream clients as a message of one data section holding its body.

The sections are walked with the format's self-describing constructors (the high
nibble of a constructor gives the width of its value), so no value is decoded that
is not needed.
"""

from __future__ import annotations

import struct

DATA = 0x75
AMQP_VALUE = 0x77
_U32 = struct.Struct(">I")


class AMQP10Error(ValueError):
    """Bytes that are not an AMQP 1.0 message."""


def _skip(data: bytes, at: int) -> int:
    """The position after the value whose constructor is at ``at``."""
    if at >= len(data):
        raise AMQP10Error("message ends inside a value")
    code = data[at]
    at += 1
    if code == 0x00:  # described: the descriptor, then the value
        return _skip(data, _skip(data, at))
    width = code >> 4
    if width == 0x4:
        return at
    if width in (0x5, 0x6, 0x7, 0x8, 0x9):
        size = {0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}[width]
    elif width in (0xA, 0xC, 0xE):
        if at >= len(data):
            raise AMQP10Error("message ends inside a size")
        size = 1 + data[at]
    elif width in (0xB, 0xD, 0xF):
        if at + 4 > len(data):
            raise AMQP10Error("message ends inside a size")
        size = 4 + _U32.unpack_from(data, at)[0]
    else:
        raise AMQP10Error(f"unknown constructor 0x{code:02x}")
    if at + size > len(data):
        raise AMQP10Error("message ends inside a value")
    return at + size


def _payload(data: bytes, at: int) -> bytes | None:
    """The bytes of a binary, string or symbol value at ``at`` (None for other types)."""
    code = data[at]
    if code in (0xA0, 0xA1, 0xA3):
        return data[at + 2:at + 2 + data[at + 1]]
    if code in (0xB0, 0xB1, 0xB3):
        n = _U32.unpack_from(data, at + 1)[0]
        return data[at + 5:at + 5 + n]
    return None


def body_of(message: bytes) -> bytes:
    """The body an AMQP 0-9-1 consumer gets: the data sections joined, or an
    amqp-value that is binary or a string; empty for anything else."""
    parts: list[bytes] = []
    at = 0
    while at < len(message):
        if message[at] != 0x00:
            raise AMQP10Error("a section is not a described value")
        start = at
        at = _skip(message, at)
        # the descriptor is a smallulong (0x53 code) or ulong (0x80 ...)
        if message[start + 1] == 0x53:
            code, value_at = message[start + 2], start + 3
        elif message[start + 1] == 0x80:
            code, value_at = message[start + 9], start + 10
        else:
            continue
        if code in (DATA, AMQP_VALUE):
            value = _payload(message, value_at)
            if value is not None:
                parts.append(value)
    return b"".join(parts)


def data_message(body: bytes) -> bytes:
    """An AMQP 1.0 message of one data section holding ``body``."""
    if len(body) < 256:
        return b"\x00\x53\x75\xa0" + bytes((len(body),)) + body
    return b"\x00\x53\x75\xb0" + _U32.pack(len(body)) + body


__all__ = ["AMQP10Error", "body_of", "data_message"]
