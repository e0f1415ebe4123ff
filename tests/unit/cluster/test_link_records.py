"""amqpd.cluster.link_records: the link's batches read straight into Messages and
QueueEntries hold what the generic records hold, are refused where those are, and the
compiled loops over them keep the link's order and batching."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

import pytest

from amqpd.broker.api import Message, QueueEntry
from amqpd.cluster import link_records as R
from amqpd.cluster import link_wire as W
from tests.unit.cluster.test_link_wire import DELIVER_RECORDS, PUBLISH_RECORDS

# properties with delivery-mode 2 (persistent) and with none
PERSISTENT_PROPS = b"\x10\x00\x02"
# names that repeat, change, keep their length but not their bytes, and go empty: the
# reader decodes a name again only when its bytes differ from the record before's
NAMES = [("", "q1"), ("", "q1"), ("", "q2"), ("ex", "q2"), ("ey", "q2"), ("", ""),
         ("é", "q2"), ("", "q2")]


# the largest numbers a head holds (past a machine word's small ints)
BIG_PUBLISH = (2**64 - 1, 1, "", "q1", b"", b"big")
BIG_DELIVER = (2**64 - 1, 1, 2**64 - 2, "", "q1", b"", b"big", 2**63 + 5)


def _publish_records() -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [*PUBLISH_RECORDS, BIG_PUBLISH]
    out += [(i, i % 2, ex, key, PERSISTENT_PROPS if i % 3 else b"", f"m{i}".encode())
            for i, (ex, key) in enumerate(NAMES)]
    return out


def _deliver_records() -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [*DELIVER_RECORDS, BIG_DELIVER]
    out += [(100 + i, i % 2, 50 - i, ex, key, PERSISTENT_PROPS if i % 3 else b"",
             f"m{i}".encode(), i % 4) for i, (ex, key) in enumerate(NAMES)]
    return out


def _frame(kind: int, records: Sequence[tuple[Any, ...]]) -> bytes:
    if kind == W.PUBLISHES:
        frame = W.publishes(5, *records[0])
        for record in records[1:]:
            assert W.add_publish(frame, *record)
    else:
        frame = W.delivers(6, 9, *records[0])
        for record in records[1:]:
            assert W.add_deliver(frame, *record)
    W.seal(frame)
    return bytes(frame)


def _as_publishes(batch: R.Publishes) -> list[tuple[Any, ...]]:
    return [(seq, int(m.persistent), m.exchange, m.routing_key, m.properties, m.body)
            for seq, m in zip(batch.seqs, batch.messages, strict=True)]


def test_publishes_read_as_messages_hold_the_generic_records() -> None:
    """Each record a Message with the record's exchange, routing key, properties, body
    and persistent flag (as sent, not as the properties say), its seq beside it; the
    same whether read whole by the link's reader or cut at any point."""
    records = _publish_records()
    data = _frame(W.PUBLISHES, records)
    generic = W.FrameReader().feed(data)[0][2][0]
    for cut in range(0, len(data), 7):
        reader = W.FrameReader(R.read_batch)
        frames = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [(k, s) for k, s, _ in frames] == [(W.PUBLISHES, 5)]
        batch = frames[0][2][0]
        assert isinstance(batch, R.Publishes) and len(batch) == len(records)
        assert _as_publishes(batch) == generic
    assert [m.exchange for m in batch.messages][-len(NAMES):] == [ex for ex, _ in NAMES]
    assert [m.routing_key for m in batch.messages][-len(NAMES):] == [k for _, k in NAMES]


