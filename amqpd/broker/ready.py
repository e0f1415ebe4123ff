"""The ready list of a plain queue: a deque that stores log-only messages as flat arrays.

A backlog of a million persistent messages must cost bytes per message, not objects:
a ``QueueEntry`` + ``LoggedMessage`` + three ints is ~200 bytes, while a (position,
size) pair in two arrays is 12. So consecutive log-only entries (recovered from disk, or
paged out under memory pressure) are kept as a :class:`ColdRun` -- RocketMQ's
ConsumeQueue idea -- and an entry object is only made when one reaches the head.

The class offers the part of ``collections.deque`` the queue code uses (append,
appendleft, popleft, [0], [-1], len, iteration, clear) plus :meth:`insert_by_seq` for
requeues, so a queue neither knows nor cares which entries are cold.

Invariant: entries are ordered by their queue-local ``seq``; a run covers the
contiguous seqs ``seq_base + start .. seq_base + len(positions) - 1``.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from typing import Any

from amqpd.broker.message import LoggedMessage
from amqpd.broker.queue_entry import QueueEntry


class ColdRun:
    __slots__ = ("head", "positions", "redelivered", "seq_base", "sizes", "start", "store")

    def __init__(self, store: Any, seq_base: int) -> None:
        self.store = store
        self.positions = array("q")
        self.sizes = array("q")
        self.seq_base = seq_base
        self.start = 0
        self.redelivered: set[int] | None = None
        self.head: QueueEntry | None = None  # materialised head, so [0] keeps identity

    def __len__(self) -> int:
        return len(self.positions) - self.start

    @property
    def next_seq(self) -> int:
        return self.seq_base + len(self.positions)

    def add(self, position: int, size: int, redelivered: bool) -> None:
        self.positions.append(position)
        self.sizes.append(size)
        if redelivered:
            if self.redelivered is None:
                self.redelivered = set()
            self.redelivered.add(position)

    def entry_at(self, i: int) -> QueueEntry:
        pos = self.positions[i]
        red = self.redelivered is not None and pos in self.redelivered
        return QueueEntry(LoggedMessage(self.store, pos, self.sizes[i]), self.seq_base + i, red)

    def peek(self) -> QueueEntry:
        if self.head is None:
            self.head = self.entry_at(self.start)
        return self.head

    def pop(self) -> QueueEntry:
        entry = self.peek()
        self.head = None
        self.start += 1
        return entry

    def split(self, seq: int) -> ColdRun:
        """Cut this run before ``seq``; return the part from ``seq`` on."""
        cut = seq - self.seq_base
        tail = ColdRun(self.store, seq)
        tail.positions = self.positions[cut:]
        tail.sizes = self.sizes[cut:]
        if self.redelivered:
            tail.redelivered = {p for p in tail.positions if p in self.redelivered}
        del self.positions[cut:]
        del self.sizes[cut:]
        self.head = None
        return tail


def _first_seq(chunk: QueueEntry | ColdRun) -> int:
    return chunk.seq_base + chunk.start if isinstance(chunk, ColdRun) else chunk.seq


def _last_seq(chunk: QueueEntry | ColdRun) -> int:
    return chunk.next_seq - 1 if isinstance(chunk, ColdRun) else chunk.seq


class ReadyList:
    __slots__ = ("_chunks", "_len")

    def __init__(self) -> None:
        self._chunks: deque[QueueEntry | ColdRun] = deque()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    # ------------------------------------------------------------------ adding
    def append(self, entry: QueueEntry) -> None:
        msg = entry.message
        if type(msg) is LoggedMessage and type(entry) is QueueEntry:  # not a TTL'd subclass
            self.append_logged(msg._store, msg.position, msg.size, entry.seq, entry.redelivered)
            return
        self._chunks.append(entry)
        self._len += 1

    def append_logged(self, store: Any, position: int, size: int, seq: int,
                      redelivered: bool = False) -> None:
        """Add a log-only entry without making any object for it."""
        chunks = self._chunks
        run = chunks[-1] if chunks else None
        if not isinstance(run, ColdRun) or run.next_seq != seq or run.store is not store:
            run = ColdRun(store, seq)
            chunks.append(run)
        run.add(position, size, redelivered)
        self._len += 1

    def appendleft(self, entry: QueueEntry) -> None:
        self._chunks.appendleft(entry)
        self._len += 1

    def insert_by_seq(self, entry: QueueEntry) -> None:
        """Put a requeued entry back at its original place (seq order)."""
        chunks = self._chunks
        seq = entry.seq
        if not chunks or seq < _first_seq(chunks[0]):
            self.appendleft(entry)
            return
        if seq > _last_seq(chunks[-1]):
            chunks.append(entry)
            self._len += 1
            return
        for i, chunk in enumerate(chunks):
            if seq < _first_seq(chunk):
                chunks.insert(i, entry)
                break
            if isinstance(chunk, ColdRun) and seq <= _last_seq(chunk):
                tail = chunk.split(seq)
                chunks.insert(i + 1, tail)
                chunks.insert(i + 1, entry)
                break
        else:
            chunks.append(entry)
        self._len += 1

    # ------------------------------------------------------------------ taking
    def __getitem__(self, index: int) -> QueueEntry:
        chunks = self._chunks
        if not chunks:
            raise IndexError("ready list is empty")
        if index == 0:
            head = chunks[0]
            return head.peek() if isinstance(head, ColdRun) else head
        if index == -1:
            tail = chunks[-1]
            return tail.entry_at(len(tail.positions) - 1) if isinstance(tail, ColdRun) else tail
        for i, entry in enumerate(self):
            if i == index:
                return entry
        raise IndexError(index)

    def popleft(self) -> QueueEntry:
        chunks = self._chunks
        head = chunks[0]
        if isinstance(head, ColdRun):
            entry = head.pop()
            if not len(head):
                chunks.popleft()
        else:
            entry = head
            chunks.popleft()
        self._len -= 1
        return entry

    def __iter__(self) -> Iterator[QueueEntry]:
        for chunk in self._chunks:
            if isinstance(chunk, ColdRun):
                if chunk.head is not None:
                    yield chunk.head
                    first = chunk.start + 1
                else:
                    first = chunk.start
                for i in range(first, len(chunk.positions)):
                    yield chunk.entry_at(i)
            else:
                yield chunk

    def positions(self) -> list[int]:
        """Log positions of every entry that has one (purge, delete), without objects."""
        out: list[int] = []
        for chunk in self._chunks:
            if isinstance(chunk, ColdRun):
                out.extend(chunk.positions[chunk.start:])
            elif chunk.message.position >= 0:
                out.append(chunk.message.position)
        return out

    def clear(self) -> None:
        self._chunks.clear()
        self._len = 0
