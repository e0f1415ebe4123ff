"""The inter-node link's wire format: frames, their fields, and the cookie handshake.

Sans-IO (no sockets, no asyncio), so the format is tested apart from the connection
(:mod:`amqpd.cluster.link`). One link carries everything two nodes say to each other
about queues, multiplexed by a *stream* number: the node that uses a queue led by its
peer opens a stream for it and every frame about that queue carries the stream's number.

A frame is ``length:u32 type:u8 stream:u32 fields...`` (``length`` counts what follows
it). Each frame type has a fixed field layout (:data:`LAYOUTS`): ``I`` u32, ``Q`` u64,
``B`` u8, ``s`` bytes with a u16 length, ``b`` bytes with a u32 length, ``j`` JSON (u32
length; control frames only, never per message), ``L`` a list of u64 (u32 count), ``P``
and ``D`` the records of a ``PUBLISHES`` or ``DELIVERS`` frame, one per message, up to
the frame's end (the last field of its layout; see the batches below).

The handshake authenticates both ends with the shared cookie without sending it: each
side sends a random nonce and proves it holds the cookie with an HMAC-SHA256 over both
nonces and both node names (:func:`proof`), the dialler's proof tagged ``client``, the
listener's ``server``, so a proof can be neither replayed nor reflected.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Callable
from typing import Any, Final

# The dialler's first bytes: the preamble, then the link protocol's version. A node
# speaks one version and links only with nodes of the same one (amqpd.cluster.link
# refuses another), so no node is sent a frame type or layout it cannot read. Bump
# VERSION whenever a frame type is added or a layout changes: 2 added the store
# positions of DELIVER / GET_OK and RECLAIM; 3 the stream-protocol publishers'
# SPUB..SPUBLOST (SPUBBED with the producer's confirmed id) and the SYNC / SYNCED
# barrier of definitions made visible on every linked node; 4 the batches PUBLISHES and
# DELIVERS (several messages of one stream in one frame); 5 ASK / ANSWER (a question for
# the peer node as a whole: the management API's cluster-wide lists)
PREAMBLE: Final = b"AMQPD-LINK\x00"
VERSION: Final = 5
MAGIC: Final = PREAMBLE + bytes((VERSION,))
MAX_FRAME: Final = 256 << 20  # a message body is bounded by the AMQP frame limits anyway

# handshake (stream 0)
HELLO: Final = 1  # dialler -> listener: node name, nonce
CHALLENGE: Final = 2  # listener -> dialler: node name, nonce, listener's proof
PROVE: Final = 3  # dialler -> listener: dialler's proof
WELCOME: Final = 4  # listener -> dialler: accepted
REFUSED: Final = 5  # either way: why, then the connection closes
PING: Final = 6  # either way, on a live link every PING_INTERVAL: it is alive

# queue streams (the user opens, the leader answers)
OPEN: Final = 10  # vhost, queue name
OPENED: Final = 11  # ready, unacked, consumers
FAILED: Final = 12  # reply code, text (the stream is closed)
CLOSE: Final = 13  # the user is done with the stream
STATS: Final = 14  # leader -> user: ready, unacked, consumers (about once a second)
PUBLISH: Final = 20  # seq (0: unconfirmed), persistent, exchange, key, props, body
CONFIRM: Final = 21  # leader -> user: seq, ok (every publish seq <= is answered first)
CREDIT: Final = 22  # leader -> user: more publishes it may send
# user -> leader: several PUBLISHes in a row on the stream, each a record of PUBLISH's
# fields (the same credit, confirms and order as that many PUBLISH frames)
PUBLISHES: Final = 23  # records of (seq, persistent, exchange, key, props, body)
CONSUME: Final = 30  # consumer id, no_ack, credit, arguments
DELIVER: Final = 31  # consumer id, delivery id, redelivered, ready, exchange, key, props, body,
#   the leader's store position + 1 (0: not sent; quorum queues only: RECLAIM names it)
# leader -> user: several DELIVERs in a row to one consumer of the stream
DELIVERS: Final = 38  # consumer id, records (DELIVER's fields after the consumer id)
GRANT: Final = 32  # user -> leader: consumer id, more deliveries it may send
CANCEL: Final = 33  # user -> leader: consumer id
CANCELLED: Final = 34  # leader -> user: consumer id (queue deleted: basic.cancel)
CONSUMED: Final = 35  # leader -> user: consumer id, reply code (0: accepted), text
# user -> a quorum queue's new leader, once per stream opened: the deliveries of the lost
# leader ``origin`` (its store positions) still unacked on this node's channels
RECLAIM: Final = 36  # origin node ("": none), positions
# leader -> user: per position asked, the delivery id it is on this stream now (0: no
# longer held for this node: returned to the queue) and its new store position + 1
RECLAIMED: Final = 37  # origin node, positions, delivery ids, new positions + 1
GET: Final = 40  # request id, no_ack
GET_OK: Final = 41  # request id, delivery id, redelivered, ready, exchange, key, props, body,
#   the leader's store position + 1 (as DELIVER)
GET_EMPTY: Final = 42  # request id
SETTLE: Final = 50  # delivery ids (acked, or rejected without requeue)
REQUEUE: Final = 51  # delivery ids
REJECT: Final = 52  # delivery ids (rejected without requeue: dead-lettered on the leader)
PURGE: Final = 60  # request id
PURGED: Final = 61  # request id, count
DELETE: Final = 62  # request id
DELETED: Final = 63  # request id, count
COUNT: Final = 64  # user -> leader: request id (a declare-ok's counts)
COUNTED: Final = 65  # leader -> user: request id, ready, unacked, consumers
DECLARE: Final = 70  # request id, declaration (JSON): create the queue here (locators)
DECLARED: Final = 71  # request id, reply code (0: ok), text
# stream 0, either way (amqpd.cluster.visibility): the asker wrote a change of one kind
# (which watch) at this coordination-store revision; the answer comes once the peer's
# watch of that kind applied it
SYNC: Final = 75  # watch, revision
SYNCED: Final = 76  # watch, revision
# stream-protocol publishers declared on a node that does not lead their stream
# (amqpd.cluster.forwarded_publish); the frame's stream number names the publisher
SPUB: Final = 130  # user -> leader: vhost, stream, producer reference, packed entries
# leader -> user: publishing ids confirmed, ids refused, their codes, and the producer's
# highest confirmed publishing id + 1 as the leader keeps it (0: unnamed, or none yet)
SPUBBED: Final = 131
SPUBEND: Final = 132  # user -> leader: the publisher is gone (deleted, connection closed)
SPUBLOST: Final = 133  # leader -> user: its publishes cannot be taken here (why)
# a question for the peer node as a whole and its answer, either way on stream 0
# (amqpd.cluster.peer_ask): what the management API lists for the whole cluster
ASK: Final = 140  # request id, kind, arguments (JSON)
ANSWER: Final = 141  # request id, {"ok": true, "value"} or {"ok": false, "code", "error"}

LAYOUTS: Final[dict[int, str]] = {
    HELLO: "sb", CHALLENGE: "sbb", PROVE: "b", WELCOME: "", REFUSED: "s", PING: "",
    OPEN: "ss", OPENED: "QQI", FAILED: "Is", CLOSE: "", STATS: "QQI",
    PUBLISH: "QBssbb", CONFIRM: "QB", CREDIT: "I", PUBLISHES: "P",
    CONSUME: "IBIj", DELIVER: "IQBQssbbQ", DELIVERS: "ID", GRANT: "II", CANCEL: "I",
    CANCELLED: "I",
    CONSUMED: "IIs", RECLAIM: "sL", RECLAIMED: "sLLL",
    GET: "IB", GET_OK: "IQBQssbbQ", GET_EMPTY: "I",
    SETTLE: "L", REQUEUE: "L", REJECT: "L",
    PURGE: "I", PURGED: "IQ", DELETE: "I", DELETED: "IQ", COUNT: "I", COUNTED: "IQQI",
    DECLARE: "Ij", DECLARED: "IIs", SYNC: "BQ", SYNCED: "BQ",
    SPUB: "sssb", SPUBBED: "LLLQ", SPUBEND: "", SPUBLOST: "s",
    ASK: "Isj", ANSWER: "Ij",
}

_HEAD = struct.Struct(">IBI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class WireError(Exception):
    """The peer sent something this format does not allow (the link is closed)."""


def encode(kind: int, stream: int, *fields: Any) -> bytes:
    """One frame of type ``kind`` on ``stream`` with ``fields`` in its layout's order."""
    layout = LAYOUTS[kind]
    if len(fields) != len(layout):
        raise ValueError(f"frame {kind} takes {len(layout)} fields, got {len(fields)}")
    parts: list[bytes] = []
    for code, value in zip(layout, fields, strict=True):
        _pack_field(code, value, parts)
    body = b"".join(parts)
    return _HEAD.pack(len(body) + 5, kind, stream) + body