def test_delivers_read_as_queue_entries_hold_the_generic_records() -> None:
    """Each record a QueueEntry (its seq the leader's delivery id, redelivered as a
    bool) of a Message whose persistent flag comes from its properties (as a DELIVER's
    does), the store positions beside them, the ready count of the last record."""
    records = _deliver_records()
    data = _frame(W.DELIVERS, records)
    generic = W.FrameReader().feed(data)[0][2]
    [(kind, stream, fields)] = W.FrameReader(R.read_batch).feed(data)
    assert (kind, stream, fields[0]) == (W.DELIVERS, 6, generic[0])
    batch = fields[1]
    assert isinstance(batch, R.Delivers) and len(batch) == len(records)
    got = [(e.seq, int(e.redelivered), e.message.exchange, e.message.routing_key,
            e.message.properties, e.message.body, p)
           for e, p in zip(batch.entries, batch.positions, strict=True)]
    assert got == [(d, r, ex, k, pr, b, p) for d, r, _ready, ex, k, pr, b, p in generic[1]]
    assert all(isinstance(e.redelivered, bool) for e in batch.entries)
    assert [e.message.persistent for e in batch.entries] == \
        [pr == PERSISTENT_PROPS for *_, pr, _b, _p in generic[1]]
    assert batch.ready == generic[1][-1][2]
    assert batch.ids() == [r[0] for r in generic[1]]


@pytest.mark.parametrize("kind", [W.PUBLISHES, W.DELIVERS])
def test_the_batch_reader_refuses_what_the_generic_refuses(kind: int) -> None:
    """The frames test_link_wire shows the generic reader refusing (cut in a record's
    head or strings, a byte too many, a length past the frame, a name that is not
    UTF-8, a DELIVERS with no consumer id) are refused with read_batch too, alone and
    with a good frame after them."""
    if kind == W.PUBLISHES:
        body = W.encode(kind, 5, PUBLISH_RECORDS)[9:]
        first, head = 0, 21
        not_utf8 = struct.pack(">QBHHII", 1, 0, 1, 0, 0, 0) + b"\xff"
        not_utf8_key = struct.pack(">QBHHII", 1, 0, 0, 1, 0, 0) + b"\xff"
    else:
        body = W.encode(kind, 5, 9, DELIVER_RECORDS)[9:]
        first, head = 4, 37
        not_utf8 = struct.pack(">IQBQQHHII", 9, 1, 0, 0, 0, 1, 0, 0, 0) + b"\xff"
        not_utf8_key = struct.pack(">IQBQQHHII", 9, 1, 0, 0, 0, 0, 1, 0, 0) + b"\xff"
    key_len_at = first + head - 10
    too_long = body[:key_len_at] + b"\xff\xff" + body[key_len_at + 2:]
    bads = [body[:-1], body + b"\x00", body[:first + head - 1], too_long, not_utf8,
            not_utf8_key]
    if kind == W.DELIVERS:
        bads.append(body[:3])
    good = W.encode_credit(5, 1)
    for bad in bads:
        frame = struct.pack(">IBI", len(bad) + 5, kind, 5) + bad
        for data in (frame, frame + good):
            with pytest.raises(W.WireError):
                W.FrameReader().feed(data)
            with pytest.raises(W.WireError):
                W.FrameReader(R.read_batch).feed(data)


def _delivers(n: int, positions: Sequence[int]) -> R.Delivers:
    records = [(i + 1, 0, n - i, "", "q", b"", b"x", positions[i]) for i in range(n)]
    [(_k, _s, fields)] = W.FrameReader(R.read_batch).feed(_frame(W.DELIVERS, records))
    batch = fields[1]
    assert isinstance(batch, R.Delivers)
    return batch


