"""The chaos test's clients: reconnecting confirmed publishers and acking consumers
over raw AMQP connections (bench.loadgen.Conn), as a careful application would write
them: a publisher re-sends whatever was not confirmed (nacked, or in flight when its
connection went) on its next connection; a consumer acks as it goes and consumes again
elsewhere when its node goes.

Every send of a message is told apart: the body is ``queue|number|attempt``. The
number says which message (what "lost" counts), the attempt which send of it (a
message re-sent after a lost confirm is a second message to the broker, not a
duplicate delivery).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header

from bench.loadgen import Conn, ProtocolError

IO_TIMEOUT = 5.0  # a node that answers nothing for this long is treated as gone
PERSISTENT = commands.Basic.Properties(delivery_mode=2)
ClientError = (OSError, ProtocolError, TimeoutError, ValueError)

Urls = Callable[[], list[str]]  # the AMQP URLs of the nodes a client may use now


def body_of(queue: str, number: int, attempt: int) -> bytes:
    return f"{queue}|{number}|{attempt}".encode()


def parse_body(data: bytes) -> tuple[str, int, int]:
    queue, number, attempt = data.decode().rsplit("|", 2)
    return queue, int(number), int(attempt)


def publish_frames(ch: int, queue: str, data: bytes) -> bytes:
    return b"".join((
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), ch),
        frame.marshal(header.ContentHeader(0, len(data), PERSISTENT), ch),
        frame.marshal(pbody.ContentBody(data), ch)))


def connect(urls: Urls, rng: random.Random) -> Conn:
    """A connection to one of the nodes that are up (tried in a random order)."""
    choices = urls()
    rng.shuffle(choices)
    last: BaseException | None = None
    for url in choices:
        try:
            return Conn(url, timeout=IO_TIMEOUT)
        except ClientError as exc:
            last = exc
    raise OSError(f"no node accepted a connection: {last}")


@dataclass
class Ledger:
    """What one queue's clients saw: confirmed message numbers and every delivery."""

    queue: str
    confirmed: set[int] = field(default_factory=set)
    nacks: int = 0
    resent: int = 0
    # every delivery: (number, attempt, redelivered)
    delivered: list[tuple[int, int, bool]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)
    probes: set[int] = field(default_factory=set)  # numbers of the post-heal probes
    confirmed_at: dict[int, float] = field(default_factory=dict)  # number -> monotonic
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, number: int, attempt: int, redelivered: bool) -> None:
        with self.lock:
            self.delivered.append((number, attempt, redelivered))
            self.seen.add(number)

    def lost(self) -> list[int]:
        with self.lock:
            return sorted(self.confirmed - self.seen)

    def bad_duplicates(self) -> list[tuple[int, int]]:
        """Sends delivered again without redelivered=true."""
        first: set[tuple[int, int]] = set()
        out = []
        with self.lock:
            for number, attempt, redelivered in self.delivered:
                key = (number, attempt)
                if key in first and not redelivered:
                    out.append(key)
                first.add(key)
        return out