def _pack_field(code: str, value: Any, parts: list[bytes]) -> None:
    """Append the bytes of one field of type ``code`` to ``parts``."""
    if code == "I":
        parts.append(_U32.pack(value))
    elif code == "Q":
        parts.append(_U64.pack(value))
    elif code == "B":
        parts.append(bytes((int(value),)))
    elif code == "s":
        raw = value.encode() if isinstance(value, str) else value
        parts.append(_U16.pack(len(raw)) + raw)
    elif code == "b":
        parts.append(_U32.pack(len(value)) + value)
    elif code == "j":
        raw = json.dumps(value, separators=(",", ":")).encode()
        parts.append(_U32.pack(len(raw)) + raw)
    elif code == "L":
        parts.append(_U32.pack(len(value)) + b"".join(_U64.pack(v) for v in value))
    elif code == "P":
        parts.extend(_publish_record(*fields) for fields in value)
    else:  # "D"
        parts.extend(_deliver_record(*fields) for fields in value)


def decode_fields(kind: int, data: bytes | memoryview) -> list[Any]:
    """The fields of a frame's body (after its head); WireError if it does not fit."""
    layout = LAYOUTS.get(kind)
    if layout is None:
        raise WireError(f"unknown frame type {kind}")
    view = memoryview(data)
    pos = 0
    out: list[Any] = []
    try:
        for code in layout:
            pos = _read_field(code, view, pos, out)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"malformed frame {kind}: {exc}") from exc
    if pos != len(view):
        raise WireError(f"frame {kind} has {len(view) - pos} bytes too many")
    return out


