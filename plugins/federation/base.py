"""What exchange and queue links share: the reconnect loop, status, and local republish.

A link runs on the downstream. It connects to the upstream with the link client that
shovels use (:mod:`plugins.shovel.wire`; a URI picked at random from the upstream's list,
as RabbitMQ does), sets up there what its kind needs (:meth:`Link.setup`), then serves
deliveries until the connection dies, and starts over after a backoff that grows from
half a second up to ``reconnect-delay`` (jittered; :mod:`plugins.common.backoff`).
Deliveries reach :meth:`Link.on_delivery` synchronously, in wire order, with their
properties as raw bytes; only ``headers`` changes on the way.

Messages are republished into the local broker through its public Python API
(:meth:`BrokerAPI.publish`) rather than a loopback AMQP connection; the ``on_confirm``
callback of that API is what ``ack-mode`` hangs on:

- ``on-confirm``: ack upstream only once the local publish is confirmed (persisted when
  it must be). A refused publish is retried here with backoff, only into the queues of
  the route that did not take it (:mod:`plugins.common.republish`); nothing is lost
  across outages. Acks are coalesced in order (:mod:`plugins.federation.acker`).
- ``on-publish``: ack as soon as the message is handed to the local broker.
- ``no-ack``: consume without acks (fastest, loses in-flight messages on failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import struct
import time
import zlib
from typing import TYPE_CHECKING, Any

from amqpd.broker.api import Message, codec
from plugins.common.backoff import Backoff
from plugins.common.republish import Held, LocalPublisher
from plugins.common.taken import Taken, has_message_id
from plugins.federation.acker import Acker
from plugins.federation.headers import first_hop_redelivered
from plugins.federation.params import Upstream, strip_credentials
from plugins.shovel.seen import Seen, fingerprint
from plugins.shovel.wire import Connection, Delivery

if TYPE_CHECKING:
    from plugins.federation.links import Supervisor

log = logging.getLogger("amqpd.federation")

_U16 = struct.Struct(">H")
_USER_ID = 1 << 4  # the user-id property's flag bit
RECONNECT_FIRST = 0.5  # seconds before the first reconnect after a failure
DRAIN_TIMEOUT = 3.0  # seconds a planned stop waits for the deliveries in hand
SETUP_TIMEOUT = 30.0  # declares and binds upstream, per attempt (a silent peer fails it)
PRODUCT = "amqpd-federation"


def _mark_retry(properties: bytes, _try: int) -> bytes:
    """A retried local publish says it may be a repeat: ``x-received-from[0].redelivered``
    (a refusal does not prove the queue lacks the message)."""
    return first_hop_redelivered(properties)


def describe(exc: BaseException) -> str:
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if str(exc) else text


class Link:
    """One upstream feeding one local exchange or queue."""

    kind = ""  # "exchange" | "queue"
    CHECK_INTERVAL = 1.0  # seconds between periodic checks while running

    def __init__(self, supervisor: Supervisor, vhost: str, name: str, upstream: Upstream) -> None:
        self.supervisor = supervisor
        self.api = supervisor.api
        self.vhost = vhost
        self.name = name
        self.upstream = upstream
        self.status = "starting"
        self.error: str | None = None
        self.timestamp = time.time()
        self.uri = strip_credentials(upstream.uris[0])
        self.upstream_cluster: str | None = None
        self.current_uri = ""
        self.conn: Connection | None = None
        self.channel = 0  # the link's channel on conn (0: none)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._acker: Acker | None = None
        self._local: LocalPublisher | None = None  # on-confirm republish of this channel
        self._wake = asyncio.Event()
        # between failed tries: from RECONNECT_FIRST up to reconnect-delay
        self._reconnect = Backoff(max(upstream.reconnect_delay, 0.05), first=RECONNECT_FIRST)
        self._gave_up: str | None = None  # why the link closed its own channel
        self.seen = Seen()  # what it forwarded lately, across reconnects
        self.taken = Taken()  # which queues took what it forwarded (message_id only)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"federation {self.key}")

    async def stop(self, cleanup: bool = False) -> None:
        """Stop the link. ``cleanup`` (the object is no longer federated, as opposed to a
        shutdown or a restart) also removes what the link declared upstream, unless the
        upstream says ``resource-cleanup-mode: never``."""
        self._stopping = True
        await self._drain()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        conn = self.conn
        if cleanup and conn is not None and not conn.closed.done() and \
                self.upstream.raw.get("resource-cleanup-mode") != "never":
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.cleanup(conn), 5)
        await self._close()

    async def _drain(self) -> None:
        """A planned stop (the link moves to another node of the cluster, or its
        definition changed): stop taking deliveries and let those in hand finish (local
        confirm, then the ack upstream), for at most DRAIN_TIMEOUT, so that the link that
        takes over does not get them again (each such move added a copy in issue 29's
        two-site test)."""
        conn, channel, acker = self.conn, self.channel, self._acker
        if conn is None or not channel or conn.closed.done() or acker is None \
                or self.upstream.ack_mode == "no-ack":
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_TIMEOUT
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.quiesce(conn, channel), DRAIN_TIMEOUT)
        while acker.pending and loop.time() < deadline and not conn.closed.done():
            await asyncio.sleep(0.02)
        await asyncio.sleep(0)  # the acker writes its last acks at the end of a tick

    def wake(self) -> None:
        """Something local changed (bindings, consumers): re-check now, not at the tick."""
        self._wake.set()

    @property
    def link_id(self) -> str:
        """Stable across restarts of the link and of the broker."""
        return f"{zlib.crc32(self.key.encode()):08x}"

    @property
    def key(self) -> str:
        return f"{self.kind} {self.vhost!r}/{self.name!r} <- {self.upstream.name}"

    def _set_status(self, status: str, error: str | None = None) -> None:
        if status != self.status or error != self.error:
            self.timestamp = time.time()
        self.status = status
        self.error = error

    async def _run(self) -> None:
        while not self._stopping:
            uri = random.choice(self.upstream.uris)
            self.uri = strip_credentials(uri)
            self.current_uri = uri
            self._set_status("starting")
            self._gave_up = None
            started = time.monotonic()
            try:
                # bounded by the URI's connection_timeout (10 s by default)
                conn = await Connection.open(uri, product=PRODUCT)
                self.conn = conn
                cluster = conn.server_properties.get("cluster_name")
                if isinstance(cluster, bytes):
                    cluster = cluster.decode("utf-8", "replace")
                self.upstream_cluster = cluster if isinstance(cluster, str) else None
                self.channel = await conn.channel()
                # a fresh channel: delivery tags start again at 1
                self._acker = Acker(functools.partial(conn.ack, self.channel),
                                    functools.partial(conn.nack, self.channel))
                if self.upstream.ack_mode == "on-confirm":
                    self._local = LocalPublisher(self.api, self.vhost, f"federation {self.key}",
                                                 self._acker.settle, _mark_retry,
                                                 self._on_local_status, self._give_up, log)
                await asyncio.wait_for(self.setup(conn, self.channel), SETUP_TIMEOUT)
                self._set_status("running")
                log.info("federation link running: %s", self.key)
                await self._serve(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    break
                reason = self._gave_up or describe(exc)
                self._set_status("error", reason)
                log.warning("federation link %s failed: %s", self.key, reason,
                            exc_info=log.isEnabledFor(logging.DEBUG))
            finally:
                if not self._stopping:
                    await self._close()
            if self._stopping:
                break
            if time.monotonic() - started > self.upstream.reconnect_delay:
                self._reconnect.reset()  # it ran a while: this failure is a new story
            # a peer that fails at once (a load balancer with no backend up accepts and
            # closes) is retried soon, then less and less often, never in a loop
            await asyncio.sleep(self._reconnect.next())

    async def _serve(self, conn: Connection) -> None:
        """Run periodic checks until the upstream connection or the link's channel closes
        (then raise, and the link starts over)."""
        closings = (("connection", conn.closed), ("channel", conn.channel_closed(self.channel)))
        while True:
            self._wake.clear()
            wake = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({closings[0][1], closings[1][1], wake},
                                   timeout=self.CHECK_INTERVAL,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
            for what, closing in closings:
                if closing.done():
                    exc = closing.exception() if not closing.cancelled() else None
                    raise ConnectionError(f"upstream {what} closed: {exc or closing.result()}")
            await self.periodic()

    async def _close(self) -> None:
        conn, self.conn, self.channel = self.conn, None, 0
        local, self._local = self._local, None
        if local is not None:
            local.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 6)  # (itself bounded to 5 s)
            conn.abort()

    # ------------------------------------------------------------------ subclass hooks
    async def setup(self, conn: Connection, channel: int) -> None:
        raise NotImplementedError

    async def periodic(self) -> None:
        """Called every CHECK_INTERVAL and on :meth:`wake` while running."""

    async def quiesce(self, conn: Connection, channel: int) -> None:
        """Stop consuming upstream (before a planned stop); default: nothing to stop."""

    async def cleanup(self, conn: Connection) -> None:
        """Delete upstream objects that only this link used (default: none)."""

    # ------------------------------------------------------------------ republish
    @staticmethod
    def fingerprint(delivery: Delivery) -> bytes:
        """The delivery's :func:`~plugins.shovel.seen.fingerprint` as the upstream sent
        it (before the link's own header), the same on every pass of one message."""
        return fingerprint(delivery.properties, delivery.body)

    def republish(self, delivery: Delivery, exchange: str, routing_key: str,
                  properties: bytes, fp: bytes | None = None) -> None:
        """Publish into the local broker (``properties`` raw, as the link rewrote them)
        and settle upstream as ``ack-mode`` says. With ``on-confirm``, a message with a
        ``message_id`` that the upstream redelivers and whose fingerprint ``fp`` the link
        forwarded before goes only into the queues of its route that did not take it
        then (:mod:`plugins.common.taken`)."""
        tag = delivery.delivery_tag
        mode = self.upstream.ack_mode
        acker = self._acker if mode != "no-ack" else None
        if acker is not None:
            acker.track(tag)
        if not self.upstream.trust_user_id and len(properties) >= 2 and \
                _U16.unpack_from(properties, 0)[0] & _USER_ID:
            props = codec.decode_properties(properties)  # rare: only such messages pay
            props.pop("user_id", None)
            properties = codec.encode_properties(props)
        local = self._local
        if local is not None and acker is not None:
            try:
                record = self.taken.record(fp) if fp is not None and \
                    has_message_id(delivery.properties) else None
                local.submit(Held(tag, exchange, routing_key, properties, delivery.body,
                                  record=record, redelivered=delivery.redelivered))
            except Exception as exc:
                local.close()
                acker.settle(tag, False)
                self._give_up(describe(exc))
            return
        message = Message(exchange, routing_key, properties, delivery.body)

        def confirmed(error: BaseException | None) -> None:
            if error is not None:
                log.warning("federation %s: local publish failed: %s", self.key, error)
            if acker is not None:
                acker.settle(tag, error is None)

        try:
            # 404 once the vhost or exchange is gone: the link errors and restarts
            self.api.publish(self.vhost, exchange, message, None,
                             on_confirm=confirmed if mode == "on-confirm" else None)
        except Exception as exc:
            if acker is not None:
                acker.settle(tag, False)
            self._give_up(describe(exc))
            return
        if acker is not None and mode == "on-publish":
            acker.settle(tag, True)

    def _on_local_status(self, reason: str | None) -> None:
        """The local publisher's word: why a retry waits, or None once all went in."""
        if reason is not None:
            self._set_status("error", reason)
        elif self.status == "error" and self.conn is not None:
            self._set_status("running")

    def _give_up(self, reason: str) -> None:
        """The link's channel closes (what it did not ack goes back upstream) and the
        link starts over after its reconnect backoff, with ``reason`` as its status."""
        self._gave_up = reason
        self._set_status("error", reason)
        conn = self.conn
        if conn is not None:
            self._spawn(conn.close_channel(self.channel))

    def settle_drop(self, delivery: Delivery) -> None:
        """A delivery the link must not forward (loop or hop limit): ack it away."""
        acker = self._acker
        if self.upstream.ack_mode != "no-ack" and acker is not None:
            acker.track(delivery.delivery_tag)
            acker.settle(delivery.delivery_tag, True)

    def _spawn(self, coro: Any) -> None:
        async def run() -> None:
            with contextlib.suppress(Exception):
                await coro

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ status
    def status_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "node": self.api.node_name(),
            self.kind: self.name,
            f"upstream_{self.kind}": self.upstream_object,
            "type": self.kind,
            "vhost": self.vhost,
            "upstream": self.upstream.name,
            "id": self.link_id,
            "status": self.status,
            "local_connection": "<internal>",
            "uri": self.uri,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.timestamp)),
        }
        if self.status == "error" and self.error:
            info["error"] = self.error
        return info

    @property
    def upstream_object(self) -> str:
        own = self.upstream.exchange if self.kind == "exchange" else self.upstream.queue
        return own or self.name
