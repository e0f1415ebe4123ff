"""The sans-IO parts of replicated streams (issue 30): the epoch rule a member's copy is
checked by, the record packing of ``SREC``, the offset a consumer resumes after, the
membership edits of add_replica / delete_replica, a member's copy against a leader's
``SSTART`` on real files, and the copy a removed member left on disk."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from amqpd.broker.api import MembershipError, Record, StreamLog, stream_directory
from amqpd.cluster import link_wire as W
from amqpd.cluster.stream_copies import DROP_GRACE, StreamCopies
from amqpd.cluster.stream_group import cluster_size, replica_edit
from amqpd.cluster.stream_replica import StreamReplica, read_term, valid_end
from amqpd.cluster.stream_wire import delivered_offset, pack_records, unpack_records


def test_a_copy_agrees_up_to_the_first_epoch_after_its_own_term() -> None:
    epochs = [[5, 0], [7, 100], [9, 250]]
    assert valid_end(9, 300, epochs) == 300  # the current term: all of it
    assert valid_end(7, 300, epochs) == 250  # term 7's records beyond 250 are not the leader's
    assert valid_end(7, 200, epochs) == 200
    assert valid_end(6, 150, epochs) == 100  # term 6 never led: up to term 7's start
    assert valid_end(0, 0, epochs) == 0


def test_records_travel_with_their_offsets_timestamps_and_flags() -> None:
    records = [Record(10, 1000, True, b"a"), Record(11, 1001, False, b"", True),
               Record(12, 1002, False, b"x" * 70000)]
    out = list(unpack_records(pack_records(records)))
    assert out == [(10, 1000, 1, b"a"), (11, 1001, 2, b""), (12, 1002, 0, b"x" * 70000)]
    with pytest.raises(W.WireError):
        list(unpack_records(pack_records(records)[:-1]))
    with pytest.raises(W.WireError):
        list(unpack_records(b"\x00" * 5))


def test_the_offset_header_of_a_delivery_is_read_back() -> None:
    from amqpd.broker.stream import with_offset_header

    for props in (b"\x00\x00", b"\x90\x00\x0atext/plain\x02"):
        assert delivered_offset(with_offset_header(props, 123456789)) == 123456789
    assert delivered_offset(b"\x00\x00") is None


def test_replica_edits_follow_rabbitmq_and_the_quorum_rules() -> None:
    nodes = ["a", "b", "c"]
    assert replica_edit(["a", "b"], "a", nodes, "c", None) == ["a", "b", "c"]
    assert replica_edit(["a", "b"], "a", nodes, "b", None) == ["a", "b"]  # a member already
    assert replica_edit(["a", "b"], "a", nodes, None, "c") == ["a", "b"]  # none: no change
    assert replica_edit(["a", "b"], "a", nodes, None, "b") == ["a"]
    with pytest.raises(MembershipError, match="leads"):
        replica_edit(["a", "b"], "a", nodes, None, "a")
    with pytest.raises(MembershipError, match="last member"):
        replica_edit(["a"], "a", nodes, None, "a")
    with pytest.raises(MembershipError, match="not a member of the cluster"):
        replica_edit(["a"], "a", nodes, "z", None)
    assert cluster_size({}, 5) == 5
    assert cluster_size({"x-initial-cluster-size": 2}, 5) == 2


def _leader_log(tmp_path: Path, n: int) -> StreamLog:
    log = StreamLog(tmp_path / "leader")
    log.open()
    for i in range(n):
        log.append(str(i).encode(), 1000 + i)
    log.flush()
    return log


def test_a_copy_continues_from_its_offset_or_starts_again(tmp_path: Path) -> None:
    leader = _leader_log(tmp_path, 30)
    replica = StreamReplica(str(tmp_path), "node-a", 1, "/", "s", {})
    assert replica.start(3, {"epochs": [[3, 0]], "first": 0, "next": 30}) == 0
    records = leader.reader(0).read(20)
    replica.append(pack_records(records))
    assert replica.flush() == 20
    assert replica.offer(3) == 20 and replica.offer(4) == -1
    replica.close()
    directory = stream_directory(tmp_path, "/", "s")
    assert read_term(directory) == 3

    # back under a new leader whose term 4 started at 20: everything is kept
    again = StreamReplica(str(tmp_path), "node-b", 2, "/", "s", {})
    assert again.start(4, {"epochs": [[3, 0], [4, 20]], "first": 0, "next": 30}) == 20
    again.close()
    # a leader of term 5 that started at 15 never had this copy's 15..19: copied again
    third = StreamReplica(str(tmp_path), "node-c", 3, "/", "s", {})
    assert third.start(5, {"epochs": [[3, 0], [5, 15]], "first": 0, "next": 15}) == 0
    assert third.log.first_offset == 0 and third.log.last_offset == -1
    # a leader whose retention starts beyond the copy: it starts at the leader's first
    assert third.start(5, {"epochs": [[3, 0], [5, 15]], "first": 40, "next": 50}) == 40
    third.close()
    leader.close()


def _copies(tmp_path: Path, records: dict[tuple[str, str], dict[str, object]]) -> Any:
    """A member's StreamCopies over stand-in groups: node-c, these group records (each
    at revision 1), no copy open, no election, no stream led here."""
    groups = SimpleNamespace(
        node="node-c", broker=SimpleNamespace(settings=SimpleNamespace(data_dir=str(tmp_path))),
        records=records, revisions=dict.fromkeys(records, 1), replicas={}, electing=set(),
        local_stream=lambda ident: None)
    return StreamCopies(cast(Any, groups))


def _copy_on_disk(tmp_path: Path, name: str) -> Path:
    directory = stream_directory(tmp_path, "/", name)
    directory.mkdir(parents=True)
    (directory / "00000000000000000000.seg").write_bytes(b"x")
    return directory


def test_a_copy_left_by_a_removed_member_is_deleted_once_it_reads_the_record(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    removed, member, open_ = (_copy_on_disk(tmp_path, n) for n in ("gone", "kept", "open"))
    records: dict[tuple[str, str], dict[str, object]] = {
        ("/", "gone"): {"leader": "node-a", "members": ["node-a", "node-b"]},
        ("/", "kept"): {"leader": "node-a", "members": ["node-a", "node-c"]},
        ("/", "open"): {"leader": "node-a", "members": ["node-a", "node-b"]}}
    copies = _copies(tmp_path, records)
    # open, (re)started by its leader after this node read the removal: a node added
    # again, whose copy the leader feeds (record_revision 1 is the record read then)
    replica = StreamReplica(str(tmp_path), "node-a", 1, "/", "open", {})
    replica.record_revision = 1
    copies.groups.replicas[("/", "open")] = replica
    with caplog.at_level(logging.WARNING, "amqpd.cluster.stream"):
        copies.clear_removed()
    assert not removed.exists() and member.is_dir() and open_.is_dir()
    assert "'gone' in vhost '/': this node is no longer a member" in caplog.text
    assert not replica.closed

    # a later record without this node: deleted once the leader's SDROP did not come
    # within DROP_GRACE (the link was down)
    copies.groups.revisions[("/", "open")] = 2
    copies.clear_removed(now=100.0)
    copies.clear_removed(now=100.0 + DROP_GRACE - 0.1)
    assert not replica.closed and open_.is_dir()
    copies.clear_removed(now=100.0 + DROP_GRACE)
    assert replica.closed and not open_.exists() and ("/", "open") not in \
        copies.groups.replicas
    assert "its leader did not drop the copy" in caplog.text

    # looked at once per record revision; a failed delete is logged, tried again with
    # the next revision
    _copy_on_disk(tmp_path, "gone")

    def refuse(path: object) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(shutil, "rmtree", refuse)
    copies.clear_removed()
    assert removed.is_dir()
    copies.groups.revisions[("/", "gone")] = 2
    with caplog.at_level(logging.ERROR, "amqpd.cluster.stream"):
        copies.clear_removed()
    assert "deleting" in caplog.text and "read-only file system" in caplog.text
    monkeypatch.undo()
    copies.groups.revisions[("/", "gone")] = 3
    copies.clear_removed()
    assert not removed.exists() and member.is_dir()
