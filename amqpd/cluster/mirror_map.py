"""Which leader position each message of a mirror's copy stands for, kept on disk so a
mirror whose node restarts keeps its copy (issue 16: "a returning mirror keeps what
it has and fetches only what it lacks").

A mirror writes the leader's messages into its own store under the queue's key, at
positions of its own log. What links the two is the copy's map: leader position ->
local position. The store recovers the local messages at restart; this file gives
back the leader positions, so the mirror can tell the leader (``MHAVE``) what it
already holds.

Layout of ``<data dir>/mirror-maps/<sha1 of the queue's store key>.map``::

    one line of JSON: {"vhost": ..., "queue": ..., "leader": <node>}\\n
    then 16-byte records: leader position (u64, big-endian) | local position (u64)

Records are appended as the copy grows and the file is rewritten from the copy's
entries when a copy is (re)started. It is flushed to the OS with the copy's store
commits but never fsync'd: a record lost in a machine crash only makes the mirror
fetch that message again (its local message, found without a record, is settled),
and a record whose local message was not recovered is ignored. A torn last record is
ignored too.

A quorum member's copy also appends its *mark* (issue 28), three records:
``(MARK, term)``, ``(MARK_SEQ, seq)``, ``(MARK_CRC, CRC-32 of every byte of the file
before the mark)``: the copy held the leader's log completely, durable in this node's
store, up to replication sequence number ``seq`` of the leader's stream of term
``term``. The last mark whose CRC matches counts (:attr:`CopyMap.mark`). It is written
only while the copy is synchronised, after the store commit that made those records
durable and before the ``MACK`` that acknowledges ``seq`` (``Mirrors._send_acks``), so
it is never ahead of the store; a rewrite carries the mark the copy still stands by. A
member whose node restarts offers it in an election (``Mirrors._adopt``,
``quorum_failover.election_offer``) instead of nothing, so it is not passed over for a
member that never had a record it acknowledged.

Marks make the file grow by 48 bytes per acknowledgement batch (one message each at a
low rate), so a copy rewrites its map from its entries once the file is more than
:data:`COMPACT_FACTOR` times what they need and over :data:`COMPACT_MIN` bytes
(:meth:`CopyMap.bloated`, checked after each mark), which also bounds the records of
settled messages.

Like the rest of the file the mark is flushed to the OS but not fsync'd (an fsync per
acknowledgement batch would double a member's fsyncs): a kill -9 loses nothing written,
the OS has it. A machine crash may lose the mark (the member then offers nothing until
it has resynchronised, as before the mark existed), or lose map records written before
a mark that survives: the CRC catches that and the mark is ignored, so a mark that
counts comes with every map record of the messages it covers, whose messages and
settles the store fsync'd before the mark was written. (Under the store's
``fsync: never`` a machine crash loses confirmed messages anyway.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO

_REC = struct.Struct(">QQ")
# leader positions no log reaches: the three records of a mark (module docstring)
MARK = (1 << 64) - 1
MARK_SEQ = (1 << 64) - 2
MARK_CRC = (1 << 64) - 3
COMPACT_MIN = 1 << 20  # bytes: a smaller map file is never rewritten to shrink it
COMPACT_FACTOR = 4  # ... nor one under this many times what its live entries need


def map_path(data_dir: str | os.PathLike[str], key: str) -> Path:
    digest = hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()
    return Path(data_dir) / "mirror-maps" / f"{digest}.map"


class CopyMap:
    """The map file of one mirror copy (module docstring)."""

    def __init__(self, path: Path, vhost: str, queue: str, leader: str) -> None:
        self.path = path
        self.vhost = vhost
        self.queue = queue
        self.leader = leader
        # (term, seq) of the last mark written, or read back by load(); None: none
        self.mark: tuple[int, int] | None = None
        self._file: IO[bytes] | None = None
        self._crc = 0  # CRC-32 of the file's bytes written so far
        self.size = 0  # ... and how many

    def rewrite(self, pairs: Iterable[tuple[int, int]],
                mark: tuple[int, int] | None = None) -> None:
        """Start the file again with these (leader position, local position) pairs,
        then ``mark`` if the copy still stands by one."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        data = json.dumps({"vhost": self.vhost, "queue": self.queue,
                           "leader": self.leader}).encode() + b"\n" + \
            b"".join(_REC.pack(lp, local) for lp, local in pairs)
        self._crc = zlib.crc32(data)
        self.size = len(data)
        if mark is not None:
            data += self._pack_mark(*mark)
        tmp.write_bytes(data)
        tmp.replace(self.path)
        self.mark = mark
        self._file = self.path.open("ab")

    def add(self, leader_pos: int, local: int) -> None:
        if self._file is not None:
            rec = _REC.pack(leader_pos, local)
            self._crc = zlib.crc32(rec, self._crc)
            self.size += _REC.size
            self._file.write(rec)

    def add_mark(self, term: int, seq: int) -> None:
        """The copy holds the leader's log of ``term`` completely up to ``seq``,
        durable in the store (the caller's word; module docstring); flushed to the OS
        at once, as the ``MACK`` of ``seq`` follows."""
        if self._file is not None and self.mark != (term, seq):
            self._file.write(self._pack_mark(term, seq))
            self._file.flush()
            self.mark = (term, seq)

    def _pack_mark(self, term: int, seq: int) -> bytes:
        data = _REC.pack(MARK, term) + _REC.pack(MARK_SEQ, seq) + \
            _REC.pack(MARK_CRC, self._crc)
        self._crc = zlib.crc32(data, self._crc)
        self.size += len(data)
        return data

    def bloated(self, entries: int) -> bool:
        """Whether the file is worth rewriting for a copy of ``entries`` messages
        (module docstring)."""
        return self.size > COMPACT_MIN and \
            self.size > COMPACT_FACTOR * _REC.size * (entries + 3)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    @classmethod
    def load(cls, path: Path) -> tuple[CopyMap, dict[int, int]] | None:
        """The map (its :attr:`mark` the last one in the file whose CRC matches) and
        its local position -> leader position records; None if there is no file or its
        header cannot be read."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head, sep, rest = data.partition(b"\n")
        if not sep:
            return None
        try:
            meta = json.loads(head)
            cmap = cls(path, str(meta["vhost"]), str(meta["queue"]), str(meta["leader"]))
        except (ValueError, KeyError, TypeError):
            return None
        usable = len(rest) - len(rest) % _REC.size
        recs = list(_REC.iter_unpack(rest[:usable]))
        to_leader: dict[int, int] = {}
        crc = zlib.crc32(head + sep)  # of the bytes before record i
        for i, (lp, local) in enumerate(recs):
            if lp == MARK:
                tail = recs[i + 1:i + 3]
                if len(tail) == 2 and tail[0][0] == MARK_SEQ and tail[1] == (MARK_CRC, crc):
                    cmap.mark = (local, tail[0][1])
            elif lp not in (MARK_SEQ, MARK_CRC):
                to_leader[local] = lp
            crc = zlib.crc32(rest[i * _REC.size:(i + 1) * _REC.size], crc)
        return cmap, to_leader


__all__ = ["CopyMap", "map_path"]
