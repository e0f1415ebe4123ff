"""Following an etcd prefix for a node's life: :func:`follow_prefix` reads all of it,
then watches it from the revision read, and when the watch ends (etcd out of reach, a
compacted revision, a malformed answer) logs it, pauses and starts over with a full
read, so nothing that changed while not watching is missed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from amqpd.coord.etcd import EtcdClient, EtcdError, WatchEvent

RETRY = 0.5  # seconds between an ended watch and the next full read


async def follow_prefix(etcd: EtcdClient, prefix: str, read_all: Callable[[], Awaitable[int]],
                        event: Callable[[WatchEvent], None], log: logging.Logger,
                        what: str, progress: Callable[[int], None] | None = None) -> None:
    """Run until cancelled: ``read_all`` reads and applies everything under ``prefix``
    and returns the revision it read at; ``event`` applies each change after it.
    ``what`` names the watch in the log line of its end; ``progress``, if given, is
    told the revision applied so far after each read and each batch of changes."""
    revision = 0
    while True:
        try:
            revision = max(revision, await read_all())
            if progress is not None:
                progress(revision)
            async for events in etcd.watch_prefix(prefix, revision + 1):
                for ev in events:
                    revision = max(revision, ev.kv.mod_revision)
                    event(ev)
                if progress is not None:
                    progress(revision)
        except asyncio.CancelledError:
            raise
        except (EtcdError, ValueError) as exc:
            log.info("cluster: %s watch ended (%s); reading again", what, exc)
        await asyncio.sleep(RETRY)


__all__ = ["follow_prefix"]
