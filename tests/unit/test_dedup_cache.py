"""DedupCache: bounded by entry count, per-entry expiry, settles what leaves."""

from __future__ import annotations

import pytest

from amqpd.broker.dedup import DedupCache, dedup_key, message_ttl, validate_exchange_arguments
from amqpd.broker.message import Message
from amqpd.protocol.codec import encode_properties
from amqpd.protocol.errors import PreconditionFailed


def _message(headers: dict[str, object]) -> Message:
    return Message("x", "", encode_properties({"headers": headers}), b"")


def test_oldest_entry_makes_room_and_its_record_is_settled() -> None:
    left: list[int] = []
    cache = DedupCache(2, left.append)
    cache.add(b"a", 0, 1000, position=10)
    cache.add(b"b", 0, 1000, position=11)
    cache.add(b"c", 0, 1000)  # "a" leaves
    assert [k for k in (b"a", b"b", b"c") if cache.seen(k, 1000)] == [b"b", b"c"]
    assert left == [10]
    cache.resize(1)
    assert len(cache) == 1 and left == [10, 11]


def test_expired_entries_leave_on_lookup_and_on_insert() -> None:
    left: list[int] = []
    cache = DedupCache(10, left.append)
    cache.add(b"a", 1500, 1000, position=1)
    cache.add(b"b", 0, 1000, position=2)
    assert cache.seen(b"a", 1499)
    assert not cache.seen(b"a", 1500) and left == [1]
    cache.add(b"c", 1600, 1000, position=3)
    cache.add(b"d", 0, 2000)  # "b" (never expires) is at the old end: nothing trimmed
    assert cache.seen(b"b", 2000) and not cache.seen(b"c", 2000)
    assert left == [1, 3]


def test_key_reads_the_header_and_keeps_types_apart() -> None:
    text = dedup_key(_message({"a": 5, "x-deduplication-header": "1"}))
    number = dedup_key(_message({"x-deduplication-header": 1}))
    assert text == b"S\x00\x00\x00\x011"  # the field as sent: type byte, then value
    assert number is not None and number != text
    assert dedup_key(_message({"other": "x-deduplication-header"})) is None
    assert message_ttl(_message({"x-cache-ttl": 250})) == 250
    assert message_ttl(_message({"x-cache-ttl": -1})) is None
    assert message_ttl(_message({"x-cache-ttl": "250"})) is None
    assert dedup_key(Message("x", "", b"\x00\x00", b"")) is None


@pytest.mark.parametrize("args", [
    {}, {"x-cache-size": 0}, {"x-cache-size": True}, {"x-cache-size": 5, "x-cache-ttl": 0},
    {"x-cache-size": 5, "x-cache-persistence": "tape"},
])
def test_bad_exchange_arguments(args: dict[str, object]) -> None:
    with pytest.raises(PreconditionFailed):
        validate_exchange_arguments(args)
