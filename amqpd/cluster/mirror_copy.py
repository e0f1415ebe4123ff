"""A mirror's copy of a queue another node leads (issue 16): :class:`MirrorCopy`.

The leader's records (``MENQ``, ``MBACKLOG``, ``MSETTLE``, ``MDELIV``, a quorum group's
``MHELD``) are written to this node's store under the queue's store key, in a copy that
serves no client until a failover promotes it; :mod:`amqpd.cluster.mirror_map` keeps
the copy's leader positions on disk. Across a new stream from the same leader the copy
keeps what it holds (:meth:`MirrorCopy.restart`); after a promotion elsewhere it keeps
the old leader's messages aside until the new leader places them
(:meth:`MirrorCopy.follow`, :meth:`MirrorCopy.rekey`). The frames reach it through
:mod:`amqpd.cluster.mirror_frames`. Theory of operation: :mod:`amqpd.cluster.mirror`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import StoredMessage, queue_key
from amqpd.cluster.mirror_map import CopyMap
from amqpd.cluster.mirror_state import Ident

if TYPE_CHECKING:
    from amqpd.broker.api import MessageStore


class MirrorCopy:
    """This node's copy of a queue another node leads: the leader's records written to
    this node's store under the queue's key; serves no client until promoted."""

    def __init__(self, store: MessageStore, leader: str, rid: int, vhost: str, name: str,
                 start_seq: int, cmap: CopyMap | None = None) -> None:
        self.store = store
        self.map = cmap  # leader position -> local position on disk (mirror_map)
        self.leader = leader
        self.rid = rid
        self.ident: Ident = (vhost, name)
        self.key = queue_key(vhost, name)
        # leader position -> [local position, size, delivered]
        self.entries: dict[int, list[Any]] = {}
        self.settled_early: set[int] = set()  # settled before their backlog copy came
        self.delivered_early: set[int] = set()
        # a quorum group's checkouts: leader position -> the node whose consumer holds
        # it (amqpd.cluster.quorum_group's MHELD); ..._early: before the backlog copy
        self.holders: dict[int, str] = {}
        self.held_early: dict[int, str] = {}
        self.last_seq = start_seq
        self.backlog_done = False
        self.synced = False  # the backlog is durable here
        # a quorum group's stream: the leader's term (its QTERM; 0: none, mirrored
        # queues), which names the leader's sequence space (quorum_group)
        self.term = 0
        # while a new stream from the same leader rebuilds the copy: the sequence number
        # up to which it held the leader's log of term ``held_term`` completely before
        # (-1: none), which it still holds (restart keeps what it has); a quorum member
        # offers it in an election, so a member that acknowledged a record and then
        # lost its link is not passed over for one that never had the record
        # (quorum_failover.election_offer). Across a restart of this node it comes from
        # the map's durable mark (mirror_map; Mirrors._adopt)
        self.held_term = 0
        self.held_seq = -1
        self.batch = 0  # the last backlog batch received (MBATCH)
        self.batch_told = 0  # ... and reported durable (MBATCHED)
        self.declined = 0.0  # when it last declined to take over (monotonic)
        self.created = time.monotonic()
        self.election_started = 0.0  # when this copy's current failover began
        self.listed = False  # the catalogue named its leader since it started
        # a copy of ``origin``'s log kept for this leader (origin lost, this leader
        # promoted after it; or this node's own queue before its restart): origin's
        # position -> entry, until the leader says where they are now (MREKEY)
        self.origin = ""
        self.foreign: dict[int, list[Any]] = {}
        self.successor = ""  # the catalogue's new leader whose MSTART it waits for
        self.successor_since = 0.0

    def restart(self, rid: int, start_seq: int) -> None:
        """A new stream from the same leader: what this copy holds is kept (the
        leader drops what was settled meanwhile and sends only what it lacks)."""
        self.rid = rid
        if self.synced:
            self.held_term, self.held_seq = self.term, self.last_seq
        self.last_seq = start_seq
        self.settled_early.clear()
        self.delivered_early.clear()
        self.holders.clear()  # the leader says again who holds what (after MHAVE)
        self.held_early.clear()
        self.backlog_done = False
        self.synced = False
        self.batch = 0
        self.batch_told = 0
        self.declined = 0.0
        if self.map is not None:  # the durable mark still holds: the copy kept it all
            self.map.rewrite(((lp, e[0]) for lp, e in self.entries.items()), self.map.mark)

    def follow(self, leader: str, rid: int, start_seq: int, cmap: CopyMap | None) -> None:
        """Another node leads the queue now (promoted after this copy's leader): what
        this copy holds is kept aside as the old leader's (:meth:`rekey` places it)."""
        if self.entries:
            if self.foreign:  # an older log's, never placed: nobody maps it any more
                self.store.append_settle(self.key, [e[0] for e in self.foreign.values()])
            self.origin = self.leader
            self.foreign = self.entries
        self.entries = {}
        self.leader = leader
        self.successor = ""
        self.forget_map()
        self.map = cmap
        # the old leader's numbers mean nothing to the new one
        self.synced, self.held_term, self.held_seq = False, 0, -1
        self.restart(rid, start_seq)

    def rekey(self, old: list[int], new: list[int]) -> tuple[int, int]:
        """The leader's answer to MHAVE_FROM: the old leader's positions ``old`` are its
        own ``new`` now; the copy keeps those under the new positions (with what the
        live records said of them meanwhile) and drops the rest. (kept, dropped)"""
        foreign, self.foreign = self.foreign, {}
        kept = 0
        for o, n in zip(old, new, strict=True):
            entry = foreign.pop(o, None)
            if entry is None:
                continue
            if n in self.settled_early or n in self.entries:
                self.settled_early.discard(n)
                self.store.append_settle(self.key, [entry[0]])
                continue
            self.entries[n] = entry
            kept += 1
            if self.map is not None:
                self.map.add(n, entry[0])
            if n in self.delivered_early:
                self.deliver([n])
                self.delivered_early.discard(n)
            holder = self.held_early.pop(n, None)
            if holder is not None:
                self.holders[n] = holder
        if foreign:
            self.store.append_settle(self.key, [e[0] for e in foreign.values()])
        self.origin = ""
        return kept, len(foreign)

    def seen(self, seq: int) -> None:
        if seq > self.last_seq:
            self.last_seq = seq

    def enqueue(self, pos: int, delivered: bool, exchange: str, key: str, props: bytes,
                body: bytes, published: int, expires: int, priority: int) -> None:
        if pos in self.settled_early:
            self.settled_early.discard(pos)
            return
        if pos in self.entries:
            return
        local = self.store.append_enqueue([self.key], StoredMessage(
            exchange, key, props, body, published, expires, priority))
        if self.map is not None:
            self.map.add(pos, local)
        if delivered or pos in self.delivered_early:
            self.delivered_early.discard(pos)
            delivered = True
            self.store.append_delivered(self.key, local)
        self.entries[pos] = [local, len(body), delivered]
        holder = self.held_early.pop(pos, None)
        if holder is not None:
            self.holders[pos] = holder

    def settle(self, positions: list[int]) -> None:
        done = []
        for p in positions:
            entry = self.entries.pop(p, None)
            self.holders.pop(p, None)
            if entry is not None:
                done.append(entry[0])
            elif not self.backlog_done:
                self.settled_early.add(p)
        if done:
            self.store.append_settle(self.key, done)

    def deliver(self, positions: list[int]) -> None:
        for p in positions:
            entry = self.entries.get(p)
            if entry is not None:
                if not entry[2]:
                    entry[2] = True
                    self.store.append_delivered(self.key, entry[0])
            elif not self.backlog_done:
                self.delivered_early.add(p)

    def hold(self, node: str, positions: list[int]) -> None:
        """A quorum group's checkout: these messages are delivered, held by a consumer
        on ``node`` (the leader's own name for its local consumers)."""
        self.deliver(positions)
        for p in positions:
            if p in self.entries:
                self.holders[p] = node
            elif not self.backlog_done:
                self.held_early[p] = node

    def backlog_end(self) -> None:
        self.backlog_done = True
        self.settled_early.clear()
        self.delivered_early.clear()
        self.held_early.clear()

    def drop(self) -> None:
        self.entries.clear()
        self.foreign.clear()
        self.store.drop_queue(self.key)
        self.forget_map()

    def forget_map(self) -> None:
        """The copy is no longer a copy (dropped, or promoted: its messages are the
        queue's own now): its map goes."""
        if self.map is not None:
            self.map.remove()
            self.map = None

    def in_order(self) -> list[list[Any]]:
        """The messages in the leader's order (its log positions grow with enqueues)."""
        return [self.entries[p] for p in sorted(self.entries)]


__all__ = ["MirrorCopy"]
