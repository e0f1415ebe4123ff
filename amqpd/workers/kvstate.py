"""The node-local coordination store's state: keys, revisions, leases, watch history.

Why a store of our own (docs/workers.md): the workers of one node run the cluster layer
(amqpd/cluster/) unchanged as members of a node-private cluster, and that layer keeps
its shared state in etcd. A single node must need no etcd, so the supervisor keeps
this small store and serves it with etcd's JSON gateway shape (:mod:`.localkv`). This
module is the sans-IO part: the same semantics etcd v3 gives the calls the cluster
makes (a revision per write request, ``create``/``mod``/``version``/``lease``/``value``
compares, leases whose expiry deletes their keys, watches that replay from a
revision), and an append-only log that makes every write durable before it is
answered.

Durability: each write request becomes one JSON line in ``kv.log`` (its revision and
operations), written and fsync'd before the caller is answered. At open the log is
replayed, keys attached to a lease are dropped (leases do not outlive the supervisor,
and the workers that held them restart with it), and the result is written back as a
fresh log (a snapshot line), so the file holds the live set, not the whole history.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# watch history kept for watches that start behind the current revision; an older start
# is answered with ``compact_revision`` (the cluster then reads the prefix again)
HISTORY: Final = 50_000


class KVError(Exception):
    """A request etcd would refuse; ``code`` is the gRPC status code it would give."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


NOT_FOUND: Final = 5
INVALID: Final = 3


@dataclass
class Entry:
    value: bytes
    create: int
    mod: int
    version: int
    lease: int


@dataclass(frozen=True)
class Event:
    revision: int
    deleted: bool
    key: bytes
    entry: Entry


@dataclass
class LeaseState:
    ttl: int
    deadline: float
    keys: set[bytes]


def in_range(key: bytes, start: bytes, end: bytes) -> bool:
    """etcd's range rule: no end = the one key; end ``\\x00`` = every key from start."""
    if not end:
        return key == start
    if end == b"\x00":
        return key >= start
    return start <= key < end


