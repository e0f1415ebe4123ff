"""Inter-node links: one authenticated, multiplexed TCP connection per pair of nodes.

Every node listens for links (``cluster.link_listen``). Of two nodes, the one whose name
sorts first dials the other, so a pair never holds two connections; it dials again
(with backoff) whenever the link is down and the peer is known (:meth:`LinkManager.want`).
Before anything else both ends prove they hold the cluster cookie
(:func:`amqpd.cluster.link_wire.proof`: HMAC over both nonces and names; the cookie
never crosses the wire); a peer that fails is refused with a log line.

Once up, a :class:`Link` carries frames for many queue streams at once
(:mod:`amqpd.cluster.link_wire`); what the frames mean is up to the
:class:`LinkHandler` (:mod:`amqpd.cluster.remote_queue`). Writes of one event-loop tick
go out in one ``transport.write``. Flow control is by credit, per stream, in the frames
themselves (publish credit from the leader, delivery credit from the consumer's node),
so one busy queue cannot stall the others on the link; a link whose socket buffer grows
past :data:`HIGH_WATER` also stops reading from the peer until it drains. Both ends send
a PING every :data:`PING_INTERVAL`, so a link that stays silent means a peer that cannot
be reached (amqpd.cluster.remote_queue closes it then, if the cluster view agrees).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, Final, Protocol, cast

from amqpd.cluster import link_wire as W
from amqpd.cluster import (
    mirror_wire,  # noqa: F401  (the replication frames' layouts)
    stream_wire,  # noqa: F401  (the replicated streams' layouts)
)
from amqpd.cluster.link_records import read_batch

log = logging.getLogger("amqpd.cluster.link")

HANDSHAKE_TIMEOUT: Final = 5.0
RECONNECT_MIN: Final = 0.1
RECONNECT_MAX: Final = 2.0
HIGH_WATER: Final = 8 << 20
PING_INTERVAL: Final = 0.5  # a live link is never silent longer than this
_PING: Final = W.encode(W.PING, 0)
_PING_KIND: Final = W.PING  # module constants: read once per frame received
_REFUSED_KIND: Final = W.REFUSED


class LinkHandler(Protocol):
    """What a link reports to (the cluster's queue layer)."""

    def link_up(self, link: Link) -> None: ...
    def link_down(self, link: Link) -> None: ...
    def frame(self, link: Link, kind: int, stream: int, fields: list[Any]) -> None: ...


class Link(asyncio.Protocol):
    """One end of the connection to ``peer``: handshake, then frames both ways."""

    def __init__(self, manager: LinkManager, dialler: bool, peer: str = "") -> None:
        self.manager = manager
        self.dialler = dialler
        self.peer = peer  # the dialler knows whom it dials; the listener learns it
        self.up = False
        self.closed = False
        self.transport: asyncio.Transport | None = None
        # PUBLISHES / DELIVERS read straight into the broker's objects (link_records)
        self._reader = W.FrameReader(read_batch)
        self._magic: bytes | None = None if dialler else b""  # listener: MAGIC seen so far
        self._nonce = os.urandom(32)
        self._peer_nonce = b""
        # the frames queued this tick, in order (they leave in one write): the last may be
        # a batch (link_wire's PUBLISHES / DELIVERS, a bytearray) that its sender still
        # extends while it is last (read by amqpd.cluster.remote_queue and remote_served);
        # flush seals the batches
        self.queued: list[bytes | bytearray] = []
        self._flush_scheduled = False
        self._handshake_timer: asyncio.TimerHandle | None = None
        self.epoch = 0  # set when up: streams of an older link are told apart
        self.last_heard = 0.0  # loop time of the last bytes from the peer

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(high=HIGH_WATER)
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_expired)
        if self.dialler:
            self.transport.write(W.MAGIC + W.encode(W.HELLO, 0, self.manager.node, self._nonce))
            self._magic = None

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_heard = asyncio.get_running_loop().time()
        if self._magic is not None:  # listener: the dialler's MAGIC first
            need = len(W.MAGIC) - len(self._magic)
            self._magic += data[:need]
            data = data[need:]
            if not W.MAGIC.startswith(self._magic):
                if self._magic[:len(W.PREAMBLE)] == W.PREAMBLE:
                    # another amqpd version: told why (REFUSED is read by every version)
                    self._fail(f"link protocol version {self._magic[-1]} there, "
                               f"{W.VERSION} here: no link between the two")
                else:
                    self._fail("not an amqpd link (bad preamble)", refuse=False)
                return
            if len(self._magic) < len(W.MAGIC):
                return
            self._magic = None
        try:
            frames = self._reader.feed(data)
        except W.WireError as exc:
            self._fail(f"malformed frame: {exc}")
            return
        frame = self.manager.handler.frame
        for kind, stream, fields in frames:
            if self.closed:
                return
            if kind == _PING_KIND and self.up:
                continue
            if kind == _REFUSED_KIND and self.up:
                # the dialler that had our welcome did not adopt the link after all (it
                # had one up already: both nodes dialled at once); not a protocol error
                self._fail(f"refused by peer: {fields[0]}", refuse=False)
                return
            if self.up:
                try:
                    frame(self, kind, stream, fields)
                except Exception:
                    log.exception("link to %s: frame %d on stream %d failed", self.peer,
                                  kind, stream)
            else:
                self._handshake(kind, fields)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(str(exc) if exc else "closed by peer")

    def pause_writing(self) -> None:  # the peer reads slower than we write
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- handshake ---------------------------------------------------------------------
    def _handshake(self, kind: int, fields: list[Any]) -> None:
        m = self.manager
        if kind == W.REFUSED:
            self._fail(f"refused by peer: {fields[0]}", refuse=False)
        elif not self.dialler and kind == W.HELLO and not self.peer:
            name, nonce = fields
            if not name or name == m.node or len(nonce) != 32:
                self._fail(f"bad hello from {name!r}")
                return
            self.peer, self._peer_nonce = name, nonce
            mine = W.proof(m.cookie, "server", name, m.node, nonce, self._nonce)
            self.transport.write(W.encode(W.CHALLENGE, 0, m.node, self._nonce, mine))  # type: ignore[union-attr]
        elif self.dialler and kind == W.CHALLENGE:
            name, nonce, theirs = fields
            if name != self.peer:
                self._fail(f"dialled {self.peer} but {name!r} answered")
                return
            want = W.proof(m.cookie, "server", m.node, name, self._nonce, nonce)
            if not W.proof_ok(want, theirs):
                self._fail(f"{name} does not hold this cluster's cookie")
                return
            mine = W.proof(m.cookie, "client", m.node, name, self._nonce, nonce)
            self._peer_nonce = nonce
            self.transport.write(W.encode(W.PROVE, 0, mine))  # type: ignore[union-attr]
        elif not self.dialler and kind == W.PROVE and self.peer:
            want = W.proof(m.cookie, "client", self.peer, m.node, self._peer_nonce,
                           self._nonce)
            if not W.proof_ok(want, fields[0]):
                self._fail(f"{self.peer} does not hold this cluster's cookie")
                return
            self.transport.write(W.encode(W.WELCOME, 0))  # type: ignore[union-attr]
            self._became_up()
        elif self.dialler and kind == W.WELCOME and self._peer_nonce:
            self._became_up()
        else:
            self._fail(f"unexpected frame {kind} during the handshake")

    def _became_up(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if not self.manager.adopt(self):
            self._fail("not accepted now (a link is up already, or the peer is not "
                       "seen as running)", refuse=True)
            return
        self.up = True
        log.info("link to %s up", self.peer)
        self.manager.handler.link_up(self)

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if not self.up:
            self._fail("handshake timed out", refuse=False)

    def _fail(self, why: str, refuse: bool = True) -> None:
        log.warning("link %s %s: %s", "to" if self.dialler else "from", self.peer or "?", why)
        if refuse and self.transport is not None and not self.closed:
            self.transport.write(W.encode(W.REFUSED, 0, why[:200]))
        self.close()

    # -- sending -----------------------------------------------------------------------
    def send(self, frame: bytes | bytearray) -> None:
        """Queue a frame; the tick's frames leave in one write."""
        if self.closed:
            return
        self.queued.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self.queued = self.queued, []
        if out and not self.closed and self.transport is not None:
            for frame in out:
                if type(frame) is bytearray:  # a batch: complete now (link_wire.seal)
                    W.seal(frame)
            self.transport.write(b"".join(out))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.flush()
            self.transport.close()
        self._gone("closed")

    def _gone(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.queued.clear()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self.up:
            self.up = False
            log.warning("link to %s down: %s", self.peer, why)
            self.manager.dropped(self)


class LinkManager:
    """This node's links: the listener, the diallers, and the one live link per peer."""

    def __init__(self, node: str, cookie: bytes, handler: LinkHandler,
                 resolve: Callable[[str], tuple[str, int] | None],
                 accept: Callable[[str], bool] = lambda peer: True) -> None:
        self.node = node
        self.cookie = cookie
        self.handler = handler
        self.resolve = resolve  # peer name -> its link address (the cluster view)
        # whether a peer may have a link now (the view counts it as running): a node
        # the cluster has lost sight of is refused until it is seen again
        self.accept = accept
        self.links: dict[str, Link] = {}
        self.server: asyncio.base_events.Server | None = None
        self.address: tuple[str, int] | None = None
        self._wanted: dict[str, asyncio.Task[None]] = {}
        self._epoch = 0
        self.closing = False
        self._pinger: asyncio.TimerHandle | None = None

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Link(self, False), host, port)
        self._pinger = loop.call_later(PING_INTERVAL, self._ping)
        sock = self.server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        return self.address

    def _ping(self) -> None:
        for link in self.links.values():
            if link.up:
                link.send(_PING)
        self._pinger = asyncio.get_running_loop().call_later(PING_INTERVAL, self._ping)

    def adopt(self, link: Link) -> bool:
        """A link finished its handshake: it is *the* link to its peer unless one is."""
        old = self.links.get(link.peer)
        if (old is not None and not old.closed) or not self.accept(link.peer):
            return False
        self._epoch += 1
        link.epoch = self._epoch
        self.links[link.peer] = link
        return True

    def dropped(self, link: Link) -> None:
        if self.links.get(link.peer) is link:
            del self.links[link.peer]
        self.handler.link_down(link)

    def link(self, peer: str) -> Link | None:
        link = self.links.get(peer)
        return link if link is not None and link.up else None

    def want(self, peer: str) -> None:
        """Keep a link to ``peer`` up. The node whose name sorts first dials; the other
        waits to be dialled."""
        if peer == self.node or self.node > peer or self.closing:
            return
        task = self._wanted.get(peer)
        if task is None or task.done():
            self._wanted[peer] = asyncio.get_running_loop().create_task(self._keep(peer))

    def unwant(self, peer: str) -> None:
        task = self._wanted.pop(peer, None)
        if task is not None:
            task.cancel()
        link = self.links.get(peer)
        if link is not None:
            link.close()

    async def _keep(self, peer: str) -> None:
        """Dial ``peer`` until a link is up, and again whenever it drops.

        One try at a time: a stopped (SIGSTOP) or overloaded peer's kernel still accepts
        the connection, so a successful connect says nothing; the try counts as failed
        only when its handshake ends without the link coming up (refused, or
        ``HANDSHAKE_TIMEOUT``), and only then is the next one dialled, after a backoff
        that doubles up to ``RECONNECT_MAX``. Dialling every ``RECONNECT_MIN`` instead
        left a stopped peer ~50 half-open links in its accept queue for every 5 s of
        its stop, each logging "handshake timed out", all handled at once when it
        woke."""
        backoff = RECONNECT_MIN  # before the next try after a failed one
        dialled: Link | None = None  # the last try, while its handshake may still run
        loop = asyncio.get_running_loop()
        while not self.closing:
            link = self.links.get(peer)
            if link is not None and not link.closed:
                backoff = RECONNECT_MIN
                await asyncio.sleep(RECONNECT_MAX / 4)  # up: look again now and then
                continue
            if dialled is not None and not dialled.closed:
                await asyncio.sleep(RECONNECT_MIN)  # its handshake runs: no second try
                continue
            if dialled is not None:
                was_up, dialled = dialled.epoch != 0, None
                if not was_up:  # the handshake failed: back off before the next try
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, RECONNECT_MAX)
                    continue
                # a link that was up and dropped is dialled again at once
            address = self.resolve(peer)
            if address is None:
                await asyncio.sleep(RECONNECT_MAX)
                continue
            try:
                _transport, proto = await loop.create_connection(
                    lambda: Link(self, True, peer), address[0], address[1])
                dialled = proto
            except OSError as exc:
                log.debug("link to %s: cannot connect: %s", peer, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
                continue
            await asyncio.sleep(RECONNECT_MIN)

    async def close(self) -> None:
        self.closing = True
        if self._pinger is not None:
            self._pinger.cancel()
        for task in self._wanted.values():
            task.cancel()
        self._wanted.clear()
        for link in list(self.links.values()):
            link.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


__all__ = ["HIGH_WATER", "Link", "LinkHandler", "LinkManager"]
