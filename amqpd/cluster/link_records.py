"""The link's batches as the broker's own objects, and the loops over their records:
compiled with the hot path (:mod:`amqpd.hotpath`).

Why. Every message that crosses between two workers of a node (docs/workers.md), or
between two cluster nodes, is one record of a ``PUBLISHES`` frame to its queue's leader
and one of a ``DELIVERS`` frame back to its consumer's node (:mod:`link_wire`'s
batches). The profile of two workers crossing (bench/RESULTS-workers.md) found the
reader building a tuple per record, then interpreted loops unpacking it again into a
``Message`` (and a ``QueueEntry``), each record costing several Python calls. Here the
reader builds the ``Message`` (leader) or the ``QueueEntry`` (consumer's node) straight
from the frame's bytes, and the per-record loops that hand them to the broker are
compiled plain functions, making native calls into the compiled broker (the remote queue
classes stay interpreted: they are subclassed per queue type at run time). The records,
their order and every check are as :func:`link_wire._records` reads them (the same
refusals for a record running past its frame or a name that is not UTF-8); what
changes is only what the fields become.

Used by :class:`amqpd.cluster.link.Link` (its reader's ``batches``), by
:class:`~amqpd.cluster.remote_served.Served` (publishes) and by
:class:`~amqpd.cluster.remote_consume.RemoteConsume` (deliveries).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from amqpd.broker.api import Consumer, Message, QueueEntry, QueueType
from amqpd.cluster import link_wire as W

if TYPE_CHECKING:
    from amqpd.broker.publish import Publisher

OnConfirm = Callable[[BaseException | None], None]

_PUBLISHES_RECORD: Final = W.PUBLISHES_RECORD
_DELIVERS_RECORD: Final = W.DELIVERS_RECORD
_U32: Final = struct.Struct(">I")  # a DELIVERS frame's consumer id


class Publishes:
    """A ``PUBLISHES`` frame's records, in order: each publish's sequence number (0:
    unconfirmed) and its message, as the leader enqueues it."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.messages: list[Message] = []

    def __len__(self) -> int:
        return len(self.messages)


class Delivers:
    """A ``DELIVERS`` frame's records, in order: each delivery as the consumer's node
    buffers it (its ``seq`` the leader's delivery id until :func:`arrive` adds the
    stream's base), the leader's store position + 1 of each (0: not sent), and the
    leader's ready count after the last."""

    def __init__(self) -> None:
        self.entries: list[QueueEntry] = []
        self.positions: list[int] = []
        self.ready = 0

    def __len__(self) -> int:
        return len(self.entries)

    def ids(self) -> list[int]:
        """The leader's delivery ids (before :func:`arrive`): what goes back in a
        ``REQUEUE`` when no consumer here takes them."""
        return [entry.seq for entry in self.entries]


# A record's head read byte by byte: compiled, each ``buf[i]`` is a native read and the
# shifts native arithmetic, where ``Struct.unpack_from`` was a Python method call
# building a tuple of boxed ints per record (a ``py-spy --native`` profile of two
# workers crossing put ``read_publishes``' own time at ~5 % of the event loop's samples
# that way). The layouts are link_wire's PUBLISHES_RECORD and DELIVERS_RECORD
# (tests/unit/cluster/test_link_records.py reads what they pack). The callers check that
# the head lies within the frame first.
def _u16(buf: bytes, pos: int) -> int:
    return (buf[pos] << 8) | buf[pos + 1]


def _u32(buf: bytes, pos: int) -> int:
    return (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]


def _u64(buf: bytes, pos: int) -> int:
    return (_u32(buf, pos) << 32) | _u32(buf, pos + 4)


def _same(buf: bytes, pos: int, raw: bytes) -> bool:
    """Whether ``buf`` holds ``raw`` at ``pos`` (compared in place: no slice made;
    mypyc turns ``all`` over a generator into a plain loop)."""
    return all(buf[pos + i] == raw[i] for i in range(len(raw)))


def read_batch(kind: int, buf: bytes, pos: int, end: int) -> list[Any]:
    """The fields of a ``PUBLISHES`` (a :class:`Publishes`) or ``DELIVERS`` (the
    consumer id, a :class:`Delivers`) whose body is ``buf[pos:end]``: the reader's
    ``batches`` (:class:`link_wire.FrameReader`)."""
    try:
        if kind == W.PUBLISHES:
            return [read_publishes(buf, pos, end)]
        if end - pos < 4:
            raise W.WireError(f"malformed frame {kind}: no consumer id")
        cid: int = _U32.unpack_from(buf, pos)[0]
        return [cid, read_delivers(buf, pos + 4, end)]
    except UnicodeDecodeError as exc:
        raise W.WireError(f"malformed record: {exc}") from exc


