"""A quorum member's durable "complete up to" mark (issue 28): written in the copy's map
before the MACK it stands behind, read back at a restart only when the map records
before it are intact, offered in an election only for the lost leader's term."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.mirror import MirrorCopy, Mirrors
from amqpd.cluster.mirror_map import CopyMap, map_path
from amqpd.cluster.quorum_group import QuorumGroups, election_offer
from amqpd.config import ClusterConfig
from amqpd.store.memory import MemoryStore
from tests.support.deferred_store import DeferredCommitStore
from tests.support.record_etcd import RecordEtcd


def _map(tmp_path: Path) -> CopyMap:
    return CopyMap(map_path(tmp_path, "/\x00q"), "/", "q", "node-a")


def _mark_of(path: Path) -> tuple[int, int] | None:
    loaded = CopyMap.load(path)
    assert loaded is not None
    return loaded[0].mark


def test_the_last_mark_counts_and_its_records_are_not_map_records(tmp_path: Path) -> None:
    cmap = _map(tmp_path)
    cmap.rewrite([(1, 101)])
    assert _mark_of(cmap.path) is None
    cmap.add(2, 102)
    cmap.add_mark(7, 40)
    cmap.add(3, 103)
    cmap.add_mark(7, 41)
    cmap.add(4, 104)  # received after the last mark: kept, the mark stays (7, 41)
    cmap.flush()
    loaded = CopyMap.load(cmap.path)
    assert loaded is not None
    again, to_leader = loaded
    assert again.mark == (7, 41)
    assert to_leader == {101: 1, 102: 2, 103: 3, 104: 4}


def test_a_rewrite_carries_the_mark_it_is_given(tmp_path: Path) -> None:
    cmap = _map(tmp_path)
    cmap.rewrite([(1, 101)], (3, 9))
    cmap.add(2, 102)
    cmap.flush()
    assert _mark_of(cmap.path) == (3, 9)
    cmap.rewrite([(1, 101), (2, 102)])  # a copy that stands by no mark
    assert _mark_of(cmap.path) is None


def test_a_mark_after_a_damaged_map_record_does_not_count(tmp_path: Path) -> None:
    """A machine crash can lose map records written before a mark that survives: the
    mark's CRC says so, and the copy offers nothing rather than a mark whose messages'
    map records are gone (their messages would be dropped as orphans)."""
    cmap = _map(tmp_path)
    cmap.rewrite([(1, 101)])
    cmap.add(2, 102)
    cmap.add_mark(5, 10)
    cmap.add(3, 103)
    cmap.add_mark(5, 11)
    cmap.close()
    data = bytearray(cmap.path.read_bytes())
    head = data.index(b"\n") + 1
    good = bytes(data)
    data[head + 16:head + 32] = bytes(16)  # the record (2, 102) never reached the disk
    cmap.path.write_bytes(bytes(data))
    assert _mark_of(cmap.path) is None
    # the record after the first mark lost: the first mark still counts
    data = bytearray(good)
    data[head + 80:head + 96] = bytes(16)
    cmap.path.write_bytes(bytes(data))
    assert _mark_of(cmap.path) == (5, 10)
    # a torn last mark (two of its three records): the one before counts
    cmap.path.write_bytes(good[:-16])
    assert _mark_of(cmap.path) == (5, 10)


# ------------------------------------------------------------------ through Mirrors
class _Link:
    """Records each frame with the mark the map file on disk holds as it is sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sent: list[tuple[int, list[Any], tuple[int, int] | None]] = []
        self.closed = False

    def send(self, data: bytes) -> None:
        kind = data[4]
        self.sent.append((kind, W.decode_fields(kind, data[9:]), _mark_of(self.path)))


def _mirrors(tmp_path: Path, link: _Link | None = None, inner: Any = None) -> Mirrors:
    if inner is None:
        inner = MemoryStore()
        inner.open()
    broker = SimpleNamespace(store=inner, settings=SimpleNamespace(data_dir=tmp_path),
                             vhosts={})
    cluster = SimpleNamespace(node_name="node-b", etcd=SimpleNamespace(), root="/r",
                              config=ClusterConfig(mirror_sync_timeout=5.0),
                              catalogue={("/", "q"): "node-a"})
    links = SimpleNamespace(link=lambda node: link if node == "node-a" else None)
    m = Mirrors(SimpleNamespace(cluster_port=lambda: broker), cluster,  # type: ignore[arg-type]
                SimpleNamespace(links=links, retired={}))  # type: ignore[arg-type]
    m.store.on_disk = True
    return m


