"""A stream's tracking (amqpd/streamproto/tracking.py) and how it reaches a member's
copy (amqpd/cluster/stream_replica.py): what the leader ships with a batch of records,
what a member continuing from an offset gets, a member that takes a producer's id
only once it holds that id's records, writes it to its file and drops what a cut
takes, and the leader's frames to a member (amqpd/cluster/stream_leading.py) fed to a
real copy."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from amqpd.broker.api import StreamLog, stream_directory
from amqpd.cluster import link_wire as W
from amqpd.cluster import stream_wire as S
from amqpd.cluster.stream_leading import StreamLeading
from amqpd.cluster.stream_replica import StreamReplica
from amqpd.cluster.stream_wire import pack_records
from amqpd.streamproto.tracking import FILE, Tracking


def test_the_leader_ships_each_producers_latest_append_of_a_batch(tmp_path: Path) -> None:
    t = Tracking(tmp_path)
    t.wrote("p", [9, 10], [4, 5])  # id 9 is offset 3, id 10 offset 4
    t.wrote("q", [3], [7])  # a sub-entry batch: offsets 5..6
    t.wrote("p", [11, 12, 20], [8, 10, 12])
    assert t.delta(0, 5) == {"p": [10, 5]}
    assert t.delta(5, 12) == {"p": [20, 12], "q": [3, 7]}
    assert t.delta(12, 20) == {}
    # a frame cut between two batches: the ids whose records are all in the first
    assert t.delta(7, 9) == {"p": [11, 8]}
    assert t.delta(5, 6) == {}  # q's batch not complete yet
    # a member continuing from an offset: what is true of the log below it
    assert t.snapshot(0) == {}
    assert t.snapshot(4) == {"p": [9, 4]}
    assert t.snapshot(9) == {"p": [11, 8], "q": [3, 7]}
    assert t.snapshot(100) == {"p": [20, 12], "q": [3, 7]}
    # confirmed ids are what the file keeps, with their end
    t.confirmed("p", 10, 5)
    t.confirmed("p", 4, 2)  # lower: no change
    t.store_offset("app", 9)
    t.save(None)
    data = json.loads((tmp_path / FILE).read_text())
    assert data == {"offsets": {"app": 9}, "publishers": {"p": 10}, "ends": {"p": 5}}
    again = Tracking(tmp_path)
    assert again.snapshot(5) == {"p": [10, 5]}
    again.cut(4)
    assert again.publishers == {} and again.snapshot(100) == {}


def test_a_batch_looks_only_at_the_frames_it_holds(tmp_path: Path) -> None:
    t = Tracking(tmp_path)
    for n in range(5000):  # many producers, one frame each, offsets 2n..2n+1
        t.wrote(f"p{n}", [1, 2], [2 * n + 1, 2 * n + 2])
    assert t.delta(9990, 10000) == {f"p{n}": [2, 2 * n + 2] for n in range(4995, 5000)}
    assert t.delta(9999, 10000) == {"p4999": [2, 10000]}
    assert t.delta(9998, 9999) == {"p4999": [1, 9999]}
    # an entry a member applied out of order is found too
    t.apply({"late": [7, 3]}, None)
    assert t.delta(2, 3) == {"late": [7, 3], "p1": [1, 3]}


def test_a_file_without_ends_is_true_of_any_prefix(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text(json.dumps({"offsets": {}, "publishers": {"p": 7}}))
    t = Tracking(tmp_path)
    assert t.snapshot(0) == {"p": [7, 0]}
    t.cut(0)
    assert t.publishers == {"p": 7}


def test_a_member_takes_an_id_once_it_holds_its_records(tmp_path: Path) -> None:
    leader = StreamLog(tmp_path / "leader")
    leader.open()
    for i in range(10):
        leader.append(str(i).encode(), 1000 + i)
    leader.flush()
    replica = StreamReplica(str(tmp_path), "node-a", 1, "/", "s", {})
    assert replica.start(1, {"epochs": [[1, 0]], "first": 0, "next": 10}) == 0
    replica.track({"publishers": {}, "offsets": {"app": 3}})
    directory = stream_directory(tmp_path, "/", "s")
    assert json.loads((directory / FILE).read_text())["offsets"] == {"app": 3}

    # the entry for ids ending at offset 10 comes before the records (as shipped)
    replica.track({"publishers": {"p": [42, 10]}})
    assert replica.tracking.publishers == {}
    replica.append(pack_records(leader.reader(0).read(6)))
    assert replica.tracking.publishers == {}  # offsets 6..9 still missing
    replica.append(pack_records(leader.reader(6).read(4)))
    assert replica.tracking.publishers == {"p": 42}
    assert "p" not in json.loads((directory / FILE).read_text())["publishers"]
    assert replica.flush() == 10  # the records first, then the file naming them
    assert json.loads((directory / FILE).read_text())["publishers"] == {"p": 42}
    replica.close()

    # back under a leader that never had offsets 5..9: the entry goes with them
    again = StreamReplica(str(tmp_path), "node-b", 2, "/", "s", {})
    assert again.tracking.publishers == {"p": 42}
    assert again.start(2, {"epochs": [[1, 0], [2, 5]], "first": 0, "next": 5}) == 0
    assert again.tracking.publishers == {}
    assert again.tracking.offsets == {"app": 3}
    again.close()
    leader.close()


class _Link:
    """The node link as the leader sees it: frames sent, in order."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.closed = False
        self.reader = W.FrameReader()
        self.frames: list[tuple[int, int, list[Any]]] = []

    def send(self, data: bytes) -> None:
        self.frames += self.reader.feed(data)


