"""Storing a stream-protocol publish frame in a stream this node leads: the one path
both a client's own publisher (:mod:`amqpd.streamproto.connection`) and a publisher
declared on another node of the cluster (:mod:`amqpd.streamproto.relay`) take, so a
forwarded publish is stored, deduplicated and confirmed exactly as a local one.

A frame's messages are appended to the stream's log at once; the publishing ids are
confirmed once the log is synced on the stream's commit rule (:meth:`StreamQueue.
sync_log`), one sync per stream per tick however many frames arrived (so the tick's
records stay one chunk, as osiris makes one of a writer's batch). A named publisher
(a producer *reference*) is deduplicated: an id at or below the highest confirmed one
(kept in the stream's ``tracking.json``, :mod:`amqpd.streamproto.tracking`) or the
highest one accepted and not yet confirmed is confirmed and dropped, not stored again;
its highest id is saved before the confirm goes. What is confirmed or refused goes to
a :class:`Sink` (the client's connection, or the link back to the publisher's node).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections.abc import Callable
from typing import Any, Final, Protocol

from amqpd.broker.stream import StreamQueue
from amqpd.streamproto import codec as c
from amqpd.streamproto.tracking import Tracking

log = logging.getLogger("amqpd.streamproto")

COMPRESSION_NONE: Final = 0  # sub-entry batch compression types (rstream's CompressionType)
COMPRESSION_GZIP: Final = 1

Entries = list[tuple[int, Any]]  # (publishing id, message bytes or a sub-entry batch)


class Named(Protocol):
    """What a publisher's stream is to the management API: a queue with a name (the
    stream here, or the stand-in of a stream led by another node)."""

    @property
    def name(self) -> str: ...

    @property
    def deleted(self) -> bool: ...


class Publisher:
    """A declared publisher: its stream, name (deduplication) and counters."""

    def __init__(self, id: int, reference: str | None, queue: Named) -> None:
        self.id = id
        self.reference = reference
        self.queue = queue
        # ids accepted but not yet confirmed, highest (dedup of re-sends in flight)
        self.highest = 0
        self.last_id = -1  # the highest publishing id received (the management API's)
        # publishing ids received (the management API's counters, as RabbitMQ 3.10.8
        # counts them: a sub-entry batch once, a re-sent duplicate and a refused id too)
        self.published = 0
        self.confirmed = 0  # publishing ids confirmed
        self.errored = 0  # publishing ids answered with publish-error


class Sink(Protocol):
    """Where a publisher's confirms and refusals go."""

    def confirm(self, pub: Publisher, ids: list[int]) -> None: ...

    def error(self, pub: Publisher, errors: list[tuple[int, int]]) -> None: ...


class _Unsynced:
    """The publishes of one tick to one stream through one writer, waiting for the
    sync that confirms them all (one confirm per publisher for the tick)."""

    def __init__(self, queue: StreamQueue) -> None:
        self.queue = queue
        # unnamed publishers: id(publisher) -> (publisher, sink, publishing ids accepted)
        self.ids: dict[int, tuple[Publisher, Sink, list[int]]] = {}
        self.callbacks: list[Callable[[BaseException | None], None]] = []  # named ones

    def synced(self, error: BaseException | None) -> None:
        for pub, sink, ids in self.ids.values():
            if error is None:
                pub.confirmed += len(ids)
                sink.confirm(pub, ids)
            else:
                pub.errored += len(ids)
                sink.error(pub, [(i, c.INTERNAL_ERROR) for i in ids])
        for callback in self.callbacks:
            callback(error)


