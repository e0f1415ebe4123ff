"""A TCP proxy a test controls, to cut, slow down and restore a link between two processes.

It runs its own asyncio loop in a thread, listens on an ephemeral loopback port and
forwards every accepted connection to ``target``. The faults it injects:

- :meth:`TcpProxy.cut` ``"blackhole"`` (the default, like a pulled cable): existing
  connections stay open and the proxy goes on reading from both sides, but forwards
  nothing; new connections are accepted and then stall. Peers notice only through AMQP
  heartbeats, exactly as across a real partition.
- :meth:`TcpProxy.cut` ``"reset"``: every connection is closed at once and new ones are
  refused until :meth:`restore` (a peer that rebooted, a firewall that sends RST).
- :meth:`TcpProxy.reset_all`: every connection open now is closed at once (aborted, so
  the peers see a reset); new ones are accepted as usual (a flapping middlebox).
- :meth:`TcpProxy.delay`: every chunk of bytes is forwarded ``ms`` milliseconds after it
  was read, in both directions, without limiting throughput (a long, fat pipe); 0 ends it.
  With ``lossy`` set, what a side sent but the proxy has not forwarded yet when that side
  closes is dropped, not delivered: the delayed bytes stand for what a process that
  died had not got out yet (its buffers, a send queue a reset discards).

:meth:`restore` lets bytes flow again; connections that stalled in a blackhole are
closed then (their peers have given up on them, and what was read meanwhile was dropped),
so clients reconnect cleanly. ``accepted`` counts connections accepted over the proxy's
life, so a test can see that a peer reconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Pipe:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for writer in (self.client, self.server):
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self.mode: str | None = None  # None = connected, else "blackhole" / "reset"
        self.delay_s = 0.0  # added to every chunk's trip through the proxy
        self.lossy = False  # a side's close drops what it sent that is still delayed
        self.accepted = 0
        self._pipes: set[_Pipe] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="tcpproxy")
        self._server: asyncio.base_events.Server | None = None
        self._flowing = asyncio.Event()

    # ------------------------------------------------------------------ control (any thread)
    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def cut(self, mode: str = "blackhole") -> None:
        assert mode in ("blackhole", "reset")
        self._call(self._cut(mode))

    def restore(self) -> None:
        self._call(self._restore())

    def reset_all(self) -> None:
        """Abort every connection open now; keep accepting new ones."""
        self._call(self._reset_all())

    def delay(self, ms: float) -> None:
        """Forward every chunk ``ms`` milliseconds late from now on (0: no delay)."""
        self.delay_s = max(0.0, ms / 1000)

    def set_target(self, host: str, port: int) -> None:
        """Forward new connections elsewhere (a restarted upstream on a new port)."""
        self.target = (host, port)

    @property
    def connections(self) -> int:
        return len(self._pipes)

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ loop side
    async def _start(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.close()
        self._pipes.clear()

    async def _cut(self, mode: str) -> None:
        self.mode = mode
        self._flowing.clear()
        if mode == "reset":
            for pipe in list(self._pipes):
                pipe.close()
            self._pipes.clear()

    async def _reset_all(self) -> None:
        for pipe in list(self._pipes):
            pipe.close()
        self._pipes.clear()

    async def _restore(self) -> None:
        stalled = self.mode == "blackhole"
        self.mode = None
        if stalled:  # peers gave up on these during the partition
            for pipe in list(self._pipes):
                pipe.close()
            self._pipes.clear()
        self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.transport.abort()
            return
        self.accepted += 1
        pipe = _Pipe(writer)
        self._pipes.add(pipe)
        try:
            await self._flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):
            pipe.close()
            self._pipes.discard(pipe)
            return
        pipe.server = up_writer
        pipe.tasks = [asyncio.create_task(self._copy(reader, up_writer, pipe)),
                      asyncio.create_task(self._copy(up_reader, writer, pipe))]

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pipe: _Pipe) -> None:
        """One direction: a reader that stamps each chunk with when it is due, and a
        writer that sends it then (so a delay adds latency, not a throughput limit)."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=64)

        async def send() -> None:
            try:
                while True:
                    item = await chunks.get()
                    if item is None:
                        return
                    due, data = item
                    wait = due - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    await self._flowing.wait()  # what was queued before a blackhole waits
                    if pipe not in self._pipes:
                        return
                    writer.write(data)
                    await writer.drain()
            except OSError:
                pipe.close()  # the other side is gone: so is this connection

        sender = asyncio.create_task(send())
        try:
            while not sender.done():
                data = await reader.read(65536)
                if not data:
                    if self.lossy:
                        return  # the finally drops what is still delayed
                    break
                if self.mode == "blackhole":
                    continue  # read, forward nothing
                await chunks.put((loop.time() + self.delay_s, data))
            if not sender.done():
                await chunks.put(None)
                await sender
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            sender.cancel()
            pipe.close()
            self._pipes.discard(pipe)
