"""A stream's records as AMQP 0-9-1 messages: encoded on publish, cut into deliveries
straight from the stored bytes (compiled: amqpd/hotpath.py).

A record's payload (:func:`encode_payload`) is the message as it will be delivered:

    exchange len u8 | routing key len u8 | exchange | routing key
    | properties len u32 | properties (with the x-stream-offset header) | body

The ``x-stream-offset`` header is written into the properties when the record is
appended (:func:`with_offset_header`: its offset is known then), so a delivery sends
the stored properties as they are.

A stream consumer reads whole records as the segment file stores them
(:meth:`amqpd.store.stream_log.Reader.read_raw`: ``crc | length | offset | timestamp |
flags | payload``). Every delivered message crosses the
loop of :func:`deliver_stored` once, so it does per record only what the delivery
needs, in compiled code (amqpd/hotpath.py):

* the record's length, offset and flags are read as bytes of its header (no struct
  call, no tuple, no :class:`~amqpd.store.stream_log.Record`);
* the message's properties and body are sliced from the stored bytes once (the
  payload is never cut out first);
* the exchange and routing key are decoded only when they differ from the previous
  record's (one ``startswith`` on the stored bytes tells), so consecutive deliveries
  share the same ``str`` objects, and the channel's delivery template
  (:class:`amqpd.protocol.codec.DeliveryFrames`) recognises them by identity.

Nothing here knows where the bytes came from (a read in place or a worker's
read-ahead: :mod:`amqpd.broker.stream_readahead`) or how many the consumer may take:
the caller says how many records at most, and the loop stops early when the consumer
cannot take more or an offset reaches the commit limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from amqpd.broker import rawprops
from amqpd.broker.message import Message
from amqpd.broker.queue_entry import QueueEntry
from amqpd.store.stream_log import AMQP10, RECORD_SIZE, StreamLog

if TYPE_CHECKING:
    from amqpd.broker.queue import Consumer
    from amqpd.broker.queue_type import QueueType

_FLAGS: Final = 24  # a stored record's flags byte, after crc, length, offset, timestamp
OFFSET_HEADER: Final = "x-stream-offset"
_OFFSET_KEY: Final = OFFSET_HEADER.encode()
_OFFSET_ENTRY: Final = bytes((len(_OFFSET_KEY),)) + _OFFSET_KEY + b"l"  # then an i64
# one byte of each value, made once: a tuple index costs less than a bytes() call here
# (a call from compiled code to a Python-level function or method costs ~700
# instructions, int.to_bytes ~400: every record pays what this module calls)
_BYTE: Final = tuple(bytes((i,)) for i in range(256))
_ENTRY_LEN: Final = len(_OFFSET_ENTRY) + 8  # the header's entry: name, type, an i64
_ENTRY_SIZE: Final = _ENTRY_LEN.to_bytes(4, "big")  # a table of that entry alone


def _be32(data: bytes, at: int) -> int:
    return (data[at] << 24) | (data[at + 1] << 16) | (data[at + 2] << 8) | data[at + 3]


def _be64(data: bytes, at: int) -> int:
    return (_be32(data, at) << 32) | _be32(data, at + 4)


def with_offset_header(properties: bytes, offset: int) -> bytes:
    """``properties`` with the ``x-stream-offset`` header (a long) set to ``offset``.
    The common case splices bytes: the headers table is the third property, after
    content-type and content-encoding, so the entry is appended to it (or a table
    made for it) without decoding anything; a header of that name already there goes
    through the general path (replaced, not doubled)."""
    if len(properties) >= 2:
        flags = properties[0]
        pos = 2
        if flags & 0x80:  # content-type
            pos += 1 + properties[pos]
        if flags & 0x40:  # content-encoding
            pos += 1 + properties[pos]
        if not flags & 0x20:  # no headers yet: a table of one
            return b"".join((_BYTE[flags | 0x20], properties[1:pos], _ENTRY_SIZE,
                             _OFFSET_ENTRY, offset.to_bytes(8, "big", signed=True),
                             properties[pos:]))
        size = _be32(properties, pos)
        end = pos + 4 + size
        # find, not ``in``: bytes.__contains__ first tries its argument as an int, and
        # the TypeError it formats and drops costs more than the search
        if properties.find(_OFFSET_KEY, pos + 4, end) < 0:
            return b"".join((properties[:pos], (size + _ENTRY_LEN).to_bytes(4, "big"),
                             properties[pos + 4:end], _OFFSET_ENTRY,
                             offset.to_bytes(8, "big", signed=True), properties[end:]))
    fields = rawprops.split_properties(properties)
    items = [kv for kv in rawprops.header_items(fields) if kv[0] != OFFSET_HEADER]
    items.append((OFFSET_HEADER, rawprops.long(offset)))
    fields["headers"] = rawprops.encode_table(items)
    return rawprops.join_properties(fields)


def encode_payload(message: Message, offset: int) -> bytes:
    """A record's payload (module docstring): exchange, routing key, the properties
    with the ``x-stream-offset`` header set to ``offset``, the body."""
    props = with_offset_header(message.properties, offset)
    exchange = message.exchange.encode()
    key = message.routing_key.encode()
    return b"".join((bytes((len(exchange), len(key))), exchange, key,
                     len(props).to_bytes(4, "big"), props, message.body))


def append_message(log: StreamLog, message: Message, timestamp: int) -> int:
    """Append ``message`` to ``log`` as the record :func:`encode_payload` would make,
    its body passed on as it came (:meth:`StreamLog.append_parts`: not copied into a
    payload first); its offset. Every AMQP 0-9-1 publish to a stream comes here."""
    props = with_offset_header(message.properties, log.next_offset)
    exchange = message.exchange.encode()
    key = message.routing_key.encode()
    # names and properties in one part (short), the body in another
    head = b"".join((_BYTE[len(exchange)], _BYTE[len(key)], exchange, key,
                     len(props).to_bytes(4, "big"), props))
    return log.append_parts([head, message.body], timestamp)


def decode_payload(payload: bytes) -> Message:
    """The message a record's payload holds (as it is delivered): exchange, routing key
    (``u8`` lengths first), ``u32``-sized properties, the body."""
    n_exchange = payload[0]
    names = 2 + n_exchange + payload[1]
    props_end = names + 4 + _be32(payload, names)
    return Message(payload[2:2 + n_exchange].decode(), payload[2 + n_exchange:names].decode(),
                   payload[names + 4:props_end], payload[props_end:], True)


def deliver_stored(queue: QueueType, consumer: Consumer, data: bytes, at: int, count: int,
                   limit: int, amqp10: Callable[[bytes, int], Message]) -> tuple[int, int]:
    """Deliver to ``consumer`` up to ``count`` of the stored records in ``data`` from
    position ``at`` on, in order, while it can take them (the first one is delivered
    unasked: the caller checked) and, with ``limit`` >= 0, while their offsets are
    below it; a record a stream-protocol client published (flag AMQP10) becomes the
    message ``amqp10(payload, offset)`` gives. Returns the position after the last
    record delivered and how many were."""
    n = 0
    head = b""  # the previous record's exchange and routing key, as stored
    exchange = routing_key = ""
    while n < count:
        offset = _be64(data, at + 8)
        if 0 <= limit <= offset:
            break
        if n and not consumer.can_receive():
            break
        body = at + RECORD_SIZE
        end = body + _be32(data, at + 4)
        if data[at + _FLAGS] & AMQP10:
            message = amqp10(data[body:end], offset)
        else:
            names = body + 2 + data[body] + data[body + 1]
            if not head or not data.startswith(head, body):
                head = data[body:names]
                split = body + 2 + data[body]
                exchange = data[body + 2:split].decode()
                routing_key = data[split:names].decode()
            props_end = names + 4 + _be32(data, names)
            message = Message(exchange, routing_key, data[names + 4:props_end],
                              data[props_end:end], True)
        consumer.deliver(queue, QueueEntry(message, offset))
        at = end
        n += 1
    return at, n


__all__ = ["OFFSET_HEADER", "append_message", "decode_payload", "deliver_stored", "encode_payload",
           "with_offset_header"]