class Writer:
    """Stores publish frames in streams led here (module docstring); one per client
    connection and one for the publishes other nodes forward."""

    def __init__(self, loop: Callable[[], asyncio.AbstractEventLoop], name: str) -> None:
        self._loop = loop
        self.name = name  # for log lines: the connection's name, or the relay's
        self._unsynced: dict[int, _Unsynced] = {}  # by id(queue): this tick's publishes
        self._sync_scheduled = False

    def publish(self, pub: Publisher, q: StreamQueue, entries: Entries,
                sink: Sink) -> None:
        """Store one publish frame's ``entries`` of ``pub`` in ``q``; each id is
        confirmed or refused through ``sink``, in the order the frames came."""
        tracking = q.stream_tracking() if pub.reference else None
        last = tracking.publishers.get(pub.reference or "", 0) if tracking else 0
        pub.published += len(entries)
        messages: list[bytes] = []
        accepted: list[int] = []
        counts: list[int] = []  # a named publisher's: messages after each accepted id
        dropped: list[int] = []
        errors: list[tuple[int, int]] = []
        plain = c.split_plain(entries) if tracking is None else None
        if plain is not None:
            # the common frame (no deduplication, no sub-entry batch): in one go
            accepted, messages, highest = plain
            pub.last_id = max(pub.last_id, highest)
            entries = []
        for publishing_id, entry in entries:
            pub.last_id = max(pub.last_id, publishing_id)
            if tracking is not None and publishing_id <= max(last, pub.highest):
                dropped.append(publishing_id)  # a re-send: confirmed, not stored again
                continue
            if isinstance(entry, bytes):
                messages.append(entry)
            else:
                batch = self._sub_batch(entry)
                if batch is None:
                    errors.append((publishing_id, c.PRECONDITION_FAILED))
                    continue
                messages.extend(batch)
            accepted.append(publishing_id)
            if tracking is not None:
                pub.highest = max(pub.highest, publishing_id)
                counts.append(len(messages))
        if errors:
            pub.errored += len(errors)
            sink.error(pub, errors)
        if not accepted and not dropped:
            return
        start = q.log.next_offset
        if messages:
            q.append_amqp10(messages)
        end = q.log.next_offset  # after this frame's records
        if tracking is not None and accepted:
            # before any confirm: replication ships each id with its records
            tracking.wrote(pub.reference or "", accepted, [start + n for n in counts])
        unsynced = self._unsynced_of(q)
        if tracking is None:  # nothing dropped: confirmed = accepted
            held = unsynced.ids.get(id(pub))
            if held is None:
                unsynced.ids[id(pub)] = (pub, sink, accepted)
            else:
                held[2].extend(accepted)
        else:
            unsynced.callbacks.append(self._named_confirm(pub, sink, tracking, accepted,
                                                          dropped, end))

    def _sub_batch(self, entry: tuple[int, int, int, bytes]) -> list[bytes] | None:
        """A sub-entry batch's messages; None (with a log line) if it cannot be read."""
        compression, n, size, data = entry
        if compression not in (COMPRESSION_NONE, COMPRESSION_GZIP):
            log.warning("stream connection %s: sub-entry batch compressed with type %d "
                        "refused (none and gzip only)", self.name, compression)
            return None
        try:
            if compression == COMPRESSION_GZIP:
                data = _gunzip(data, size)
            return c.split_sub_batch(data, n)
        except c.FrameError as exc:
            log.warning("stream connection %s: bad sub-entry batch: %s", self.name, exc)
            return None

    def _unsynced_of(self, q: StreamQueue) -> _Unsynced:
        """This tick's publishes to ``q``, synced once at the end of the tick."""
        batch = self._unsynced.get(id(q))
        if batch is None:
            batch = self._unsynced[id(q)] = _Unsynced(q)
            if not self._sync_scheduled:
                self._sync_scheduled = True
                # after the stream's own end-of-tick flush (scheduled by the append)
                self._loop().call_soon(self._sync_unsynced)
        return batch

    def _sync_unsynced(self) -> None:
        self._sync_scheduled = False
        batches, self._unsynced = self._unsynced, {}
        for batch in batches.values():
            batch.queue.sync_log(batch.synced)

    def _named_confirm(self, pub: Publisher, sink: Sink, tracking: Tracking,
                       accepted: list[int], dropped: list[int], end: int
                       ) -> Callable[[BaseException | None], None]:
        """What a named publisher's publish frame does once synced: its highest id is
        kept for deduplication (saved before the confirm goes), re-sends dropped as
        duplicates are confirmed too."""
        confirmed = accepted + dropped

        def synced(error: BaseException | None) -> None:
            if error is not None:
                pub.errored += len(accepted)
                sink.error(pub, [(i, c.INTERNAL_ERROR) for i in accepted])
                if dropped:
                    sink.confirm(pub, dropped)
                return
            pub.confirmed += len(confirmed)
            if not accepted:
                sink.confirm(pub, confirmed)
                return
            tracking.confirmed(pub.reference or "", max(accepted), end)
            tracking.save(self._loop(), lambda: sink.confirm(pub, confirmed))

        return synced


_ENTRY = struct.Struct(">QI")  # publishing id, size of a plain entry
_BATCH = struct.Struct(">QBHII")  # publishing id, kind, count, uncompressed, size


def pack_entries(entries: Entries) -> bytes:
    """A publish frame's entries in the protocol's own layout (count, then each entry
    as the client sent it), to forward them to the stream's leader
    (:func:`unpack_entries` reads them back with the protocol's decoder)."""
    parts = [struct.pack(">I", len(entries))]
    for publishing_id, entry in entries:
        if isinstance(entry, bytes):
            parts.append(_ENTRY.pack(publishing_id, len(entry)))
            parts.append(entry)
        else:
            compression, n, size, data = entry
            parts.append(_BATCH.pack(publishing_id, 0x80 | (compression & 0x7) << 4, n,
                                     size, len(data)))
            parts.append(bytes(data))
    return b"".join(parts)


_PUBLISH_HEAD: Final = struct.pack(">HHB", c.PUBLISH, 1, 0)


def unpack_entries(packed: bytes) -> Entries:
    """What :func:`pack_entries` packed (:class:`codec.FrameError` if it is not)."""
    entries: Entries = c.decode(_PUBLISH_HEAD + packed).fields[1]
    return entries


def _gunzip(data: bytes, size: int) -> bytes:
    """A gzip sub-entry batch, decompressed to at most its declared ``size`` (a batch
    that inflates beyond it is refused, not buffered)."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, size + 1)
    except zlib.error as exc:
        raise c.FrameError(f"gzip batch does not inflate: {exc}") from None
    if len(out) != size or not inflater.eof:
        raise c.FrameError(f"gzip batch inflates to other than its {size} bytes")
    return out


__all__ = ["COMPRESSION_GZIP", "COMPRESSION_NONE", "Entries", "Named", "Publisher", "Sink",
           "Writer", "pack_entries", "unpack_entries"]
