"""The (epoch, sequence) rule, the history file, and cutting a log's tail."""

from __future__ import annotations

from pathlib import Path

from amqpd.replication import wire
from amqpd.replication.epochs import EpochHistory, decide
from amqpd.store import checkpoint
from amqpd.store.api import StoredMessage
from amqpd.store.log import SharedLog
from amqpd.store.tail import scan_tail


def _history(tmp_path: Path, entries: list[tuple[int, int]]) -> EpochHistory:
    h = EpochHistory(tmp_path)
    h.replace(entries)
    return h


def test_history_file_survives_reload(tmp_path: Path) -> None:
    h = EpochHistory(tmp_path)
    assert h.last_epoch == 0
    h.begin(1, 1)
    h.begin(3, 50)
    assert EpochHistory(tmp_path).entries == [(1, 1), (3, 50)]
    try:
        h.begin(2, 60)
    except ValueError:
        pass
    else:
        raise AssertionError("an older epoch must be refused")


def test_returning_old_active_cuts_what_the_new_active_never_had(tmp_path: Path) -> None:
    # the new active (epoch 2) began at seq 101: the old active's 101..130 were never seen
    h = _history(tmp_path, [(1, 1), (2, 101)])
    assert decide(h, 2, 500, 1, 130) == (wire.TRUNCATE, 100)
    # it stopped before the new epoch began: nothing to cut, it just continues
    assert decide(h, 2, 500, 1, 100) == (wire.CONTINUE, 0)
    assert decide(h, 2, 500, 1, 90) == (wire.CONTINUE, 0)
    # a standby of the current epoch is a prefix of the active
    assert decide(h, 2, 500, 2, 400) == (wire.CONTINUE, 0)


def test_never_the_other_way_round(tmp_path: Path) -> None:
    h = _history(tmp_path, [(1, 1), (2, 101)])
    # the follower saw epoch 3: this active is stale and must not be followed
    assert decide(h, 2, 500, 3, 10) == (wire.REFUSE, 0)


def test_unknown_epoch_or_empty_follower(tmp_path: Path) -> None:
    h = _history(tmp_path, [(2, 40), (5, 90)])
    assert decide(h, 5, 200, 4, 80)[0] == wire.SNAPSHOT  # never heard of epoch 4
    assert decide(h, 5, 200, 0, 0) == (wire.CONTINUE, 0)  # empty: position decides
    # records from before any epoch (a node that ran alone) end where epoch 2 began
    assert decide(h, 5, 200, 0, 45) == (wire.TRUNCATE, 39)


def _msg(i: int) -> StoredMessage:
    return StoredMessage("", "q", b"", b"body-%d" % i)


def test_truncate_after_cuts_records_segments_and_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "log"
    s = SharedLog(d, segment_size=4096)
    s.open()
    for i in range(40):
        s.append_enqueue(["q"], _msg(i))
    s.sync()
    keep = s.last_sequence
    for i in range(40, 400):  # several more segments and a checkpoint past `keep`
        s.append_enqueue(["q"], _msg(i))
    s.sync()
    s.close()
    before = scan_tail(d)
    assert before.last_seq > keep
    loaded = checkpoint.load(d)
    assert loaded is not None and loaded[0].sequence > keep

    cut = SharedLog(d)
    assert cut.truncate_after(keep) > 0
    assert scan_tail(d).last_seq == keep
    assert not (d / checkpoint.FILE_NAME).exists() or checkpoint.load(d) is None or \
        checkpoint.load(d)[0].sequence <= keep  # type: ignore[index]
    state = cut.open()
    try:
        positions = list(state.queues["q"].positions)
        assert [cut.read(p).body for p in positions] == [b"body-%d" % i for i in range(40)]
        assert state.last_sequence == keep
    finally:
        cut.close()


def test_truncate_after_the_end_cuts_nothing(tmp_path: Path) -> None:
    d = tmp_path / "log"
    s = SharedLog(d)
    s.open()
    for i in range(5):
        s.append_enqueue(["q"], _msg(i))
    s.sync()
    last = s.last_sequence
    s.close()
    size = sum(p.stat().st_size for p in d.glob("*.log"))
    assert SharedLog(d).truncate_after(last + 10) == 0
    assert sum(p.stat().st_size for p in d.glob("*.log")) == size