def _leading(tmp_path: Path) -> tuple[Any, StreamLeading, _Link]:
    """A stream led here (offsets 0..5 by producer p, ids 1..3, two records each) with
    one other member, node-b, whose copy continues from offset 0."""
    log = StreamLog(tmp_path / "leader")
    log.open()
    tracking = Tracking(tmp_path / "leader")
    q = SimpleNamespace(name="s", log=log, arguments={}, consumers=[], watchers=[],
                        commit_gate=None, read_limit=None, commit_moved=lambda: None,
                        stream_tracking=lambda: tracking)
    for _ in range(6):
        log.append(b"m", 1000)
    log.flush()
    tracking.wrote("p", [1, 2, 3], [2, 4, 6])
    lead = StreamLeading("node-a", "/", cast(Any, q), ["node-a", "node-b"], 1, [[1, 0]],
                         lambda: 7, 30.0)
    link = _Link("node-b")
    lead.connect(lambda member: cast(Any, link))
    assert [f[0] for f in link.frames] == [S.SSTART]
    return q, lead, link


def test_a_member_copy_gets_the_ids_before_their_records_and_offsets_at_once(
        tmp_path: Path) -> None:
    q, lead, link = _leading(tmp_path)
    link.frames.clear()
    lead.have("node-b", 0)
    kinds = [f[0] for f in link.frames]
    # what it holds (nothing yet) and the offsets, then the ids before the records
    assert kinds == [S.SCOMMIT, S.STRACK, S.STRACK, S.SREC], kinds
    assert link.frames[1][2][0] == {"publishers": {}, "offsets": {}}
    assert link.frames[2][2][0] == {"publishers": {"p": [3, 6]}}

    replica = StreamReplica(str(tmp_path), "node-a", 7, "/", "s", {})
    assert replica.start(1, {"epochs": [[1, 0]], "first": 0, "next": 6}) == 0
    for kind, _rid, fields in link.frames:
        if kind == S.STRACK:
            replica.track(fields[0])
        elif kind == S.SREC:
            replica.append(fields[0])
    replica.flush()
    assert replica.tracking.publishers == {"p": 3}

    # a store-offset reaches the member at once, without records
    link.frames.clear()
    lead.tracking.store_offset("app", 5)
    assert [(f[0], f[2][0]) for f in link.frames] == [(S.STRACK, {"offsets": {"app": 5}})]
    lead.stop()
    assert lead.ship not in lead.tracking.watchers
    replica.close()
    q.log.close()
