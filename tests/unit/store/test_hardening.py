"""File store only: what a restart (clean or kill -9) must never bring back or forget.

* a transient message paged to the log never comes back;
* a message that may have reached a consumer comes back redelivered, even when the
  crash came before its DELIVERED record was written;
* publish time, per-message expiry and priority come back from the record itself;
* losing the checkpoint file never resurrects a settled message.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from array import array
from pathlib import Path
from typing import Any, TypedDict

import pytest

from amqpd.store import checkpoint, marks
from amqpd.store.api import StoredMessage
from amqpd.store.log import SharedLog

from .conftest import Q1, Q2, crash_copy, msg, open_log, wait_commit


class LogSizes(TypedDict):
    """SharedLog keyword arguments for small segments and no automatic checkpoint."""

    segment_size: int
    checkpoint_every_bytes: int
    compact_ratio: float


SMALL: LogSizes = {"segment_size": 4096, "checkpoint_every_bytes": 1 << 30,
                   "compact_ratio": 0.0}


def kill_copy(store: SharedLog, dst: Path) -> Path:
    """What a kill -9 leaves *now*: no sync first, so records the writer thread has
    not written yet are lost (crash_copy syncs, which models a crash after a commit)."""
    shutil.copytree(store.directory, dst)
    return dst


def transient(i: int) -> StoredMessage:
    m = msg(i)
    m.transient = True
    m.published = 1_700_000_000_000 + i
    return m


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_paged_transient_messages_never_come_back(make_log: Any, tmp_path: Path,
                                                 how: str) -> None:
    s = make_log()
    kept = s.append_enqueue([Q1], msg(1))
    for i in range(50):
        s.append_enqueue([Q1, Q2], transient(i))
    assert wait_commit(s) is None
    if how == "clean":
        s.close()
        directory = s.directory
    else:
        directory = crash_copy(s, tmp_path / "crashed")
    again = open_log(directory)
    try:
        assert again.stats()["live_messages"] == 1
        assert list(again._index.queues[Q1].live_positions()) == [kept]
        assert len(again._index.queues.get(Q2, [])) == 0
    finally:
        again.close()
    third = open_log(directory)  # and the drop itself was made durable
    try:
        assert third.stats()["live_messages"] == 1
    finally:
        third.close()


def test_a_delivery_promise_survives_a_kill_before_any_write(
        make_log: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(marks, "AHEAD", 0)  # promise exactly the message delivered
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(3)]
    assert wait_commit(s) is None
    # the broker hands ps[1] to a consumer: promise, then the DELIVERED record that
    # rides on a later write; the process dies before the writer thread sees it
    s.delivering(Q1, ps[1])
    s.append_delivered(Q1, ps[1])
    directory = kill_copy(s, tmp_path / "killed")
    again = SharedLog(directory, segment_size=64 * 1024)
    state = again.open()
    try:
        red = state.queues[Q1].redelivered
        assert ps[1] in red, "a delivered message came back with redelivered=false"
        assert ps[2] not in red, "a message never delivered keeps redelivered=false"
    finally:
        again.close()


def test_a_clean_close_keeps_exact_marks(make_log: Any, tmp_path: Path) -> None:
    s = make_log()
    ps = [s.append_enqueue([Q1], msg(i)) for i in range(3)]
    s.delivering(Q1, ps[0])
    s.append_delivered(Q1, ps[0])
    s.close()
    assert not (s.directory / marks.FILE_NAME).exists()
    again = SharedLog(s.directory, segment_size=64 * 1024)
    state = again.open()
    try:
        assert state.queues[Q1].redelivered == {ps[0]}
    finally:
        again.close()


def test_record_meta_comes_back_without_reading_messages(make_log: Any,
                                                         tmp_path: Path) -> None:
    s = make_log()
    m = msg(7)
    m.published, m.expires, m.priority = 1_700_000_000_123, 1_700_000_060_123, 9
    p = s.append_enqueue([Q1], m)
    old = s.append_enqueue([Q1], msg(8))  # no meta: a plain ENQUEUE, as before
    assert wait_commit(s) is None
    crashed = crash_copy(s, tmp_path / "crashed")  # replayed from the log
    s.close()  # and from the checkpoint file (version 2)
    for directory in (crashed, s.directory):
        again = SharedLog(directory, segment_size=64 * 1024)
        state = again.open()
        try:
            rq = state.queues[Q1]
            assert list(rq.positions) == [p, old]
            assert list(rq.stamps) == [m.published << 1, 0]
            assert list(rq.extra) == [m.expires << 8 | 9, 0]
            assert again.read(p) == m
        finally:
            again.close()


def test_a_version_1_checkpoint_still_loads(make_log: Any, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_log()
    p = s.append_enqueue([Q1], msg(1))
    s.close()
    # rewrite the checkpoint as the previous build did (no stamps, no carried settles)
    loaded = checkpoint.load(s.directory)
    assert loaded is not None
    cp, index = loaded
    (s.directory / checkpoint.FILE_NAME).write_bytes(_encode_v1(cp.covered, cp.sequence, index))
    loaded = checkpoint.load(s.directory)
    assert loaded is not None, "a version 1 checkpoint must load"
    assert loaded[0].definitions == []  # version 1 had no definitions section
    again = SharedLog(s.directory, segment_size=64 * 1024)
    state = again.open()
    try:
        assert list(state.queues[Q1].positions) == [p]
        assert list(state.queues[Q1].stamps) == [0]
    finally:
        again.close()


def _encode_v1(covered: int, sequence: int, index: Any) -> bytes:
    """The checkpoint layout of version 1 (before stamps and carried settles)."""
    i64 = struct.Struct("<q")
    parts = [i64.pack(covered), i64.pack(sequence), struct.pack("<I", len(index.bases))]
    for base in index.bases:
        parts.append(struct.pack("<qqq", base, index.seg_live[base], index.seg_total[base]))
    queues = [(n, q) for n, q in index.queues.items() if len(q)]
    parts.append(struct.pack("<I", len(queues)))
    for name, q in queues:
        raw = name.encode()
        positions, sizes = q.live()
        parts.append(struct.pack("<H", len(raw)) + raw + i64.pack(len(positions)))
        parts += [positions.tobytes(), sizes.tobytes(), i64.pack(len(q.delivered)),
                  array("q", sorted(q.delivered)).tobytes()]
    parts.append(i64.pack(len(index.reloc)))
    parts += [array("q", index.reloc.keys()).tobytes(),
              array("q", index.reloc.values()).tobytes(),
              array("q", (index.reloc_refs[k] for k in index.reloc)).tobytes()]
    body = b"".join(parts)
    return struct.pack("<4sHIQ", b"AMQC", 1, zlib.crc32(body), len(body)) + body


def _lose_checkpoint_scenario(s: SharedLog) -> tuple[int, list[int]]:
    """ps[0] pins segment 0; the rest of segment 0 is settled by a record in a later
    segment that is itself deleted once everything in it is dead."""
    ps = [s.append_enqueue([Q1], msg(i, size=40)) for i in range(120)]
    s.append_settle(Q1, ps[1:])  # written in the active segment, far from segment 0
    more = [s.append_enqueue([Q1], msg(1000 + i, size=40)) for i in range(120)]
    s.append_settle(Q1, more)
    s.checkpoint()
    s.sync()
    s.checkpoint()  # GC runs once the first checkpoint is durable
    s.sync()
    files = sorted(s.directory.glob("*.log"))
    assert int(files[0].stem) <= ps[0] < int(files[1].stem), "segment 0 survives"
    assert len(files) <= 3, "the segments holding the settles were deleted"
    return ps[0], ps[1:]


@pytest.mark.parametrize("how", ["clean", "crash"])
def test_losing_the_checkpoint_never_resurrects_settled_messages(
        make_log: Any, tmp_path: Path, how: str) -> None:
    s = make_log(**SMALL)
    kept, _settled = _lose_checkpoint_scenario(s)
    if how == "clean":
        s.close()
        directory = s.directory
    else:
        directory = crash_copy(s, tmp_path / "crashed")
    (directory / checkpoint.FILE_NAME).unlink()
    again = SharedLog(directory, **SMALL)
    state = again.open()
    try:
        live = list(state.queues[Q1].positions)
        assert live == [kept], f"{len(live) - 1} settled messages came back"
    finally:
        again.close()


def test_a_full_replay_over_a_hole_marks_older_messages_redelivered(
        make_log: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = make_log(**SMALL)
    kept, _settled = _lose_checkpoint_scenario(s)
    s.close()
    (s.directory / checkpoint.FILE_NAME).unlink()
    again = SharedLog(s.directory, **SMALL)
    with caplog.at_level("WARNING", logger="amqpd.store"):
        state = again.open()
    try:
        assert state.queues[Q1].redelivered == {kept}
        assert "come back marked redelivered" in caplog.text
    finally:
        again.close()
