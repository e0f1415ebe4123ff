"""The RabbitMQ Stream protocol's frames, sans-IO: bytes in, decoded commands out.

The wire format is RabbitMQ's ``deps/rabbitmq_stream/docs/PROTOCOL.adoc`` (the plugin
of 3.10.8): a frame is ``size u32`` then ``key u16 | version u16`` then the command's
fields, all big-endian; strings are ``i16`` length + UTF-8 (-1: null), bytes ``i32``
length + content, arrays ``i32`` count + items. A response sets the key's top bit.

:class:`FrameReader` cuts a byte stream into frames and refuses a frame larger than the
negotiated maximum before buffering it; :func:`decode` turns one frame into a
:class:`Command` whose ``fields`` are the command's values in the order the spec lists
them, or raises :class:`FrameError` with the response code the server answers (or the
reason it closes). Encoding the server's frames is :class:`Writer` plus one function
per frame the server sends. Nothing here knows the broker.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

# command keys (PROTOCOL.adoc "Commands")
DECLARE_PUBLISHER: Final = 0x01
PUBLISH: Final = 0x02
PUBLISH_CONFIRM: Final = 0x03
PUBLISH_ERROR: Final = 0x04
QUERY_PUBLISHER_SEQUENCE: Final = 0x05
DELETE_PUBLISHER: Final = 0x06
SUBSCRIBE: Final = 0x07
DELIVER: Final = 0x08
CREDIT: Final = 0x09
STORE_OFFSET: Final = 0x0A
QUERY_OFFSET: Final = 0x0B
UNSUBSCRIBE: Final = 0x0C
CREATE: Final = 0x0D
DELETE: Final = 0x0E
METADATA: Final = 0x0F
METADATA_UPDATE: Final = 0x10
PEER_PROPERTIES: Final = 0x11
SASL_HANDSHAKE: Final = 0x12
SASL_AUTHENTICATE: Final = 0x13
TUNE: Final = 0x14
OPEN: Final = 0x15
CLOSE: Final = 0x16
HEARTBEAT: Final = 0x17
ROUTE: Final = 0x18
PARTITIONS: Final = 0x19
# RabbitMQ 3.11+: the server asks, the client answers (single active consumer)
CONSUMER_UPDATE: Final = 0x1A
EXCHANGE_COMMAND_VERSIONS: Final = 0x1B  # RabbitMQ 3.11+ (3.10.8's plugin does not know it)
CREATE_SUPER_STREAM: Final = 0x1D  # RabbitMQ 3.13+
DELETE_SUPER_STREAM: Final = 0x1E  # RabbitMQ 3.13+
RESPONSE: Final = 0x8000

# response codes (PROTOCOL.adoc "Response Codes")
OK: Final = 0x01
STREAM_DOES_NOT_EXIST: Final = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS: Final = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST: Final = 0x04
STREAM_ALREADY_EXISTS: Final = 0x05
STREAM_NOT_AVAILABLE: Final = 0x06
SASL_MECHANISM_NOT_SUPPORTED: Final = 0x07
AUTHENTICATION_FAILURE: Final = 0x08
SASL_ERROR: Final = 0x09
SASL_CHALLENGE: Final = 0x0A
AUTHENTICATION_FAILURE_LOOPBACK: Final = 0x0B
VIRTUAL_HOST_ACCESS_FAILURE: Final = 0x0C
UNKNOWN_FRAME: Final = 0x0D
FRAME_TOO_LARGE: Final = 0x0E
INTERNAL_ERROR: Final = 0x0F
ACCESS_REFUSED: Final = 0x10
PRECONDITION_FAILED: Final = 0x11
PUBLISHER_DOES_NOT_EXIST: Final = 0x12
NO_OFFSET: Final = 0x13  # query-offset for a reference with nothing stored (3.10's plugin)

# offset specifications of subscribe
OFFSET_FIRST: Final = 1
OFFSET_LAST: Final = 2
OFFSET_NEXT: Final = 3
OFFSET_OFFSET: Final = 4
OFFSET_TIMESTAMP: Final = 5

# osiris chunk header (PROTOCOL.adoc "Deliver"; osiris_log.erl)
CHUNK_MAGIC_VERSION: Final = 0x50  # magic 5, version 0
CHUNK_USER: Final = 0
CHUNK_HEADER: Final = struct.Struct(">BBHIqQQiIII")
CHUNK_HEADER_SIZE: Final = CHUNK_HEADER.size  # 48
MIN_FRAME_MAX: Final = 8  # a key, a version and a correlation id at least

_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_I16: Final = struct.Struct(">h")
_U32: Final = struct.Struct(">I")
_I32: Final = struct.Struct(">i")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")
_HEAD: Final = struct.Struct(">HH")


class FrameError(Exception):
    """A frame the server cannot take: ``code`` is the response code to answer with,
    ``close`` says whether the connection must end (a frame that cannot be answered)."""

    def __init__(self, message: str, code: int = UNKNOWN_FRAME, close: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.close = close


@dataclass(slots=True)
class Command:
    """One decoded client frame: key, version, correlation id (0 where the command has
    none) and the command's fields in the spec's order."""

    key: int
    version: int
    correlation_id: int
    fields: tuple[Any, ...]


class Reader:
    """Reads the protocol's types from one frame; running past its end is a FrameError."""

    __slots__ = ("at", "data")

    def __init__(self, data: bytes | memoryview, at: int = 0) -> None:
        self.data = data
        self.at = at

    def _take(self, st: struct.Struct) -> Any:
        if self.at + st.size > len(self.data):
            raise FrameError("frame ends inside a field")
        value = st.unpack_from(self.data, self.at)[0]
        self.at += st.size
        return value

    def u8(self) -> int:
        return int(self._take(_U8))

    def u16(self) -> int:
        return int(self._take(_U16))

    def u32(self) -> int:
        return int(self._take(_U32))

    def i32(self) -> int:
        return int(self._take(_I32))

    def u64(self) -> int:
        return int(self._take(_U64))

    def i64(self) -> int:
        return int(self._take(_I64))

    def raw(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise FrameError("frame ends inside a field")
        out = bytes(self.data[self.at:self.at + n])
        self.at += n
        return out

    def string(self) -> str | None:
        n = int(self._take(_I16))
        if n == -1:
            return None
        try:
            return self.raw(n).decode()
        except UnicodeDecodeError as exc:
            raise FrameError("a string is not UTF-8") from exc

    def text(self) -> str:
        """A string that must be there (null reads as empty)."""
        return self.string() or ""

    def bytes_(self) -> bytes | None:
        n = int(self._take(_I32))
        return None if n == -1 else self.raw(n)

    def count(self, item_size: int) -> int:
        """An array's count, refused when the frame cannot hold that many items."""
        n = int(self._take(_I32))
        if n < 0 or n * item_size > len(self.data) - self.at:
            raise FrameError(f"array of {n} items does not fit in the frame")
        return n

    def properties(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for _ in range(self.count(4)):
            key = self.text()
            out[key] = self.text()
        return out

    def end(self) -> None:
        if self.at != len(self.data):
            raise FrameError(f"{len(self.data) - self.at} bytes left over in the frame")


class FrameReader:
    """Cuts a byte stream into frames (without their size field)."""

    def __init__(self, frame_max: int = 0) -> None:
        self.frame_max = frame_max  # 0: no limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Every complete frame in the stream so far; FrameError (FRAME_TOO_LARGE) for a
        size beyond ``frame_max`` (nothing of it is buffered). With nothing held back
        from the last call (the usual case) the frames are cut from ``data`` itself,
        one copy each; only an incomplete frame's bytes are held."""
        buf = self._buffer
        if buf:
            buf += data
            out: list[bytes] = []
            at = 0
            while len(buf) - at >= 4:
                size = self._size(_U32.unpack_from(buf, at)[0])
                if len(buf) - at - 4 < size:
                    break
                out.append(bytes(buf[at + 4:at + 4 + size]))
                at += 4 + size
            del buf[:at]
            return out
        out = []
        at = 0
        total = len(data)
        while total - at >= 4:
            size = self._size(be32(data, at))
            if total - at - 4 < size:
                break
            out.append(data[at + 4:at + 4 + size])
            at += 4 + size
        if at < total:
            buf += memoryview(data)[at:]
        return out

    def _size(self, size: int) -> int:
        """A frame's size field, checked (the buffer is dropped when it is refused)."""
        if self.frame_max and size + 4 > self.frame_max:
            self._buffer = bytearray()
            raise FrameError(f"frame of {size + 4} bytes exceeds frame max "
                             f"{self.frame_max}", FRAME_TOO_LARGE)
        if size < 4:
            self._buffer = bytearray()
            raise FrameError(f"frame of {size} bytes holds no key and version")
        return size


def _declare_publisher(r: Reader) -> tuple[Any, ...]:
    return r.u8(), r.string(), r.text()


def be32(data: bytes, at: int) -> int:
    """The big-endian u32 at ``at`` (byte reads: in compiled code no call, no tuple)."""
    return (data[at] << 24) | (data[at + 1] << 16) | (data[at + 2] << 8) | data[at + 3]


def be64(data: bytes, at: int) -> int:
    """The big-endian u64 at ``at``."""
    return (be32(data, at) << 32) | be32(data, at + 4)


def _publish(r: Reader) -> tuple[Any, ...]:
    """(publisher id, [(publishing id, entry)]) where an entry is the message bytes, or
    for a sub-entry batch (top bit set) ``(compression, count, uncompressed, data)``.
    Plain entries are cut in one tight loop (every message of the frame crosses here:
    the general :class:`Reader` calls cost more than the rest of the publish)."""
    publisher = r.u8()
    entries: list[tuple[int, Any]] = []
    data = r.data
    size_all = len(data)
    for _ in range(r.count(12)):
        at = r.at
        if isinstance(data, bytes) and at + 12 <= size_all and data[at + 8] & 0x80 == 0:
            # a plain entry: publishing id, 0 bit + 31-bit size, the message
            end = at + 12 + be32(data, at + 8)
            if end > size_all:
                raise FrameError("frame ends inside a field")
            entries.append((be64(data, at), data[at + 12:end]))
            r.at = end
            continue
        publishing_id = r.u64()
        if r.at < size_all and not data[r.at] & 0x80:  # plain (a view, or cut short)
            entries.append((publishing_id, r.raw(r.u32())))
            continue
        kind = r.u8()  # 1 bit, 3-bit compression, 4 reserved; then count, sizes
        compression = (kind >> 4) & 0x7
        n = r.u16()
        uncompressed = r.u32()
        size = r.u32()
        entries.append((publishing_id, (compression, n, uncompressed, r.raw(size))))
    return publisher, entries


def split_plain(entries: list[tuple[int, Any]]) -> tuple[list[int], list[bytes], int] | None:
    """A publish frame's entries as (publishing ids, messages, highest id) when every
    entry is a plain message (the common frame); None when one is a sub-entry batch or
    there are none. One compiled loop: the publish path's own loops over a frame's
    entries ran interpreted, several per message."""
    ids: list[int] = []
    messages: list[bytes] = []
    highest = -1
    for publishing_id, entry in entries:
        if type(entry) is not bytes:
            return None
        ids.append(publishing_id)
        messages.append(entry)
        if publishing_id > highest:
            highest = publishing_id
    if not ids:
        return None
    return ids, messages, highest


def split_sub_batch(data: bytes, n: int) -> list[bytes]:
    """The ``n`` messages of an uncompressed sub-entry batch (each ``u32`` size first)."""
    r = Reader(data)
    out = [r.raw(r.u32()) for _ in range(n)]
    r.end()
    return out


def _subscribe(r: Reader) -> tuple[Any, ...]:
    sub = r.u8()
    stream = r.text()
    kind = r.u16()
    if kind in (OFFSET_OFFSET,):
        value: int | None = r.u64()
    elif kind == OFFSET_TIMESTAMP:
        value = r.i64()
    elif kind in (OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT):
        value = None
    else:
        raise FrameError(f"unknown offset specification {kind}", PRECONDITION_FAILED,
                         close=False)
    credit = r.u16()
    props = r.properties() if r.at < len(r.data) else {}
    return sub, stream, kind, value, credit, props


def _offset_answer(r: Reader) -> tuple[int, int | None]:
    """A consumer-update answer's offset specification: (type, value). The value is
    there for offset and timestamp; some clients (rstream) send 8 bytes of zeros after
    the other types too, which are read and dropped."""
    kind = r.u16()
    if kind == OFFSET_OFFSET:
        value: int | None = r.u64()
    elif kind == OFFSET_TIMESTAMP:
        value = r.i64()
    elif kind in (OFFSET_NONE, OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT):
        value = None
        if len(r.data) - r.at == 8:
            r.u64()
    else:
        raise FrameError(f"unknown offset specification {kind} in a consumer-update answer")
    r.end()
    return kind, value


def _metadata(r: Reader) -> tuple[Any, ...]:
    return tuple(r.text() for _ in range(r.count(2)))


def _sasl_authenticate(r: Reader) -> tuple[Any, ...]:
    return r.text(), r.bytes_() or b""


def _create(r: Reader) -> tuple[Any, ...]:
    return r.text(), r.properties()


def _create_super_stream(r: Reader) -> tuple[Any, ...]:
    """Name, partition streams, binding keys, arguments (RabbitMQ 3.13's layout)."""
    name = r.text()
    partitions = [r.text() for _ in range(r.count(2))]
    keys = [r.text() for _ in range(r.count(2))]
    return name, partitions, keys, r.properties()


# key -> (has a correlation id, field decoder)
_DECODERS: dict[int, tuple[bool, Callable[[Reader], tuple[Any, ...]]]] = {
    DECLARE_PUBLISHER: (True, _declare_publisher),
    PUBLISH: (False, _publish),
    QUERY_PUBLISHER_SEQUENCE: (True, lambda r: (r.text(), r.text())),
    DELETE_PUBLISHER: (True, lambda r: (r.u8(),)),
    SUBSCRIBE: (True, _subscribe),
    CREDIT: (False, lambda r: (r.u8(), r.u16())),
    STORE_OFFSET: (False, lambda r: (r.text(), r.text(), r.u64())),
    QUERY_OFFSET: (True, lambda r: (r.text(), r.text())),
    UNSUBSCRIBE: (True, lambda r: (r.u8(),)),
    CREATE: (True, _create),
    DELETE: (True, lambda r: (r.text(),)),
    METADATA: (True, _metadata),
    PEER_PROPERTIES: (True, lambda r: (r.properties(),)),
    SASL_HANDSHAKE: (True, lambda r: ()),
    SASL_AUTHENTICATE: (True, _sasl_authenticate),
    TUNE: (False, lambda r: (r.u32(), r.u32())),
    OPEN: (True, lambda r: (r.text(),)),
    CLOSE: (True, lambda r: (r.u16(), r.text())),
    HEARTBEAT: (False, lambda r: ()),
    ROUTE: (True, lambda r: (r.text(), r.text())),
    PARTITIONS: (True, lambda r: (r.text(),)),
    EXCHANGE_COMMAND_VERSIONS: (True, lambda r: tuple(
        (r.u16(), r.u16(), r.u16()) for _ in range(r.count(6)))),
    CREATE_SUPER_STREAM: (True, _create_super_stream),
    DELETE_SUPER_STREAM: (True, lambda r: (r.text(),)),
}
# responses a client sends (to the server's close and consumer-update requests)
CLIENT_RESPONSES: Final = frozenset({CLOSE | RESPONSE, CONSUMER_UPDATE | RESPONSE})
OFFSET_NONE: Final = 0  # a consumer-update answer's "keep the subscription's own offset"
SUPPORTED_VERSION: Final = 1


def decode(frame: bytes) -> Command:
    """One frame (without its size) as a Command; FrameError when it is not one this
    server knows (UNKNOWN_FRAME) or its fields do not fit (the connection closes)."""
    if len(frame) < 4:
        raise FrameError("frame holds no key and version")
    key, version = _HEAD.unpack_from(frame, 0)
    r = Reader(frame, 4)
    if key in CLIENT_RESPONSES:
        correlation = r.u32()
        code = r.u16()
        if key == CONSUMER_UPDATE | RESPONSE:
            return Command(key, version, correlation, (code, *_offset_answer(r)))
        return Command(key, version, correlation, (code,))
    entry = _DECODERS.get(key)
    if entry is None:
        raise FrameError(f"unknown command key 0x{key:04x}")
    if version != SUPPORTED_VERSION:
        raise FrameError(f"command key 0x{key:04x}: version {version} is not supported")
    with_correlation, decoder = entry
    correlation = r.u32() if with_correlation else 0
    try:
        fields = decoder(r)
    except FrameError as exc:
        exc.args = (f"command key 0x{key:04x}: {exc.args[0]}",)
        if with_correlation and not exc.close:
            raise FrameError(exc.args[0], exc.code, close=False) from None
        raise
    r.end()
    return Command(key, version, correlation, fields)


# ---------------------------------------------------------------------- encoding
class Writer:
    """Builds one server frame; :meth:`frame` prefixes its size."""

    __slots__ = ("parts",)

    def __init__(self, key: int, version: int = SUPPORTED_VERSION) -> None:
        self.parts: list[bytes] = [_HEAD.pack(key, version)]

    def u8(self, v: int) -> Writer:
        self.parts.append(_U8.pack(v))
        return self

    def u16(self, v: int) -> Writer:
        self.parts.append(_U16.pack(v))
        return self

    def u32(self, v: int) -> Writer:
        self.parts.append(_U32.pack(v))
        return self

    def u64(self, v: int) -> Writer:
        self.parts.append(_U64.pack(v))
        return self

    def string(self, s: str | None) -> Writer:
        if s is None:
            self.parts.append(_I16.pack(-1))
        else:
            b = s.encode()
            self.parts.append(_I16.pack(len(b)) + b)
        return self

    def bytes_(self, b: bytes | None) -> Writer:
        self.parts.append(_I32.pack(-1) if b is None else _I32.pack(len(b)) + b)
        return self

    def properties(self, props: dict[str, str]) -> Writer:
        self.parts.append(_I32.pack(len(props)))
        for k, v in props.items():
            self.string(k).string(v)
        return self

    def raw(self, b: bytes) -> Writer:
        self.parts.append(b)
        return self

    def frame(self) -> bytes:
        body = b"".join(self.parts)
        return _U32.pack(len(body)) + body


def response(key: int, correlation: int, code: int) -> Writer:
    """The start of a response frame: key with the top bit, correlation id, code."""
    return Writer(key | RESPONSE).u32(correlation).u16(code)


def tune(frame_max: int, heartbeat: int) -> bytes:
    return Writer(TUNE).u32(frame_max).u32(heartbeat).frame()


def heartbeat() -> bytes:
    return Writer(HEARTBEAT).frame()


def close_request(correlation: int, code: int, reason: str) -> bytes:
    return Writer(CLOSE).u32(correlation).u16(code).string(reason).frame()


def publish_confirm(publisher: int, ids: list[int]) -> bytes:
    w = Writer(PUBLISH_CONFIRM).u8(publisher).u32(len(ids))
    w.raw(struct.pack(f">{len(ids)}Q", *ids))
    return w.frame()


def publish_error(publisher: int, errors: list[tuple[int, int]]) -> bytes:
    w = Writer(PUBLISH_ERROR).u8(publisher).u32(len(errors))
    w.raw(b"".join(_U64.pack(i) + _U16.pack(c) for i, c in errors))
    return w.frame()


def credit_error(code: int, subscription: int) -> bytes:
    return Writer(CREDIT | RESPONSE).u16(code).u8(subscription).frame()


def consumer_update(correlation: int, subscription: int, active: bool) -> bytes:
    """The server's consumer-update request (RabbitMQ 3.11+)."""
    return Writer(CONSUMER_UPDATE).u32(correlation).u8(subscription).u8(
        1 if active else 0).frame()


def metadata_update(code: int, stream: str) -> bytes:
    return Writer(METADATA_UPDATE).u16(code).string(stream).frame()


def chunk_header(first_offset: int, timestamp: int, entries: int, records: int,
                 data: bytes) -> bytes:
    """An osiris user chunk's 48-byte header over ``data`` (its entries): magic and
    version, type, entries u16, records u32, timestamp i64, epoch u64, first offset
    u64, crc i32, data size u32, trailer size u32, reserved u32 (the layout of
    :data:`CHUNK_HEADER`, built without a struct call: once per delivered chunk)."""
    return b"".join((
        _CHUNK_KIND, entries.to_bytes(2, "big"), records.to_bytes(4, "big"),
        timestamp.to_bytes(8, "big", signed=True), _EPOCH, first_offset.to_bytes(8, "big"),
        zlib.crc32(data).to_bytes(4, "big"), len(data).to_bytes(4, "big"), _NO_TRAILER))


_CHUNK_KIND: Final = bytes((CHUNK_MAGIC_VERSION, CHUNK_USER))
_EPOCH: Final = (1).to_bytes(8, "big")
_NO_TRAILER: Final = bytes(8)  # trailer size and reserved


def deliver(subscription: int, chunk: bytes) -> bytes:
    """A deliver frame (version 1) around a whole chunk (header and entries)."""
    return deliver_head(subscription, len(chunk)) + chunk


def deliver_head(subscription: int, chunk_size: int) -> bytes:
    """A deliver frame's first 9 bytes (size, key, version 1, subscription id): the
    chunk of ``chunk_size`` bytes follows."""
    return b"".join(((5 + chunk_size).to_bytes(4, "big"), _DELIVER_V1,
                     subscription.to_bytes(1, "big")))


_DELIVER_V1: Final = _HEAD.pack(DELIVER, 1)


def simple_entries(messages: list[bytes]) -> bytes:
    """Messages as osiris simple entries (``0`` bit + 31-bit size, then the bytes)."""
    return b"".join(_U32.pack(len(m)) + m for m in messages)


__all__ = ["Command", "FrameError", "FrameReader", "Reader", "Writer", "decode"]
