"""What the broker keeps per stream for stream clients: consumer offsets and publisher
sequences, durable in ``tracking.json`` in the stream's directory.

RabbitMQ keeps both in the stream itself (tracking chunks); here they live beside the
segments so a stream's log holds only messages (AMQP 0-9-1 consumers read it too).
``offsets`` maps a consumer reference to its stored offset (store-offset), and
``publishers`` a producer name to the highest publishing id confirmed to it
(deduplication). :meth:`Tracking.save` writes the file in a worker thread, fsynced and
renamed into place, and calls back once what was set before the call is durable;
saves asked for meanwhile share the next write (group commit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqpd.broker.stream import StreamQueue

log = logging.getLogger("amqpd.streamproto")

FILE = "tracking.json"


class Tracking:
    """One stream's stored offsets and publisher sequences (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self.offsets: dict[str, int] = {}
        self.publishers: dict[str, int] = {}
        self._saving = False
        self._waiters: list[Callable[[], None]] = []
        self._again = False
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.offsets = {str(k): int(v) for k, v in data.get("offsets", {}).items()}
                self.publishers = {str(k): int(v)
                                   for k, v in data.get("publishers", {}).items()}
            except (OSError, ValueError, AttributeError) as exc:
                log.error("%s is unreadable (%s): stored offsets and publisher sequences "
                          "of this stream start empty", self.path, exc)

    def _write(self, text: str) -> None:
        if not self.path.parent.exists():  # the stream was deleted meanwhile
            return
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def save(self, loop: asyncio.AbstractEventLoop,
             callback: Callable[[], None] | None = None) -> None:
        """Make the current state durable; ``callback`` once it is (also on a write
        error, which is logged: the broker keeps serving from memory)."""
        if callback is not None:
            self._waiters.append(callback)
        if self._saving:
            self._again = True
            return
        self._saving = True
        self._again = False
        waiters, self._waiters = self._waiters, []
        text = json.dumps({"offsets": self.offsets, "publishers": self.publishers})
        future = loop.run_in_executor(None, self._write, text)

        def done(fut: asyncio.Future[None]) -> None:
            self._saving = False
            if fut.exception() is not None:
                log.error("cannot write %s: %s", self.path, fut.exception())
            for waiter in waiters:
                waiter()
            if self._again or self._waiters:
                self.save(loop)

        future.add_done_callback(done)


def tracking_of(queue: StreamQueue, cache: dict[int, Tracking]) -> Tracking:
    """The queue's tracking state, loaded once per queue object."""
    t = cache.get(id(queue))
    if t is None:
        t = cache[id(queue)] = Tracking(queue.directory)

        def forget(q: object) -> None:
            cache.pop(id(q), None)

        queue.on_removed.append(forget)
    return t


__all__ = ["Tracking", "tracking_of"]
