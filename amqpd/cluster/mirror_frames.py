"""The mirrored queues' link protocol (issue 16): part of
:class:`amqpd.cluster.mirror.Mirrors`.

:meth:`MirrorFrames.frame` takes the replication frames of
:mod:`amqpd.cluster.mirror_wire` off the inter-node links (``ClusterQueues.extensions``):
the mirrors' answers to a queue this node leads go to its
:class:`~amqpd.cluster.mirror_leading.Leading`, a leader's records to this node's
:class:`~amqpd.cluster.mirror_copy.MirrorCopy` (``MSTART`` starts one:
:meth:`MirrorFrames._start_copy`). A copy acknowledges (``MACK``, ``MBATCHED``,
``MSYNCED``) once per event-loop tick, after this node's store made what it received
durable (:meth:`MirrorFrames._send_acks`). Theory of operation: :mod:`amqpd.cluster.mirror`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import queue_key
from amqpd.cluster import link_wire as W
from amqpd.cluster import mirror_wire as M
from amqpd.cluster.mirror_copy import MirrorCopy
from amqpd.cluster.mirror_host import MirrorsHost

if TYPE_CHECKING:
    from amqpd.cluster.link import Link

log = logging.getLogger("amqpd.cluster.mirror")

STREAM_SPLIT: Final = 1 << 31  # replication streams from here on: quorum queues'


class MirrorFrames(MirrorsHost):
    """:class:`~amqpd.cluster.mirror.Mirrors`' side of the links (a mixin: the state is
    the ``Mirrors`` instance's)."""

    def link_up(self, link: Link) -> None:
        pass  # the next reconciliation starts the mirrors the link's peer should hold

    def link_down(self, link: Link) -> None:
        for lead in list(self.leading.values()):
            s = lead.streams.get(link.peer)
            if s is not None and s.link is link:
                lead.detach(link.peer, drop=False)
                asyncio.get_running_loop().create_task(lead.write())
        # copies of the queues the peer leads are kept: they are what failover promotes

    def owns_stream(self, stream: int) -> bool:
        """Whether a replication stream number is this instance's: quorum queues
        (amqpd.cluster.quorum_group) reuse these frames with numbers from
        :data:`STREAM_SPLIT` on, so the two never take each other's streams."""
        return stream < STREAM_SPLIT

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> None:
        if not M.is_mirror_frame(kind) or not self.owns_stream(stream):
            return
        peer = link.peer
        if kind in M.TO_LEADER:
            lead = self.by_rid.get((peer, stream))
            if lead is None:
                return
            if kind == M.MACK:
                lead.got_ack(peer, f[0])
                self.gate.release()
            elif kind == M.MBATCHED:
                lead.got_batch(peer, stream, f[0])
            elif kind == M.MHAVE:
                lead.got_have(peer, stream, list(f[0]))
            elif kind == M.MHAVE_FROM:
                lead.got_have_from(peer, stream, list(f[0]), f[1], list(f[2]))
            elif kind == M.MREFUSE:
                log.info("queue '%s' in vhost '%s': %s cannot mirror it yet: %s",
                         lead.ident[1], lead.ident[0], peer, f[0])
                lead.detach(peer, drop=False)  # the next reconciliation tries again
            else:
                lead.got_synced(peer, stream)
                self.gate.release()
                asyncio.get_running_loop().create_task(lead.write())
            return
        if kind == M.MSTART:
            self._start_copy(link, stream, f[0], f[1], f[2])
            return
        if kind == M.MSYNCREQ:
            self.request_sync(f[0], f[1], f[2])
            return
        copy = self.copies.get((peer, stream))
        if copy is None:
            return
        if kind == M.MENQ:
            copy.seen(f[0])
            copy.enqueue(f[1], False, *f[2:])
        elif kind == M.MBACKLOG:
            copy.enqueue(*f)
        elif kind == M.MSETTLE:
            copy.seen(f[0])
            copy.settle(f[1])
        elif kind == M.MDELIV:
            copy.seen(f[0])
            copy.deliver(f[1])
        elif kind == M.MBATCH:
            copy.batch = f[0]
        elif kind == M.MBACKLOG_END:
            copy.backlog_end()
        elif kind == M.MREKEY:
            kept, dropped = copy.rekey(list(f[0]), list(f[1]))
            log.info("queue '%s' in vhost '%s': %d messages of the earlier copy kept for "
                     "%s, %d dropped", copy.ident[1], copy.ident[0], kept, peer, dropped)
        elif kind == M.MDROP:
            self._end_copy(copy)
            return
        self._schedule_ack(copy, link)

    def _start_copy(self, link: Link, rid: int, vhost: str, name: str, seq: int) -> None:
        ident = (vhost, name)
        self._adopt_retired()
        vh = self.broker.vhosts.get(vhost)
        local = vh.queues.get(name) if vh is not None else None
        if local is not None and not local.forwards_publish:
            # this node led it before it went down: the cluster's definitions will make
            # it a remote queue in a moment (ClusterQueues.materialise)
            link.send(W.encode(M.MREFUSE, rid, "it still holds the queue as its leader"))
            return
        listed = self.cluster.catalogue.get(ident)
        if listed is not None and listed != link.peer:
            # a leader deposed meanwhile (woken from a SIGSTOP), or the catalogue here
            # is behind: the sender tries again after its next reconciliation
            link.send(W.encode(M.MREFUSE, rid, f"the catalogue names {listed} its leader"))
            return
        old = self.copy_of.get(ident)
        if old is not None and old.leader == link.peer and ident not in self.promoting:
            # the same leader again (its link came back): keep what the copy holds
            self.copies.pop((old.leader, old.rid), None)
            old.restart(rid, seq)
            copy = old
        elif old is not None:
            # another leader (promoted after the copy's): the copy is kept aside until
            # it says where its messages are (MREKEY); a leader that was not promoted
            # after the copy's leader maps none of them, and they go. (An election of
            # this node still running ends undecided: the record names that leader.)
            self.copies.pop((old.leader, old.rid), None)
            old.follow(link.peer, rid, seq, self._new_map(ident, link.peer))
            copy = old
        else:
            if old is not None:
                self._end_copy(old)
            store = self.store.inner
            store.drop_queue(queue_key(vhost, name))  # what was here is another log's
            copy = MirrorCopy(store, link.peer, rid, vhost, name, seq,
                              self._new_map(ident, link.peer))
            if copy.map is not None:
                copy.map.rewrite(())
        self.copies[(link.peer, rid)] = copy
        self.copy_of[ident] = copy
        if copy.foreign:
            link.send(W.encode(M.MHAVE_FROM, rid, sorted(copy.entries), copy.origin,
                               sorted(copy.foreign)))
        else:
            link.send(W.encode(M.MHAVE, rid, sorted(copy.entries)))
        log.info("queue '%s' in vhost '%s': mirroring it for %s (%d messages held%s)",
                 name, vhost, link.peer, len(copy.entries),
                 f"; {len(copy.foreign)} of {copy.origin}'s" if copy.foreign else "")

    def _end_copy(self, copy: MirrorCopy) -> None:
        self.copies.pop((copy.leader, copy.rid), None)
        if self.copy_of.get(copy.ident) is copy:
            del self.copy_of[copy.ident]
            copy.drop()

    def _schedule_ack(self, copy: MirrorCopy, link: Link) -> None:
        due = self._ack_due
        if not due:
            asyncio.get_running_loop().call_soon(self._send_acks, link)
        due.add(copy)

    def _send_acks(self, _link: Link) -> None:
        due, self._ack_due = self._ack_due, set()
        # (copy, its stream, the seq acknowledged, synchronised by it, the backlog
        # batch, complete up to that seq: the mark may claim it once it is durable)
        marks = []
        for c in due:
            synced_now = c.backlog_done and not c.synced
            if synced_now:
                c.synced = True
            if c.map is not None:
                c.map.flush()
            marks.append((c, c.rid, c.last_seq, synced_now, c.batch, c.synced))

        def durable(error: BaseException | None) -> None:
            if error is not None:
                log.error("mirror copies not durable here: %s", error)
                return
            for c, rid, seq, synced_now, batch, complete in marks:
                link = self.queues.links.link(c.leader)
                if link is None or c.rid != rid or self.copies.get((c.leader, rid)) is not c:
                    continue
                if complete and c.term and c.map is not None:
                    # durable here up to seq, complete: the mark first, then the MACK
                    c.map.add_mark(c.term, seq)
                if c.map is not None and c.map.bloated(len(c.entries)):
                    c.map.rewrite(((lp, e[0]) for lp, e in c.entries.items()), c.map.mark)
                if batch > c.batch_told:
                    c.batch_told = batch
                    link.send(W.encode(M.MBATCHED, c.rid, batch))
                if synced_now:
                    link.send(W.encode(M.MSYNCED, c.rid))
                link.send(W.encode(M.MACK, c.rid, seq))

        self.store.inner.commit(durable)


__all__ = ["STREAM_SPLIT", "MirrorFrames"]
