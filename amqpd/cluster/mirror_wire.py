"""Frames of the mirrored-queue stream kind on the inter-node link (issue 16).

They ride the same link as the queue streams (:mod:`amqpd.cluster.link_wire`: the same
head, the same field codes) under their own frame types, 80 and up, which this module
adds to ``link_wire.LAYOUTS`` when imported. The *stream* number of these frames is a
replication stream the leader opened with :data:`MSTART` (one per mirrored queue and
mirror), not a queue stream.

Leader -> mirror: MSTART opens the copy; the mirror answers MHAVE with the leader
positions it still holds of an earlier copy from the same leader (it keeps those and
drops anything else it held for the queue); the leader settles those it no longer
holds and sends only what the mirror lacks: MBACKLOG carries the messages the queue
held when the copy started and the mirror lacks (in the background: at once with
``ha-sync-mode: automatic``, on ``sync_queue`` with ``manual``), MBACKLOG_END says
nothing the mirror lacks is left (copied, or settled meanwhile); MENQ / MSETTLE / MDELIV are the
live records (enqueue with body and properties, messages settled -- acked, rejected,
purged, expired --, messages handed to a consumer: redelivered if they come back),
each with the replication sequence number the mirror acknowledges; MDROP ends the copy.
Mirror -> leader: MACK (every record up to a sequence number is durable here), MSYNCED
(the backlog is durable here: the mirror may join the synchronised set), MREFUSE (it
cannot hold a copy yet, e.g. it still holds the queue as its old leader: the leader
drops the stream and starts it again later). The backlog is paced: after each batch the
leader sends MBATCH and sends the batch after next only once the mirror answered
MBATCHED for it (durable there), so a mirror is never flooded faster than it writes.
A copy of the leader that was lost (or of this node's own queue from before its
restart) is kept when another node takes the queue over: the mirror answers the new
leader's MSTART with MHAVE_FROM, naming the old leader and its positions it holds;
the new leader, which knows where each of the old leader's messages went when it was
promoted, answers MREKEY (old positions -> its own), and the mirror keeps those under
the new positions and drops the rest. So a second failover finds full copies.
MSYNCREQ asks the leader, from the node an operator asked, to start or cancel the
copy of what its mirrors lack (``amqpctl sync_queue`` / ``cancel_sync_queue``).

The link module imports this one, so every link knows these layouts from its first
frame on: a peer that leads mirrored queues sends MSTART as soon as the link is up,
which on a node still starting can come before the mirrors' own module is loaded
(it was a "malformed frame: unknown frame type 80" that closed the link).
"""

from __future__ import annotations

from typing import Final

from amqpd.cluster import link_wire as W

MSTART: Final = 80  # vhost, queue name, the replication sequence the live records follow
MBACKLOG: Final = 81  # position, delivered, then the fields of MENQ after its position
MBACKLOG_END: Final = 82  # how many backlog messages were sent
MENQ: Final = 83  # seq, position, exchange, key, props, body, published, expires, priority
MSETTLE: Final = 84  # seq, positions
MDELIV: Final = 85  # seq, positions
MDROP: Final = 86  # the copy ends (queue deleted, or this node no longer mirrors it)
MACK: Final = 87  # mirror -> leader: seq (every record <= seq is durable on the mirror)
MSYNCED: Final = 88  # mirror -> leader: the backlog is durable here
MREFUSE: Final = 89  # mirror -> leader: why it cannot hold the copy now (try again later)
MBATCH: Final = 90  # leader -> mirror: backlog batch number n ends here
MBATCHED: Final = 91  # mirror -> leader: backlog batch n is durable here (flow control)
MHAVE: Final = 92  # mirror -> leader, answering MSTART: the leader positions it holds
MSYNCREQ: Final = 93  # any node -> the leader (stream 0): vhost, queue, "sync"|"cancel_sync"
# mirror -> a new leader, answering MSTART: the positions of this leader it holds, the
# leader before it (the one it was promoted after) and that leader's positions it holds
MHAVE_FROM: Final = 94
# leader -> mirror, answering MHAVE_FROM: the old leader's positions and the leader's
# positions now of the same messages (the rest of the old copy goes)
MREKEY: Final = 95
# quorum queues' groups (amqpd.cluster.quorum_group) on the same streams:
QTERM: Final = 100  # leader -> member: the term of the replication stream about to start
# leader -> member: seq, node, positions: checked out to a consumer on that node (the
# leader's own name for its local consumers); also delivered (MDELIV's mark)
MHELD: Final = 101

LAYOUTS: Final[dict[int, str]] = {
    MSTART: "ssQ", MBACKLOG: "QBssbbQQB", MBACKLOG_END: "Q",
    MENQ: "QQssbbQQB", MSETTLE: "QL", MDELIV: "QL", MDROP: "",
    MACK: "Q", MSYNCED: "", MREFUSE: "s", MBATCH: "Q", MBATCHED: "Q",
    MHAVE: "L", MSYNCREQ: "sss", MHAVE_FROM: "LsL", MREKEY: "LL",
    QTERM: "Q", MHELD: "QsL",
}
FIRST: Final = MSTART
LAST: Final = MREKEY
TO_MIRROR: Final = frozenset({MSTART, MBACKLOG, MBACKLOG_END, MENQ, MSETTLE, MDELIV, MDROP,
                              MBATCH, MREKEY})
TO_LEADER: Final = frozenset({MACK, MSYNCED, MREFUSE, MBATCHED, MHAVE, MHAVE_FROM})

W.LAYOUTS.update(LAYOUTS)


def is_mirror_frame(kind: int) -> bool:
    return FIRST <= kind <= LAST


__all__ = [
    "LAYOUTS",
    "MACK",
    "MBACKLOG",
    "MBACKLOG_END",
    "MBATCH",
    "MBATCHED",
    "MDELIV",
    "MDROP",
    "MENQ",
    "MHAVE",
    "MHAVE_FROM",
    "MHELD",
    "MREFUSE",
    "MREKEY",
    "MSETTLE",
    "MSTART",
    "MSYNCED",
    "MSYNCREQ",
    "QTERM",
    "TO_LEADER",
    "TO_MIRROR",
    "is_mirror_frame",
]
