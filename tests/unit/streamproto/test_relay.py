"""A publisher whose stream another node leads (amqpd/streamproto/relay.py): its
entries packed as the protocol packs them, the leader's answers passed to the client,
and what the client gets when the leader is lost (publish-error 0x06 for every id not
answered, a metadata-update, the publisher gone)."""

from __future__ import annotations

import gzip
import struct
from typing import Any

from amqpd.streamproto import codec as c
from amqpd.streamproto.connection import FORWARD_HIGH_WATER, StreamConnection
from amqpd.streamproto.publishing import Publisher, pack_entries, unpack_entries
from amqpd.streamproto.relay import RemotePublisher
from tests.unit.protocol.peer import real_broker


class Links:
    """ForwardedPublishes as a RemotePublisher uses it."""

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.sent: list[tuple[Any, ...]] = []
        self.closed: list[int] = []

    def open(self, leader: str, publisher: Any) -> int | None:
        return 7 if self.up else None

    def send(self, number: int, vhost: str, stream: str, reference: str,
             packed: bytes) -> bool:
        if self.up:
            self.sent.append((number, vhost, stream, reference, packed))
        return self.up

    def close(self, number: int) -> None:
        self.closed.append(number)


class Owner:
    name = "test"

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.confirms: list[int] = []
        self.errors: list[tuple[int, int]] = []
        self.lost: list[Publisher] = []
        self.bytes = 0  # in flight, as in_flight was told

    def in_flight(self, change: int) -> None:
        self.bytes += change
        assert self.bytes >= 0

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)

    def confirm(self, pub: Publisher, ids: list[int]) -> None:
        self.confirms += ids

    def error(self, pub: Publisher, errors: list[tuple[int, int]]) -> None:
        self.errors += errors

    def publisher_lost(self, pub: RemotePublisher) -> None:
        self.lost.append(pub)


class Stream:
    name = "s1"
    deleted = False


def _publisher(links: Links, owner: Owner) -> RemotePublisher:
    pub = RemotePublisher(3, "producer", Stream(), "/", "node-a", owner)
    assert pub.bind(links)  # type: ignore[arg-type]
    return pub


def test_entries_round_trip_as_the_protocol_packs_them() -> None:
    data = struct.pack(">I", 2) + b"ab" + struct.pack(">I", 1) + b"c"
    packed_batch = gzip.compress(data)
    entries: list[tuple[int, Any]] = [(1, b"one"), (2, (0, 2, len(data), data)),
                                      (3, (1, 2, len(data), packed_batch)), (4, b"")]
    assert unpack_entries(pack_entries(entries)) == entries


def test_answers_reach_the_client_and_a_lost_leader_refuses_what_is_pending() -> None:
    links, owner = Links(), Owner()
    pub = _publisher(links, owner)
    pub.forward([(1, b"a"), (2, b"b"), (3, (0, 4, 0, b""))])
    assert [s[:4] for s in links.sent] == [(7, "/", "s1", "producer")]
    assert unpack_entries(links.sent[0][4])[:2] == [(1, b"a"), (2, b"b")]
    # publishing ids, a sub-entry batch once (as RabbitMQ 3.10.8 and a local publisher)
    assert pub.published == 3 and pub.last_id == 3
    assert owner.bytes >= len(links.sent[0][4])
    assert pub.stored is None
    pub.answered([1], [(3, c.PRECONDITION_FAILED)], 1)
    assert owner.confirms == [1] and owner.errors == [(3, c.PRECONDITION_FAILED)]
    assert pub.stored == 1  # the leader's figure, for the management API
    assert (pub.confirmed, pub.errored) == (1, 1)
    assert list(pub.pending) == [2] and owner.bytes == pub.pending[2] > 0
    pub.lost("the link went down")
    assert owner.bytes == 0
    assert owner.errors[1:] == [(2, c.STREAM_NOT_AVAILABLE)]
    assert owner.lost == [pub]
    assert owner.frames == [c.metadata_update(c.STREAM_NOT_AVAILABLE, "s1")]
    pub.lost("again")  # once only
    pub.close()  # nothing left to tell the leader
    assert len(owner.frames) == 1 and links.closed == []


def test_a_publish_without_a_link_loses_the_leader() -> None:
    links, owner = Links(), Owner()
    pub = _publisher(links, owner)
    links.up = False
    pub.forward([(5, b"x")])
    assert owner.errors == [(5, c.STREAM_NOT_AVAILABLE)] and owner.lost == [pub]


def test_close_tells_the_leader() -> None:
    links, owner = Links(), Owner()
    pub = _publisher(links, owner)
    pub.forward([(1, b"a" * 100)])
    pub.close()
    assert links.closed == [7] and owner.bytes == 0
    assert not RemotePublisher(1, None, Stream(), "/", "n", owner).bind(
        Links(up=False))  # type: ignore[arg-type]


def test_a_connection_stops_reading_past_its_forwarding_bound() -> None:
    # a real connection (compiled, its methods take no stand-in object)
    conn = StreamConnection(real_broker(), None, "relay-test", ("127.0.0.1", 5552))
    calls: list[bool] = []
    conn.reading = calls.append
    step = FORWARD_HIGH_WATER // 4
    for _ in range(5):
        conn.in_flight(step)
    assert calls == [False]  # once, when it went past the bound
    conn.in_flight(-2 * step)
    assert calls == [False]  # above half the bound: still held
    conn.in_flight(-2 * step)
    assert calls == [False, True]


def test_a_deleted_stream_refuses_what_is_pending_and_tells_the_leader() -> None:
    """The stand-in of the stream was removed here (:meth:`RemotePublisher.ended`): the
    ids not answered get 0x06, the leader's node forgets the publisher; the metadata
    update is the connection's (once per stream, with its other clients of it)."""
    links, owner = Links(), Owner()
    pub = _publisher(links, owner)
    pub.forward([(1, b"a"), (2, b"b")])
    pub.answered([1], [], 1)
    pub.ended()
    assert owner.errors == [(2, c.STREAM_NOT_AVAILABLE)] and owner.bytes == 0
    assert links.closed == [7] and owner.frames == [] and owner.lost == []
    assert (pub.confirmed, pub.errored) == (1, 1)
