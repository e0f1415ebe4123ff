"""Client traffic for the warren tests: publishers with confirms and consumers with
manual acks, each in its own thread with its own pika connection, reconnecting (through
HAProxy) whenever the broker goes away, and recording what they saw.

A publisher never republishes a message it did not get a confirm for: it moves on to
the next sequence number. So any message a consumer sees twice was delivered twice by
the broker, and must then carry redelivered=true. A publisher with ``resend`` does the
opposite, as a reliable producer does: it sends an unconfirmed message again (after
reconnecting), carrying the same ``x-deduplication-header``, until it is confirmed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions

CLIENT_ERRORS = (pika.exceptions.AMQPError, OSError, ConnectionError)


def connect(url: str | list[str], deadline: float) -> pika.BlockingConnection:
    """A connection to ``url`` (or the first of several that takes it: both warren nodes,
    without HAProxy), retried until ``deadline``."""
    urls = [url] if isinstance(url, str) else list(url)
    last: BaseException | None = None
    while time.monotonic() < deadline:
        for one in urls:
            params = pika.URLParameters(one)
            params.socket_timeout = 2.0
            params.blocked_connection_timeout = 60.0
            params.heartbeat = 5
            try:
                return pika.BlockingConnection(params)
            except CLIENT_ERRORS as exc:
                last = exc
        time.sleep(0.1)
    raise TimeoutError(f"no connection to {urls}: {last!r}")


def drain_numbers(url: str | list[str], queue: str, reconnects: int = 5) -> list[int]:
    """Every message left in ``queue``, as the sequence numbers a :class:`Publisher` put
    at the start of its bodies, in queue order: one entry per message the queue held.

    basic.get with manual acks, each acked once recorded. A connection the broker
    closes (a loaded node pausing for a moment) is opened again, up to ``reconnects``
    times; a message got but whose ack may not have arrived comes back redelivered,
    and is then not counted a second time."""
    out: list[int] = []
    unsure: set[int] = set()  # got on a connection that went: their acks may be lost
    for _attempt in range(reconnects + 1):
        conn = connect(url, time.monotonic() + 30)
        got: set[int] = set()
        try:
            ch = conn.channel()
            for _ in range(10_000_000):
                method, _props, body = ch.basic_get(queue, auto_ack=False)
                if method is None:
                    return out
                seq = int(body.split(b":", 1)[0])
                if not (method.redelivered and seq in unsure):
                    out.append(seq)
                got.add(seq)
                ch.basic_ack(method.delivery_tag)
            raise AssertionError("the queue never emptied")
        except CLIENT_ERRORS:
            unsure |= got
            continue
        finally:
            try:
                conn.close()
            except CLIENT_ERRORS:
                pass
    raise AssertionError(f"draining {queue}: the connection went {reconnects + 1} times")


@dataclass
class Publisher:
    url: str | list[str]
    queue: str
    body_size: int = 64
    exchange: str = ""  # "" : straight to ``queue``; else to this exchange, key ``queue``
    resend: bool = False  # re-send the unconfirmed, with an x-deduplication-header
    message_id: bool = False  # give each message a message_id ("{queue}-{seq}")
    confirmed: list[int] = field(default_factory=list)
    confirmed_at: list[float] = field(default_factory=list)  # monotonic, one per confirm
    failed: list[int] = field(default_factory=list)  # nacked or cut off: not confirmed
    nacked: list[float] = field(default_factory=list)  # monotonic time of each nack
    reconnects: int = 0
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Publisher:
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"pub-{self.queue}")
        self.thread.start()
        return self

    def _run(self) -> None:
        seq = 0
        again = False  # resend: seq was not confirmed, it goes once more
        pad = b"x" * self.body_size
        try:
            while not self.stop.is_set():
                conn = connect(self.url, time.monotonic() + 60)
                try:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    while not self.stop.is_set():
                        if not again:
                            seq += 1
                        headers = {"x-deduplication-header": f"msg-{seq}"} if self.resend \
                            else None
                        mid = f"{self.queue}-{seq}" if self.message_id else None
                        try:
                            ch.basic_publish(self.exchange, self.queue, b"%d:" % seq + pad,
                                             pika.BasicProperties(delivery_mode=2,
                                                                  headers=headers,
                                                                  message_id=mid))
                        except pika.exceptions.NackError:
                            self.failed.append(seq)
                            self.nacked.append(time.monotonic())
                            again = self.resend
                            continue
                        except CLIENT_ERRORS:
                            self.failed.append(seq)
                            again = self.resend
                            raise
                        self.confirmed_at.append(time.monotonic())
                        again = False
                        self.confirmed.append(seq)
                except CLIENT_ERRORS:
                    self.reconnects += 1
                finally:
                    try:
                        conn.close()
                    except CLIENT_ERRORS:
                        pass
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(90)


@dataclass
class Consumer:
    url: str | list[str]
    queue: str
    prefetch: int = 50
    seen: list[tuple[int, bool]] = field(default_factory=list)  # (seq, redelivered)
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each of seen
    # the broker's own redelivered flag of each of seen (False: a copy the queue took in)
    broker_redelivered: list[bool] = field(default_factory=list)
    # a delivery that says "maybe a duplicate" otherwise than by redelivered (a header a
    # federation link or a shovel sets): counted as redelivered
    flagged: Callable[[Any], bool] | None = None
    # what ``describe`` says of each of seen (kept when given): to tell copies apart
    # when a check fails (the broker port, the hops a federation link or shovel added)
    describe: Callable[[Any, Any], str] | None = None
    described: list[str] = field(default_factory=list)
    reconnects: int = 0
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Consumer:
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"con-{self.queue}")
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                conn = connect(self.url, time.monotonic() + 60)
                try:
                    ch = conn.channel()
                    ch.basic_qos(prefetch_count=self.prefetch)
                    for method, props, body in ch.consume(self.queue, auto_ack=False,
                                                          inactivity_timeout=0.2):
                        if self.stop.is_set():
                            break
                        if method is None:
                            continue
                        seq = int(body.split(b":", 1)[0])
                        again = bool(method.redelivered) or (
                            self.flagged is not None and self.flagged(props))
                        self.arrivals.append(time.monotonic())
                        self.broker_redelivered.append(bool(method.redelivered))
                        self.seen.append((seq, again))
                        if self.describe is not None:
                            self.described.append(self.describe(conn, props))
                        ch.basic_ack(method.delivery_tag)
                except CLIENT_ERRORS:
                    self.reconnects += 1
                finally:
                    try:
                        conn.close()
                    except CLIENT_ERRORS:
                        pass
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)


def check_delivery(queue: str, publisher: Publisher, consumer: Consumer) -> None:
    """Every confirmed message consumed; repeats only with redelivered=true; the first
    delivery of each message in publish order."""
    seen_first: list[int] = []
    seen: set[int] = set()
    for seq, redelivered in consumer.seen:
        if seq in seen:
            assert redelivered, f"{queue}: message {seq} delivered again without redelivered"
            continue
        seen.add(seq)
        seen_first.append(seq)
    missing = sorted(set(publisher.confirmed) - seen)
    assert not missing, (f"{queue}: {len(missing)} confirmed messages never consumed, "
                         f"first {missing[:10]}")
    out_of_order = [(a, b) for a, b in itertools.pairwise(seen_first) if b < a]
    assert not out_of_order, f"{queue}: order broken at {out_of_order[:5]}"
