"""A member's copy read by its own node's consumers (issue 30): only records below the
commit point the leader told it, where ``x-stream-offset`` says on the copy, and a
reader that knows when the copy it reads started again or went."""

from __future__ import annotations

from pathlib import Path

from amqpd.cluster.stream_local import LocalRead, local_start, usable
from amqpd.cluster.stream_replica import StreamReplica
from amqpd.cluster.stream_wire import pack_records
from tests.unit.cluster.test_stream_replication import _leader_log


def _copy(tmp_path: Path, n: int) -> StreamReplica:
    leader = _leader_log(tmp_path, n)
    replica = StreamReplica(str(tmp_path), "node-a", 1, "/", "s", {})
    replica.start(1, {"epochs": [[1, 0]], "first": 0, "next": n})
    replica.append(pack_records(leader.reader(0).read(n)))
    replica.flush()
    leader.close()
    return replica


def _drain(read: LocalRead) -> list[int]:
    """Every offset readable now (a batch comes in pieces: the put-back first)."""
    out: list[int] = []
    for _ in range(100):
        batch = read.next_batch(100)
        if not batch:
            return out
        out += [r.offset for r in batch]
    raise AssertionError("no end")


def test_only_committed_records_are_read(tmp_path: Path) -> None:
    replica = _copy(tmp_path, 30)
    woken: list[int] = []
    assert not usable(replica, "node-a")  # no commit point told yet
    read = LocalRead(replica, 0, lambda: woken.append(1))
    assert read.next_batch(100) == []
    replica.commit(10)
    assert usable(replica, "node-a") and not usable(replica, "node-b")
    assert woken, "the commit point moving wakes the reader"
    assert _drain(read) == list(range(10)) and read.offset == 10
    replica.commit(25)
    batch = read.next_batch(4)
    assert [r.offset for r in batch] == [10, 11, 12, 13]
    read.unread(batch[2:])
    assert _drain(read) == list(range(12, 25))
    replica.commit(40)  # committed beyond what the copy holds: what it holds
    assert _drain(read) == list(range(25, 30))
    read.close()
    assert replica.watchers == []
    replica.close()


def test_the_start_is_the_offset_form_on_the_copy_or_the_resume_point(
        tmp_path: Path) -> None:
    replica = _copy(tmp_path, 30)
    assert local_start("first", None, replica) == 0
    assert local_start("next", None, replica) == 30
    assert local_start(None, None, replica) == 30
    assert local_start(12, None, replica) == 12
    assert local_start(99, None, replica) == 30
    assert local_start("1h", None, replica) == 30  # its records are of 1970: all older
    assert local_start("bogus", None, replica) is None
    # a consumer given offsets up to 40 elsewhere goes on at 41, not at the copy's end
    assert local_start("first", 41, replica) == 41
    replica.close()


def test_a_reader_knows_when_its_copy_started_again_or_went(tmp_path: Path) -> None:
    replica = _copy(tmp_path, 30)
    replica.commit(30)
    read = LocalRead(replica, 5, lambda: None)
    assert read.follows(replica)
    # a leader whose log starts beyond the copy: the copy starts again (reset)
    replica.start(2, {"epochs": [[1, 0], [2, 30]], "first": 50, "next": 60})
    assert not read.follows(replica) and replica.committed == -1
    read.close()
    again = LocalRead(replica, 50, lambda: None)
    assert again.follows(replica)
    replica.close()
    assert not again.follows(replica)
    assert not read.follows(None)
