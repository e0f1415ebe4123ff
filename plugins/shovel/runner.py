"""One asyncio task per shovel: connect both ends, forward, settle, and start over on failure.

Reliability (``ack-mode: on-confirm``): a source delivery is acked only once the
destination confirmed the message published for it. Deliveries are kept in delivery
order; a confirm marks them settled, and the run of settled deliveries at the head is
acked at the source with one ``multiple`` ack. A destination ``nack`` (a quorum queue electing
a leader refuses publishes) is not sent back to the source, which would hand the message
straight back in a hot loop: the shovel keeps it and publishes it again after a backoff
(:mod:`plugins.common.backoff`), with the header ``x-shovel-retry`` (the try number) so
that a consumer of a queue that had already taken it can tell the copy; after
:data:`MAX_PUBLISH_ATTEMPTS` tries of one message the attempt ends. That is the path of
a remote destination (:class:`AMQPDestination`), where a retry goes through the
destination exchange again (into every queue of the route, unless the destination is
an amqpd that offered ``publish_retry_of``: then the retry names the destination's
sequence number of its first try, :data:`~plugins.shovel.wire.RETRY_OF_HEADER`, and
goes only into the queues that did not take it); a destination on this node
(``amqp://`` without a host, :class:`~plugins.shovel.local.LocalDestination`) publishes
per destination queue and retries only into the queue that refused, so its confirms are
all acks. When either end goes away both connections are closed: the source broker
requeues every unacked delivery (they are sent again after the reconnect with
``redelivered`` set, so duplicates are possible, never losses), and the next attempt
starts after a backoff growing from half a second to ``reconnect-delay``. Each attempt
is bounded (connect timeout; a peer that accepts and closes fails at once), and a
failing shovel waits between attempts: it never spins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from plugins.common.backoff import Backoff
from plugins.common.taken import Pass, Taken, has_message_id
from plugins.shovel.destination import AMQPDestination, Destination, Message
from plugins.shovel.local import LocalDestination, mark_retry
from plugins.shovel.params import ShovelDef, redact
from plugins.shovel.seen import Seen, fingerprint
from plugins.shovel.source import AMQPSource
from plugins.shovel.wire import Delivery, decode_properties, encode_properties

if TYPE_CHECKING:
    from amqpd.broker.api import BrokerAPI

log = logging.getLogger("amqpd.shovel")


BATCH = 256  # most messages per socket write to the destination
_LONG_MARK = 1 << 62
OPEN_TIMEOUT = 30.0  # connect + declare + consume, per end and attempt
RECONNECT_FIRST = 0.5  # seconds before the first new attempt after a failure
RETRY_FIRST = 0.05  # seconds before the first new publish of a refused message
RETRY_CAP = 5.0
MAX_PUBLISH_ATTEMPTS = 25  # of one message, then the attempt ends (~1.5 min)
# the longest a planned stop waits for the deliveries in hand to be settled at the source
DRAIN_TIMEOUT = 3.0
REDELIVERED_HEADER = "x-shovel-redelivered"  # maybe forwarded before (see seen.py)
_CREDENTIALS = re.compile(r"(amqps?://)[^@/\s'\"]*@")


class Completed(Exception):
    """src-delete-after reached: the shovel ends."""


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


class ShovelRunner:
    def __init__(self, defn: ShovelDef, *, local_uri: Callable[[str], str], node: str,
                 cluster_name: str, on_completed: Callable[[ShovelRunner], None] | None = None,
                 api: BrokerAPI | None = None) -> None:
        self.defn = defn
        self.local_uri = local_uri
        self.api = api  # publishes to a local destination (without it: over AMQP)
        self.node = node
        self.cluster_name = cluster_name
        self.on_completed = on_completed
        self.state = "starting"
        self.reason: str | None = None
        self.timestamp = _now()
        self.src_uri = redact(defn.src_uris[0])
        self.dest_uri = redact(defn.dest_uris[0])
        self.forwarded = 0  # messages settled at the source over the shovel's life
        self.task: asyncio.Task[None] | None = None
        self._last_failure: str | None = None
        self._reconnect = Backoff(max(defn.reconnect_delay, 0.05), first=RECONNECT_FIRST)
        self.publish_retries = 0  # refused publishes sent again, over the shovel's life
        self.seen = Seen()  # what it forwarded lately, across attempts
        self.taken = Taken()  # which queues took it (local destination, message_id only)
        self.link: _Link | None = None  # the attempt under way, once both ends are open

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(
                self._run(), name=f"shovel {self.defn.vhost}/{self.defn.name}")

    async def stop(self) -> None:
        """Stop the shovel. A planned stop (its definition changed, it moves to another
        node of the cluster, a restart, the broker shutting down) first hands over
        what it holds: see :meth:`_Link.drain`."""
        task, self.task = self.task, None
        if task is not None and not task.done():
            link = self.link
            if link is not None:
                with contextlib.suppress(Exception):
                    await link.drain(DRAIN_TIMEOUT)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def restart(self) -> None:
        await self.stop()
        self._set("starting")
        self.start()

    def status(self) -> dict[str, Any]:
        d = self.defn
        out: dict[str, Any] = {
            "node": self.node, "timestamp": self.timestamp, "name": d.name, "vhost": d.vhost,
            "type": d.type, "state": self.state,
        }
        if self.state == "terminated":
            out["reason"] = self.reason or "normal"
        out.update({"src_uri": self.src_uri, "dest_uri": self.dest_uri,
                    "src_protocol": "amqp091", "dest_protocol": "amqp091"})
        if d.src_queue is not None:
            out["src_queue"] = d.src_queue
        else:
            out["src_exchange"] = d.src_exchange
            out["src_exchange_key"] = d.src_exchange_key
        if d.dest_queue is not None:
            out["dest_queue"] = d.dest_queue
        elif d.dest_exchange is not None:
            out["dest_exchange"] = d.dest_exchange
            if d.dest_exchange_key is not None:
                out["dest_exchange_key"] = d.dest_exchange_key
        if self.state == "running":
            out["blocked_status"] = "running"
        return out

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state = state
        self.reason = reason
        self.timestamp = _now()

    # ------------------------------------------------------------------ loop
    async def _run(self) -> None:
        d = self.defn
        while True:
            self._set("starting")
            started = time.monotonic()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Completed:
                self._set("terminated", "completed")
                log.info("shovel %s/%s: src-delete-after reached, done", d.vhost, d.name)
                if self.on_completed is not None:
                    self.on_completed(self)
                return
            except Exception as exc:
                reason = _describe(exc)
                # the first failure of a kind is a warning; the same one again is not news
                level = logging.DEBUG if reason == self._last_failure else logging.WARNING
                self._last_failure = reason
                self._set("terminated", reason)
                if d.type == "static" and d.reconnect_delay <= 0:
                    log.warning("shovel %s/%s failed: %s; not restarted (reconnect-delay 0)",
                                d.vhost, d.name, reason)
                    return  # RabbitMQ: 0 means "stop after the first failure"
                if time.monotonic() - started > d.reconnect_delay:
                    self._reconnect.reset()  # it ran a while: this failure is a new story
                # never spin, even with reconnect-delay 0 on a dynamic shovel; a peer that
                # fails at once is tried again soon, then less and less often
                delay = self._reconnect.next()
                log.log(level, "shovel %s/%s failed: %s; retrying in %.2fs", d.vhost,
                        d.name, reason, delay)
                await asyncio.sleep(delay)

    def _resolve(self, uri: str) -> tuple[str, str]:
        """(URI to connect to, URI to report)."""
        vhost = _local_vhost(uri)
        if vhost is not None:
            return self.local_uri(vhost), redact(uri)
        if urlsplit(uri).username is None:
            uri = uri.replace("://", "://guest:guest@", 1)
        return uri, redact(uri)

    async def _session(self) -> None:
        d = self.defn
        # a random URI of each list per attempt, as RabbitMQ does
        src_uri, self.src_uri = self._resolve(random.choice(d.src_uris))
        picked = random.choice(d.dest_uris)
        dest_vhost = _local_vhost(picked)
        dest: Destination
        if dest_vhost is not None and self.api is not None:
            # this node: through the broker API, one publish per destination queue
            dest = LocalDestination(d, self.api, dest_vhost)
            self.dest_uri = redact(picked)
        else:
            dest_uri, self.dest_uri = self._resolve(picked)
            dest = AMQPDestination(d, dest_uri)
        src = AMQPSource(d, src_uri)
        link = _Link(self, src, dest)
        try:
            await link.run()
        finally:
            await asyncio.gather(src.close(), dest.close(), return_exceptions=True)

    def forward_headers(self) -> dict[str, Any]:
        d = self.defn
        table: dict[str, Any] = {
            "shovelled-by": self.cluster_name, "shovel-type": d.type, "shovel-name": d.name,
            "shovel-vhost": d.vhost, "src-uri": self.src_uri,
        }
        if d.src_queue is not None:
            table["src-queue"] = d.src_queue
        else:
            table["src-exchange"] = d.src_exchange
            table["src-exchange-key"] = d.src_exchange_key
        table["dest-uri"] = self.dest_uri
        if d.dest_exchange is not None:
            table["dest-exchange"] = d.dest_exchange
        if d.dest_exchange_key is not None:
            table["dest-exchange-key"] = d.dest_exchange_key
        if d.dest_queue is not None:
            table["dest-queue"] = d.dest_queue
        return table


class _Link:
    """One connected attempt: source and destination open, messages flowing."""

    def __init__(self, runner: ShovelRunner, src: AMQPSource, dest: Destination) -> None:
        self.runner = runner
        self.defn = runner.defn
        self.src = src
        self.dest = dest
        self.inbox: deque[Delivery] = deque()
        self.inbox_ready = asyncio.Event()
        # source delivery tag -> settled? (True ack, False nack, None pending), in order
        self.outstanding: OrderedDict[int, bool | None] = OrderedDict()
        self.by_seq: OrderedDict[int, int] = OrderedDict()  # dest seq -> source tag
        self.settle_ready = asyncio.Event()
        # on-confirm: what went out for each unsettled source tag (sent again if refused)
        self.sent: dict[int, Message] = {}
        # the destination's sequence number of each unsettled tag's first try, when the
        # destination routes a retry only into the queues that missed it (remote amqpd)
        self.first_seq: dict[int, int] | None = None
        self.refused: list[int] = []  # refused by the destination, not yet sent again
        self.attempts: dict[int, int] = {}  # tries of each refused message so far
        self.retry_backoff = Backoff(RETRY_CAP, first=RETRY_FIRST)
        self.retry_task: asyncio.Task[None] | None = None
        self.failure: Exception | None = None  # why retry() gave up
        self.remaining: int | None = None  # src-delete-after countdown (None = never)
        self.taken = 0
        d = self.defn
        self.seen = runner.seen
        self.forward_table = runner.forward_headers() if d.add_forward_headers else None
        self.rewrite = bool(d.publish_properties or d.add_forward_headers
                            or d.add_timestamp_header)

    async def run(self) -> None:
        d = self.defn
        confirm = d.ack_mode == "on-confirm"
        # bounded: a peer that accepts the connection but never answers is a failure too
        await asyncio.wait_for(self.dest.open(self.on_confirm if confirm else None), OPEN_TIMEOUT)
        if confirm and self.dest.retry_of:
            self.first_seq = {}
        await asyncio.wait_for(self.src.open(self.on_message), OPEN_TIMEOUT)
        if d.delete_after == "queue-length":
            self.remaining = self.src.initial_length
        elif isinstance(d.delete_after, int):
            self.remaining = d.delete_after - self.runner.forwarded
        if self.remaining is not None and self.remaining <= 0:
            raise Completed
        self.runner._set("running")
        self.runner._last_failure = None
        self.runner.link = self
        log.info("shovel %s/%s running: %s -> %s", d.vhost, d.name, self.runner.src_uri,
                 self.runner.dest_uri)
        tasks = [asyncio.ensure_future(self.forwarder()), asyncio.ensure_future(self.settler())]
        watch = [self.src.closed(), self.dest.closed()]
        try:
            done, _ = await asyncio.wait([*tasks, *watch], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t in done:
                    t.result()  # Completed or a failure
            for w in watch:
                if w in done:
                    side = "source" if w is watch[0] else "destination"
                    raise ConnectionError(f"{side} closed: {_describe(w.result())}")
        finally:
            if self.runner.link is self:
                self.runner.link = None
            if self.retry_task is not None:
                tasks.append(self.retry_task)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self, timeout: float) -> None:
        """A planned stop: stop consuming at the source, and let the deliveries in hand
        be published, confirmed and acked, for at most ``timeout`` seconds; then the
        runner closes both ends. Cancelled on the spot instead, the source would requeue
        every delivery published but not yet acked (up to the prefetch count) and the
        runner that takes over, with no record of them, would publish each again
        (issue 29: 768 copies of 20,000 after one definition change)."""
        if self.defn.ack_mode == "no-ack":
            return  # nothing to settle: the source forgot them on delivery
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ends = (self.src.closed(), self.dest.closed())
        held = len(self.inbox) + len(self.outstanding)
        try:
            await asyncio.wait_for(self.src.stop_consuming(), timeout)
            while (self.inbox or self.outstanding) and self.failure is None \
                    and not any(end.done() for end in ends) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0)  # the settler writes its last ack at the end of its turn
        finally:
            d = self.defn
            left = len(self.inbox) + len(self.outstanding)
            if held or left:
                log.log(logging.WARNING if left else logging.INFO,
                        "shovel %s/%s: stopping; %d deliveries in hand settled, %d left "
                        "to the source to deliver again", d.vhost, d.name,
                        max(held - left, 0), left)

    # ------------------------------------------------------------------ source side
    def on_message(self, message: Delivery) -> None:
        self.inbox.append(message)
        self.inbox_ready.set()

    async def forwarder(self) -> None:
        d = self.defn
        mode = d.ack_mode
        inbox = self.inbox
        track = mode == "on-confirm" and isinstance(self.dest, LocalDestination)
        while True:
            if not inbox:
                self.inbox_ready.clear()
                await self.inbox_ready.wait()
                continue
            # everything that arrived since the last write goes out in one socket write
            batch: list[Message] = []
            tags: list[int] = []
            records: list[Pass | None] = []
            while inbox and len(batch) < BATCH:
                message = inbox.popleft()
                if self.remaining is not None:
                    if self.taken >= self.remaining:
                        continue  # beyond the limit: requeued when the source closes
                    self.taken += 1
                tag = message.delivery_tag
                if mode != "no-ack":
                    self.outstanding[tag] = None
                tags.append(tag)
                # seen before (a source that failed over may not know it delivered it)
                fp = fingerprint(message.properties, message.body)
                again = self.seen.check_and_add_fp(fp)
                batch.append((*self.route(message, again or message.redelivered),
                              message.body))
                # which queues took it on an earlier pass (a local destination publishes a
                # redelivered one only into the others; messages with a message_id only)
                records.append((self.runner.taken.record(fp), message.redelivered)
                               if track and has_message_id(message.properties) else None)
            if not batch:
                continue
            if mode == "on-confirm":
                # registered before the write, so no confirm can come first
                by_seq = self.by_seq
                seq = self.dest.seq + 1
                first = self.first_seq
                for i, tag in enumerate(tags):
                    by_seq[seq + i] = tag
                    self.sent[tag] = batch[i]
                    if first is not None:
                        first[tag] = seq + i
            await self.dest.publish_many(batch, records if track else None)
            if mode == "on-publish":
                for tag in tags:
                    self.outstanding[tag] = True
                self.settle_ready.set()
            elif mode == "no-ack":
                self.count(len(tags))

    def route(self, message: Delivery, again: bool = False) -> tuple[str, str, bytes]:
        """Where the message goes, and its properties (as received unless changed).
        ``again``: maybe forwarded before, flagged with ``x-shovel-redelivered``."""
        d = self.defn
        exchange, routing_key = message.exchange, message.routing_key
        if d.dest_queue is not None:
            exchange, routing_key = "", d.dest_queue
        elif d.dest_exchange is not None:
            exchange = d.dest_exchange
            if d.dest_exchange_key is not None:
                routing_key = d.dest_exchange_key
        if not self.rewrite and not again:
            return exchange, routing_key, message.properties
        props = decode_properties(message.properties)
        for k, v in d.publish_properties.items():
            setattr(props, k, v)
        if d.add_forward_headers or d.add_timestamp_header or again:
            headers = dict(props.headers or {})
            if again:
                headers[REDELIVERED_HEADER] = True
            if self.forward_table is not None:
                previous = headers.get("x-shovelled")
                chain = list(previous) if isinstance(previous, list) else []
                headers["x-shovelled"] = [dict(self.forward_table), *chain]
            stamp = int(time.time())
            if d.add_timestamp_header:
                # RabbitMQ sends a long (64-bit, 'l'); pamqp picks the smallest integer
                # type, so a marker too big for 32 bits is encoded and then swapped
                headers["x-shovelled-timestamp"] = _LONG_MARK + stamp
            props.headers = headers
            raw = encode_properties(props)
            if d.add_timestamp_header:
                raw = raw.replace(b"l" + struct.pack(">q", _LONG_MARK + stamp),
                                  b"l" + struct.pack(">q", stamp), 1)
            return exchange, routing_key, raw
        return exchange, routing_key, encode_properties(props)

    # ------------------------------------------------------------------ destination side
    def on_confirm(self, seq: int, multiple: bool, ack: bool) -> None:
        by_seq = self.by_seq
        if multiple:
            while by_seq:
                first = next(iter(by_seq))
                if first > seq:
                    break
                self._settle(by_seq.pop(first), ack)
        else:
            tag = by_seq.pop(seq, None)
            if tag is not None:
                self._settle(tag, ack)
        self.settle_ready.set()

    def _settle(self, tag: int, ack: bool) -> None:
        if tag not in self.outstanding:
            return
        if ack:
            self.outstanding[tag] = True
            self.sent.pop(tag, None)
            if self.first_seq is not None:
                self.first_seq.pop(tag, None)
            if self.attempts.pop(tag, None) is not None:
                self.retry_backoff.reset()  # a refused one went in: the destination is back
        else:
            self.refused.append(tag)  # stays pending at the source: sent again later

    async def settler(self) -> None:
        """Ack (multiple) the settled run at the head; schedule the refused ones again."""
        out = self.outstanding
        while True:
            # wait first, then clear: a confirm that came before this task first ran (a
            # destination on this node confirms a transient message inside the publish)
            # must not be cleared unseen
            await self.settle_ready.wait()
            self.settle_ready.clear()
            if self.failure is not None:
                raise self.failure  # gave up on a refused message: the attempt ends
            if self.refused and self.retry_task is None:
                self.retry_task = asyncio.ensure_future(self.retry())
            last = None
            acked = 0
            while out:
                tag, state = next(iter(out.items()))
                if state is None:
                    break
                out.popitem(last=False)
                if state:
                    last = tag
                    acked += 1
            if last is not None:
                self.src.ack(last, multiple=True)
            self.count(acked)

    async def retry(self) -> None:
        """Publish the refused messages again after a backoff, marked with the try
        number; past MAX_PUBLISH_ATTEMPTS for one of them, end the attempt (the source
        requeues what is unacked, and the shovel starts over after its own backoff)."""
        try:
            while self.refused:
                delay = self.retry_backoff.next()
                log.warning("shovel %s/%s: the destination refused %d message(s); "
                            "publishing them again in %.2fs", self.defn.vhost,
                            self.defn.name, len(self.refused), delay)
                await asyncio.sleep(delay)
                tags, self.refused = self.refused, []
                batch: list[Message] = []
                first = self.first_seq
                for tag in tags:
                    tries = self.attempts[tag] = self.attempts.get(tag, 1) + 1
                    if tries > MAX_PUBLISH_ATTEMPTS:
                        raise ConnectionError(
                            f"the destination refused a message {MAX_PUBLISH_ATTEMPTS} times;"
                            " starting over")
                    exchange, routing_key, raw, body = self.sent[tag]
                    batch.append((exchange, routing_key, mark_retry(
                        raw, tries, None if first is None else first.get(tag)), body))
                seq = self.dest.seq + 1
                for i, tag in enumerate(tags):
                    self.by_seq[seq + i] = tag
                self.runner.publish_retries += len(batch)
                await self.dest.publish_many(batch)
        except (ConnectionError, OSError) as exc:
            self.failure = exc
            self.settle_ready.set()
        finally:
            self.retry_task = None
            if self.refused:
                self.settle_ready.set()  # more came meanwhile: scheduled again

    def count(self, n: int) -> None:
        if not n:
            return
        self.runner.forwarded += n
        if self.remaining is not None:
            self.remaining -= n
            self.taken -= n
            if self.remaining <= 0:
                raise Completed


def _local_vhost(uri: str) -> str | None:
    """The vhost of a URI that names this node (``amqp://`` without a host; the path
    names the vhost, ``/`` by default), or None for any other broker."""
    parts = urlsplit(uri)
    if parts.hostname:
        return None
    return unquote(parts.path[1:]) if len(parts.path) > 1 else "/"


def _describe(exc: Any) -> str:
    """A reason for the status: the exception, with any URI credentials removed."""
    if isinstance(exc, TimeoutError):
        text = "TimeoutError: no answer in time"
    elif isinstance(exc, BaseException):
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    else:
        text = str(exc)
    return _CREDENTIALS.sub(r"\1", text)
