"""This node's copies of streams led by other nodes: the member's side of a replicated
stream (:mod:`~amqpd.cluster.stream_group` has the theory of operation).

A leader's ``SSTART`` opens (or continues) the copy, unless this node saw a newer term,
leads the stream itself or is electing its leader; ``SREC`` frames are appended as
they come and acknowledged once per tick with ``SACK`` (the offset the copy holds
written), which is what the leader's majority counts; ``SDROP`` deletes the copy (the
member was removed). A copy that cannot be opened or appended to is refused
(``SREFUSE``) and the leader starts it again later. ``SCOMMIT`` moves the copy's
commit point, up to which this node's consumers read it
(:mod:`amqpd.cluster.stream_local`). ``STRACK`` brings the stream's tracking (producers'
publishing ids, stored offsets) into the copy (:meth:`StreamReplica.track`).

A member removed while its node or its link was down (the ``SDROP`` never came)
finds out from the stream's group record, which every node reads from etcd: its copy
-- left on disk, or still open -- is deleted then, with a log line
(:meth:`StreamCopies.clear_removed`).

A stream deleted while this node was down (the leader's ``SDROP`` went nowhere, and
no group record is left to read) is found once after the node starts, when the
definitions are in line with etcd and the group records were read: a copy on disk
whose stream has neither a record nor a definition any more is deleted, with a log
line (:meth:`StreamCopies.sweep_deleted`). A stream deleted and declared again under
the same name meanwhile has a record, but its first term is above every term of the
old one (terms start at an etcd revision), so a copy whose ``epoch.json`` names an
older term belongs to the old stream: the new leader's ``SSTART`` finds it and it is
deleted before the copy is opened, so nothing of the old stream (records, stored
offsets, producers' ids) is read into the new one (:meth:`StreamCopies._start_copy`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import StreamLogError, stream_directory
from amqpd.cluster import link_wire as W
from amqpd.cluster import stream_wire as S
from amqpd.cluster.stream_replica import StreamReplica, read_term

if TYPE_CHECKING:
    from amqpd.cluster.link import Link
    from amqpd.cluster.mirror_state import Ident
    from amqpd.cluster.stream_group import StreamGroups

log = logging.getLogger("amqpd.cluster.stream")

# seconds an open copy waits for its leader's SDROP once the group record says this
# node is no member any more, before deleting itself (the link may have been down)
DROP_GRACE: Final = 10.0


class StreamCopies:
    """The copies this node keeps for other nodes' streams (module docstring). The
    copies themselves live in ``groups.replicas``, which elections read as well."""

    def __init__(self, groups: StreamGroups) -> None:
        self.groups = groups
        self._acks: set[tuple[Link, int, StreamReplica]] = set()
        self._checked: dict[Ident, int] = {}  # stream -> record revision looked at
        # stream -> since when its open copy's record names this node no member
        self._unfed: dict[Ident, float] = {}
        self.swept = False  # the copies of streams deleted while down were looked for

    def sweep_deleted(self) -> None:
        """Delete the copies on disk of streams deleted while this node was down
        (module docstring); called once, after the definitions synced and the group
        records were read. A copy is left alone while anything here still knows its
        stream: a group record, a definition (a stream of that name declared since
        the records were read), an open copy, a stream this node leads or elects."""
        self.swept = True
        groups = self.groups
        root = Path(groups.broker.settings.data_dir) / "streams"
        try:
            directories = sorted(p for p in root.iterdir() if p.is_dir())
        except OSError:
            return  # no streams directory: nothing was ever copied here
        for directory in directories:
            ident = _named(directory)
            if ident is None or stream_directory(root.parent, *ident) != directory:
                continue
            vh = groups.broker.vhosts.get(ident[0])
            if ident in groups.records or (vh is not None and ident[1] in vh.queues) \
                    or ident in groups.replicas or ident in groups.leading \
                    or ident in groups.electing or ident in groups.establishing \
                    or ident in groups.queues.retired:
                continue
            log.warning("stream '%s' in vhost '%s' was deleted while this node was down; "
                        "its copy left on disk is deleted", ident[1], ident[0])
            try:
                shutil.rmtree(directory)
            except OSError as exc:
                log.error("stream '%s' in vhost '%s': deleting %s failed: %s", ident[1],
                          ident[0], directory, exc)

    def clear_removed(self, now: float | None = None) -> None:
        """Delete the copies of streams whose group record no longer names this node a
        member, looking at each record revision once: a copy left on disk (the node
        was down when it was removed), and an open one whose leader's ``SDROP`` did not
        come within :data:`DROP_GRACE` (the link was down then) when the record is
        newer than the one read when the copy was last started. A node added again
        meanwhile is left alone: its leader's ``SSTART`` came after the removal was
        read (the copy is open and its record revision is that one's), or it comes
        later and copies the log afresh."""
        groups = self.groups
        node = groups.node
        now = time.monotonic() if now is None else now
        for ident, rec in groups.records.items():
            revision = groups.revisions.get(ident, 0)
            if self._checked.get(ident) == revision:
                continue
            if node not in rec.get("members", ()) and rec.get("leader") != node \
                    and ident not in groups.electing and groups.local_stream(ident) is None:
                replica = groups.replicas.get(ident)
                members = rec.get("members")
                if replica is None:
                    self._delete_left(ident, members)
                elif replica.record_revision < revision:
                    since = self._unfed.setdefault(ident, now)
                    if now - since < DROP_GRACE:
                        continue  # its leader's SDROP may be on the way
                    log.warning("stream '%s' in vhost '%s': this node is no longer a "
                                "member (members %s) and its leader did not drop the "
                                "copy within %g s; it is deleted", ident[1], ident[0],
                                members, DROP_GRACE)
                    self.drop(replica, destroy=True)
            self._checked[ident] = revision
            self._unfed.pop(ident, None)
        for ident in [i for i in self._checked if i not in groups.records]:
            del self._checked[ident]

    def _delete_left(self, ident: Ident, members: Any) -> None:
        """A removed member's copy left on disk goes (a failed delete is logged and
        tried again with the record's next revision)."""
        directory = stream_directory(Path(self.groups.broker.settings.data_dir), *ident)
        if not directory.is_dir():
            return
        log.warning("stream '%s' in vhost '%s': this node is no longer a member (members "
                    "%s); its copy left on disk is deleted", ident[1], ident[0], members)
        try:
            shutil.rmtree(directory)
        except OSError as exc:
            log.error("stream '%s' in vhost '%s': deleting %s failed: %s", ident[1],
                      ident[0], directory, exc)

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
        elif kind == S.STRACK:
            replica = self._replica_on(link, stream)
            if replica is not None and not replica.frozen:
                replica.track(dict(f[0]))
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
        self._drop_earlier(ident, info)
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
            # the group record as read when this leader (re)started it: a later one
            # that names this node no member any more removes it (clear_removed)
            replica.record_revision = self.groups.revisions.get(ident, 0)
            offset = replica.start(term, info)
        except (OSError, StreamLogError, ValueError, TypeError) as exc:
            log.error("stream '%s' in vhost '%s': cannot open this node's copy: %s", name,
                      vhost, exc)
            link.send(W.encode(S.SREFUSE, rid, f"cannot open the copy: {exc}"))
            return
        log.info("stream '%s' in vhost '%s': copy of %s's log (term %d) continues from "
                 "offset %d", name, vhost, link.peer, term, offset)
        link.send(W.encode(S.SHAVE, rid, offset))

    def _drop_earlier(self, ident: Ident, info: dict[str, Any]) -> None:
        """A copy of an earlier stream of this name (deleted, then declared again while
        this node was away) is deleted before the new stream's copy is opened: its
        last term is older than the new stream's first (module docstring)."""
        epochs = info.get("epochs") or []
        if not epochs:
            return
        first_term = int(epochs[0][0])
        old = self.groups.replicas.get(ident)
        directory = stream_directory(Path(self.groups.broker.settings.data_dir), *ident)
        held = old.term if old is not None else read_term(directory)
        if not 0 < held < first_term:
            return
        log.warning("stream '%s' in vhost '%s': this node's copy (term %d) is of an earlier "
                    "stream of that name (the stream's first term is %d); it is deleted",
                    ident[1], ident[0], held, first_term)
        if old is not None:
            self.drop(old, destroy=True)
            return
        try:
            shutil.rmtree(directory)
        except OSError as exc:  # the copy's open then fails and is refused: logged
            log.error("stream '%s' in vhost '%s': deleting %s failed: %s", ident[1],
                      ident[0], directory, exc)

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


def _named(directory: Path) -> Ident | None:
    """The stream a stream directory's ``stream.json`` names (None: unreadable)."""
    try:
        data = json.loads((directory / "stream.json").read_text())
        return str(data["vhost"]), str(data["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
