"""A retried publish goes only into the queues of its route that did not take an earlier try.

Over AMQP 0-9-1 a publisher hears one confirm per publish: when an exchange routes a
message to several queues and one of them refuses it (a queue at its ``x-max-length``
with ``reject-publish``, a quorum queue without a leader, a mirrored queue taking over),
the publisher gets a ``basic.nack`` and cannot tell which queue refused. A link that
retries (a shovel whose destination is this broker over AMQP) then publishes through the
exchange again, and every queue that took the first try gets one more copy per retry
(issue 29).

A client that wants better announces the capability :data:`CAPABILITY` in its
``connection.start-ok`` client properties (amqpd offers it in its server properties).
On the channels of that connection, in confirm mode, this module takes the publishes:

- a publish whose route has several queues is published once per queue (the pipeline's
  ``only``), so each queue's answer is known; the publisher's confirm comes once all
  answered, an ack when all took it, a nack otherwise (one queue or none: the ordinary
  publish);
- for a nacked publish, the names of the queues that took it are kept, under its
  confirm sequence number, for at most :data:`KEEP_AGE` seconds and the last
  :data:`KEEP_COUNT` nacked publishes of the channel (the oldest forgotten first);
- a publish carrying the header :data:`HEADER` (a long: the sequence number of the
  first try on this channel) is a retry: it goes only into the queues of its current
  route missing from that record, and is acked at once when none remain. The header
  is removed before the message is stored (a consumer, or a next link, never sees it).
  The record also holds a checksum of the body: a header that names a publish with a
  different body (a message that somehow kept the header from elsewhere) is routed to
  the whole route, as is a retry whose record was forgotten (age, count) or made on
  another channel or connection (a link that reconnected): a copy then, never a loss.

Why per channel: sequence numbers are per channel, the memory goes with the channel
(closed: freed), and a queue led by another node of a cluster answers through this
node's pipeline (:mod:`amqpd.cluster.remote_queue`), so the node the client is
connected to knows every queue's answer. Ordinary publishes pay one attribute test
(:attr:`amqpd.broker.channel.Channel.retry_routes` is None for every other connection).
"""

from __future__ import annotations

import functools
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from amqpd.broker import reply_to
from amqpd.broker.message import Message
from amqpd.broker.rawprops import encode_table, header_items, join_properties, split_properties
from amqpd.protocol.constants import FLAG_HEADERS_HI, FLAG_REPLY_TO_HI
from amqpd.protocol.errors import PreconditionFailed

if TYPE_CHECKING:
    from amqpd.broker.channel import Channel
    from amqpd.broker.queue_type import QueueType

log = logging.getLogger("amqpd.publish")

CAPABILITY = "publish_retry_of"  # client and server properties' capabilities table
HEADER = "x-publish-retry-of"  # on a retry: the confirm sequence number of its first try
_HEADER_BYTES = HEADER.encode()
KEEP_COUNT = 4096  # nacked publishes remembered per channel (~305 bytes each: 1.25 MB)
KEEP_AGE = 120.0  # seconds a nacked publish is remembered (a shovel retries for ~1.5 min)
_SETS_MAX = 256  # distinct sets of queue names shared between records, per channel


def body_sum(body: bytes) -> tuple[int, int]:
    """What a retry's body must match: its length and CRC-32."""
    return len(body), zlib.crc32(body)


class Kept:
    """The queues that took a nacked publish, its body's checksum, and when it was kept."""

    __slots__ = ("at", "checksum", "queues")

    def __init__(self, queues: frozenset[str], checksum: tuple[int, int], at: float) -> None:
        self.queues = queues
        self.checksum = checksum
        self.at = at


