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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import IO

_REC = struct.Struct(">QQ")


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
        self._file: IO[bytes] | None = None

    def rewrite(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Start the file again with these (leader position, local position) pairs."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(json.dumps({"vhost": self.vhost, "queue": self.queue,
                                "leader": self.leader}).encode() + b"\n")
            f.write(b"".join(_REC.pack(lp, local) for lp, local in pairs))
        tmp.replace(self.path)
        self._file = self.path.open("ab")

    def add(self, leader_pos: int, local: int) -> None:
        if self._file is not None:
            self._file.write(_REC.pack(leader_pos, local))

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
        """The map and its local position -> leader position records; None if there is
        no file or its header cannot be read."""
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
        to_leader = {local: lp for lp, local in _REC.iter_unpack(rest[:usable])}
        return cmap, to_leader


__all__ = ["CopyMap", "map_path"]
