"""The replication wire protocol: framing, messages and authentication. No sockets here.

Every frame is a 5-byte header and a payload (network byte order)::

    +------+------------+-------------------------+
    | type | length u32 | payload (length bytes)  |
    | u8   |            |                         |
    +------+------------+-------------------------+

A DATA frame's payload starts with ``base u64 | offset u64`` and goes on with raw bytes
of segment file ``base`` from ``offset``: those bytes are sent straight from the
active's segment file with ``sendfile`` (zero-copy) and are never copied into Python on
the sending side. Every other payload is small and built here.

Conversation (S = standby / follower, A = active / source)::

    S -> A  HELLO      magic "AMQR" | version u16 | nonce 16B | name str
    A -> S  CHALLENGE  nonce 16B | name str
    S -> A  AUTH       mac 32B = HMAC-SHA256(secret, "standby" | A nonce | S nonce | S name)
    A -> S  AUTH_OK    mac 32B = HMAC-SHA256(secret, "active" | S nonce | A nonce | A name)
            (or ERROR "authentication failed", then A closes)
    S -> A  FOLLOW     epoch u64 | last_seq u64 | base u64 | size u64
                       (S's last epoch, last sequence it holds, end of its log)
    A -> S  WELCOME    decision u8 | epoch u64 | base u64 | offset u64 | truncate_seq u64
                       | live bases (u32 count + u64 each) | history (u32 count +
                       (epoch u64, first_seq u64) each)
    A -> S  DATA / CHECKPOINT data / DELETE base / PROMISE queue upto / TAIL seq pos
    S -> A  ACK        seq u64 | position u64   (durable on S up to there)

Decisions: CONTINUE from (base, offset); SNAPSHOT (S drops its log and receives the live
segments from ``base``); TRUNCATE (S cuts its log after ``truncate_seq``, a tail the
active never had, then reconnects); REFUSE (S's epoch is newer: A is stale).

Authentication is mutual: each side proves it holds the shared secret over both nonces,
and macs are compared with :func:`hmac.compare_digest` (constant time). With TLS client
certificates and no secret, the TLS handshake authenticates and the macs are empty.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

MAGIC = b"AMQR"
VERSION = 1

HEADER = struct.Struct(">BI")
HEADER_SIZE = HEADER.size  # 5
MAX_CONTROL = 256 * 1024 * 1024  # a CHECKPOINT can be large; anything bigger is garbage
MAX_DATA = 16 * 1024 * 1024  # raw segment bytes per DATA frame

HELLO = 1
CHALLENGE = 2
AUTH = 3
AUTH_OK = 4
FOLLOW = 5
WELCOME = 6
DATA = 7
CHECKPOINT = 8
DELETE = 9
PROMISE = 10
TAIL = 11
ACK = 12
ERROR = 13
TYPES = frozenset(range(HELLO, ERROR + 1))

CONTINUE = 0
SNAPSHOT = 1
TRUNCATE = 2
REFUSE = 3

_Q = struct.Struct(">Q")
_QQ = struct.Struct(">QQ")
_FOLLOW = struct.Struct(">QQQQ")
_WELCOME = struct.Struct(">BQQQQ")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
NONCE_SIZE = 16
MAC_SIZE = 32


class ProtocolError(Exception):
    """The peer sent something that is not this protocol: log it and close."""


class AuthError(ProtocolError):
    """The peer does not hold the shared secret."""


def frame(ftype: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(ftype, len(payload)) + payload


def parse_header(data: bytes) -> tuple[int, int]:
    """(type, length) of a 5-byte header; ProtocolError for unknown types or sizes."""
    if len(data) != HEADER_SIZE:
        raise ProtocolError("short frame header")
    ftype, length = HEADER.unpack(data)
    if ftype not in TYPES:
        raise ProtocolError(f"unknown frame type {ftype}")
    limit = MAX_DATA + 16 if ftype == DATA else MAX_CONTROL
    if length > limit:
        raise ProtocolError(f"frame type {ftype} of {length} bytes exceeds {limit}")
    return ftype, length


def data_header(base: int, offset: int, count: int) -> bytes:
    """Header + the (base, offset) prefix of a DATA frame whose bytes follow by sendfile."""
    if count > MAX_DATA:
        raise ValueError(f"DATA frame of {count} bytes exceeds {MAX_DATA}")
    return HEADER.pack(DATA, 16 + count) + _QQ.pack(base, offset)


def parse_data(payload: bytes | memoryview) -> tuple[int, int, memoryview]:
    if len(payload) < 16:
        raise ProtocolError("DATA frame shorter than its header")
    base, offset = _QQ.unpack_from(payload, 0)
    return base, offset, memoryview(payload)[16:]


def _str(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("string too long")
    return _H.pack(len(raw)) + raw


def _read_str(buf: bytes, off: int) -> tuple[str, int]:
    if off + 2 > len(buf):
        raise ProtocolError("string length runs past the frame")
    (n,) = _H.unpack_from(buf, off)
    if off + 2 + n > len(buf):
        raise ProtocolError("string runs past the frame")
    try:
        return buf[off + 2 : off + 2 + n].decode(), off + 2 + n
    except UnicodeDecodeError:
        raise ProtocolError("string is not UTF-8") from None


# -- handshake ------------------------------------------------------------------------


def hello(nonce: bytes, name: str) -> bytes:
    return frame(HELLO, MAGIC + _H.pack(VERSION) + nonce + _str(name))


def parse_hello(payload: bytes) -> tuple[bytes, str]:
    if payload[:4] != MAGIC:
        raise ProtocolError("not an amqpd replication peer (bad magic)")
    if len(payload) < 6 + NONCE_SIZE:
        raise ProtocolError("short HELLO")
    (version,) = _H.unpack_from(payload, 4)
    if version != VERSION:
        raise ProtocolError(f"replication protocol version {version}, this node speaks "
                            f"{VERSION}")
    nonce = payload[6 : 6 + NONCE_SIZE]
    name, _ = _read_str(payload, 6 + NONCE_SIZE)
    return nonce, name


def challenge(nonce: bytes, name: str) -> bytes:
    return frame(CHALLENGE, nonce + _str(name))


def parse_challenge(payload: bytes) -> tuple[bytes, str]:
    if len(payload) < NONCE_SIZE:
        raise ProtocolError("short CHALLENGE")
    name, _ = _read_str(payload, NONCE_SIZE)
    return payload[:NONCE_SIZE], name


def mac(secret: bytes, role: bytes, first: bytes, second: bytes, name: str) -> bytes:
    """HMAC-SHA256 proof that the sender (``role``) holds ``secret``; empty without one."""
    if not secret:
        return b""
    return hmac.new(secret, role + first + second + name.encode(), hashlib.sha256).digest()


def check_mac(expected: bytes, got: bytes) -> None:
    """Constant-time comparison; AuthError when they differ."""
    if not hmac.compare_digest(expected, got):
        raise AuthError("authentication failed")


# -- follow / welcome -----------------------------------------------------------------


@dataclass(frozen=True)
class Follow:
    epoch: int  # the last epoch in the follower's history (0: none)
    last_seq: int  # the last sequence number it holds (0: none)
    base: int  # the base of its last segment
    size: int  # that segment's size (0: no segment)


def follow(f: Follow) -> bytes:
    return frame(FOLLOW, _FOLLOW.pack(f.epoch, f.last_seq, f.base, f.size))


def parse_follow(payload: bytes) -> Follow:
    if len(payload) != _FOLLOW.size:
        raise ProtocolError("FOLLOW has the wrong size")
    return Follow(*_FOLLOW.unpack(payload))


@dataclass(frozen=True)
class Welcome:
    decision: int
    epoch: int
    base: int = 0
    offset: int = 0
    truncate_seq: int = 0
    live: tuple[int, ...] = ()
    history: tuple[tuple[int, int], ...] = field(default_factory=tuple)


def welcome(w: Welcome) -> bytes:
    parts = [_WELCOME.pack(w.decision, w.epoch, w.base, w.offset, w.truncate_seq),
             _I.pack(len(w.live)), *(_Q.pack(b) for b in w.live),
             _I.pack(len(w.history)), *(_QQ.pack(e, s) for e, s in w.history)]
    return frame(WELCOME, b"".join(parts))


def parse_welcome(payload: bytes) -> Welcome:
    try:
        decision, epoch, base, offset, tseq = _WELCOME.unpack_from(payload, 0)
        off = _WELCOME.size
        (n,) = _I.unpack_from(payload, off)
        off += 4
        live = tuple(_Q.unpack_from(payload, off + 8 * i)[0] for i in range(n))
        off += 8 * n
        (m,) = _I.unpack_from(payload, off)
        off += 4
        history = tuple(_QQ.unpack_from(payload, off + 16 * i) for i in range(m))
        off += 16 * m
    except struct.error:
        raise ProtocolError("short WELCOME") from None
    if off != len(payload):
        raise ProtocolError("WELCOME has trailing bytes")
    if decision not in (CONTINUE, SNAPSHOT, TRUNCATE, REFUSE):
        raise ProtocolError(f"unknown WELCOME decision {decision}")
    return Welcome(decision, epoch, base, offset, tseq, live, history)


# -- the stream -----------------------------------------------------------------------


def delete(base: int) -> bytes:
    return frame(DELETE, _Q.pack(base))


def parse_u64(payload: bytes, what: str) -> int:
    if len(payload) != 8:
        raise ProtocolError(f"{what} has the wrong size")
    return int(_Q.unpack(payload)[0])


def promise(queue: str, upto: int) -> bytes:
    return frame(PROMISE, _Q.pack(upto) + _str(queue))


def parse_promise(payload: bytes) -> tuple[str, int]:
    if len(payload) < 10:
        raise ProtocolError("short PROMISE")
    (upto,) = _Q.unpack_from(payload, 0)
    queue, end = _read_str(payload, 8)
    if end != len(payload):
        raise ProtocolError("PROMISE has trailing bytes")
    return queue, upto


def pair(ftype: int, a: int, b: int) -> bytes:
    """TAIL (active's last seq, end position) and ACK (durable seq, position)."""
    return frame(ftype, _QQ.pack(a, b))


def parse_pair(payload: bytes, what: str) -> tuple[int, int]:
    if len(payload) != 16:
        raise ProtocolError(f"{what} has the wrong size")
    a, b = _QQ.unpack(payload)
    return int(a), int(b)


def error(text: str) -> bytes:
    return frame(ERROR, _str(text[:1000]))


def parse_error(payload: bytes) -> str:
    return _read_str(payload, 0)[0]
