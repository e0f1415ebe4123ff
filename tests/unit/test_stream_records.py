"""A stream's AMQP 0-9-1 deliveries cut from stored records (amqpd.broker.stream_records):
the same messages the Record path decodes, in order, stopping where the consumer stalls
or the commit limit is, and the exchange and routing key shared between consecutive
records that carry the same ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpd.broker.message import Message
from amqpd.broker.queue import Consumer
from amqpd.broker.queue_entry import QueueEntry
from amqpd.broker.queue_type import QueueType
from amqpd.broker.stream import decode_record, encode_payload
from amqpd.broker.stream_records import append_message, decode_payload, deliver_stored
from amqpd.protocol import codec
from amqpd.store.stream_log import AMQP10, StreamLog, parse_records


class _Channel:
    """The channel of a consumer, as deliver_stored meets it: takes ``room``
    deliveries, then stalls."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.got: list[QueueEntry] = []

    def can_deliver(self, consumer: Consumer) -> bool:
        return len(self.got) < self.room

    def deliver(self, consumer: Consumer, queue: Any, entry: QueueEntry) -> None:
        self.got.append(entry)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        raise AssertionError("not cancelled here")


# a queue type the loop only passes on (compiled code checks its type)
_QUEUE = QueueType.__new__(QueueType)


def _consumer(room: int) -> tuple[Consumer, _Channel]:
    channel = _Channel(room)
    return Consumer(channel, _QUEUE, "ctag", False, False, 0, {}), channel


def _deliver(consumer: tuple[Consumer, _Channel], data: bytes, at: int, count: int,
             limit: int) -> tuple[int, int]:
    return deliver_stored(_QUEUE, consumer[0], data, at, count, limit, _amqp10)


def _stored(tmp_path: Path) -> tuple[bytes, int]:
    """Ten records as a stream stores them: AMQP 0-9-1 messages through two exchanges
    and routing keys (runs of equal ones), one with no properties, one stream-protocol
    message; then the stored bytes read back whole."""
    sl = StreamLog(tmp_path / "s")
    sl.open()
    names = [("amq.direct", "k1"), ("amq.direct", "k1"), ("", "q"), ("", "q"),
             ("ex\u00e9", "cl\u00e9"), ("ex\u00e9", "cl\u00e9"), ("", "")]
    for i, (exchange, key) in enumerate(names):
        props = b"\x90\x00\x0atext/plain\x02" if i != 3 else b"\x00\x00"
        sl.append(encode_payload(Message(exchange, key, props, b"body %d" % i, True),
                                 sl.next_offset), 1000 + i)
    sl.append(b"\x00Su\xb0\x00\x00\x00\x03raw", 2000, AMQP10)
    sl.append(encode_payload(Message("amq.direct", "k1", b"\x00\x00", b"", True),
                             sl.next_offset), 2001)
    sl.append(encode_payload(Message("amq.direct", "k1", b"\x00\x00", b"x" * 5000, True),
                             sl.next_offset), 2002)
    sl.flush()
    data, n = sl.reader(0).read_raw(100)
    sl.close()
    return data, n


def _expected(data: bytes) -> list[Message]:
    return [decode_record(r, "q") for r in parse_records(data)]


def _amqp10(payload: bytes, offset: int) -> Message:
    return Message("", "from-amqp10", b"\x00\x00", payload + b"@%d" % offset, True)


def test_every_record_becomes_the_message_the_record_path_decodes(tmp_path: Path) -> None:
    data, n = _stored(tmp_path)
    consumer = _consumer(100)
    end, sent = _deliver(consumer, data, 0, n, -1)
    assert (end, sent) == (len(data), n) and n == 10
    want = _expected(data)
    got = consumer[1].got
    assert [e.seq for e in got] == list(range(n))
    for i, (entry, message) in enumerate(zip(got, want, strict=True)):
        m = entry.message
        if i == 7:  # the stream-protocol record went through the callback
            assert (m.routing_key, m.body) == ("from-amqp10", b"\x00Su\xb0\x00\x00\x00\x03raw@7")
            continue
        assert (m.exchange, m.routing_key, m.properties, m.body, m.persistent) == (
            message.exchange, message.routing_key, message.properties, message.body, True)
        assert m.body == decode_payload(parse_records(data)[i].payload).body
    # a run of equal exchange and routing key shares the decoded strings
    assert got[1].message.exchange is got[0].message.exchange
    assert got[1].message.routing_key is got[0].message.routing_key
    assert got[5].message.routing_key is got[4].message.routing_key


@pytest.mark.parametrize("room", [1, 3, 9])
def test_a_stalled_consumer_stops_the_loop_where_it_stalled(tmp_path: Path, room: int) -> None:
    data, n = _stored(tmp_path)
    consumer = _consumer(room)
    end, sent = _deliver(consumer, data, 0, n, -1)
    assert sent == room == len(consumer[1].got)
    rest = parse_records(data[end:])
    assert [r.offset for r in rest] == list(range(room, n))
    # and the caller goes on from there
    more = _consumer(100)
    end2, sent2 = _deliver(more, data, end, n - room, -1)
    assert (end2, sent2) == (len(data), n - room)
    assert [e.seq for e in more[1].got] == list(range(room, n))


def test_count_and_limit_bound_the_loop(tmp_path: Path) -> None:
    data, n = _stored(tmp_path)
    consumer = _consumer(100)
    _, sent = _deliver(consumer, data, 0, 4, -1)
    assert sent == 4
    consumer = _consumer(100)
    end, sent = _deliver(consumer, data, 0, n, 6)
    assert sent == 6 and [e.seq for e in consumer[1].got] == list(range(6))
    assert parse_records(data[end:])[0].offset == 6
    _, sent = _deliver(_consumer(100), data, 0, n, 0)
    assert sent == 0


def test_append_message_stores_the_record_encode_payload_makes(tmp_path: Path) -> None:
    """The publish path appends a message in parts (its body not copied into a payload
    first): the stored record is the one ``append(encode_payload(...))`` stores, the
    ``x-stream-offset`` header holding the record's own offset."""
    messages = [
        Message("", "q", b"\x00\x00", b"body-0", True),
        Message("ex", "k.1", codec.encode_properties({"content_type": "text/plain",
                                                       "headers": {"a": 1}}), b"", True),
        Message("\u00e9x", "r" * 255, codec.encode_properties({"headers": {
            "x-stream-offset": 99}}), b"z" * 3000, True),
    ]
    joined, parts = StreamLog(tmp_path / "joined"), StreamLog(tmp_path / "parts")
    joined.open()
    parts.open()
    for ts, m in enumerate(messages):
        assert joined.append(encode_payload(m, joined.next_offset), ts) == ts
        assert append_message(parts, m, ts) == ts
    joined.flush()
    parts.flush()
    assert joined.segments[0].path.read_bytes() == parts.segments[0].path.read_bytes()
    for record, m in zip(parts.reader(0).records(10), messages, strict=True):
        got = decode_payload(record.payload)
        assert (got.exchange, got.routing_key, got.body) == (m.exchange, m.routing_key,
                                                             m.body)
        assert codec.decode_properties(got.properties)["headers"]["x-stream-offset"] == \
            record.offset