def _read_field(code: str, view: memoryview, pos: int, out: list[Any]) -> int:
    """Append the field of type ``code`` at ``pos`` to ``out``; the position after it."""
    if code == "I":
        out.append(_U32.unpack_from(view, pos)[0])
        return pos + 4
    if code == "Q":
        out.append(_U64.unpack_from(view, pos)[0])
        return pos + 8
    if code == "B":
        out.append(view[pos])
        return pos + 1
    if code == "s":
        n = _U16.unpack_from(view, pos)[0]
        raw = bytes(view[pos + 2:pos + 2 + n])
        if len(raw) != n:
            raise WireError("short string field")
        out.append(raw.decode())
        return pos + 2 + n
    if code in "bj":
        n = _U32.unpack_from(view, pos)[0]
        raw = bytes(view[pos + 4:pos + 4 + n])
        if len(raw) != n:
            raise WireError("short bytes field")
        out.append(raw if code == "b" else json.loads(raw))
        return pos + 4 + n
    if code == "L":
        n = _U32.unpack_from(view, pos)[0]
        end = pos + 4 + 8 * n
        if end > len(view):
            raise WireError("short list field")
        out.append(list(struct.unpack_from(f">{n}Q", view, pos + 4)))
        return end
    # "P", "D": records up to the frame's end
    rest = bytes(view[pos:])
    out.append(_records(code == "P", rest, 0, len(rest)))
    return len(view)


# -- the per-message frames, without the generic loop ----------------------------------
# PUBLISH, DELIVER and GET_OK carry one message each: a basic.get's answer (GET_OK) and
# a quorum queue's delivery (DELIVER, sent once its checkout commits) go so; other
# publishes and deliveries go in batches (PUBLISHES / DELIVERS, below), and PUBLISH is
# still read (this node no longer sends it; tests and tools may). Their layouts are
# fixed (``LAYOUTS``), so they are packed and unpacked by hand here, with the same
# bytes as :func:`encode` and the same checks as :func:`decode_fields`
# (tests/unit/cluster/test_link_wire.py compares them), but no per-field loop, no list
# of parts per field and no copy of the frame body before its fields are read: the
# profile of two workers crossing (bench/RESULTS-workers.md) put the generic codec
# among the largest per-message costs of the link.
_PUBLISH_HEAD = struct.Struct(">IBIQBH")  # length, kind, stream, seq, persistent, |exchange|
_DELIVER_HEAD = struct.Struct(">IBIIQBQH")  # ... id, delivery, redelivered, ready, |exchange|


