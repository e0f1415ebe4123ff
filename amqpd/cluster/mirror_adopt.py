"""Mirror copies kept across a restart of this node (issue 16): part of
:class:`amqpd.cluster.mirror.Mirrors`.

A queue this node held locally that another node leads now (the cluster found it at
start: ``cluster_queues.ClusterQueues.retire``) is taken back as this node's mirror copy
when its map (:mod:`amqpd.cluster.mirror_map`) says it was one (:meth:`CopyAdoption._adopt`),
or kept aside as a copy of this node's own log when this node led it before its
restart (:meth:`CopyAdoption._adopt_own`); else it is deleted. Theory of operation:
:mod:`amqpd.cluster.mirror`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import queue_key
from amqpd.cluster.mirror_copy import MirrorCopy
from amqpd.cluster.mirror_host import MirrorsHost
from amqpd.cluster.mirror_map import CopyMap, map_path
from amqpd.cluster.mirror_state import Ident

if TYPE_CHECKING:
    from amqpd.broker.api import QueueType

log = logging.getLogger("amqpd.cluster.mirror")


class CopyAdoption(MirrorsHost):
    """:class:`~amqpd.cluster.mirror.Mirrors`' adoption of the queues this node held
    before its restart (a mixin: the state is the ``Mirrors`` instance's)."""

    def _new_map(self, ident: Ident, leader: str) -> CopyMap | None:
        if not self.store.on_disk:
            return None
        path = map_path(self.broker.settings.data_dir, queue_key(*ident))
        return CopyMap(path, ident[0], ident[1], leader)

    def _adopt_retired(self) -> None:
        """Queues this node held locally that another node leads (the cluster found
        them at start, cluster_queues.ClusterQueues.retire): those that were this node's
        mirror copies become copies again (the leader then sends only what they lack);
        the others are deleted. Only the queues :meth:`adopts`: quorum queues'
        copies are amqpd.cluster.quorum_group's (its own streams and copies), never
        this instance's."""
        retired = self.queues.retired
        for ident, q in list(retired.items()):
            # the cluster's type: the remote queue now in its place says it (a copy
            # recovered without a local definition was recreated as a classic queue)
            vh = self.broker.vhosts.get(ident[0])
            now = vh.queues.get(ident[1]) if vh is not None else None
            kind = now.listed_type() if now is not None and now.forwards_publish \
                else q.type_name
            if not self.adopts(kind):
                continue
            del retired[ident]
            if not self._adopt(ident, q):
                q.delete()

    def adopts(self, type_name: str) -> bool:
        """Whether a retired queue of the cluster's type ``type_name`` is this
        instance's to adopt or delete: every type but quorum queues
        (amqpd.cluster.quorum_group's instance takes those) and streams (their logs
        stay, as copies: amqpd.cluster.stream_group)."""
        return type_name not in ("quorum", "stream")

    def _adopt(self, ident: Ident, q: QueueType) -> bool:
        if not self.store.on_disk or ident in self.copy_of:
            return False
        loaded = CopyMap.load(map_path(self.broker.settings.data_dir, q.store_key))
        if loaded is None:
            return self._adopt_own(ident, q)
        cmap, to_leader = loaded
        leader = self.cluster.catalogue.get(ident)
        if leader is None or leader == self.node or cmap.leader != leader:
            cmap.remove()  # a copy of another leader's log: its positions mean nothing
            return False
        copy = MirrorCopy(self.store.inner, leader, 0, ident[0], ident[1], 0, cmap)
        orphans: list[int] = []
        for entry in q.ready_entries():
            local = entry.message.position
            lp = to_leader.get(local)
            if lp is None or lp in copy.entries:
                orphans.append(local)  # its map record was lost: fetched again
                continue
            copy.entries[lp] = [local, entry.message.size, bool(entry.redelivered)]
        q.in_store = False  # the messages stay in the store: they are the copy's now
        q.delete()
        if orphans:
            self.store.inner.append_settle(q.store_key, orphans)
        if cmap.mark is not None:  # it held the leader's log completely up to there
            copy.held_term, copy.held_seq = cmap.mark
        cmap.rewrite(((lp, e[0]) for lp, e in copy.entries.items()), cmap.mark)
        self.copy_of[ident] = copy
        log.info("queue '%s' in vhost '%s': the copy of %s's queue kept across this node's "
                 "restart (%d messages, %d without a map record dropped%s)", ident[1],
                 ident[0], leader, len(copy.entries), len(orphans),
                 f"; complete up to seq {cmap.mark[1]} of term {cmap.mark[0]}"
                 if cmap.mark is not None else "")
        return True

    def _adopt_own(self, ident: Ident, q: QueueType) -> bool:
        """This node led the queue before its restart and another node leads it now
        (promoted after this one was lost): its messages become a copy of this node's
        own log, kept aside until the new leader says which of them it holds and where
        (MHAVE_FROM, MREKEY) -- RabbitMQ throws them away."""
        leader = self.cluster.catalogue.get(ident)
        if leader is None or leader == self.node:
            return False
        foreign: dict[int, list[Any]] = {}
        for entry in q.ready_entries():
            pos = entry.message.position
            if pos >= 0:
                foreign[pos] = [pos, entry.message.size, bool(entry.redelivered)]
        if not foreign:
            return False
        cmap = self._new_map(ident, leader)
        if cmap is not None:
            cmap.rewrite(())
        copy = MirrorCopy(self.store.inner, leader, 0, ident[0], ident[1], 0, cmap)
        copy.origin = self.node
        copy.foreign = foreign
        q.in_store = False  # the messages stay in the store: they are the copy's now
        q.delete()
        self.copy_of[ident] = copy
        log.info("queue '%s' in vhost '%s': %d messages this node held as its leader kept "
                 "for %s, which leads it now", ident[1], ident[0], len(foreign), leader)
        return True


__all__ = ["CopyAdoption"]