def test_arrive_makes_the_ids_this_nodes_and_records_owners_and_positions() -> None:
    """The stream's base is added to each id; with an owner map each id names the
    consumer's state and a quorum queue's position (sent + 1) is kept; the entries
    join the buffer after what waits there, in order."""
    buffer: deque[QueueEntry] = deque([QueueEntry(_delivers(1, [0]).entries[0].message, 7)])
    owner: dict[int, Any] = {}
    positions: dict[int, int] = {}
    state = object()
    R.arrive(_delivers(3, [0, 5, 1]), 1000, buffer, owner, state, positions)
    assert [e.seq for e in buffer] == [7, 1001, 1002, 1003]
    assert owner == {1001: state, 1002: state, 1003: state}
    assert positions == {1002: 4, 1003: 0}
    no_ack: deque[QueueEntry] = deque()
    R.arrive(_delivers(2, [3, 3]), 50, no_ack, None, state, positions)
    assert [e.seq for e in no_ack] == [51, 52]
    assert positions == {1002: 4, 1003: 0}  # a no-ack delivery is nobody's to settle


class _Link:
    """What the batching reads of a link: its queued frames; send queues one."""

    def __init__(self) -> None:
        self.queued: list[bytes | bytearray] = []

    def send(self, frame: bytes | bytearray) -> None:
        self.queued.append(frame)


def _read(link: _Link) -> list[tuple[int, list[tuple[Any, ...]]]]:
    out = []
    for frame in link.queued:
        if type(frame) is bytearray:
            W.seal(frame)
        for kind, _stream, fields in W.FrameReader().feed(bytes(frame)):
            out.append((kind, fields[-1] if kind == W.PUBLISHES else fields))
    return out


def test_publishes_join_the_last_frame_only_while_it_is_last() -> None:
    """add_message grows the stream's frame while nothing was queued after it; a frame
    queued meanwhile (a purge) starts a new one, so it is not overtaken. send_unsent
    sends the waiting publishes while the credit lasts, joining the frame if it is
    last, and leaves the rest waiting in order."""
    link = _Link()
    message = Message("", "q", b"", b"")
    frame = R.add_message(None, link, 5, 0, message, b"a")
    assert R.add_message(frame, link, 5, 1, message, b"b") is frame
    link.send(W.encode(W.PURGE, 5, 1))
    frame = R.add_message(frame, link, 5, 0, message, b"c")
    unsent: deque[tuple[int, bool, str, str, bytes, bytes]] = deque(
        (0, True, "", "q", b"", bytes([100 + i])) for i in range(5))
    credit, frame2 = R.send_unsent(unsent, 3, frame, link, 5)
    assert (credit, frame2) == (0, frame) and len(unsent) == 2
    link.send(W.encode_credit(5, 1))
    credit, frame3 = R.send_unsent(unsent, 5, frame2, link, 5)
    assert credit == 3 and not unsent and frame3 is not frame2
    bodies = [[r[5] for r in fields] if kind == W.PUBLISHES else kind
              for kind, fields in _read(link)]
    assert bodies == [[b"a", b"b"], W.PURGE, [b"c", b"d", b"e", b"f"], W.CREDIT,
                      [b"g", b"h"]]
    first = _read(link)[0][1]
    assert [r[0] for r in first] == [0, 1]


def test_deliveries_join_the_consumers_frame_only_while_it_is_last() -> None:
    """add_delivery grows a consumer's DELIVERS frame while it is the last frame
    queued, and starts another after anything queued meanwhile (a CANCELLED)."""
    link = _Link()
    message = Message("ex", "q", b"", b"")
    frame = R.add_delivery(None, link, 6, 9, 1, False, 3, message, b"a", 0)
    assert R.add_delivery(frame, link, 6, 9, 2, True, 2, message, b"b", 7) is frame
    link.send(W.encode(W.CANCELLED, 6, 8))
    frame2 = R.add_delivery(frame, link, 6, 9, 3, False, 1, message, b"c", 0)
    assert frame2 is not frame
    got = _read(link)
    assert [kind for kind, _ in got] == [W.DELIVERS, W.CANCELLED, W.DELIVERS]
    assert got[0][1] == [9, [(1, 0, 3, "ex", "q", b"", b"a", 0),
                             (2, 1, 2, "ex", "q", b"", b"b", 7)]]
    assert got[2][1] == [9, [(3, 0, 1, "ex", "q", b"", b"c", 0)]]
