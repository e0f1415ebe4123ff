"""Byte transport for replication: frames in, frames and file ranges out.

Two kinds, one interface (``recv_frame``, ``send``, ``send_file``, ``close``):

* :class:`SocketConn`, plain TCP: file ranges go out with ``os.sendfile`` straight from
  the segment file to the socket (zero-copy, as Kafka serves its log), waiting for the
  socket to be writable through the event loop (works on asyncio and uvloop alike).
* :class:`StreamConn`, asyncio streams (TLS): the bytes are encrypted in user space, so
  file ranges are read with ``pread`` and written; there is no zero-copy with TLS.
"""

from __future__ import annotations

import asyncio
import os
import socket

from amqpd.replication import wire

_FILE_CHUNK = 1 << 20  # pread size on the TLS path


class SocketConn:
    """A non-blocking socket driven by the loop's ``sock_*`` calls."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer
        self.loop = asyncio.get_running_loop()

    async def recv_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = await self.loop.sock_recv_into(self.sock, view[got:])
            if k == 0:
                raise ConnectionError("peer closed the connection")
            got += k
        return bytes(buf)

    async def recv_frame(self) -> tuple[int, bytes]:
        ftype, length = wire.parse_header(await self.recv_exactly(wire.HEADER_SIZE))
        return ftype, (await self.recv_exactly(length) if length else b"")

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def send_file(self, fd: int, offset: int, count: int) -> None:
        """``count`` bytes of ``fd`` from ``offset``, kernel to kernel."""
        out = self.sock.fileno()
        while count > 0:
            try:
                sent = os.sendfile(out, fd, offset, count)
            except BlockingIOError:
                await self._writable()
                continue
            if sent == 0:
                raise ConnectionError("sendfile: the file is shorter than expected")
            offset += sent
            count -= sent

    async def _writable(self) -> None:
        fut: asyncio.Future[None] = self.loop.create_future()
        fd = self.sock.fileno()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self.loop.add_writer(fd, ready)
        try:
            await fut
        finally:
            self.loop.remove_writer(fd)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class StreamConn:
    """asyncio streams (used for TLS, and by the follower)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 peer: str) -> None:
        self.reader = reader
        self.writer = writer
        self.peer = peer

    async def recv_frame(self) -> tuple[int, bytes]:
        try:
            header = await self.reader.readexactly(wire.HEADER_SIZE)
            ftype, length = wire.parse_header(header)
            return ftype, (await self.reader.readexactly(length) if length else b"")
        except asyncio.IncompleteReadError:
            raise ConnectionError("peer closed the connection") from None

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def send_nowait(self, data: bytes) -> None:
        """Queue a small frame without waiting for the buffer to drain (the standby's
        ACKs, from a loop callback: each is 21 bytes and follows an fsync)."""
        self.writer.write(data)

    async def send_file(self, fd: int, offset: int, count: int) -> None:
        while count > 0:
            chunk = os.pread(fd, min(count, _FILE_CHUNK), offset)
            if not chunk:
                raise ConnectionError("the file is shorter than expected")
            self.writer.write(chunk)
            await self.writer.drain()
            offset += len(chunk)
            count -= len(chunk)

    def close(self) -> None:
        self.writer.close()


Conn = SocketConn | StreamConn
