"""DEFINITION records: encoding, replay after a crash, checkpoint snapshots, torn tails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpd.store import format as fmt
from amqpd.store.log import SharedLog

from .conftest import Q1, Q2, crash_copy, msg, open_log, wait_commit


def _reopen(directory: Path) -> tuple[SharedLog, Any]:
    s = SharedLog(directory, segment_size=64 * 1024, checkpoint_every_bytes=1 << 30)
    return s, s.open()


def test_changes_round_trip_and_damage_is_refused() -> None:
    changes = [(fmt.DEF_QUEUE, Q1, b'{"name":"q1"}'), (fmt.DEF_BINDING, "a\x00b", b""),
               (fmt.DEF_USER, "\u00e9l\u00e8ve", b"{}")]
    payload = fmt.encode_definition_changes(changes)
    assert fmt.decode_definition(payload) == changes
    for cut in range(len(payload)):
        with pytest.raises(fmt.CorruptRecord):
            fmt.decode_definition(payload[:cut])
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_definition(payload + b"x")
    bad_kind = bytearray(payload)
    bad_kind[4] = 99
    with pytest.raises(fmt.CorruptRecord):
        fmt.decode_definition(bytes(bad_kind))


def test_existing_record_kinds_keep_their_numbers() -> None:
    assert (fmt.ENQUEUE, fmt.SETTLE, fmt.DELIVERED, fmt.DROP_QUEUE, fmt.CHECKPOINT) == \
        (1, 2, 3, 4, 5)
    assert fmt.DEFINITION == 32


def test_definitions_survive_a_crash_in_order(make_log: Any, tmp_path: Path) -> None:
    s = make_log()
    s.append_definition(fmt.DEF_QUEUE, Q1, b'{"v":1}')
    s.append_definition(fmt.DEF_QUEUE, Q2, b'{"v":1}')
    s.append_definition(fmt.DEF_QUEUE, Q1, b'{"v":2}')  # redeclared with a new body
    p = s.append_enqueue([Q2], msg(1))
    s.append_definition(fmt.DEF_BINDING, "b1", b'{"b":1}')
    assert wait_commit(s) is None
    s2, rec = _reopen(crash_copy(s, tmp_path / "copy"))
    try:
        assert rec.definitions == {(fmt.DEF_QUEUE, Q1): b'{"v":2}',
                                   (fmt.DEF_QUEUE, Q2): b'{"v":1}',
                                   (fmt.DEF_BINDING, "b1"): b'{"b":1}'}
        assert list(rec.queues[Q2].positions) == [p]
    finally:
        s2.close()


def test_deleting_a_queue_definition_settles_its_messages(make_log: Any,
                                                          tmp_path: Path) -> None:
    s = make_log()
    s.append_definition(fmt.DEF_QUEUE, Q1, b"{}")
    s.append_enqueue([Q1, Q2], msg(1))
    s.append_definition(fmt.DEF_BINDING, "to-q1", b"{}")
    s.append_definition(fmt.DEF_BINDING, "to-q1", b"")  # both in one record
    s.append_definition(fmt.DEF_QUEUE, Q1, b"")
    assert wait_commit(s) is None
    assert s.stats()["live_messages"] == 1  # Q2's copy
    s2, rec = _reopen(crash_copy(s, tmp_path / "copy"))
    try:
        assert rec.definitions == {}
        assert Q1 not in rec.queues and len(rec.queues[Q2].positions) == 1
    finally:
        s2.close()


def test_a_torn_definition_record_applies_none_of_its_changes(make_log: Any,
                                                             tmp_path: Path) -> None:
    s = make_log()
    s.append_definition(fmt.DEF_QUEUE, Q1, b"{}")
    assert wait_commit(s) is None
    for i in range(50):  # one stretch: one record
        s.append_definition(fmt.DEF_BINDING, f"b{i}", b'{"x":1}')
    s.append_definition(fmt.DEF_QUEUE, Q2, b"{}")
    assert wait_commit(s) is None
    copy = crash_copy(s, tmp_path / "copy")
    seg = sorted(copy.glob("*.log"))[-1]
    data = seg.read_bytes()
    seg.write_bytes(data[:-7])  # the write of the last record did not finish
    s2, rec = _reopen(copy)
    try:
        assert rec.definitions == {(fmt.DEF_QUEUE, Q1): b"{}"}
        assert rec.truncated_bytes > 0
    finally:
        s2.close()


def test_checkpoint_snapshot_then_replay_and_old_segments_go(tmp_path: Path) -> None:
    s = open_log(tmp_path / "log", segment_size=4096)
    for i in range(400):  # many segments of nothing but definition records
        s.append_definition(fmt.DEF_QUEUE, f"/\x00q{i}", b'{"name":"%d"}' % i)
        if i % 3 == 0:
            s.append_definition(fmt.DEF_QUEUE, f"/\x00q{i}", b"")
        assert wait_commit(s) is None
    s.checkpoint()
    s.sync()
    s.maintain()
    s.sync()
    assert s.stats()["segments"] <= 2  # the snapshot covers them: deleted
    s.append_definition(fmt.DEF_USER, "after", b"{}")  # replayed after the snapshot
    s2, rec = _reopen(crash_copy(s, tmp_path / "copy"))
    s.close()
    try:
        expected = {(fmt.DEF_QUEUE, f"/\x00q{i}"): b'{"name":"%d"}' % i
                    for i in range(400) if i % 3}
        expected[(fmt.DEF_USER, "after")] = b"{}"
        assert rec.definitions == expected
    finally:
        s2.close()


# A version 1 checkpoint (no definitions section) loading is tested in
# test_hardening.py::test_a_version_1_checkpoint_still_loads, which writes the whole
# version 1 layout.