class _Reconnecting(threading.Thread):
    """A client thread: one session (a connection) after another until told to stop;
    what ends a session unexpectedly is kept in ``error`` for the driver."""

    def __init__(self, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.stopping = threading.Event()
        self.interruptions = 0  # sessions ended by a connection error
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self._session()
                except ClientError:
                    self.interruptions += 1
                    time.sleep(0.3)
        except BaseException as exc:  # reported by the driver
            self.error = exc

    def _session(self) -> None:
        raise NotImplementedError


def settled(outstanding: dict[int, int], fr: Any) -> list[int]:
    """The message numbers a basic.ack or basic.nack answers (taken out of
    ``outstanding``: delivery tag -> number)."""
    tags = [fr.delivery_tag] if not fr.multiple else \
        [t for t in outstanding if t <= fr.delivery_tag]
    return [n for n in (outstanding.pop(t, -1) for t in tags) if n >= 0]


class Publisher(_Reconnecting):
    """Publishes numbered persistent messages to ``queue`` with confirms until told to
    stop, at about ``rate`` messages a second, re-sending on its next connection what
    was nacked or unanswered."""

    def __init__(self, ledger: Ledger, urls: Urls, rng: random.Random, rate: float = 100.0,
                 window: int = 200, batch: int = 20) -> None:
        super().__init__(f"pub-{ledger.queue}")
        self.ledger = ledger
        self.urls = urls
        self.rng = rng
        self.rate = rate
        self.window = window
        self.batch = batch
        self.next_number = 0
        self.attempt = 0
        self.resend: list[int] = []  # numbers to send again

    def _session(self) -> None:
        conn = connect(self.urls, self.rng)
        outstanding: dict[int, int] = {}  # delivery tag -> number
        try:
            conn.sock.settimeout(IO_TIMEOUT)
            ch = conn.open_channel(1)
            conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
            seq = 0
            while not self.stopping.is_set():
                numbers = self.resend[:self.batch]
                del self.resend[:len(numbers)]
                self.ledger.resent += len(numbers)
                while len(numbers) < self.batch:
                    numbers.append(self.next_number)
                    self.next_number += 1
                out = bytearray()
                for number in numbers:
                    seq += 1
                    self.attempt += 1
                    outstanding[seq] = number
                    out += publish_frames(ch, self.ledger.queue,
                                          body_of(self.ledger.queue, number, self.attempt))
                conn.sock.sendall(out)
                while len(outstanding) > self.window - self.batch:
                    self._answer(conn, outstanding)
                time.sleep(self.batch / self.rate)
            deadline = time.monotonic() + IO_TIMEOUT * 2
            while outstanding and time.monotonic() < deadline:
                self._answer(conn, outstanding)
        finally:
            self.resend += sorted(outstanding.values())
            with contextlib.suppress(Exception):
                conn.sock.close()

    def _answer(self, conn: Conn, outstanding: dict[int, int]) -> None:
        _ch, fr = conn.read_frame()
        if isinstance(fr, commands.Basic.Ack | commands.Basic.Nack):
            for number in settled(outstanding, fr):
                if isinstance(fr, commands.Basic.Ack):
                    with self.ledger.lock:
                        self.ledger.confirmed.add(number)
                        self.ledger.confirmed_at[number] = time.monotonic()
                else:
                    self.ledger.nacks += 1
                    self.resend.append(number)
        elif isinstance(fr, commands.Channel.Close | commands.Connection.Close):
            raise ProtocolError(f"closed by the broker: {fr.reply_code} {fr.reply_text}")


def publish_once(urls: Urls, rng: random.Random, ledger: Ledger, numbers: list[int],
                 attempt_base: int, timeout: float, declare: dict[str, Any] | None = None,
                 passive: bool = False) -> int:
    """One connection: (declare the queue, or with ``passive`` check that it exists:
    a publish to a missing queue is confirmed too, as unroutable; then) publish
    ``numbers`` with confirms and wait for their answers up to ``timeout``; how many
    were confirmed. Raises what the connection or the declare raised."""
    conn = connect(urls, rng)
    try:
        conn.sock.settimeout(min(IO_TIMEOUT, timeout))
        ch = conn.open_channel(1)
        if declare is not None or passive:
            conn.rpc(ch, commands.Queue.Declare(queue=ledger.queue, durable=True,
                                                passive=passive, arguments=declare or {}),
                     commands.Queue.DeclareOk)
        conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        outstanding: dict[int, int] = {}
        out = bytearray()
        for i, number in enumerate(numbers, 1):
            outstanding[i] = number
            out += publish_frames(ch, ledger.queue,
                                  body_of(ledger.queue, number, attempt_base + i))
        conn.sock.sendall(out)
        deadline = time.monotonic() + timeout
        confirmed = 0
        while outstanding and time.monotonic() < deadline:
            _ch, fr = conn.read_frame()
            if isinstance(fr, commands.Basic.Ack | commands.Basic.Nack):
                for sent in settled(outstanding, fr):
                    if isinstance(fr, commands.Basic.Ack):
                        with ledger.lock:
                            ledger.confirmed.add(sent)
                            ledger.confirmed_at[sent] = time.monotonic()
                        confirmed += 1
            elif isinstance(fr, commands.Channel.Close | commands.Connection.Close):
                raise ProtocolError(f"closed by the broker: {fr.reply_code} {fr.reply_text}")
        return confirmed
    finally:
        with contextlib.suppress(Exception):
            conn.sock.close()


class Consumer(_Reconnecting):
    """Consumes ``queues`` (one channel each) with a prefetch, acking in batches, and
    consumes again through another node when its connection goes."""

    def __init__(self, ledgers: list[Ledger], urls: Urls, rng: random.Random,
                 prefetch: int = 200) -> None:
        super().__init__("consumer-" + "+".join(x.queue for x in ledgers))
        self.ledgers = {x.queue: x for x in ledgers}
        self.urls = urls
        self.rng = rng
        self.prefetch = prefetch
        self.kick = threading.Event()  # set: reconnect (through another node, maybe)

    def _session(self) -> None:
        conn = connect(self.urls, self.rng)
        try:
            conn.sock.settimeout(IO_TIMEOUT)
            for i, queue in enumerate(self.ledgers, 1):
                ch = conn.open_channel(i)
                conn.rpc(ch, commands.Basic.Qos(prefetch_count=self.prefetch),
                         commands.Basic.QosOk)
                conn.rpc(ch, commands.Basic.Consume(queue=queue, consumer_tag=queue),
                         commands.Basic.ConsumeOk)
            conn.sock.settimeout(0.3)
            last_tag: dict[int, int] = {}
            unacked: dict[int, int] = {}
            deliver: dict[int, commands.Basic.Deliver] = {}
            while not self.stopping.is_set():
                try:
                    ch, fr = conn.read_frame()
                except TimeoutError:
                    self._ack(conn, last_tag, unacked)
                    if self.kick.is_set():  # the driver asks for a fresh connection
                        self.kick.clear()
                        raise OSError("consuming again elsewhere") from None
                    continue
                if isinstance(fr, commands.Basic.Deliver):
                    deliver[ch] = fr
                elif isinstance(fr, pbody.ContentBody):
                    d = deliver[ch]
                    queue, number, attempt = parse_body(fr.value)
                    self.ledgers[queue].got(number, attempt, bool(d.redelivered))
                    assert d.delivery_tag is not None
                    last_tag[ch] = d.delivery_tag
                    unacked[ch] = unacked.get(ch, 0) + 1
                    if unacked[ch] >= 50:
                        self._ack(conn, last_tag, unacked)
                elif isinstance(fr, commands.Basic.Cancel | commands.Channel.Close |
                                commands.Connection.Close):
                    raise ProtocolError(f"consumer stopped by the broker: {fr}")
            self._ack(conn, last_tag, unacked)
        finally:
            with contextlib.suppress(Exception):
                conn.sock.close()

    @staticmethod
    def _ack(conn: Conn, last_tag: dict[int, int], unacked: dict[int, int]) -> None:
        for ch, n in list(unacked.items()):
            if n:
                conn.send(ch, commands.Basic.Ack(delivery_tag=last_tag[ch], multiple=True))
                unacked[ch] = 0