def _copy(m: Mirrors, tmp_path: Path, term: int) -> MirrorCopy:
    cmap = _map(tmp_path)
    copy = MirrorCopy(m.store.inner, "node-a", 9, "/", "q", 0, cmap)
    cmap.rewrite(())
    copy.term = term
    m.copies[("node-a", 9)] = copy
    m.copy_of[("/", "q")] = copy
    return copy


def _receive(copy: MirrorCopy, seq: int, pos: int) -> None:
    copy.seen(seq)
    copy.enqueue(pos, False, "", "q", b"", b"m%d" % pos, 0, 0, 0)


def _ack(m: Mirrors, copy: MirrorCopy, link: _Link) -> None:
    """What a tick of records ends with (Mirrors._schedule_ack): the store commit, then
    the acknowledgements (MemoryStore answers at once)."""
    m._ack_due.add(copy)
    m._send_acks(link)  # type: ignore[arg-type]


def test_a_synchronised_copy_writes_its_mark_before_the_mack(tmp_path: Path) -> None:
    link = _Link(map_path(tmp_path, "/\x00q"))
    m = _mirrors(tmp_path, link)
    copy = _copy(m, tmp_path, term=4)
    _receive(copy, 1, 10)
    _ack(m, copy, link)
    # still copying its backlog: acknowledged, but no claim to hold the leader's log
    assert [(k, f[-1], mark) for k, f, mark in link.sent] == [(M.MACK, 1, None)]
    copy.backlog_end()
    _receive(copy, 2, 11)
    _ack(m, copy, link)
    assert [(k, mark) for k, _f, mark in link.sent[1:]] == [(M.MSYNCED, (4, 2)),
                                                            (M.MACK, (4, 2))]
    _receive(copy, 3, 12)
    _ack(m, copy, link)
    assert link.sent[-1][0] == M.MACK and link.sent[-1][1][-1] == 3
    assert link.sent[-1][2] == (4, 3)


def test_a_commit_asked_before_the_copy_was_complete_writes_no_mark(
        tmp_path: Path) -> None:
    """Two acknowledgement batches in flight, the copy complete only from the second:
    the first one's answer (the store commits answer in order) claims nothing, though
    the copy is complete by the time it comes."""
    slow = DeferredCommitStore(MemoryStore())
    slow.inner.open()
    link = _Link(map_path(tmp_path, "/\x00q"))
    m = _mirrors(tmp_path, link, slow)
    copy = _copy(m, tmp_path, term=4)
    _receive(copy, 1, 10)
    _ack(m, copy, link)  # copying its backlog still
    copy.backlog_end()
    _receive(copy, 2, 11)
    _ack(m, copy, link)
    assert link.sent == [] and copy.synced
    slow.release()
    assert [(k, f[-1] if k == M.MACK else None, mark) for k, f, mark in link.sent] == [
        (M.MACK, 1, None), (M.MSYNCED, None, (4, 2)), (M.MACK, 2, (4, 2))]


def test_a_map_grown_past_its_entries_is_rewritten_with_its_mark(
        tmp_path: Path, monkeypatch: Any) -> None:
    from amqpd.cluster import mirror_map

    monkeypatch.setattr(mirror_map, "COMPACT_MIN", 0)
    link = _Link(map_path(tmp_path, "/\x00q"))
    m = _mirrors(tmp_path, link)
    copy = _copy(m, tmp_path, term=4)
    copy.backlog_end()
    seq = 0
    for pos in range(10, 20):
        seq += 1
        _receive(copy, seq, pos)
        _ack(m, copy, link)
    assert copy.map is not None
    grown = copy.map.size
    assert grown > 10 * 16 + 10 * 48  # a mark per acknowledgement
    seq += 1
    copy.seen(seq)
    copy.settle(list(range(10, 19)))  # one message left: 16 bytes of records would do
    _ack(m, copy, link)
    assert copy.map.size < grown / 2
    loaded = CopyMap.load(copy.map.path)
    assert loaded is not None and loaded[0].mark == (4, seq)
    assert set(loaded[1].values()) == {19}


def test_a_copy_without_a_term_writes_no_mark(tmp_path: Path) -> None:
    """Mirrored queues' copies (no term) keep the map as before."""
    link = _Link(map_path(tmp_path, "/\x00q"))
    m = _mirrors(tmp_path, link)
    copy = _copy(m, tmp_path, term=0)
    copy.backlog_end()
    _receive(copy, 1, 10)
    _ack(m, copy, link)
    assert link.sent and all(mark is None for _k, _f, mark in link.sent)


