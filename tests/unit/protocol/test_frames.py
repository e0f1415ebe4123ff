"""FrameReader: splitting, need-more-data, and the malformed frames that are 501."""

from __future__ import annotations

import pytest

from amqpd.protocol.errors import FrameError
from amqpd.protocol.frames import HEARTBEAT_FRAME, FrameReader
from tests.support.wire import raw_frame


def test_one_frame() -> None:
    reader = FrameReader(4096)
    assert reader.feed(raw_frame(1, 3, b"abc")) == [(1, 3, b"abc")]
    assert reader.buffered == 0


def test_heartbeat_frame() -> None:
    assert FrameReader(4096).feed(HEARTBEAT_FRAME) == [(8, 0, b"")]


def test_many_frames_in_one_feed() -> None:
    data = b"".join(raw_frame(3, n, bytes([n]) * n) for n in range(1, 20))
    frames = FrameReader(4096).feed(data)
    assert frames == [(3, n, bytes([n]) * n) for n in range(1, 20)]


@pytest.mark.parametrize("cut", range(1, 15))
def test_split_at_every_byte(cut: int) -> None:
    data = raw_frame(1, 1, b"hello") + raw_frame(2, 1, b"x")
    reader = FrameReader(4096)
    first = reader.feed(data[:cut])
    rest = reader.feed(data[cut:])
    assert first + rest == [(1, 1, b"hello"), (2, 1, b"x")]
    assert reader.buffered == 0


def test_byte_by_byte() -> None:
    data = raw_frame(1, 7, b"payload" * 10) * 3
    reader = FrameReader(4096)
    frames = []
    for i in range(len(data)):
        frames += reader.feed(data[i:i + 1])
    assert frames == [(1, 7, b"payload" * 10)] * 3


def test_incomplete_is_not_an_error() -> None:
    reader = FrameReader(4096)
    assert reader.feed(raw_frame(1, 1, b"abcdef")[:-1]) == []
    assert reader.buffered == 13


def test_frame_max_is_enforced_with_rabbitmqs_leniency() -> None:
    """The spec limits the payload to frame_max - 8; RabbitMQ 3.10 accepts up to frame_max."""
    reader = FrameReader(4096)
    assert reader.feed(raw_frame(3, 1, b"x" * 4096)) == [(3, 1, b"x" * 4096)]
    with pytest.raises(FrameError) as err:
        reader.feed(raw_frame(3, 1, b"x" * 4097))
    assert err.value.reply_code == 501


def test_oversize_detected_from_the_header_alone() -> None:
    """A huge declared size is refused before the body arrives (no unbounded buffering)."""
    with pytest.raises(FrameError):
        FrameReader(131072).feed(b"\x03\x00\x01\x7f\xff\xff\xff")


def test_frame_max_zero_means_no_limit() -> None:
    assert FrameReader(0).feed(raw_frame(3, 1, b"x" * 200000)) == [(3, 1, b"x" * 200000)]


def test_bad_frame_end() -> None:
    with pytest.raises(FrameError, match="frame end"):
        FrameReader(4096).feed(raw_frame(1, 1, b"abc", end=0))


def test_unknown_frame_type() -> None:
    with pytest.raises(FrameError, match="unknown frame type"):
        FrameReader(4096).feed(raw_frame(4, 1, b"abc"))


def test_good_frames_before_a_bad_one_are_salvaged() -> None:
    reader = FrameReader(4096)
    with pytest.raises(FrameError):
        reader.feed(raw_frame(1, 1, b"ok") + raw_frame(9, 1, b"bad"))
    assert reader.salvaged == [(1, 1, b"ok")]
