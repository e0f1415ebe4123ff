"""The one interface between the broker and whatever keeps messages across a restart.

What reaches the store: at publish time, persistent messages (delivery_mode 2) routed to
durable queues. Under memory pressure the broker also pages messages out to it, transient
ones and those of non-durable queues included, when the store is ``on_disk`` (their
records then die with the queue or at the next restart's recovery, which drops queues
that are not durable). The broker calls the
``append_*`` methods from the event-loop thread; they must be cheap (buffer the
record, no fsync). Durability is requested separately with :meth:`MessageStore.commit`,
which is how group commit works: the broker appends any number of records during one
event-loop tick, then asks for one callback once all of them are on disk.

Queues are named by a *queue key*: ``"<vhost>\\x00<queue name>"``, which cannot collide
because AMQP short strings used as names never contain NUL in practice and the vhost
comes first.

A message is identified in the log by its *position* (an int that grows monotonically
over the node's lifetime, e.g. ``segment_base + offset``). The same position is shared
by every queue the message was routed to: the body is written once.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


def queue_key(vhost: str, name: str) -> str:
    """The store's name for a queue: unique across vhosts."""
    return f"{vhost}\x00{name}"


@dataclass(slots=True)
class StoredMessage:
    """What the log holds for one published message (read back on delivery/recovery).

    ``properties`` is the raw AMQP content-header property section (flags + values),
    exactly as the publisher sent it, so it can be passed through unchanged.
    """

    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    # What recovery needs without reading the message back (format.ENQUEUE_META):
    published: int = 0  # wall-clock ms at publish (0: unknown, a log from before)
    expires: int = 0  # absolute per-message expiry, wall-clock ms (0: none)
    priority: int = 0  # the priority property (0 when absent)
    transient: bool = False  # paged out under memory pressure: never recovered


@dataclass(slots=True)
class RecoveredQueue:
    """The messages still live in one queue after recovery, in queue (log) order.

    Kept as flat arrays, not one object per message: a million-message backlog must
    recover in seconds and cost bytes, not hundreds of bytes, per message.
    """

    positions: array[int] = field(default_factory=lambda: array("q"))
    sizes: array[int] = field(default_factory=lambda: array("q"))  # body sizes
    redelivered: set[int] = field(default_factory=set)  # positions with a DELIVERED record
    # parallel to positions, from ENQUEUE_META (see index.QueueIndex): stamps are
    # published_ms << 1 (0: a record from before ENQUEUE_META; TTL and priority must
    # then be read from the message itself), extra is expires_ms << 8 | priority
    stamps: array[int] = field(default_factory=lambda: array("q"))
    extra: array[int] = field(default_factory=lambda: array("q"))


@dataclass(slots=True)
class RecoveredState:
    """What :meth:`MessageStore.open` found on disk."""

    queues: dict[str, RecoveredQueue] = field(default_factory=dict)
    truncated_bytes: int = 0  # torn/corrupt tail removed during recovery
    last_sequence: int = 0  # highest record sequence number seen
    # durable definitions (store/defs.py): (kind, key) -> JSON body, kinds in format.DEF_*
    definitions: dict[tuple[int, str], bytes] = field(default_factory=dict)


class StoreError(Exception):
    """A write or read failed (disk full, I/O error). The broker nacks or blocks."""


class MessageStore(Protocol):
    """A node-wide append-only log of ENQUEUE / SETTLE / DELIVERED records.

    Implementations: ``amqpd.store.log.SharedLog`` (segmented files, CRC, group-commit
    fsync in a worker thread) and ``amqpd.store.memory.MemoryStore`` (same contract,
    nothing on disk; the store of ``persistence = false``, and of tests).
    """

    #: True when what is appended can be dropped from memory and read back later (the
    #: shared log); False for the in-memory store, to which paging would save nothing.
    on_disk: bool

    def open(self) -> RecoveredState:
        """Recover from disk (checkpoint + replay; torn tail truncated). Called once."""
        ...

    def append_enqueue(self, queues: Sequence[str], message: StoredMessage) -> int:
        """Write the message once for all ``queues``; return its log position."""
        ...

    def append_settle(self, queue: str, positions: Iterable[int]) -> None:
        """The queue is done with these messages (ack, reject, drop, expire, purge)."""
        ...

    def append_delivered(self, queue: str, position: int) -> None:
        """The message was handed to a consumer (so recovery marks it redelivered).

        Need not be durable on its own: it rides on the next commit.
        """
        ...

    def delivering(self, queue: str, position: int) -> None:
        """The message is being handed to a consumer now (before its bytes leave): a
        crash from here on must bring it back redelivered. Synchronous and cheap."""
        ...

    def append_delivered_many(self, queue: str, positions: Iterable[int]) -> None:
        """DELIVERED marks for many messages of one queue, in one record."""
        ...

    def drop_queue(self, queue: str) -> None:
        """The queue was deleted: settle everything it still holds."""
        ...

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        """A durable definition was put (``body``: its JSON) or deleted (``body`` empty).

        Deleting a queue's definition (``format.DEF_QUEUE``, key = queue key) also
        settles its messages. Durable once a later :meth:`commit` answers."""
        ...

    def read(self, position: int) -> StoredMessage:
        """Read a message back (its body may have been evicted from memory)."""
        ...

    def commit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback`` (on the event-loop thread) once every record appended so far
        is durable according to the fsync policy, or with the error if the write failed.
        Many calls within one tick share a single fsync."""
        ...

    def stats(self) -> dict[str, int]:
        """Numbers for metrics: bytes on disk, segments, fsyncs, fsync latency (us)..."""
        ...

    def close(self) -> None:
        """Flush, fsync and close files. Further appends raise StoreError."""
        ...
