"""File store only: restart, checkpoint + tail replay, torn and corrupt tails."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest

from amqpd.store import checkpoint
from amqpd.store.log import SharedLog

from .conftest import Q1, Q2, crash_copy, msg, open_log, wait_commit


def _positions(state: Any, queue: str) -> list[int]:
    return list(state.queues[queue].positions) if queue in state.queues else []


def test_clean_restart(make_log: Any, tmp_path: Path) -> None:
    s = make_log()
    ps = [s.append_enqueue([Q1, Q2], msg(i)) for i in range(100)]
    s.append_settle(Q1, ps[:40])
    s.append_settle(Q2, ps[::2])
    s.append_delivered(Q1, ps[50])
    s.append_delivered(Q2, ps[51])
    seq = s._seq
    s.close()

    s2 = SharedLog(tmp_path / "log")
    state = s2.open()
    try:
        assert _positions(state, Q1) == ps[40:]
        assert _positions(state, Q2) == ps[1::2]
        assert list(state.queues[Q1].sizes) == [16] * 60
        assert state.queues[Q1].redelivered == {ps[50]}
        assert state.queues[Q2].redelivered == {ps[51]}
        assert state.last_sequence == seq + 1  # close() appends a CHECKPOINT record
        assert state.truncated_bytes == 0
        assert [s2.read(p) for p in ps[40:]] == [msg(i) for i in range(40, 100)]
        p_new = s2.append_enqueue([Q1], msg(1000))
        assert p_new > ps[-1]
    finally:
        s2.close()


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_crash_restart_replays_tail(make_log: Any, tmp_path: Path, with_checkpoint: bool) -> None:
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(60)]
    s.append_settle(Q1, ps[:10])
    if with_checkpoint:
        s.checkpoint()
    s.append_settle(Q1, ps[10:20])
    s.append_delivered(Q1, ps[30])
    more = [s.append_enqueue([Q1, Q2], msg(i)) for i in range(60, 80)]
    s.drop_queue(Q2)
    copy = crash_copy(s, tmp_path / "crashed")
    if with_checkpoint:
        assert (copy / checkpoint.FILE_NAME).exists()

    s3 = SharedLog(copy)
    state = s3.open()
    try:
        assert _positions(state, Q1) == ps[20:] + more
        assert Q2 not in state.queues
        assert state.queues[Q1].redelivered == {ps[30]}
        assert [s3.read(p).body for p in ps[20:] + more] == [
            msg(i).body for i in range(20, 80)
        ]
    finally:
        s3.close()


def _filled(make_log: Any, tmp_path: Path, n: int = 40) -> tuple[Path, list[int]]:
    """A crashed log (no closing checkpoint) holding n live messages in Q1."""
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i, size=40)) for i in range(n)]
    assert wait_commit(s) is None
    return crash_copy(s, tmp_path / "crashed"), ps


def _only_segment(directory: Path) -> Path:
    (seg,) = sorted(directory.glob("*.log"))
    return seg


def test_torn_tail_at_random_offsets(make_log: Any, tmp_path: Path, caplog: Any) -> None:
    src, ps = _filled(make_log, tmp_path)
    seg = _only_segment(src)
    data = seg.read_bytes()
    first = ps[0] - int(seg.stem)
    rng = random.Random(1234)
    for trial in range(12):
        cut = rng.randrange(first, len(data))
        d = tmp_path / f"cut{trial}"
        d.mkdir()
        (d / seg.name).write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="amqpd.store"):
            s = SharedLog(d)
            state = s.open()
        try:
            end = int(seg.stem) + cut
            ends = [*ps[1:], int(seg.stem) + len(data)]  # where each record stops
            got = [p for p, e in zip(ps, ends, strict=True) if e <= end]
            # every record wholly before the cut survives, nothing after it
            assert _positions(state, Q1) == got
            assert all(s.read(p) == msg(i, size=40) for i, p in enumerate(got))
            torn = end - (ps[len(got)] if len(got) < len(ps) else end)
            assert state.truncated_bytes == torn
            if torn:
                assert f"dropped {torn} bytes" in caplog.text
            # the node keeps working after the truncation
            p = s.append_enqueue([Q1], msg(999))
            assert wait_commit(s) is None
            assert s.read(p) == msg(999)
        finally:
            s.close()
        # and reopens cleanly afterwards
        s = SharedLog(d)
        assert _positions(s.open(), Q1)[: len(got)] == got
        s.close()


def test_bit_flip_keeps_everything_before_it(make_log: Any, tmp_path: Path) -> None:
    src, ps = _filled(make_log, tmp_path)
    seg = _only_segment(src)
    data = seg.read_bytes()
    base = int(seg.stem)
    rng = random.Random(99)
    for trial in range(12):
        victim = rng.randrange(len(ps))
        offset = ps[victim] - base + rng.randrange(17 + 40)
        bad = bytearray(data)
        bad[offset] ^= 1 << rng.randrange(8)
        d = tmp_path / f"flip{trial}"
        d.mkdir()
        (d / seg.name).write_bytes(bytes(bad))
        s = SharedLog(d)
        state = s.open()
        try:
            assert _positions(state, Q1) == ps[:victim]
            assert state.truncated_bytes == len(data) - (ps[victim] - base)
        finally:
            s.close()


def test_corrupt_checkpoint_falls_back_to_full_replay(make_log: Any, tmp_path: Path) -> None:
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(30)]
    s.append_settle(Q1, ps[:5])
    s.close()
    cp = tmp_path / "log" / checkpoint.FILE_NAME
    for damage in (lambda b: b[: len(b) // 2], lambda b: b[:10] + b"\xff" + b[11:], lambda b: b""):
        cp.write_bytes(damage(cp.read_bytes()) if cp.exists() else b"")
        s2 = SharedLog(tmp_path / "log")
        try:
            assert _positions(s2.open(), Q1) == ps[5:]
        finally:
            s2.close()  # writes a fresh checkpoint


def test_missing_checkpoint(make_log: Any, tmp_path: Path) -> None:
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(30)]
    s.close()
    (tmp_path / "log" / checkpoint.FILE_NAME).unlink()
    s2 = SharedLog(tmp_path / "log")
    try:
        assert _positions(s2.open(), Q1) == ps
    finally:
        s2.close()


def test_checkpoint_without_its_log_record_is_ignored(make_log: Any, tmp_path: Path) -> None:
    """A checkpoint file pointing past the (truncated) log must not be trusted."""
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(30)]
    s.close()
    seg = _only_segment(tmp_path / "log")
    keep = ps[20] - int(seg.stem)
    seg.write_bytes(seg.read_bytes()[:keep])
    s2 = SharedLog(tmp_path / "log")
    try:
        assert _positions(s2.open(), Q1) == ps[:20]
    finally:
        s2.close()


def test_restart_many_times_keeps_order(tmp_path: Path) -> None:
    expected: list[int] = []
    for round_ in range(5):
        s = SharedLog(tmp_path / "log", segment_size=4096, checkpoint_every_bytes=3000)
        state = s.open()
        assert _positions(state, Q1) == expected
        expected += [s.append_enqueue([Q1], msg(round_ * 100 + i)) for i in range(30)]
        s.append_settle(Q1, expected[:10])
        expected = expected[10:]
        if round_ % 2:
            crash_copy(s, tmp_path / f"c{round_}")
            s.close()
            (tmp_path / "log").rename(tmp_path / f"old{round_}")
            (tmp_path / f"c{round_}").rename(tmp_path / "log")
        else:
            s.close()


def test_empty_and_headerless_segment_files(tmp_path: Path) -> None:
    s = open_log(tmp_path / "log")
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(3)]
    s.close()
    (tmp_path / "log" / f"{10**12:020d}.log").write_bytes(b"AM")
    s2 = SharedLog(tmp_path / "log")
    try:
        state = s2.open()
        assert _positions(state, Q1) == ps
        assert state.truncated_bytes == 2
    finally:
        s2.close()
