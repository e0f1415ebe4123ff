"""Which queues of its route took a message a link forwarded lately, across its attempts.

A link's source hands it a message again after every failure between the link's local
publish and the source keeping its ack: the link's connection lost, the node running a
shovel's source or hq's warren active killed (the standby recovers every message it did
not see acked, all flagged ``redelivered``), the link giving up on a refused publish.
Each attempt used to start from nothing and publish the message into the whole route
again, so every failure added one copy to every queue that already had it; two failures
close together (a takeover, then the link's node killed; a refused publish held past a
cut) made a third copy (issue 29).

:class:`Taken` remembers, per fingerprint (:func:`plugins.shovel.seen.fingerprint` of
the properties and body as the source sent them), the names of the queues that
confirmed the message, and the per-queue publisher (:mod:`plugins.common.republish`)
publishes a message the source *redelivers* only into the queues of its route missing
from that set; one every queue of its route already has is settled at the source
without a publish. A record also counts the publishes of its message still unanswered
(an attempt that ended may hear from its queues later): a redelivery waits for those
answers before it chooses, or a queue whose confirm was late would get it again.

Only a message with a ``message_id`` is recognised so. Two messages alike in every
property and byte of body may be two messages a publisher meant to send (a sensor's
same reading twice): without an id the link cannot tell a repeat from a second
message, and dropping one would lose it, so it publishes again and flags the copy, as
before. With a ``message_id``, a redelivered message of the same id and content as one
forwarded is that one by the publisher's own word (what a consumer deduplicating on
``message_id`` drops); one delivered for the first time is published as usual, even if
alike (a publisher may send a fixed id on purpose). The memory is per link and per
node: a link moving to another node starts without it (that node's first copy of a
redelivered message is flagged ``redelivered``).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SIZE = 10_000  # messages remembered per link (as many as its Seen window)
# the sets of queue names records hold: nearly every record of a link holds the same
# one (its route), so each distinct set is kept once: ~160 bytes a record with its key
# (tracemalloc, 10,000 records), ~1.6 MB for a full window
_SETS: dict[frozenset[str], frozenset[str]] = {}
_SETS_MAX = 4096

_U16 = struct.Struct(">H")
_MESSAGE_ID = 1 << 7  # the message-id property's flag bit (basic properties, 0-9-1)


def has_message_id(properties: bytes) -> bool:
    """Whether the raw basic properties carry a ``message_id``."""
    return len(properties) >= 2 and bool(_U16.unpack_from(properties, 0)[0] & _MESSAGE_ID)


@dataclass(eq=False, slots=True)
class Record:
    """One forwarded message: the queues known to hold it (filled as they confirm), the
    queues a publish of it went to that have not answered yet (an attempt that ended
    may still hear from them), and who waits for those answers."""

    queues: frozenset[str] = frozenset()
    pending: dict[str, int] | None = None  # queue -> publishes not answered yet
    waiters: list[Callable[[], None]] | None = None

    def sending(self, names: Iterable[str]) -> None:
        """A publish of the message to these queues goes out."""
        pending = self.pending
        if pending is None:
            pending = self.pending = {}
        for name in names:
            pending[name] = pending.get(name, 0) + 1

    def answered(self, names: Iterable[str], ok: bool) -> None:
        """The queues answered that publish: a confirm (``ok``) or a refusal. Once no
        publish is unanswered, the waiters are called."""
        if ok:
            self.add(names)
        pending = self.pending
        if pending is not None:
            for name in names:
                left = pending.get(name, 0) - 1
                if left > 0:
                    pending[name] = left
                else:
                    pending.pop(name, None)
            if not pending:
                self.pending = None
        if self.pending is None and self.waiters:
            waiters, self.waiters = self.waiters, None
            for wake in waiters:
                wake()

    def unanswered(self, names: Iterable[str]) -> bool:
        """Is a publish to one of these queues still waiting for its answer?"""
        pending = self.pending
        return pending is not None and any(name in pending for name in names)

    def wait(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` once every publish of the message has been answered."""
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(wake)

    def add(self, names: Iterable[str]) -> None:
        """These queues confirmed the message."""
        merged = self.queues.union(names)
        if merged != self.queues:
            if len(_SETS) < _SETS_MAX:
                merged = _SETS.setdefault(merged, merged)
            self.queues = merged


# one message on its way: its record, and whether the source redelivered it (only then
# does the record of an earlier pass keep it out of queues: republish.Held.redelivered)
Pass = tuple[Record, bool]


class Taken:
    """The records of the last ``size`` messages with a ``message_id`` a link forwarded
    (the oldest forgotten first; a forgotten message is published again if it comes
    back, flagged, as one without an id)."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._records: OrderedDict[bytes, Record] = OrderedDict()
        self.skipped = 0  # repeats settled without a publish (every queue had them)

    def record(self, fp: bytes) -> Record:
        """The record of the message with fingerprint ``fp``: the one kept from an
        earlier pass (its queues took it then), or a new, empty one."""
        records = self._records
        found = records.get(fp)
        if found is not None:
            records.move_to_end(fp)
            return found
        found = records[fp] = Record()
        if len(records) > self.size:
            records.popitem(last=False)
        return found

    def __len__(self) -> int:
        return len(self._records)
