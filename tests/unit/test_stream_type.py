"""The stream queue type's pure parts (amqpd.broker.stream): argument checks, offset
specifications, the record payload with its x-stream-offset header."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from amqpd.broker import rawprops
from amqpd.broker.message import Message
from amqpd.broker.stream import (
    decode_payload,
    encode_payload,
    parse_duration,
    start_offset,
    stream_directory,
    validate_stream_arguments,
    with_offset_header,
)
from amqpd.protocol.errors import PreconditionFailed
from amqpd.store.stream_log import StreamLog


@pytest.mark.parametrize(("text", "ms"), [
    ("10s", 10_000), ("7m", 420_000), ("2h", 7_200_000), ("1D", 86_400_000),
    ("1M", 30 * 86_400_000), ("1Y", 365 * 86_400_000)])
def test_durations_in_rabbitmqs_units(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["10", "0s", "1d", "1H", "-1s", "bad", "1h ", 10, None])
def test_bad_durations(bad: object) -> None:
    assert parse_duration(bad) is None


@pytest.mark.parametrize(("args", "text"), [
    ({"x-max-age": "bad"}, "invalid_max_age"),
    ({"x-max-age": 5}, "{unacceptable_type,signedint}"),
    ({"x-max-length-bytes": -1}, "{value_negative,-1}"),
    ({"x-initial-cluster-size": 0}, "{value_zero,0}"),
    ({"x-stream-max-segment-size-bytes": "x"}, '"expected integer, got longstr"'),
    ({"x-queue-leader-locator": "nowhere"}, "invalid_queue_locator_arg"),
    ({"x-message-ttl": 5}, "of queue type rabbit_stream_queue"),
])
def test_argument_refusals(args: dict[str, object], text: str) -> None:
    with pytest.raises(PreconditionFailed) as exc:
        validate_stream_arguments(args, "s", "/")
    assert text in str(exc.value)


def test_accepted_arguments() -> None:
    validate_stream_arguments({"x-max-age": "3M", "x-max-length-bytes": 0,
                               "x-stream-max-segment-size-bytes": 0,
                               "x-initial-cluster-size": 5,
                               "x-queue-leader-locator": "balanced", "x-other": 1}, "s", "/")


def _log(tmp_path: Path) -> StreamLog:
    log = StreamLog(tmp_path, max_segment_bytes=10**9)
    log.open()
    for i in range(10):
        log.append(b"r", 1_000_000 + i * 1000)
        if i in (4, 8):
            log.flush()
    log.flush()
    return log


@pytest.mark.parametrize(("spec", "offset"), [
    ("first", 0), ("last", 9), ("next", 10), (None, 10), (3, 3), (-5, 0), (99, 10),
    (datetime.datetime.fromtimestamp(1003, datetime.UTC), 3),
    (datetime.datetime(1970, 1, 1, 0, 16, 43), 3),  # naive: UTC, as pika sends it
    ("bogus", None), (True, None), (1.5, None)])
def test_start_offsets(tmp_path: Path, spec: object, offset: int | None) -> None:
    assert start_offset(spec, _log(tmp_path), now_ms=2_000_000) == offset


def test_interval_offsets(tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert start_offset("10s", log, now_ms=1_000_000 + 15_000) == 5
    assert start_offset("1h", log, now_ms=1_000_000 + 15_000) == 0
    assert start_offset("1s", log, now_ms=10**12) == 10


def test_last_is_the_chunk_start(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.append(b"a", 1)
    log.append(b"b", 2)
    log.flush()
    assert start_offset("last", log, 0) == 10


def test_payload_carries_the_offset_header_and_keeps_the_rest() -> None:
    props = rawprops.join_properties({
        "content_type": rawprops.shortstr_field("text/plain"),
        "headers": rawprops.encode_table([("a", rawprops.longstr("b")),
                                          ("x-stream-offset", rawprops.long(1))])})
    msg = Message("ex", "rk", props, b"body")
    back = decode_payload(encode_payload(msg, 42))
    assert (back.exchange, back.routing_key, back.body) == ("ex", "rk", b"body")
    assert back.props["content_type"] == "text/plain"
    assert back.headers == {"a": "b", "x-stream-offset": 42}  # replaced, not doubled
    bare = decode_payload(encode_payload(Message("", "q", b"\x00\x00", b""), 7))
    assert bare.headers == {"x-stream-offset": 7} and bare.body == b""


@pytest.mark.parametrize("fields", [
    {},
    {"content_type": rawprops.shortstr_field("a/b")},
    {"content_type": rawprops.shortstr_field("a/b"),
     "content_encoding": rawprops.shortstr_field("gzip"),
     "delivery_mode": b"\x02", "priority": b"\x05",
     "correlation_id": rawprops.shortstr_field("c")},
    {"content_encoding": rawprops.shortstr_field("gzip"),
     "headers": rawprops.encode_table([("k", rawprops.long(1)),
                                       ("t", rawprops.longstr("v"))]),
     "reply_to": rawprops.shortstr_field("r")},
    {"headers": rawprops.encode_table([])},
    # the header's name elsewhere in the properties (the splice searches the table only)
    {"reply_to": rawprops.shortstr_field("x-stream-offset")},
    {"headers": rawprops.encode_table([("k", rawprops.long(1))]),
     "reply_to": rawprops.shortstr_field("x-stream-offset")},
    # ... or as a value in the table (the general path, with the same result)
    {"headers": rawprops.encode_table([("k", rawprops.longstr("x-stream-offset"))])},
])
def test_the_spliced_header_equals_the_decoded_one(fields: dict[str, bytes]) -> None:
    """The byte-splicing path gives what decoding, setting and encoding gives."""
    props = rawprops.join_properties(fields)
    spliced = with_offset_header(props, 123)
    expected = rawprops.split_properties(props)
    items = [*rawprops.header_items(expected), ("x-stream-offset", rawprops.long(123))]
    expected["headers"] = rawprops.encode_table(items)
    assert spliced == rawprops.join_properties(expected)
    assert Message("", "", spliced, b"").headers["x-stream-offset"] == 123


def test_directory_is_a_digest_of_vhost_and_name(tmp_path: Path) -> None:
    a = stream_directory(tmp_path, "/", "x" * 255)
    assert a.parent == tmp_path / "streams" and len(a.name) == 32
    assert a != stream_directory(tmp_path, "/", "y")
    assert stream_directory(tmp_path, "a", "b/c") != stream_directory(tmp_path, "a/b", "c")


def test_a_publishers_own_offset_header_is_replaced_not_doubled() -> None:
    props = rawprops.join_properties({"headers": rawprops.encode_table(
        [("a", rawprops.long(1)), ("x-stream-offset", rawprops.long(5))])})
    spliced = with_offset_header(props, 123)
    assert Message("", "", spliced, b"").headers == {"a": 1, "x-stream-offset": 123}
    assert spliced.count(b"x-stream-offset") == 1
