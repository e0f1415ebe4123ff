"""This node's copies of streams led by other nodes: the member's side of a replicated
stream (:mod:`~amqpd.cluster.stream_group` has the theory of operation).

A leader's ``SSTART`` opens (or continues) the copy, unless this node saw a newer term,
leads the stream itself or is electing its leader; ``SREC`` frames are appended as
they come and acknowledged once per tick with ``SACK`` (the offset the copy holds
written), which is what the leader's majority counts; ``SDROP`` deletes the copy (the
member was removed). A copy that cannot be opened or appended to is refused
(``SREFUSE``) and the leader starts it again later. ``SCOMMIT`` moves the copy's
commit point, up to which this node's consumers read it
(:mod:`amqpd.cluster.stream_local`).

A member removed while its node was down (the ``SDROP`` never came) finds out from
the stream's group record once it is back: a copy left on disk for a stream whose
record no longer names this node is deleted then, with a log line
(:meth:`StreamCopies.clear_removed`). A copy still open (the node ran, its link to the
leader was down) is left alone: not done yet (docs/streams.md).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import StreamLogError, stream_directory
from amqpd.cluster import link_wire as W
from amqpd.cluster import stream_wire as S
from amqpd.cluster.stream_replica import StreamReplica

if TYPE_CHECKING:
    from amqpd.cluster.link import Link
    from amqpd.cluster.mirror_state import Ident
    from amqpd.cluster.stream_group import StreamGroups

log = logging.getLogger("amqpd.cluster.stream")


class StreamCopies:
    """The copies this node keeps for other nodes' streams (module docstring). The
    copies themselves live in ``groups.replicas``, which elections read as well."""

    def __init__(self, groups: StreamGroups) -> None:
        self.groups = groups
        self._acks: set[tuple[Link, int, StreamReplica]] = set()
        self._checked: dict[Ident, int] = {}  # stream -> record revision looked at

    def clear_removed(self) -> None:
        """Delete the copies left on disk of streams whose group record no longer names
        this node a member. Only a copy no leader feeds now (none open here: an open
        one is dropped by its leader's ``SDROP``) and only once per record revision.
        A leader's ``SSTART`` for a node added again meanwhile either came first (the
        copy is open: left alone) or finds no files and copies the log afresh."""
        groups = self.groups
        node = groups.node
        data_dir = Path(groups.broker.settings.data_dir)
        for ident, rec in groups.records.items():
            revision = groups.revisions.get(ident, 0)
            if self._checked.get(ident) == revision:
                continue
            self._checked[ident] = revision
            if node in rec.get("members", ()) or rec.get("leader") == node \
                    or ident in groups.replicas or ident in groups.electing \
                    or groups.local_stream(ident) is not None:
                continue
            directory = stream_directory(data_dir, ident[0], ident[1])
            if not directory.is_dir():
                continue
            log.warning("stream '%s' in vhost '%s': this node is no longer a member "
                        "(members %s); its copy left on disk is deleted", ident[1],
                        ident[0], rec.get("members"))
            try:
                shutil.rmtree(directory)
            except OSError as exc:  # looked at again with the record's next revision
                log.error("stream '%s' in vhost '%s': deleting %s failed: %s", ident[1],
                          ident[0], directory, exc)
        for ident in [i for i in self._checked if i not in groups.records]:
            del self._checked[ident]

    def frame(self, link: Link, kind: int, stream: int, f: list[Any]) -> bool:
        """A member's frame from a leader handled here: True; False for the others
        (the leader's side: ``SHAVE``, ``SACK``, ``SREFUSE``)."""
        if kind == S.SSTART:
            self._start_copy(link, stream, f)
        elif kind == S.SREC:
            self._records(link, stream, f[0])
        elif kind == S.SCOMMIT:
            replica = self._replica_on(link, stream)
            if replica is not None:
                replica.commit(int(f[0]))
        elif kind == S.SDROP:
            replica = self._replica_on(link, stream)
            if replica is not None:
                log.info("stream '%s' in vhost '%s': %s drops this node's copy",
                         replica.ident[1], replica.ident[0], link.peer)
                self.drop(replica, destroy=True)
        else:
            return False
        return True

    def drop(self, replica: StreamReplica, destroy: bool) -> None:
        if self.groups.replicas.get(replica.ident) is replica:
            del self.groups.replicas[replica.ident]
        try:
            if destroy:
                replica.destroy()
            else:
                replica.close()
        except (OSError, StreamLogError) as exc:
            log.warning("stream '%s' in vhost '%s': closing this node's copy: %s",
                        replica.ident[1], replica.ident[0], exc)

    def _start_copy(self, link: Link, rid: int, f: list[Any]) -> None:
        vhost, name, term, info = f[0], f[1], int(f[2]), dict(f[3])
        ident = (vhost, name)
        known = self.groups.known_terms.get(ident, 0)
        why = None
        if term < known:
            why = f"term {term} is older than term {known}"
        elif self.groups.local_stream(ident) is not None:
            why = "this node holds the stream as its leader"
        elif ident in self.groups.electing:
            why = "an election is under way here"
        if why is not None:
            log.warning("stream '%s' in vhost '%s': %s replicates it: refused (%s)", name,
                        vhost, link.peer, why)
            link.send(W.encode(S.SREFUSE, rid, why))
            return
        self.groups.known_terms[ident] = term
        old = self.groups.replicas.get(ident)
        try:
            if old is not None and old.leader == link.peer:
                replica = old
                replica.rid = rid
            else:
                if old is not None:
                    self.drop(old, destroy=False)
                replica = StreamReplica(self.groups.broker.settings.data_dir, link.peer, rid,
                                        vhost, name, dict(info.get("arguments") or {}))
                self.groups.replicas[ident] = replica
            offset = replica.start(term, info)
        except (OSError, StreamLogError, ValueError, TypeError) as exc:
            log.error("stream '%s' in vhost '%s': cannot open this node's copy: %s", name,
                      vhost, exc)
            link.send(W.encode(S.SREFUSE, rid, f"cannot open the copy: {exc}"))
            return
        log.info("stream '%s' in vhost '%s': copy of %s's log (term %d) continues from "
                 "offset %d", name, vhost, link.peer, term, offset)
        link.send(W.encode(S.SHAVE, rid, offset))

    def _records(self, link: Link, rid: int, data: bytes) -> None:
        replica = self._replica_on(link, rid)
        if replica is None or replica.frozen:
            return
        try:
            replica.append(data)
        except (OSError, StreamLogError) as exc:
            log.error("stream '%s' in vhost '%s': records from %s not appended: %s; the "
                      "copy starts again", replica.ident[1], replica.ident[0], link.peer, exc)
            link.send(W.encode(S.SREFUSE, rid, f"append failed: {exc}"))
            self.drop(replica, destroy=False)
            return
        if not self._acks:
            asyncio.get_running_loop().call_soon(self._send_acks)
        self._acks.add((link, rid, replica))

    def _send_acks(self) -> None:
        """End of the tick: write what came, then say so (one SACK per copy)."""
        acks, self._acks = self._acks, set()
        for link, rid, replica in acks:
            if self.groups.replicas.get(replica.ident) is not replica or replica.frozen:
                continue
            try:
                offset = replica.flush()
            except OSError as exc:
                log.error("stream '%s': write failed: %s", replica.ident[1], exc)
                continue
            if not link.closed:
                link.send(W.encode(S.SACK, rid, offset))

    def _replica_on(self, link: Link, rid: int) -> StreamReplica | None:
        for replica in self.groups.replicas.values():
            if replica.leader == link.peer and replica.rid == rid:
                return replica
        return None
