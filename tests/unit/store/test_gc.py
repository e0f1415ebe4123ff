"""File store only: segment deletion and compaction (copy-forward with relocation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from amqpd.store import checkpoint
from amqpd.store.log import SharedLog

from .conftest import Q1, Q2, crash_copy, msg, wait_commit

SMALL = {"segment_size": 4096, "checkpoint_every_bytes": 1 << 30}


def _segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def _fill(s: SharedLog, n: int, queues: list[str] | None = None) -> list[int]:
    return [s.append_enqueue(queues or [Q1], msg(i, size=40)) for i in range(n)]


def test_settled_segments_are_deleted(make_log: Any, tmp_path: Path) -> None:
    s = make_log(**SMALL)
    ps = _fill(s, 300)
    s.sync()
    before = len(_segment_files(tmp_path / "log"))
    assert before >= 8
    s.append_settle(Q1, ps)
    s.checkpoint()
    s.sync()
    files = _segment_files(tmp_path / "log")
    assert len(files) == 1, "only the active segment is left"
    assert s.stats()["segments"] == 1
    assert s.stats()["live_messages"] == 0


def test_segment_kept_until_its_messages_are_settled(make_log: Any, tmp_path: Path) -> None:
    s = make_log(**SMALL, compact_ratio=0.0)  # no compaction: pure GC
    ps = _fill(s, 300)
    s.append_settle(Q1, ps[1:])
    s.checkpoint()
    s.sync()
    first = _segment_files(tmp_path / "log")[0]
    assert int(first.stem) <= ps[0], "the segment holding ps[0] is pinned"
    assert len(_segment_files(tmp_path / "log")) == 2
    assert s.read(ps[0]) == msg(0, size=40)
    s.append_settle(Q1, ps[:1])
    s.checkpoint()
    s.sync()
    assert len(_segment_files(tmp_path / "log")) == 1


def test_drop_queue_reclaims(make_log: Any, tmp_path: Path) -> None:
    s = make_log(**SMALL)
    _fill(s, 200, [Q1, Q2])
    s.drop_queue(Q1)
    s.drop_queue(Q2)
    s.checkpoint()
    s.sync()
    assert len(_segment_files(tmp_path / "log")) == 1


def test_compaction_moves_live_messages_forward(make_log: Any, tmp_path: Path) -> None:
    s = make_log(**SMALL)
    ps = _fill(s, 400, [Q1, Q2])
    keep = [ps[3], ps[150], ps[151]]
    s.append_delivered(Q2, ps[3])
    s.append_settle(Q1, [p for p in ps if p not in keep])
    s.append_settle(Q2, [p for p in ps if p not in keep])
    s.append_settle(Q2, [ps[151]])
    s.checkpoint()  # compacts, then checkpoints
    s.sync()
    s.checkpoint()
    s.sync()
    stats = s.stats()
    assert stats["relocations_total"] >= 2
    assert stats["segments"] <= 2, "old segments are gone once their live copies moved"
    assert [s.read(p) for p in keep] == [msg(3, 40), msg(150, 40), msg(151, 40)]
    # old positions still work for settle / delivered
    s.append_delivered(Q1, ps[150])
    wait_commit(s)
    # a crash right now, with and without the checkpoint
    for name, drop_cp in (("c1", False), ("c2", True)):
        copy = crash_copy(s, tmp_path / name)
        if drop_cp:
            (copy / checkpoint.FILE_NAME).unlink()
        s2 = SharedLog(copy)
        state = s2.open()
        try:
            assert list(state.queues[Q1].positions) == keep
            assert list(state.queues[Q2].positions) == keep[:2]
            assert state.queues[Q2].redelivered == {ps[3]}
            assert state.queues[Q1].redelivered == {ps[150]}
            assert [s2.read(p).body for p in keep] == [msg(i, 40).body for i in (3, 150, 151)]
            s2.append_settle(Q1, keep)
            s2.append_settle(Q2, keep)
            assert s2.stats()["live_messages"] == 0
        finally:
            s2.close()
    s.append_settle(Q1, keep[:1])
    s.append_settle(Q2, keep[:1])
    s.close()
    s3 = SharedLog(tmp_path / "log")
    state = s3.open()
    try:
        assert list(state.queues[Q1].positions) == keep[1:]
        assert list(state.queues[Q2].positions) == keep[1:2]
    finally:
        s3.close()


def test_compaction_survives_crash_before_old_segment_is_deleted(
    make_log: Any, tmp_path: Path
) -> None:
    """Both the original and its copy on disk: recovery counts the message once."""
    s = make_log(**SMALL, compact_ratio=0.0)
    ps = _fill(s, 200)
    s.append_settle(Q1, ps[1:])
    s.sync()
    s.compact_ratio = 0.1
    s._compact()  # copies ps[0] forward; nothing deleted yet
    s.sync()
    assert len(s._index.reloc) == 1
    copy = crash_copy(s, tmp_path / "crashed")
    assert len(_segment_files(copy)) >= 2
    (copy / checkpoint.FILE_NAME).unlink(missing_ok=True)
    s2 = SharedLog(copy)
    state = s2.open()
    try:
        assert list(state.queues[Q1].positions) == ps[:1]
        assert s2.stats()["live_messages"] == 1
        assert s2.read(ps[0]) == msg(0, size=40)
    finally:
        s2.close()


def test_long_lived_backlog_does_not_pin_segments(make_log: Any, tmp_path: Path) -> None:
    """One old message while lots of traffic flows: disk use stays bounded."""
    s = make_log(segment_size=4096, checkpoint_every_bytes=8192)
    old = s.append_enqueue([Q1], msg(0, 40))
    for _ in range(30):
        ps = _fill(s, 40)
        s.append_settle(Q1, ps)
    s.sync()
    s.checkpoint()
    s.sync()
    assert s.stats()["segments"] <= 4
    assert s.read(old) == msg(0, 40)


def test_freed_segment_goes_at_once_and_maintain_is_cheap(make_log: Any, tmp_path: Path) -> None:
    """The checkpoint taken at each roll already covers every older segment, so a
    settle that empties one deletes it at once; maintain() then has nothing to do."""
    s = make_log(segment_size=64 * 1024, checkpoint_every_bytes=1 << 30, compact_ratio=0.0)
    ps = _fill(s, 1500)
    s.sync()
    assert len(_segment_files(tmp_path / "log")) == 3
    checkpoints = s.stats()["checkpoints"]
    second = int(_segment_files(tmp_path / "log")[1].stem)
    s.append_settle(Q1, [p for p in ps if p < second])
    s.sync()
    assert len(_segment_files(tmp_path / "log")) == 2
    for _ in range(3):
        s.maintain()
    s.sync()
    assert s.stats()["checkpoints"] == checkpoints