def encode_publish(stream: int, seq: int, persistent: int, exchange: str, key: str,
                   props: bytes, body: bytes) -> bytes:
    """``encode(PUBLISH, stream, seq, persistent, exchange, key, props, body)``."""
    ex = exchange.encode()
    rk = key.encode()
    size = 26 + len(ex) + len(rk) + len(props) + len(body)  # after the length field
    return b"".join((
        _PUBLISH_HEAD.pack(size, PUBLISH, stream, seq, persistent, len(ex)), ex,
        _U16.pack(len(rk)), rk, _U32.pack(len(props)), props, _U32.pack(len(body)), body))


def encode_deliver(kind: int, stream: int, ident: int, delivery: int, redelivered: int,
                   ready: int, exchange: str, key: str, props: bytes, body: bytes,
                   position: int) -> bytes:
    """``encode(kind, stream, ...)`` for DELIVER (``ident``: the consumer id) and GET_OK
    (``ident``: the request id), which share a layout."""
    ex = exchange.encode()
    rk = key.encode()
    size = 46 + len(ex) + len(rk) + len(props) + len(body)
    return b"".join((
        _DELIVER_HEAD.pack(size, kind, stream, ident, delivery, redelivered, ready, len(ex)),
        ex, _U16.pack(len(rk)), rk, _U32.pack(len(props)), props, _U32.pack(len(body)),
        body, _U64.pack(position)))


_PUBLISH_FIXED = struct.Struct(">QBH")  # seq, persistent, |exchange|
_DELIVER_FIXED = struct.Struct(">IQBQH")  # id, delivery, redelivered, ready, |exchange|


def _tail(buf: bytes, pos: int, n: int, end: int) -> tuple[str, str, bytes, bytes, int]:
    """The ``ssbb`` fields both fast layouts share, from ``pos`` (the exchange, ``n``
    bytes) to at most ``end``; the position after them."""
    exchange = buf[pos:pos + n].decode()
    pos += n
    n = _U16.unpack_from(buf, pos)[0]
    pos += 2
    key = buf[pos:pos + n].decode()
    pos += n
    n = _U32.unpack_from(buf, pos)[0]
    pos += 4
    props = buf[pos:pos + n]
    pos += n
    n = _U32.unpack_from(buf, pos)[0]
    pos += 4
    body = buf[pos:pos + n]
    pos += n
    if pos > end:
        raise WireError("a field runs past its frame")
    return exchange, key, props, body, pos


def _decode_fast(kind: int, buf: bytes, pos: int, end: int) -> list[Any]:
    """The fields of a PUBLISH, DELIVER or GET_OK whose body is ``buf[pos:end]``."""
    try:
        if kind == PUBLISH:
            seq, persistent, n = _PUBLISH_FIXED.unpack_from(buf, pos)
            exchange, key, props, body, p = _tail(buf, pos + 11, n, end)
            if p != end:
                raise WireError(f"frame {kind} has {end - p} bytes too many")
            return [seq, persistent, exchange, key, props, body]
        ident, delivery, redelivered, ready, n = _DELIVER_FIXED.unpack_from(buf, pos)
        exchange, key, props, body, p = _tail(buf, pos + 23, n, end)
        if p + 8 != end:
            raise WireError(f"frame {kind} does not end with its position")
        position = _U64.unpack_from(buf, p)[0]
        return [ident, delivery, redelivered, ready, exchange, key, props, body, position]
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"malformed frame {kind}: {exc}") from exc


