"""The standby's check of received records (follower ``_check``): whatever way the
frames cut the segment, the same records pass, a torn one waits for the next frame, and
a corrupt one ends the session, whether it is checked in the frame's own bytes or in
the carry-over buffer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from amqpd.replication import wire
from amqpd.replication.epochs import EpochHistory
from amqpd.replication.follower import ReplicationFollower
from amqpd.store import format as fmt
from tests.unit.replication.test_shipping import _cfg


def _segment(records: int) -> tuple[bytes, list[int]]:
    """A segment file's bytes and the end offset of each record."""
    out = bytearray(fmt.FILE_HEADER.pack(fmt.MAGIC, fmt.VERSION, 0))
    ends = []
    for seq in range(1, records + 1):
        out += fmt.encode_record(fmt.SETTLE, seq, b"p" * (seq % 97))
        ends.append(len(out))
    return bytes(out), ends


def _follower(tmp_path: Path) -> ReplicationFollower:
    f = ReplicationFollower(tmp_path, _cfg("b", role="standby"), EpochHistory(tmp_path))
    f._cur_base = 0
    return f


def _feed(f: ReplicationFollower, seg: bytes, cuts: list[int]) -> list[tuple[int, int]]:
    """Check ``seg`` in frames ending at ``cuts``; (valid seq, valid pos) after each."""
    seen = []
    start = 0
    for end in [*cuts, len(seg)]:
        payload = bytes(16) + seg[start:end]  # a DATA frame's payload: base, offset, bytes
        _, _, data = wire.parse_data(payload)
        f._check(data, payload)
        seen.append((f._valid_seq, f._valid_pos))
        start = end
    return seen


@pytest.mark.parametrize("seed", range(20))
def test_any_cut_of_the_frames_checks_the_same_records(tmp_path: Path, seed: int) -> None:
    seg, ends = _segment(300)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(seg)), rng.randint(1, 40)))
    if seed % 2:  # frames on record boundaries: the usual case, checked in place
        cuts = sorted(rng.sample(ends[:-1], rng.randint(1, 40)))
    got = _feed(_follower(tmp_path), seg, cuts)
    assert got[-1] == (300, len(seg))
    for (seq, pos), end in zip(got, [*cuts, len(seg)], strict=True):
        whole = [e for e in ends if e <= end]  # records the frames so far hold whole
        header = fmt.FILE_HEADER_SIZE if end >= fmt.FILE_HEADER_SIZE else 0
        assert (seq, pos) == (len(whole), whole[-1] if whole else header)


@pytest.mark.parametrize("aligned", [True, False])
def test_a_corrupt_record_is_refused_in_either_path(tmp_path: Path, aligned: bool) -> None:
    seg, ends = _segment(50)
    bad = bytearray(seg)
    bad[ends[30] - 1] ^= 0xFF  # the payload of record 31
    cut = ends[20] if aligned else ends[20] + 3
    f = _follower(tmp_path)
    with pytest.raises(wire.ProtocolError, match="CRC mismatch"):
        _feed(f, bytes(bad), [cut])
    assert f._valid_seq == 21  # the records before it passed
