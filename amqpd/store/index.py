"""What is live in the log: per-queue indexes, per-segment refcounts, relocations.

The same state machine runs in two places: the event-loop thread applies each record
as it is appended, and recovery applies each record as it is replayed. Keeping one
implementation is what makes "state after restart == state before the crash" hold.

Memory is the point of the layout (DESIGN.md: bounded by configuration, not backlog).
No object per message::

    QueueIndex (one per queue that ever held a persistent message)
      positions  array('q')  ascending stable positions   8 B/message
      sizes      array('q')  body sizes, parallel          8 B/message
      stamps     array('q')  published_ms << 1 | transient 8 B/message (0: unknown)
      extra      array('q')  expires_ms << 8 | priority    8 B/message
                             (both from ENQUEUE_META: what recovery needs for TTL,
                             priority and dropping paged transient messages without
                             reading a single message back)
      head       int         entries before head are settled
      dead       set[int]    settled entries past head (out-of-order acks), kept small
                             by compaction of the arrays once it grows
      delivered  set[int]    entries with a DELIVERED record (about the unacked window)

    LiveIndex (one per store)
      queues     dict[str, QueueIndex]
      seg_live   dict[base, int]  live (queue, message) pairs whose bytes sit in segment
      seg_total  dict[base, int]  pairs ever placed there (for the compaction ratio)
      reloc      dict[pos, pos]   stable position -> where compaction copied the message
      reloc_refs dict[pos, int]   live pairs of a relocated message (drop the map entry)
      carry      dict[base, dict[queue, (stables, currents)]]   settles written in
                 segment ``base`` of messages that lie in older segments (see below)

Carried settles. Segments are deleted out of order: a dead segment goes as soon as a
durable checkpoint lies past it, even while older segments live on. Its SETTLE records
may be the only ones saying that a message in an older, surviving segment is done with.
With the checkpoint, nobody replays those records; without it (the file lost or
damaged), a full replay would bring such messages back. So each segment remembers the
settles it holds for older messages, and when it is deleted the log first re-appends
those still needed (their ENQUEUE or a compaction copy is still on disk) as SETTLE
records in the active segment, where they are remembered again.

A message's *stable position* is the position ``append_enqueue`` returned. It never
changes: compaction writes a copy elsewhere and records ``reloc[stable] = new``, so the
broker keeps using the number it has. Because stable positions are handed out in log
order, a queue's array is sorted, membership is a bisect, and queue order is array order.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Sequence


class QueueIndex:
    """The live messages of one queue, in queue order, as flat arrays."""

    __slots__ = ("dead", "delivered", "extra", "head", "positions", "sizes", "stamps")

    def __init__(self) -> None:
        self.positions: array[int] = array("q")
        self.sizes: array[int] = array("q")
        self.stamps: array[int] = array("q")
        self.extra: array[int] = array("q")
        self.head = 0
        self.dead: set[int] = set()
        self.delivered: set[int] = set()

    def __len__(self) -> int:
        return len(self.positions) - self.head - len(self.dead)

    def add(self, position: int, size: int, stamp: int = 0, extra: int = 0) -> None:
        positions = self.positions
        if not positions or position > positions[-1]:
            positions.append(position)
            self.sizes.append(size)
            self.stamps.append(stamp)
            self.extra.append(extra)
            return
        # Out of order: only a full replay meeting a compaction copy of an old message
        # whose original segment is gone. Rare; keep the arrays sorted anyway.
        self._trim()
        i = bisect_left(positions, position)
        if i < len(positions) and positions[i] == position:
            if position in self.dead:
                self.dead.discard(position)
            return
        insort(positions, position)
        self.sizes.insert(i, size)
        self.stamps.insert(i, stamp)
        self.extra.insert(i, extra)

    def _find(self, position: int) -> int:
        """Array index of a live ``position``, or -1."""
        positions = self.positions
        i = bisect_left(positions, position, self.head)
        if i < len(positions) and positions[i] == position and position not in self.dead:
            return i
        return -1

    def __contains__(self, position: int) -> bool:
        return self._find(position) >= 0

    def size_of(self, position: int) -> int:
        i = self._find(position)
        return self.sizes[i] if i >= 0 else -1

    def meta_of(self, position: int) -> tuple[int, int]:
        """(stamp, extra) of a live message, (0, 0) if it is not live here."""
        i = self._find(position)
        return (self.stamps[i], self.extra[i]) if i >= 0 else (0, 0)

    def remove(self, position: int) -> bool:
        """Settle one message; False if it was not live here (double ack, replay)."""
        positions = self.positions
        head = self.head
        if head < len(positions) and positions[head] == position:
            # The common case: acks arrive roughly in queue order.
            head += 1
            dead = self.dead
            if dead:
                n = len(positions)
                while head < n and positions[head] in dead:
                    dead.discard(positions[head])
                    head += 1
            self.head = head
            self.delivered.discard(position)
            if head > 4096 and head * 2 > len(positions):
                self._trim()
            return True
        if self._find(position) < 0:
            return False
        self.dead.add(position)
        self.delivered.discard(position)
        if len(self.dead) > 4096 and len(self.dead) * 2 > len(positions) - self.head:
            self.compact()
        return True

    def _trim(self) -> None:
        if self.head:
            del self.positions[: self.head]
            del self.sizes[: self.head]
            del self.stamps[: self.head]
            del self.extra[: self.head]
            self.head = 0

    def compact(self) -> None:
        """Rewrite the arrays without settled entries (bounded memory, faster bisects)."""
        if not self.dead:
            self._trim()
            return
        # Cut the dead entries out with slices (memcpy) between their indexes: the cost
        # is O(dead * log n) Python steps, not O(n), so a checkpoint of a big queue with
        # a few out-of-order acks stays a copy.
        positions, head = self.positions, self.head
        cuts = sorted(bisect_left(positions, p, head) for p in self.dead)
        columns = (positions, self.sizes, self.stamps, self.extra)
        kept: tuple[array[int], ...] = tuple(array("q") for _ in columns)
        prev = head
        for i in cuts:
            for keep, col in zip(kept, columns, strict=True):
                keep += col[prev:i]
            prev = i + 1
        for keep, col in zip(kept, columns, strict=True):
            keep += col[prev:]
        self.positions, self.sizes, self.stamps, self.extra = kept
        self.head = 0
        self.dead.clear()

    def live(self) -> tuple[array[int], array[int]]:
        """Copies of the live (positions, sizes), in queue order."""
        self.compact()
        return array("q", self.positions), array("q", self.sizes)

    def live_meta(self) -> tuple[array[int], array[int]]:
        """Copies of the live (stamps, extra), parallel to :meth:`live`."""
        self.compact()
        return array("q", self.stamps), array("q", self.extra)

    def transient(self) -> list[int]:
        """Live positions whose record is flagged TRANSIENT (dropped at recovery)."""
        stamps, positions, dead = self.stamps, self.positions, self.dead
        return [positions[i] for i in range(self.head, len(positions))
                if stamps[i] & 1 and positions[i] not in dead]

    def live_positions(self) -> Iterable[int]:
        dead = self.dead
        for i in range(self.head, len(self.positions)):
            p = self.positions[i]
            if p not in dead:
                yield p

    def range(self, lo: int, hi: int) -> Iterable[int]:
        """Live stable positions p with lo <= p < hi."""
        positions = self.positions
        i = bisect_left(positions, lo, self.head)
        j = bisect_left(positions, hi, i)
        dead = self.dead
        for k in range(i, j):
            p = positions[k]
            if p not in dead:
                yield p


class LiveIndex:
    """All queues plus the per-segment accounting that drives GC and compaction."""

    def __init__(self) -> None:
        self.queues: dict[str, QueueIndex] = {}
        self.bases: list[int] = []  # sorted segment bases
        self.seg_live: dict[int, int] = {}
        self.seg_total: dict[int, int] = {}
        self.reloc: dict[int, int] = {}
        self.reloc_refs: dict[int, int] = {}
        self.carry: dict[int, dict[str, tuple[array[int], array[int]]]] = {}
        self.live_pairs = 0

    # -- segments -----------------------------------------------------------------

    def add_segment(self, base: int) -> None:
        if base in self.seg_live:
            return
        if self.bases and base < self.bases[-1]:
            insort(self.bases, base)
        else:
            self.bases.append(base)
        self.seg_live[base] = 0
        self.seg_total[base] = 0

    def remove_segment(self, base: int) -> None:
        self.carry.pop(base, None)
        i = bisect_left(self.bases, base)
        if i < len(self.bases) and self.bases[i] == base:
            del self.bases[i]
        self.seg_live.pop(base, None)
        self.seg_total.pop(base, None)

    def segment_of(self, position: int) -> int:
        """Base of the segment holding ``position`` (a physical position)."""
        i = bisect_right(self.bases, position) - 1
        if i < 0:
            raise KeyError(position)
        return self.bases[i]

    def current(self, stable: int) -> int:
        """Where the message with this stable position physically is now."""
        return self.reloc.get(stable, stable)

    # -- applying records ---------------------------------------------------------

    def enqueue(self, queues: Sequence[str], position: int, size: int, base: int,
                stamp: int = 0, extra: int = 0) -> None:
        """A fresh ENQUEUE at ``position`` inside segment ``base``."""
        qs = self.queues
        for name in queues:
            q = qs.get(name)
            if q is None:
                q = qs[name] = QueueIndex()
            q.add(position, size, stamp, extra)
        n = len(queues)
        self.seg_live[base] += n
        self.seg_total[base] += n
        self.live_pairs += n

    def relocate(
        self, stable: int, queues: Sequence[str], position: int, size: int, base: int,
        stamp: int = 0, extra: int = 0,
    ) -> None:
        """A compaction copy of message ``stable`` for ``queues`` now lives at
        ``position`` in segment ``base``.

        Compaction copies every live pair of a message at once (they share one physical
        place), so afterwards the message has exactly ``moved`` live pairs. If no queue
        holds the message, the original was in a segment that is gone (a full replay
        after losing the checkpoint): the copy is then the only one and acts as the
        enqueue.
        """
        held = [name for name in queues if name in self.queues and stable in self.queues[name]]
        moved = len(held)
        if moved:
            try:
                old_base = self.segment_of(self.current(stable))
            except KeyError:
                old_base = -1
            if old_base in self.seg_live:
                self.seg_live[old_base] -= moved
        else:
            moved = len(queues)
            for name in queues:
                q = self.queues.get(name)
                if q is None:
                    q = self.queues[name] = QueueIndex()
                q.add(stable, size, stamp, extra)
            self.live_pairs += moved
        self.seg_live[base] += moved
        self.seg_total[base] += moved
        if moved and stable != position:
            self.reloc[stable] = position
            self.reloc_refs[stable] = moved
        else:
            self.reloc.pop(stable, None)
            self.reloc_refs.pop(stable, None)

    def settle(self, queue: str, positions: Iterable[int]) -> list[int]:
        """Settle; return bases of segments whose live count reached zero."""
        q = self.queues.get(queue)
        if q is None:
            return []
        emptied = []
        seg_live = self.seg_live
        reloc = self.reloc
        for stable in positions:
            if not q.remove(stable):
                continue
            self.live_pairs -= 1
            cur = stable
            if reloc and stable in reloc:
                cur = reloc[stable]
                left = self.reloc_refs[stable] - 1
                if left:
                    self.reloc_refs[stable] = left
                else:
                    del reloc[stable]
                    del self.reloc_refs[stable]
            try:
                base = self.segment_of(cur)
            except KeyError:
                continue
            live = seg_live.get(base)
            if live is None:
                continue
            seg_live[base] = live - 1
            if live == 1:
                emptied.append(base)
        if not len(q):
            q.compact()
        return emptied

    def note_carry(self, base: int, queue: str, positions: Sequence[int]) -> None:
        """Settles of ``queue`` written in segment ``base``: remember those of messages
        in older segments (call before :meth:`settle`, which forgets relocations)."""
        if not positions or min(positions) >= base:
            return
        q = self.queues.get(queue)
        if q is None:
            return
        per_queue = self.carry.setdefault(base, {})
        entry = per_queue.get(queue)
        if entry is None:
            entry = per_queue[queue] = (array("q"), array("q"))
        stables, currents = entry
        reloc = self.reloc
        for p in positions:
            if p < base and p in q:
                stables.append(p)
                currents.append(reloc.get(p, p))

    def carried_for(self, base: int, survivors: set[int]
                    ) -> dict[str, tuple[array[int], array[int]]]:
        """Forget the settles remembered for segment ``base`` (being deleted); return
        those still needed: the message's ENQUEUE (or a copy) may lie in a surviving
        segment older than ``base``."""
        carried = self.carry.pop(base, None)
        if not carried or not any(b < base for b in survivors):
            return {}
        out: dict[str, tuple[array[int], array[int]]] = {}
        for queue, (stables, currents) in carried.items():
            keep_s: array[int] = array("q")
            keep_c: array[int] = array("q")
            for s, c in zip(stables, currents, strict=True):
                if s != c or self._holder(s) in survivors or self._holder(c) in survivors:
                    keep_s.append(s)
                    keep_c.append(c)
            if keep_s:
                out[queue] = (keep_s, keep_c)
        return out

    def _holder(self, position: int) -> int:
        try:
            return self.segment_of(position)
        except KeyError:
            return -1

    def delivered(self, queue: str, position: int) -> None:
        q = self.queues.get(queue)
        if q is not None and position in q:
            q.delivered.add(position)

    def drop(self, queue: str) -> list[int]:
        q = self.queues.get(queue)
        if q is None:
            return []
        emptied = self.settle(queue, list(q.live_positions()))
        del self.queues[queue]
        return emptied

    # -- compaction ---------------------------------------------------------------

    def live_in_segment(self, base: int, end: int) -> dict[int, list[str]]:
        """Live messages physically inside [base, end): stable position -> queues."""
        found: dict[int, list[str]] = {}
        reloc = self.reloc
        for name, q in self.queues.items():
            for stable in q.range(base, end):
                cur = reloc.get(stable, stable)
                if base <= cur < end:
                    found.setdefault(stable, []).append(name)
        for stable, cur in reloc.items():
            if base <= cur < end and not (base <= stable < end):
                for name, q in self.queues.items():
                    if stable in q:
                        found.setdefault(stable, []).append(name)
        return found