# -- batches: the messages of one stream that leave in one tick, in one frame ----------
# A busy stream sends its messages a tick's worth at a time (every frame queued in one
# tick leaves in one write: amqpd.cluster.link). A run of them is one PUBLISHES or
# DELIVERS frame instead of one frame each, so the receiving node dispatches, looks up
# its stream and consumer, and schedules its queue once per run, not once per message
# (the profile of two workers crossing: bench/RESULTS-workers.md). A batch is a
# bytearray that grows in place while it is the last frame queued on its link (the
# sender checks that, so nothing overtakes anything); its length is written once, by
# :func:`seal`, when the link writes it. Its records run to the frame's end (no count),
# each one fixed-size head holding the message's numbers and the lengths of its
# exchange, routing key, properties and body, then those four: one struct per record
# each way, not one per field.
BATCH_BYTES: Final = 1 << 20  # a batch takes no more records once it is this long
_BATCH_HEAD = struct.Struct(">IBI")  # length (written by seal), kind, stream
_DELIVERS_HEAD = struct.Struct(">IBII")  # ... and the consumer id
# seq, persistent, |exchange|, |routing key|, |properties|, |body|
PUBLISHES_RECORD: Final = struct.Struct(">QBHHII")
# delivery id, redelivered, ready, the leader's store position + 1 (as DELIVER's),
# |exchange|, |routing key|, |properties|, |body|
DELIVERS_RECORD: Final = struct.Struct(">QBQQHHII")


def _publish_record(seq: int, persistent: int, exchange: str, key: str, props: bytes,
                    body: bytes) -> bytes:
    ex = exchange.encode()
    rk = key.encode()
    return b"".join((PUBLISHES_RECORD.pack(seq, persistent, len(ex), len(rk), len(props),
                                            len(body)), ex, rk, props, body))


def _deliver_record(delivery: int, redelivered: int, ready: int, exchange: str, key: str,
                    props: bytes, body: bytes, position: int) -> bytes:
    ex = exchange.encode()
    rk = key.encode()
    return b"".join((DELIVERS_RECORD.pack(delivery, redelivered, ready, position, len(ex),
                                           len(rk), len(props), len(body)),
                     ex, rk, props, body))


def _append_publish(frame: bytearray, seq: int, persistent: int, exchange: str, key: str,
                    props: bytes, body: bytes) -> None:
    """:func:`_publish_record`'s bytes, appended to ``frame`` piece by piece (no record
    joined first, then copied again)."""
    ex = exchange.encode()
    rk = key.encode()
    frame += PUBLISHES_RECORD.pack(seq, persistent, len(ex), len(rk), len(props), len(body))
    frame += ex
    frame += rk
    frame += props
    frame += body


def _append_deliver(frame: bytearray, delivery: int, redelivered: int, ready: int,
                    exchange: str, key: str, props: bytes, body: bytes,
                    position: int) -> None:
    """:func:`_deliver_record`'s bytes, appended to ``frame`` (as :func:`_append_publish`)."""
    ex = exchange.encode()
    rk = key.encode()
    frame += DELIVERS_RECORD.pack(delivery, redelivered, ready, position, len(ex), len(rk),
                                  len(props), len(body))
    frame += ex
    frame += rk
    frame += props
    frame += body


def publishes(stream: int, seq: int, persistent: int, exchange: str, key: str,
              props: bytes, body: bytes) -> bytearray:
    """A PUBLISHES frame holding one record, to grow with :func:`add_publish` and be
    sealed (:func:`seal`) before it is written."""
    frame = bytearray(_BATCH_HEAD.pack(0, PUBLISHES, stream))
    _append_publish(frame, seq, persistent, exchange, key, props, body)
    return frame


def add_publish(frame: bytearray, seq: int, persistent: int, exchange: str, key: str,
                props: bytes, body: bytes) -> bool:
    """Append one record to a frame of :func:`publishes`; False (and nothing appended)
    once it holds :data:`BATCH_BYTES`: the caller starts another."""
    if len(frame) >= BATCH_BYTES:
        return False
    _append_publish(frame, seq, persistent, exchange, key, props, body)
    return True


def delivers(stream: int, cid: int, delivery: int, redelivered: int, ready: int,
             exchange: str, key: str, props: bytes, body: bytes,
             position: int) -> bytearray:
    """A DELIVERS frame to consumer ``cid`` holding one record, to grow with
    :func:`add_deliver` (and be sealed)."""
    frame = bytearray(_DELIVERS_HEAD.pack(0, DELIVERS, stream, cid))
    _append_deliver(frame, delivery, redelivered, ready, exchange, key, props, body,
                    position)
    return frame


def add_deliver(frame: bytearray, delivery: int, redelivered: int, ready: int,
                exchange: str, key: str, props: bytes, body: bytes, position: int) -> bool:
    """Append one record to a frame of :func:`delivers` (as :func:`add_publish`)."""
    if len(frame) >= BATCH_BYTES:
        return False
    _append_deliver(frame, delivery, redelivered, ready, exchange, key, props, body,
                    position)
    return True