class Memory:
    """The records of nacked publishes, bounded by count and age (oldest first out)."""

    def __init__(self, count: int = KEEP_COUNT, age: float = KEEP_AGE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.count = count
        self.age = age
        self.clock = clock
        self.records: OrderedDict[int, Kept] = OrderedDict()
        self._sets: dict[frozenset[str], frozenset[str]] = {}

    def keep(self, seq: int, queues: frozenset[str], checksum: tuple[int, int]) -> None:
        """Remember that ``queues`` took publish ``seq`` (which was nacked)."""
        sets = self._sets
        shared = sets.get(queues)
        if shared is not None:
            queues = shared
        elif len(sets) < _SETS_MAX:
            sets[queues] = queues
        records = self.records
        now = self.clock()
        records.pop(seq, None)
        records[seq] = Kept(queues, checksum, now)  # the newest at the end
        self._expire(now)
        while len(records) > self.count:
            records.popitem(last=False)

    def take(self, seq: int, checksum: tuple[int, int]) -> frozenset[str] | None:
        """The queues known to hold publish ``seq`` (forgotten here: a retry that is
        nacked again is kept anew), none when unknown or too old, and None when the
        record is of another body (it stays: this publish is no retry of it)."""
        self._expire(self.clock())
        records = self.records
        kept = records.get(seq)
        if kept is None:
            return frozenset()
        if kept.checksum != checksum:
            return None
        del records[seq]
        return kept.queues

    def _expire(self, now: float) -> None:
        records = self.records
        limit = now - self.age
        while records:
            oldest = next(iter(records.values()))
            if oldest.at >= limit:
                break
            records.popitem(last=False)

    def __len__(self) -> int:
        return len(self.records)


class _Publish:
    """One publish split into one per queue: its confirm comes once every part answered."""

    __slots__ = ("checksum", "error", "key", "left", "seq", "taken")

    def __init__(self, key: int, seq: int, taken: frozenset[str], parts: int,
                 checksum: tuple[int, int]) -> None:
        self.key = key  # the first try's sequence number (the record's key)
        self.seq = seq  # this publish's sequence number (what is confirmed)
        self.taken = set(taken)
        self.left = parts
        self.error: BaseException | None = None
        self.checksum = checksum


class RetryRoutes:
    """The publishes of one channel of a connection that announced :data:`CAPABILITY`."""

    def __init__(self, channel: Channel, memory: Memory | None = None) -> None:
        self.channel = channel
        self.memory = memory if memory is not None else Memory()
        self.skipped = 0  # retries every queue of the route already had: acked at once

    def publish(self, exchange: str, routing_key: str, mandatory: bool, properties: bytes,
                body: bytes, seq: int, persistent: bool) -> None:
        """Route publish ``seq`` (confirm mode) per queue, or as a retry of an earlier one."""
        ch = self.channel
        retry_of: int | None = None
        if len(properties) > 1 and properties[0] & FLAG_HEADERS_HI \
                and _HEADER_BYTES in properties:
            retry_of, properties = self._retry_header(properties, seq)
        if retry_of is None and mandatory:
            # a first try: the ordinary path returns it when nothing takes it
            ch._route(exchange, routing_key, mandatory, properties, body, seq, persistent)
            return
        msg = Message(exchange, routing_key, properties, body, persistent)
        if len(properties) > 1 and properties[0] & FLAG_REPLY_TO_HI:
            msg = reply_to.rewrite(ch, msg)
            properties = msg.properties
        publisher = ch.session.broker.publisher
        names = publisher.route_names(ch.vhost, exchange, msg)
        checksum = body_sum(body)
        taken = None if retry_of is None else self.memory.take(retry_of, checksum)
        if taken is None:  # a first try, or a header naming a publish of another body
            retry_of, taken = None, frozenset()
        targets = [n for n in names if n not in taken]
        if not names or (len(names) == 1 and not taken):
            # unroutable, or one queue and nothing taken before: the ordinary publish
            # (mandatory returns an unroutable one); a nack needs no record, a retry
            # goes to the whole route of one
            ch._route(exchange, routing_key, mandatory, properties, body, seq, persistent)
            return
        if not targets:
            ch.vhost.get_exchange(exchange).stat_publish_in += 1  # published, stored nowhere
            self.skipped += 1
            log.debug("publish %d on channel %d: every queue of its route took try %s "
                      "already: acked without a publish", seq, ch.number, retry_of)
            ch.confirm(seq, True)
            return
        state = _Publish(seq if retry_of is None else retry_of, seq, taken, len(targets),
                         checksum)
        reached: list[QueueType] = []
        for name in targets:
            # a fresh Message each time: the pipeline writes its store position into it
            reached += publisher.publish(
                ch.vhost, exchange, Message(exchange, routing_key, properties, body,
                                            persistent),
                ch.session.username, on_confirm=functools.partial(self._part, state, name),
                only=frozenset((name,)))
        # one publish for the exchange's publish_in, as RabbitMQ counts it (each part
        # counted one; publish_out, one per queue, is right as it is)
        ch.vhost.get_exchange(exchange).stat_publish_in -= len(targets) - 1
        ch._credit_flow(reached)

    def _retry_header(self, properties: bytes, seq: int) -> tuple[int | None, bytes]:
        """The retry's first sequence number, and the properties without the header."""
        fields = split_properties(properties)
        items = header_items(fields)
        kept = [(k, v) for k, v in items if k != HEADER]
        if len(kept) == len(items):
            return None, properties  # the bytes were in another field's value
        value = Message("", "", properties, b"").headers.get(HEADER)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < seq:
            log.warning("channel %d: refused publish %d: header %s must be the sequence "
                        "number of an earlier publish on the channel, got %r",
                        self.channel.number, seq, HEADER, value)
            raise PreconditionFailed(
                f"{HEADER} must be the confirm sequence number of an earlier publish on "
                f"this channel (1..{seq - 1}), got {value!r}")
        if kept:
            fields["headers"] = encode_table(kept)
        else:
            del fields["headers"]
        return value, join_properties(fields)

    def _part(self, state: _Publish, name: str, error: BaseException | None) -> None:
        if error is None:
            state.taken.add(name)
        elif state.error is None:
            state.error = error
        state.left -= 1
        if state.left:
            return
        if state.error is None:
            self.channel.confirm(state.seq, True)
            return
        if state.taken:
            self.memory.keep(state.key, frozenset(state.taken), state.checksum)
        self.channel.confirm(state.seq, False)