def read_publishes(buf: bytes, pos: int, end: int) -> Publishes:
    """The records of a ``PUBLISHES`` frame in ``buf[pos:end]``. A batch's records
    nearly always share their exchange and routing key (one queue's publishes), so a
    name is decoded only when its bytes differ from the record before's."""
    out = Publishes()
    seqs = out.seqs
    messages = out.messages
    size = _PUBLISHES_RECORD.size
    raw_ex = b""
    exchange = ""
    raw_key = b""
    key = ""
    while pos < end:
        if pos + size > end:
            raise W.WireError("a record runs past its frame")
        # seq:u64 persistent:u8 |exchange|:u16 |key|:u16 |props|:u32 |body|:u32
        seq = _u64(buf, pos)
        persistent = buf[pos + 8]
        ne = _u16(buf, pos + 9)
        nk = _u16(buf, pos + 11)
        np_ = _u32(buf, pos + 13)
        nb = _u32(buf, pos + 17)
        pos += size
        if pos + ne + nk + np_ + nb > end:
            raise W.WireError("a record runs past its frame")
        if ne != len(raw_ex) or not _same(buf, pos, raw_ex):
            raw_ex = buf[pos:pos + ne]
            exchange = raw_ex.decode()
        pos += ne
        if nk != len(raw_key) or not _same(buf, pos, raw_key):
            raw_key = buf[pos:pos + nk]
            key = raw_key.decode()
        pos += nk
        props = buf[pos:pos + np_]
        pos += np_
        body = buf[pos:pos + nb]
        pos += nb
        seqs.append(seq)
        messages.append(Message(exchange, key, props, body, persistent != 0))
    return out


def read_delivers(buf: bytes, pos: int, end: int) -> Delivers:
    """The records of a ``DELIVERS`` frame in ``buf[pos:end]`` (names decoded as
    :func:`read_publishes` decodes them). The message's ``persistent`` comes from its
    properties, as for a ``DELIVER``."""
    out = Delivers()
    entries = out.entries
    positions = out.positions
    size = _DELIVERS_RECORD.size
    raw_ex = b""
    exchange = ""
    raw_key = b""
    key = ""
    ready = 0
    while pos < end:
        if pos + size > end:
            raise W.WireError("a record runs past its frame")
        # delivery:u64 redelivered:u8 ready:u64 position:u64 |exchange|:u16 |key|:u16
        # |props|:u32 |body|:u32
        delivery = _u64(buf, pos)
        redelivered = buf[pos + 8]
        ready = _u64(buf, pos + 9)
        position = _u64(buf, pos + 17)
        ne = _u16(buf, pos + 25)
        nk = _u16(buf, pos + 27)
        np_ = _u32(buf, pos + 29)
        nb = _u32(buf, pos + 33)
        pos += size
        if pos + ne + nk + np_ + nb > end:
            raise W.WireError("a record runs past its frame")
        if ne != len(raw_ex) or not _same(buf, pos, raw_ex):
            raw_ex = buf[pos:pos + ne]
            exchange = raw_ex.decode()
        pos += ne
        if nk != len(raw_key) or not _same(buf, pos, raw_key):
            raw_key = buf[pos:pos + nk]
            key = raw_key.decode()
        pos += nk
        props = buf[pos:pos + np_]
        pos += np_
        body = buf[pos:pos + nb]
        pos += nb
        entries.append(QueueEntry(Message(exchange, key, props, body), delivery,
                                  redelivered != 0))
        positions.append(position)
    out.ready = ready
    return out


def enqueue_publishes(publisher: Publisher, q: QueueType, batch: Publishes, link: Any,
                      stream: int, confirmer: Callable[[Any, int, int], OnConfirm]) -> None:
    """The leader's side of a ``PUBLISHES`` frame (``Served.publish_many``): each
    message into local queue ``q`` through the publish pipeline's tail, in order; a
    confirmed one (its seq not 0) answered by ``confirmer(link, stream, seq)``'s
    callback, or refused at once if the queue was deleted meanwhile."""
    seqs = batch.seqs
    for i, message in enumerate(batch.messages):
        seq = seqs[i]
        if q.deleted:
            if seq:
                link.send(W.encode_confirm(stream, seq, False))
            continue
        publisher.enqueue_forwarded(q, message, confirmer(link, stream, seq) if seq else None)