def seal(frame: bytearray) -> None:
    """Write a batch's length into its head: it takes no more records (the link calls
    this as it writes the frame)."""
    _U32.pack_into(frame, 0, len(frame) - 4)


def _records(publish: bool, buf: bytes, pos: int, end: int) -> list[tuple[Any, ...]]:
    """The records of a PUBLISHES (``publish``) or DELIVERS frame in ``buf[pos:end]``,
    each a tuple of PUBLISH's fields, or of DELIVER's after the consumer id."""
    records: list[tuple[Any, ...]] = []
    head = PUBLISHES_RECORD if publish else DELIVERS_RECORD
    size = head.size
    try:
        while pos < end:
            if pos + size > end:
                raise WireError("a record runs past its frame")
            if publish:
                seq, persistent, ne, nk, np_, nb = head.unpack_from(buf, pos)
            else:
                delivery, redelivered, ready, position, ne, nk, np_, nb = \
                    head.unpack_from(buf, pos)
            pos += size
            if pos + ne + nk + np_ + nb > end:
                raise WireError("a record runs past its frame")
            exchange = buf[pos:pos + ne].decode()
            pos += ne
            key = buf[pos:pos + nk].decode()
            pos += nk
            props = buf[pos:pos + np_]
            pos += np_
            body = buf[pos:pos + nb]
            pos += nb
            if publish:
                records.append((seq, persistent, exchange, key, props, body))
            else:
                records.append((delivery, redelivered, ready, exchange, key, props, body,
                                position))
    except UnicodeDecodeError as exc:
        raise WireError(f"malformed record: {exc}") from exc
    return records


def _decode_batch(kind: int, buf: bytes, pos: int, end: int) -> list[Any]:
    """The fields of a PUBLISHES (its records) or DELIVERS (the consumer id, its
    records) whose body is ``buf[pos:end]``."""
    if kind == PUBLISHES:
        return [_records(True, buf, pos, end)]
    if end - pos < 4:
        raise WireError(f"malformed frame {kind}: no consumer id")
    return [_U32.unpack_from(buf, pos)[0], _records(False, buf, pos + 4, end)]


# The small frames that come with the messages: CONFIRM per confirmed publish, CREDIT per
# tick and stream, GRANT and SETTLE per batch of acks (the consumers' ``multiple`` acks:
# per message when a client acks each). Their fields are fixed-size numbers (a list of
# u64 for SETTLE, REQUEUE and REJECT), so one precompiled struct packs or reads them
# whole: the same bytes and the same refusals as the generic codec (a frame too short
# or too long), without its per-field loop.
_SMALL: Final[dict[int, struct.Struct]] = {
    CONFIRM: struct.Struct(">IBIQB"), CREDIT: struct.Struct(">IBII"),
    GRANT: struct.Struct(">IBIII"),
}
_SMALL_FIELDS: Final[dict[int, struct.Struct]] = {
    CONFIRM: struct.Struct(">QB"), CREDIT: struct.Struct(">I"), GRANT: struct.Struct(">II"),
}
_IDS: Final = frozenset((SETTLE, REQUEUE, REJECT))


def encode_confirm(stream: int, seq: int, ok: bool) -> bytes:
    """``encode(CONFIRM, stream, seq, ok)``."""
    return _SMALL[CONFIRM].pack(14, CONFIRM, stream, seq, 1 if ok else 0)


def encode_credit(stream: int, n: int) -> bytes:
    """``encode(CREDIT, stream, n)``."""
    return _SMALL[CREDIT].pack(9, CREDIT, stream, n)


def encode_grant(stream: int, cid: int, n: int) -> bytes:
    """``encode(GRANT, stream, cid, n)``."""
    return _SMALL[GRANT].pack(13, GRANT, stream, cid, n)


def encode_ids(kind: int, stream: int, ids: list[int]) -> bytes:
    """``encode(kind, stream, ids)`` for SETTLE, REQUEUE and REJECT (a list of u64)."""
    n = len(ids)
    return _HEAD.pack(9 + 8 * n, kind, stream) + struct.pack(f">I{n}Q", n, *ids)