def test_a_restarted_member_reads_its_mark_back_and_offers_it(tmp_path: Path) -> None:
    link = _Link(map_path(tmp_path, "/\x00q"))
    m = _mirrors(tmp_path, link)
    copy = _copy(m, tmp_path, term=4)
    copy.backlog_end()
    for seq, pos in ((1, 10), (2, 11)):
        _receive(copy, seq, pos)
    _ack(m, copy, link)
    assert copy.map is not None
    copy.map.close()
    # the node restarts: the store gives back the messages, the cluster retires the
    # local queue and the copy is adopted from its map
    ready = [SimpleNamespace(message=SimpleNamespace(position=e[0], size=e[1]),
                             redelivered=False) for e in copy.in_order()]
    gone: list[bool] = []
    q = SimpleNamespace(store_key="/\x00q", ready_entries=lambda: ready, in_store=True,
                        delete=lambda: gone.append(True))
    again = _mirrors(tmp_path)
    assert again._adopt(("/", "q"), q)  # type: ignore[arg-type]
    adopted = again.copy_of[("/", "q")]
    assert gone == [True] and sorted(adopted.entries) == [10, 11]
    assert not adopted.synced and (adopted.held_term, adopted.held_seq) == (4, 2)
    assert election_offer(adopted, 4) == 2
    # the group record names another term: a leader elected (or restarted) since, whose
    # sequence numbers are another space
    assert election_offer(adopted, 5) == -1
    # the leader streams to it again: it keeps its mark until it is complete again
    adopted.restart(12, 0)
    adopted.term = 4
    assert election_offer(adopted, 4) == 2
    assert _mark_of(map_path(tmp_path, "/\x00q")) == (4, 2)


def test_a_copy_that_follows_another_leader_drops_its_mark(tmp_path: Path) -> None:
    m = _mirrors(tmp_path)
    copy = _copy(m, tmp_path, term=4)
    copy.held_term, copy.held_seq = 4, 7
    copy.follow("node-c", 13, 0, CopyMap(map_path(tmp_path, "/\x00q"), "/", "q", "node-c"))
    assert (copy.held_term, copy.held_seq) == (0, -1)
    assert election_offer(copy, 4) == -1 and election_offer(copy, 5) == -1


def test_a_complete_copy_offers_its_last_sequence_number_of_the_same_term() -> None:
    store = MemoryStore()
    store.open()
    copy = MirrorCopy(store, "node-a", 9, "/", "q", 30)
    copy.term, copy.synced, copy.held_term, copy.held_seq = 6, True, 5, 80
    assert election_offer(copy, 6) == 30
    assert election_offer(copy, 5) == 80  # its earlier stream's, held completely
    assert election_offer(copy, 7) == -1


# ------------------------------------------------------------------ a restarted leader
async def test_a_leader_taking_up_its_record_again_starts_a_new_term() -> None:
    """Its sequence numbers start again from 0: a new term names the new space, so no
    member's mark or offer of the earlier one is read as a number of this one."""
    groups = QuorumGroups.__new__(QuorumGroups)
    groups.root, groups.node = "/r", "node-a"
    groups.establishing, groups.leading = set(), {}
    key = groups.record_key(("/", "q"))
    etcd = RecordEtcd(key, {"leader": "node-a", "members": ["node-a", "node-b", "node-c"],
                       "term": 6}, revision=40)
    groups.etcd = etcd  # type: ignore[assignment]
    led: list[int] = []

    def lead_group(vh: Any, q: Any, members: list[str], term: int, live: Any) -> Any:
        led.append(term)
        return SimpleNamespace(rev=0, written=None)

    groups._lead_group = lead_group  # type: ignore[method-assign]
    q = SimpleNamespace(name="q")
    vh = SimpleNamespace(name="/", queues={"q": q})
    await groups._establish(vh, q)  # type: ignore[arg-type]
    assert led == [7] and json.loads(etcd.value)["term"] == 7
    # another node's record: not led, the term left alone
    etcd.value = json.dumps({"leader": "node-b", "members": [], "term": 9}).encode()
    await groups._establish(vh, q)  # type: ignore[arg-type]
    assert led == [7] and json.loads(etcd.value)["term"] == 9