def arrive(batch: Delivers, base: int, buffer: deque[QueueEntry],
           owner: dict[int, Any] | None, state: object, positions: dict[int, int]) -> None:
    """A ``DELIVERS`` frame's deliveries into its consumer's buffer here
    (``RemoteConsume.deliver_many``), in order: each entry's id made this node's (the
    stream's ``base`` added); with ``owner`` (the consumer acks), each recorded as
    ``state``'s and a quorum queue's store position kept (RECLAIM names it after a
    failover)."""
    entries = batch.entries
    if owner is None:
        for entry in entries:
            entry.seq += base
    else:
        at = batch.positions
        for i, entry in enumerate(entries):
            seq = entry.seq + base
            entry.seq = seq
            owner[seq] = state
            position = at[i]
            if position:
                positions[seq] = position - 1
    buffer.extend(entries)


def hand_out(queue: QueueType, consumer: Consumer, buffer: deque[QueueEntry], cid: int,
             cons: dict[int, Any]) -> int:
    """Hand ``consumer``'s waiting deliveries to its channel while it takes them
    (``RemoteConsume.dispatch``, a queue that is not a stream); how many went. Stops
    when consumer ``cid`` is gone from ``cons`` (its channel closed while
    delivering). ``Consumer.can_receive`` and ``Consumer.deliver`` ask its channel
    (natively when it is an AMQP channel)."""
    n = 0
    while buffer and consumer.can_receive():
        entry = buffer.popleft()
        consumer.deliver(queue, entry)
        n += 1
        if cid not in cons:
            break
    return n


def add_message(frame: bytearray | None, link: Any, stream: int, seq: int,
                message: Message, body: bytes) -> bytearray:
    """Queue one publish on ``link``: joins ``frame`` (a ``PUBLISHES`` frame of
    ``stream``) while that is the last frame queued on the link and not full (so
    nothing sent meanwhile is overtaken), else starts a frame and sends it; the frame
    it is in (``RemoteQueue.forward``)."""
    queued = link.queued
    if frame is None or not queued or queued[-1] is not frame or not W.add_publish(
            frame, seq, message.persistent, message.exchange, message.routing_key,
            message.properties, body):
        frame = W.publishes(stream, seq, message.persistent, message.exchange,
                            message.routing_key, message.properties, body)
        link.send(frame)
    return frame


def add_delivery(frame: bytearray | None, link: Any, stream: int, cid: int, delivery: int,
                 redelivered: bool, ready: int, message: Message, body: bytes,
                 position: int) -> bytearray:
    """Queue one delivery to consumer ``cid`` on ``link``, as :func:`add_message`
    queues a publish: joins ``frame`` (that consumer's ``DELIVERS`` frame) while it is
    the last frame queued and not full, else starts one; the frame it is in
    (``_Proxy.deliver`` on the leader)."""
    queued = link.queued
    if frame is None or not queued or queued[-1] is not frame or not W.add_deliver(
            frame, delivery, redelivered, ready, message.exchange, message.routing_key,
            message.properties, body, position):
        frame = W.delivers(stream, cid, delivery, redelivered, ready, message.exchange,
                           message.routing_key, message.properties, body, position)
        link.send(frame)
    return frame


def send_unsent(unsent: deque[tuple[int, bool, str, str, bytes, bytes]], credit: int,
                frame: bytearray | None, link: Any, stream: int) -> tuple[int, bytearray | None]:
    """Send the publishes waiting for credit, oldest first, while ``credit`` lasts,
    batched as :func:`add_message` batches them (``RemoteQueue._got_credit``); the credit
    left and the frame the last one is in."""
    queued = link.queued
    # joining ``frame`` needs it to be the last frame queued; nothing else is sent while
    # this runs, so once true it stays true (each new frame is sent, so last, at once)
    joinable = frame is not None and bool(queued) and queued[-1] is frame
    while unsent and credit > 0:
        credit -= 1
        seq, persistent, exchange, key, props, body = unsent.popleft()
        if frame is None or not joinable or not W.add_publish(
                frame, seq, persistent, exchange, key, props, body):
            frame = W.publishes(stream, seq, persistent, exchange, key, props, body)
            link.send(frame)
            joinable = True
    return credit, frame


__all__ = ["Delivers", "Publishes", "add_delivery", "add_message", "arrive", "enqueue_publishes",
           "hand_out", "read_batch", "read_delivers", "read_publishes", "send_unsent"]