def _decode_small(kind: int, buf: bytes, pos: int, end: int) -> list[Any]:
    """The fields of a CONFIRM, CREDIT, GRANT, SETTLE, REQUEUE or REJECT whose body is
    ``buf[pos:end]``."""
    fixed = _SMALL_FIELDS.get(kind)
    if fixed is not None:
        if end - pos != fixed.size:
            raise WireError(f"frame {kind} is {end - pos} bytes, not {fixed.size}")
        return list(fixed.unpack_from(buf, pos))
    if end - pos < 4:
        raise WireError(f"malformed frame {kind}: no list count")
    n = _U32.unpack_from(buf, pos)[0]
    if 4 + 8 * n > end - pos:
        raise WireError("short list field")
    if 4 + 8 * n != end - pos:
        raise WireError(f"frame {kind} has {end - pos - 4 - 8 * n} bytes too many")
    return [list(struct.unpack_from(f">{n}Q", buf, pos + 4))]


BatchReader = Callable[[int, bytes, int, int], list[Any]]


class FrameReader:
    """Splits received bytes into ``(kind, stream, fields)`` frames.

    Frames are sliced from immutable bytes, so a field is one copy (not a bytearray
    slice copied again into bytes). A frame cut by the socket waits as a list of reads
    until it is whole: they are joined once, so a large message arriving in many reads
    is not copied again with each.

    ``batches``, if given, reads the fields of PUBLISHES and DELIVERS frames instead of
    the generic records (tuples of PUBLISH's or DELIVER's fields) as ``batches(kind,
    buf, pos, end)`` (the frame's body is ``buf[pos:end]``), raising WireError as they
    would: the link's reader builds the broker's objects straight from the bytes
    (:func:`amqpd.cluster.link_records.read_batch`)."""

    def __init__(self, batches: BatchReader | None = None) -> None:
        self._parts: list[bytes] = []  # the start of a frame not yet whole
        self._have = 0  # bytes in _parts
        self._need = 0  # bytes the frame in _parts needs (9 while its head is cut)
        self._batches = batches

    def feed(self, data: bytes) -> list[tuple[int, int, list[Any]]]:
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts = []
        else:
            buf = bytes(data)
        frames: list[tuple[int, int, list[Any]]] = []
        pos = 0
        n = len(buf)
        need = 9
        while n - pos >= 9:
            length, kind, stream = _HEAD.unpack_from(buf, pos)
            if length < 5 or length > MAX_FRAME:
                raise WireError(f"frame length {length} out of range")
            end = pos + 4 + length
            if end > n:
                need = 4 + length
                break
            if kind in (PUBLISH, DELIVER, GET_OK):
                frames.append((kind, stream, _decode_fast(kind, buf, pos + 9, end)))
            elif kind in (PUBLISHES, DELIVERS):
                batches = self._batches
                frames.append((kind, stream, _decode_batch(kind, buf, pos + 9, end)
                               if batches is None else batches(kind, buf, pos + 9, end)))
            elif kind in _SMALL_FIELDS or kind in _IDS:
                frames.append((kind, stream, _decode_small(kind, buf, pos + 9, end)))
            else:
                frames.append((kind, stream, decode_fields(kind, buf[pos + 9:end])))
            pos = end
        if pos < n:
            self._parts = [buf[pos:] if pos else buf]
            self._have = n - pos
            self._need = need
        return frames


def proof(cookie: bytes, role: str, dialler: str, listener: str, dialler_nonce: bytes,
          listener_nonce: bytes) -> bytes:
    """What ``role`` ("client": the dialler, "server": the listener) sends to show it
    holds ``cookie``: bound to both names and both nonces, so it is worthless anywhere
    else."""
    msg = b"\x00".join((role.encode(), dialler.encode(), listener.encode(), dialler_nonce,
                        listener_nonce))
    return hmac.new(cookie, msg, hashlib.sha256).digest()


def proof_ok(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


__all__ = ["BATCH_BYTES", "DELIVERS_RECORD", "LAYOUTS", "MAGIC", "PREAMBLE", "PUBLISHES_RECORD",
           "VERSION", "BatchReader", "FrameReader", "WireError", "add_deliver", "add_publish",
           "decode_fields", "delivers", "encode", "encode_confirm", "encode_credit",
           "encode_deliver", "encode_grant", "encode_ids", "encode_publish", "proof",
           "proof_ok", "publishes", "seal"]
