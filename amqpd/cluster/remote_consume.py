"""A remote queue's consumers and deliveries (issue 28's split of remote_queue.py):
part of :class:`amqpd.cluster.remote_queue.RemoteQueue`.

The leader attaches a consumer of its own for each consumer here, or refuses it, and
the client's consume-ok waits for that answer (:meth:`RemoteConsume.consume_for`,
bounded by ``ANSWER_TIMEOUT``). A stream's consumer on a node holding one of its
members reads that copy here instead (:mod:`amqpd.cluster.stream_local`): consume-ok
at once, deliveries up to the commit point, nothing asked of the leader. It delivers
within the credit this node grants (the consumer's prefetch, or
:data:`DELIVERY_WINDOW`); the deliveries wait here in order
until the client's channel may take them (:meth:`RemoteConsume.dispatch`). basic.get is
a request whose answer comes later (:meth:`RemoteConsume.fetch_for`). Theory of
operation: :mod:`amqpd.cluster.remote_queue`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from amqpd.broker.api import (
    AccessRefused,
    Consumer,
    Message,
    NotFound,
    NotImplemented_,
    QueueEntry,
    ResourceLocked,
    decode_record,
)
from amqpd.cluster import link_wire as W
from amqpd.cluster.link_records import Delivers, arrive, hand_out
from amqpd.cluster.remote_state import (
    RemoteQueueState,
    _RemoteConsumer,
    home_node_down,
    jsonable,
)
from amqpd.cluster.stream_local import LocalRead, local_start, usable
from amqpd.cluster.stream_wire import delivered_offset

log = logging.getLogger("amqpd.cluster.queues")

DELIVERY_WINDOW: Final = 500  # deliveries in flight to a consumer without a prefetch
# a consume (consume-ok) and a declare's counts wait this long at most for the leader
ANSWER_TIMEOUT: Final = 5.0
_NONE: Final = object()


class RemoteConsume(RemoteQueueState):
    """The consumer side of a remote queue (module docstring)."""

    # -- deliveries ----------------------------------------------------------------------
    def take(self) -> QueueEntry | None:
        return None  # deliveries arrive from the leader (dispatch)

    def defers_get(self) -> bool:
        return True  # basic.get is answered once the leader has (fetch_for)

    def fetch_for(self, channel: Any, no_ack: bool) -> None:
        if self.real_type == "stream":  # refused here, as the leader's stream refuses it
            raise NotImplemented_(f"basic.get not supported by stream queues queue "
                                  f"'{self.name}' in vhost '{self.vhost.name}'")
        if not self.available:
            raise self._unavailable()
        self._next_req += 1
        self._gets[self._next_req] = (channel, no_ack)
        self._send(W.encode(W.GET, self.stream, self._next_req, no_ack))

    def _got(self, req: int, delivery: int, redelivered: bool, ready: int,
             exchange: str, key: str, props: bytes, body: bytes, position: int) -> None:
        channel, no_ack = self._gets.pop(req, (None, True))
        self.ready_count = ready
        entry = QueueEntry(Message(exchange, key, props, body), self._base + delivery,
                           bool(redelivered))
        if channel is None or channel.closed:
            if not no_ack:
                self._send(W.encode(W.REQUEUE, self.stream, [delivery]))
            return
        if not no_ack:
            self._owner[entry.seq] = None
            if position:
                self._pos[entry.seq] = position - 1
        channel.answer_get(self, entry, no_ack, ready)

    def _got_empty(self, req: int) -> None:
        channel, _ = self._gets.pop(req, (None, True))
        if channel is not None and not channel.closed:
            channel.answer_get(self, None, True, 0)


    # -- consumers -----------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._next_cid += 1
        state = _RemoteConsumer(self._next_cid, consumer)
        self._cons[state.id] = state
        self._by_consumer[id(consumer)] = state
        self._consume(state)

    def consume_for(self, consumer: Consumer,
                    answer: Callable[[BaseException | None], None]) -> None:
        """basic.consume: the leader attaches its stand-in and answers (CONSUMED)
        before any delivery; ``answer`` is called then (consume-ok), or with the
        leader's refusal (403 ACCESS_REFUSED for an exclusive consumer there), or with
        the 404 of a leader out of reach when the link goes or ANSWER_TIMEOUT passes."""
        self.add_consumer(consumer)
        state = self._by_consumer[id(consumer)]
        if state.local is not None:  # read here: nothing to wait for
            answer(None)
            return
        state.answer = answer
        state.timer = asyncio.get_running_loop().call_later(
            ANSWER_TIMEOUT, self._consume_timeout, state)

    def _consumed(self, cid: int, code: int, text: str) -> None:
        state = self._cons.get(cid)
        if state is None:
            return  # cancelled meanwhile (a CANCEL is on the way)
        answer = state.answer
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.answer = None
        if code:
            error = {403: AccessRefused, 405: ResourceLocked}.get(code, NotFound)(text)
            self._forget_consumer(state)  # never attached on the leader
            if answer is not None:
                answer(error)
            else:  # consuming again after a failover, refused by the new leader
                state.consumer.channel.consumer_cancelled_by_server(state.consumer)
            return
        if answer is not None:
            answer(None)
            if state.buffer:
                self.vhost.schedule_dispatch(self)

    def _consume_timeout(self, state: _RemoteConsumer) -> None:
        state.timer = None
        answer = state.answer
        if answer is None or self._cons.get(state.id) is not state:
            return
        log.warning("queue '%s' in vhost '%s': leader %s did not answer a basic.consume "
                    "within %g s; refused", self.name, self.vhost.name, self.leader,
                    ANSWER_TIMEOUT)
        state.answer = None
        self.remove_consumer(state.consumer)
        answer(home_node_down(self.leader, self.name, self.vhost.name, self.durable))

    def _forget_consumer(self, state: _RemoteConsumer) -> None:
        """``state`` is no consumer here any more (nothing is said to the leader)."""
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        self._cons.pop(state.id, None)
        self._by_consumer.pop(id(state.consumer), None)
        try:
            self.consumers.remove(state.consumer)
        except ValueError:
            pass


    def _consume(self, state: _RemoteConsumer) -> None:
        """Attach ``state``'s consumer on the leader. With a prefetch, the leader may
        hand out what the window has left: a consumer kept across a failover still
        holds the lost leader's unacked deliveries on its channel (``_stale``; each
        settled one grants a credit back), a stream's consumer moving off this node's
        copy those the copy gave it (``_local_owner``: the same), and a full prefetch on
        top of them would leave deliveries waiting here for ever that its channel may
        not take."""
        if self.real_type == "stream" and self._read_here(state):
            return
        consumer = state.consumer
        window = DELIVERY_WINDOW
        if state.by_settle:
            window = max(0, consumer.prefetch - consumer.unacked)
        args = {"tag": consumer.tag, "exclusive": consumer.exclusive,
                "arguments": jsonable(self.resume_arguments(consumer))}
        self._send(W.encode(W.CONSUME, self.stream, state.id, consumer.no_ack, window, args))

    def _read_here(self, state: _RemoteConsumer) -> bool:
        """Serve a stream's consumer from this node's copy when it may
        (:mod:`amqpd.cluster.stream_local`): True when it reads here now."""
        copy = self.cluster.stream_copy(self.vhost.name, self.name) \
            if self.cluster is not None else None
        if state.local is not None:
            if state.local.follows(copy):
                return True
            self._stop_local(state)
        if copy is None or not usable(copy, self.leader):
            return False
        offset = local_start(state.consumer.arguments.get("x-stream-offset"), state.resume,
                             copy)
        if offset is None:
            return False  # the leader refuses it (its 406)
        state.local = LocalRead(copy, offset, lambda: self.vhost.schedule_dispatch(self))
        self.vhost.schedule_dispatch(self)
        return True

    def _stop_local(self, state: _RemoteConsumer) -> None:
        """``state`` no longer reads this node's copy; it goes on from the offset after
        its last delivery (or where it was to start)."""
        local = state.local
        if local is None:
            return
        state.local = None
        if state.resume is None:
            state.resume = local.offset
        local.close()

    def _move_here(self, state: _RemoteConsumer) -> None:
        """A stream's consumer read through the leader because this node's copy could
        not serve it then (a new leader had not told it a commit point yet): once it
        can, the consumer moves here. The leader's stand-in is cancelled (the consumer
        takes a new id, so what that one still sends is given back there), what waits
        here undelivered is dropped (the copy has it), and reading goes on from the
        offset after its last delivery."""
        copy = self.cluster.stream_copy(self.vhost.name, self.name) \
            if self.cluster is not None else None
        if not usable(copy, self.leader):
            return
        self._send(W.encode(W.CANCEL, self.stream, state.id))
        self._grants.pop(state.id, None)
        del self._cons[state.id]
        for entry in state.buffer:
            self._owner.pop(entry.seq, None)
            self._pos.pop(entry.seq, None)
        state.buffer.clear()
        self._next_cid += 1
        state.id = self._next_cid
        self._cons[state.id] = state
        self._read_here(state)

    def _dispatch_local(self, state: _RemoteConsumer, local: LocalRead) -> None:
        """Deliver committed records of this node's copy as the channel allows; a copy
        that changed sends the consumer on (:meth:`_consume`: the new copy, or the
        leader)."""
        if not local.follows(self.cluster.stream_copy(self.vhost.name, self.name)
                             if self.cluster is not None else None):
            self._stop_local(state)
            self._consume(state)
            return
        consumer = state.consumer
        channel = consumer.channel
        while consumer.has_credit() and channel.can_deliver(consumer):
            batch = local.next_batch(consumer.prefetch - consumer.unacked)
            if not batch:
                return
            for i, record in enumerate(batch):
                if i and not (consumer.has_credit() and channel.can_deliver(consumer)):
                    local.unread(batch[i:])
                    return
                entry = QueueEntry(decode_record(record, self.name), -1 - record.offset)
                if state.by_settle:
                    self._local_owner[entry] = state
                channel.deliver(consumer, self, entry)
                state.resume = record.offset + 1
                if state.local is not local:
                    return  # the channel went while delivering

    def resume_arguments(self, consumer: Consumer) -> dict[str, Any]:
        """The consume arguments ``consumer`` goes on with at a (new) leader: a stream
        consumer's ``x-stream-offset`` is the offset after the last delivery its
        channel was given, so it sees no gap and no repeat across a failover."""
        state = self._by_consumer.get(id(consumer))
        if state is None or state.resume is None:
            return consumer.arguments
        return {**consumer.arguments, "x-stream-offset": state.resume}

    def remove_consumer(self, consumer: Consumer) -> None:
        state = self._by_consumer.pop(id(consumer), None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass
        del self._cons[state.id]
        if state.local is not None:  # read here: the leader never knew it
            self._stop_local(state)
            return
        self._send(W.encode(W.CANCEL, self.stream, state.id))
        # deliveries not handed to the client go back to the leader
        back = [e.seq - self._base for e in state.buffer
                if self._owner.pop(e.seq, _NONE) is not _NONE]
        for e in state.buffer:
            self._pos.pop(e.seq, None)
        state.buffer.clear()
        if back:
            self._send(W.encode(W.REQUEUE, self.stream, back))

    def _deliver(self, cid: int, delivery: int, redelivered: bool, ready: int,
                 exchange: str, key: str, props: bytes, body: bytes, position: int) -> None:
        self.ready_count = ready
        state = self._cons.get(cid)
        if state is None:  # cancelled meanwhile: the CANCEL and a REQUEUE are on the way
            self._send(W.encode(W.REQUEUE, self.stream, [delivery]))
            return
        entry = QueueEntry(Message(exchange, key, props, body), self._base + delivery,
                           bool(redelivered))
        if not state.consumer.no_ack:
            self._owner[entry.seq] = state
            if position:  # a quorum queue's: RECLAIM names it after a failover
                self._pos[entry.seq] = position - 1
        state.buffer.append(entry)
        self.vhost.schedule_dispatch(self)

    def deliver_many(self, cid: int, batch: Delivers) -> None:
        """A DELIVERS frame's records to consumer ``cid`` (read by the link as
        QueueEntries), each as :meth:`_deliver`, in order (the loop is compiled:
        :func:`amqpd.cluster.link_records.arrive`), the queue scheduled once."""
        state = self._cons.get(cid)
        if state is None:  # cancelled meanwhile: the CANCEL and a REQUEUE are on the way
            self._send(W.encode_ids(W.REQUEUE, self.stream, batch.ids()))
            return
        arrive(batch, self._base, state.buffer,
               None if state.consumer.no_ack else self._owner, state, self._pos)
        if len(batch):
            self.ready_count = batch.ready  # the leader's count after the last
        self.vhost.schedule_dispatch(self)

    def dispatch(self) -> None:
        """Hand waiting deliveries to their consumers as their channels allow."""
        grants = self._grants
        for state in list(self._cons.values()):
            if state.local is None and state.resume is not None and state.answer is None:
                self._move_here(state)
            if state.local is not None:
                self._dispatch_local(state, state.local)
                continue
            if state.answer is not None:
                continue  # consume-ok not sent yet
            consumer = state.consumer
            buffer = state.buffer
            if self.real_type != "stream":  # compiled, the same loop but the offsets
                n = hand_out(self, consumer, buffer, state.id, self._cons)
                if n and not state.by_settle:
                    grants[state.id] = grants.get(state.id, 0) + n
                continue
            n = 0
            while buffer and consumer.has_credit() and consumer.channel.can_deliver(consumer):
                entry = buffer.popleft()
                consumer.channel.deliver(consumer, self, entry)
                n += 1
                if self.real_type == "stream":
                    offset = delivered_offset(entry.message.properties)
                    if offset is not None:
                        state.resume = offset + 1
                if state.id not in self._cons:
                    break  # the channel went while delivering
            if n and not state.by_settle:
                grants[state.id] = grants.get(state.id, 0) + n
        self._send_grants()

    def _send_grants(self) -> None:
        grants = self._grants
        if grants:
            for cid, n in grants.items():
                self._send(W.encode_grant(self.stream, cid, n))
            grants.clear()

    def _cancelled(self, cid: int) -> None:
        state = self._cons.get(cid)
        if state is None:
            return
        consumer = state.consumer
        self.remove_consumer(consumer)
        consumer.channel.consumer_cancelled_by_server(consumer)


__all__ = ["ANSWER_TIMEOUT", "DELIVERY_WINDOW", "RemoteConsume"]