class KVState:
    def __init__(self, path: Path | None, clock: Callable[[], float]) -> None:
        self.path = path
        self.clock = clock
        self.revision = 1  # etcd starts at 1
        self.keys: dict[bytes, Entry] = {}
        self.leases: dict[int, LeaseState] = {}
        self.history: deque[Event] = deque(maxlen=HISTORY)
        self.compacted = 1  # the oldest revision a watch may start from
        self._next_lease = 1
        self._log: Any = None
        self.watchers: list[Callable[[list[Event]], None]] = []

    # ------------------------------------------------------------------ durability
    def open(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    if not line.endswith("\n"):
                        break  # a torn last line: never answered, so never relied on
                    self._replay(json.loads(line))
        for key in [k for k, e in self.keys.items() if e.lease]:
            del self.keys[key]
        self.compacted = self.revision
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(self._snapshot()) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._log = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the store

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _snapshot(self) -> dict[str, Any]:
        return {"snapshot": self.revision,
                "keys": [[k.hex(), e.value.hex(), e.create, e.mod, e.version]
                         for k, e in self.keys.items()]}

    def _replay(self, record: dict[str, Any]) -> None:
        if "snapshot" in record:
            self.revision = int(record["snapshot"])
            self.keys = {bytes.fromhex(k): Entry(bytes.fromhex(v), c, m, ver, 0)
                         for k, v, c, m, ver in record["keys"]}
            return
        rev = int(record["rev"])
        for op in record["ops"]:
            key = bytes.fromhex(op[1])
            if op[0] == "put":
                old = self.keys.get(key)
                self.keys[key] = Entry(bytes.fromhex(op[2]), old.create if old else rev, rev,
                                       (old.version if old else 0) + 1, int(op[3]))
            else:
                self.keys.pop(key, None)
        self.revision = rev

    def _write(self, ops: list[list[Any]]) -> None:
        if self._log is None:
            return
        self._log.write(json.dumps({"rev": self.revision, "ops": ops}) + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    # ------------------------------------------------------------------ reads
    def range(self, start: bytes, end: bytes) -> list[tuple[bytes, Entry]]:
        if not end:
            entry = self.keys.get(start)
            return [(start, entry)] if entry is not None else []
        return sorted((k, e) for k, e in self.keys.items() if in_range(k, start, end))

    def compare(self, cmp: dict[str, Any]) -> bool:
        key = cmp["key"]
        entry = self.keys.get(key)
        target = cmp["target"]
        actual: int | bytes
        if target == "VALUE":
            if entry is None:
                return False  # etcd: a value compare on a missing key fails
            actual = entry.value
        elif target == "CREATE":
            actual = entry.create if entry else 0
        elif target == "MOD":
            actual = entry.mod if entry else 0
        elif target == "LEASE":
            actual = entry.lease if entry else 0
        else:
            actual = entry.version if entry else 0
        operand = cmp["operand"]
        result = cmp["result"]
        if result == "EQUAL":
            return bool(actual == operand)
        if result == "NOT_EQUAL":
            return bool(actual != operand)
        if result == "GREATER":
            return bool(actual > operand)  # type: ignore[operator]
        if result == "LESS":
            return bool(actual < operand)  # type: ignore[operator]
        raise KVError(f"unknown compare result {result!r}", INVALID)

    # ------------------------------------------------------------------ writes
    def write(self, ops: list[tuple[str, bytes, bytes, bytes, int]]) -> list[Any]:
        """Apply one request's operations at one new revision (a request without a
        change takes none). Each op: ("put", key, value, b"", lease),
        ("delete", start, b"", end, 0) or ("get", start, b"", end, 0). Answers, per op,
        the entries read or the count deleted."""
        for kind, _key, _value, _end, lease in ops:
            if kind == "put" and lease and lease not in self.leases:
                raise KVError("etcdserver: requested lease not found", NOT_FOUND)
        changes = [op for op in ops if op[0] == "put" or
                   (op[0] == "delete" and self.range(op[1], op[3]))]
        rev = self.revision + 1 if changes else self.revision
        events: list[Event] = []
        logged: list[list[Any]] = []
        answers: list[Any] = []
        for kind, key, value, end, lease in ops:
            if kind == "get":
                answers.append(self.range(key, end))
            elif kind == "put":
                old = self.keys.get(key)
                if old is not None and old.lease and old.lease != lease:
                    self._detach(key, old.lease)
                entry = Entry(value, old.create if old else rev, rev,
                              (old.version if old else 0) + 1, lease)
                self.keys[key] = entry
                if lease:
                    self.leases[lease].keys.add(key)
                events.append(Event(rev, False, key, entry))
                logged.append(["put", key.hex(), value.hex(), lease])
                answers.append(None)
            else:
                gone = self.range(key, end)
                for k, e in gone:
                    del self.keys[k]
                    if e.lease:
                        self._detach(k, e.lease)
                    events.append(Event(rev, True, k, Entry(b"", 0, rev, 0, 0)))
                    logged.append(["delete", k.hex()])
                answers.append(len(gone))
        if events:
            self.revision = rev
            self._write(logged)
            self._publish(events)
        return answers

    def _detach(self, key: bytes, lease: int) -> None:
        state = self.leases.get(lease)
        if state is not None:
            state.keys.discard(key)

    def _publish(self, events: list[Event]) -> None:
        self.history.extend(events)
        if self.history and len(self.history) == self.history.maxlen:
            self.compacted = self.history[0].revision + 1
        for watcher in list(self.watchers):
            watcher(events)

    def since(self, revision: int) -> list[Event] | None:
        """The events from ``revision`` on, or None when history no longer reaches it."""
        if revision < self.compacted:
            return None
        return [e for e in self.history if e.revision >= revision]

    # ------------------------------------------------------------------ leases
    def grant(self, ttl: int) -> int:
        lease = self._next_lease
        self._next_lease += 1
        self.leases[lease] = LeaseState(ttl, self.clock() + ttl, set())
        return lease

    def keepalive(self, lease: int) -> int:
        state = self.leases.get(lease)
        if state is None:
            return 0
        state.deadline = self.clock() + state.ttl
        return state.ttl

    def revoke(self, lease: int) -> None:
        state = self.leases.pop(lease, None)
        if state is None:
            raise KVError("etcdserver: requested lease not found", NOT_FOUND)
        if state.keys:
            self.write([("delete", key, b"", b"", 0) for key in sorted(state.keys)])

    def expire(self) -> int:
        """Revoke every lease past its deadline; answers how many."""
        now = self.clock()
        due = [lease for lease, s in self.leases.items() if s.deadline <= now]
        for lease in due:
            self.revoke(lease)
        return len(due)


__all__ = ["Entry", "Event", "KVError", "KVState", "in_range"]
