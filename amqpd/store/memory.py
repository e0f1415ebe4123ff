"""MemoryStore: the MessageStore contract with nothing on disk.

The store of a broker with ``persistence = false`` (and of unit tests): the broker runs the
same code path as with the shared log, persistent messages of durable queues are
appended here and confirmed after :meth:`MemoryStore.commit`, and nothing survives the
process. The store contract tests run against this and ``SharedLog`` alike (NATS
memstore/filestore). ``on_disk`` is False: the broker never pages messages out to it
(that would free no memory).

Positions grow like a log's would (each message advances by its size), so code that
accidentally relies on "position == counter" fails here as it would against a file.
Bodies are kept in a dict: with no disk there is nowhere else to keep them.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Iterable, Sequence

from amqpd.store.api import RecoveredState, StoredMessage, StoreError
from amqpd.store.defs import DefinitionState


class MemoryStore:
    """In-memory :class:`~amqpd.store.api.MessageStore`.

    ``commit`` callbacks run via ``loop.call_soon`` when a loop is given (never inside
    ``commit`` itself, matching the file store), else synchronously inside ``commit``.
    """

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.on_disk = False  # keeps bodies in memory: paging to it would save nothing
        self._messages: dict[int, StoredMessage] = {}
        self._refs: dict[int, int] = {}
        self._queues: dict[str, dict[int, None]] = {}  # insertion-ordered sets
        self._delivered: dict[str, set[int]] = {}
        self._next = 8
        self._records = 0
        self._live = 0
        self._open = False
        self._defs = DefinitionState()
        self._closed = False
        self.failed: str | None = None

    def open(self) -> RecoveredState:
        if self._open or self._closed:
            raise StoreError("open() called twice")
        self._open = True
        return RecoveredState()

    def _check(self) -> None:
        if not self._open or self._closed:
            raise StoreError("store is not open")

    def append_enqueue(self, queues: Sequence[str], message: StoredMessage) -> int:
        self._check()
        pos = self._next
        self._next += 64 + len(message.body) + len(message.properties)
        self._messages[pos] = message
        self._refs[pos] = len(queues)
        for q in queues:
            self._queues.setdefault(q, {})[pos] = None
        self._live += len(queues)
        self._records += 1
        return pos

    def append_settle(self, queue: str, positions: Iterable[int]) -> None:
        self._check()
        q = self._queues.get(queue)
        self._records += 1
        if q is None:
            return
        delivered = self._delivered.get(queue, set())
        for pos in positions:
            if q.pop(pos, 0) is None:
                self._live -= 1
                delivered.discard(pos)
                left = self._refs[pos] - 1
                if left:
                    self._refs[pos] = left
                else:
                    del self._refs[pos]
                    del self._messages[pos]

    def append_delivered(self, queue: str, position: int) -> None:
        self._check()
        if position in self._queues.get(queue, {}):
            self._delivered.setdefault(queue, set()).add(position)
            self._records += 1


    def delivering(self, queue: str, position: int) -> None:
        """Nothing survives a restart here, so there is nothing to promise."""

    def append_delivered_many(self, queue: str, positions: Iterable[int]) -> None:
        for position in positions:
            self.append_delivered(queue, position)

    def drop_queue(self, queue: str) -> None:
        self._check()
        q = self._queues.get(queue)
        if q is not None:
            self.append_settle(queue, list(q))
            del self._queues[queue]
            self._delivered.pop(queue, None)

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        self._check()
        self._records += 1
        for queue in self._defs.apply(((kind, key, body),)):
            self.drop_queue(queue)

    def definitions(self) -> dict[tuple[int, str], bytes]:
        return dict(self._defs.entries)

    def read(self, position: int) -> StoredMessage:
        try:
            return self._messages[position]
        except KeyError:
            raise StoreError(f"no message at position {position}") from None

    def commit(self, callback: Callable[[BaseException | None], None]) -> None:
        self._check()
        if self.loop is None:
            callback(None)
        else:
            self.loop.call_soon(callback, None)

    def sync(self, timeout: float | None = None) -> None:
        """Nothing to wait for (API parity with SharedLog)."""

    def queue_positions(self, queue: str) -> array[int]:
        """Live positions of a queue in order (tests)."""
        return array("q", self._queues.get(queue, {}))

    def stats(self) -> dict[str, int]:
        return {
            "bytes_on_disk": 0,
            "segments": 0,
            "fsyncs": 0,
            "fsync_last_us": 0,
            "fsync_avg_us": 0,
            "records_written": self._records,
            "live_messages": self._live,
            "queues": sum(1 for q in self._queues.values() if q),
            "failed": 0,
        }

    def close(self) -> None:
        self._closed = True
