"""Offsets and publisher sequences asked on a node that does not lead the stream:
passed on to the leader's node, which keeps them (issue 31).

A stream's ``tracking.json`` (:mod:`amqpd.streamproto.tracking`) lives on its leader's
node only, but clients subscribe on the replicas the metadata names
(:mod:`amqpd.streamproto.copies`) and store their consumer's offset on that same
connection (rabbitmq-stream-js-client does). RabbitMQ 3.10.8 writes tracking through the
leader from any node; amqpd asks the leader's node with a node request (the way the
shovel's ``shovel-restart`` travels: over the inter-node link when it is up,
:mod:`amqpd.cluster.peer_ask`, else through etcd, :mod:`amqpd.cluster.node_requests`):

* ``stream-store-offset`` {vhost, stream, reference, offset}: the leader stores it as
  its own store-offset does and answers once ``tracking.json`` is written. The client
  gets no response (the command has none), so a failed request is a warning in the
  log. Store-offsets for one reference while a request for it is under way are
  coalesced, the latest winning: a client that stores per chunk sends one request at
  a time per reference, never a storm.
* ``stream-query-offset`` {vhost, stream, reference}: the stored offset, or null (the
  client gets 0x13, no offset, as on the leader). A store-offset for the same
  reference still under way from this node is waited for first, so a client reads
  back what it stored.
* ``stream-query-publisher-sequence`` {vhost, stream, reference}: the producer's
  highest confirmed publishing id (0 when none).

The asking node checked the user's permission; the leader's node only checks that it
leads the stream (404 otherwise: leadership moved meanwhile, and the client is
answered 0x06, stream not available, with a log line, as when no node answers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.stream import StreamQueue
from amqpd.protocol.errors import AMQPError, NotFound
from amqpd.streamproto import codec as c
from amqpd.streamproto.tracking import Tracking

if TYPE_CHECKING:
    from amqpd.server import Broker

log = logging.getLogger("amqpd.streamproto")

STORE: Final = "stream-store-offset"
QUERY: Final = "stream-query-offset"
SEQUENCE: Final = "stream-query-publisher-sequence"
TIMEOUT: Final = 5.0  # seconds a request may take before the leader counts as not there

Key = tuple[str, str, str]  # vhost, stream, reference


class TrackingForwarder:
    """One node's side of forwarded tracking (module docstring): the handlers it
    answers other nodes with, and the requests it makes for its own connections."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._latest: dict[Key, int] = {}  # offsets stored here not yet sent on
        self._sending: dict[Key, asyncio.Task[None]] = {}
        self._answering: set[asyncio.Task[None]] = set()

    def serve(self) -> None:
        """Answer the other nodes' requests for the streams this node leads."""
        api = self.broker.api
        api.serve_node_requests(STORE, self._serve_store)
        api.serve_node_requests(QUERY, self._serve_query)
        api.serve_node_requests(SEQUENCE, self._serve_sequence)

    # ------------------------------------------------------------------ leader's side
    def _led(self, args: dict[str, Any]) -> Tracking:
        vhost, stream = str(args["vhost"]), str(args["stream"])
        vh = self.broker.vhosts.get(vhost)
        q = vh.queues.get(stream) if vh is not None else None
        if not isinstance(q, StreamQueue) or q.deleted:
            raise NotFound(f"stream '{stream}' in vhost '{vhost}' is not led on node "
                           f"'{self.broker.api.node_name()}'")
        return q.stream_tracking()

    async def _serve_store(self, args: dict[str, Any]) -> None:
        t = self._led(args)
        t.store_offset(str(args["reference"]), int(args["offset"]))
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()

        def durable() -> None:
            if not written.done():  # (not when this request was cancelled meanwhile)
                written.set_result(None)

        t.save(loop, durable)
        await written

    async def _serve_query(self, args: dict[str, Any]) -> int | None:
        return self._led(args).offsets.get(str(args["reference"]))

    async def _serve_sequence(self, args: dict[str, Any]) -> int:
        return self._led(args).publishers.get(str(args["reference"]), 0)

    # ------------------------------------------------------------------ asking side
    def leader(self, vhost: str, stream: str) -> str:
        """The node that leads ``stream`` as this node knows it (NotFound if none)."""
        cluster = self.broker.api.cluster()
        leader: str | None = None
        if cluster is not None:
            leader = cluster.queue_leader(vhost, stream)
            groups = getattr(cluster, "stream_groups", None)
            if not leader and groups is not None:
                leader = groups.queue_fields(vhost, stream).get("leader")
        if not leader:
            raise NotFound(f"no known leader for stream '{stream}' in vhost '{vhost}'")
        return leader

    async def _ask(self, kind: str, vhost: str, stream: str, reference: str,
                   **more: Any) -> Any:
        leader = self.leader(vhost, stream)
        args = {"vhost": vhost, "stream": stream, "reference": reference, **more}
        return await self.broker.api.ask_node(leader, kind, args, TIMEOUT)

    def store_offset(self, vhost: str, stream: str, reference: str, offset: int,
                     who: str) -> None:
        """Send ``offset`` for ``reference`` to the leader's node, after any request for
        the same reference under way (only the latest offset asked meanwhile)."""
        key = (vhost, stream, reference)
        self._latest[key] = offset
        if key not in self._sending:
            self._sending[key] = asyncio.create_task(self._send_stores(key, who),
                                                     name="stream-store-offset")

    async def _send_stores(self, key: Key, who: str) -> None:
        vhost, stream, reference = key
        try:
            while True:
                offset = self._latest.pop(key, None)
                if offset is None:
                    return  # (and out of _sending before anyone can store again)
                try:
                    await self._ask(STORE, vhost, stream, reference, offset=offset)
                except (AMQPError, TimeoutError, OSError) as exc:
                    log.warning("stream connection %s: store-offset %d for reference %r "
                                "of stream '%s' not stored on the leader's node: %s", who,
                                offset, reference, stream, exc)
        finally:
            self._sending.pop(key, None)

    async def query_offset(self, vhost: str, stream: str, reference: str,
                           who: str) -> tuple[int, int]:
        """(response code, offset) for a query-offset (module docstring)."""
        under_way = self._sending.get((vhost, stream, reference))
        if under_way is not None:
            await asyncio.wait({under_way}, timeout=TIMEOUT)
        try:
            offset = await self._ask(QUERY, vhost, stream, reference)
        except (AMQPError, TimeoutError, OSError) as exc:
            return self._unavailable("query-offset", stream, who, exc), 0
        if offset is None:
            return c.NO_OFFSET, 0
        return c.OK, int(offset)

    async def query_sequence(self, vhost: str, stream: str, reference: str,
                             who: str) -> tuple[int, int]:
        """(response code, sequence) for a query-publisher-sequence."""
        try:
            return c.OK, int(await self._ask(SEQUENCE, vhost, stream, reference))
        except (AMQPError, TimeoutError, OSError) as exc:
            return self._unavailable("query-publisher-sequence", stream, who, exc), 0

    @staticmethod
    def _unavailable(what: str, stream: str, who: str, exc: BaseException) -> int:
        log.warning("stream connection %s: %s for stream '%s' answered 'stream not "
                    "available': the leader's node did not answer it: %s", who, what,
                    stream, exc)
        return c.STREAM_NOT_AVAILABLE

    def answer(self, ask: Coroutine[Any, Any, tuple[int, int]],
               send: Callable[[int, int], None]) -> None:
        """``send(code, value)`` once ``ask`` has the answer (the connection's frame)."""

        async def run() -> None:
            code, value = await ask
            send(code, value)

        task = asyncio.create_task(run(), name="stream-tracking-query")
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    def close(self) -> None:
        """The stream listener closed (shutdown, a fenced node): stop asking, with a
        warning for the store-offsets not sent (their clients are gone)."""
        if self._latest or self._sending:
            log.warning("stream listener closed: store-offsets of %d references not "
                        "(all) passed on to the leader's node", len(self._sending))
        self._latest.clear()
        for task in [*self._sending.values(), *self._answering]:
            task.cancel()


__all__ = ["QUERY", "SEQUENCE", "STORE", "TrackingForwarder"]
