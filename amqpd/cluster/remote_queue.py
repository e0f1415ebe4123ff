"""Queues led by another node: :class:`RemoteQueue` here, :class:`Served` on the leader.

Every queue lives on one node, its leader. Any other node that knows the queue (the
cluster's definitions: :meth:`ClusterQueues.materialise`) holds a :class:`RemoteQueue`
in its vhost in the queue's place, a queue type (:mod:`amqpd.broker.queue_type`) whose
operations go over the link to the leader (:mod:`amqpd.cluster.link`, frames in
:mod:`amqpd.cluster.link_wire`), so channels, exchanges and the API use it as any queue:

* publish: routing happens on the node where the message arrives; the publish pipeline
  hands the message to :meth:`RemoteQueue.forward`. The leader enqueues it as its own
  publish pipeline would (length limits, the store for persistent messages in durable
  queues) and confirms it after its group commit; the publisher's confirm waits for that
  (:class:`amqpd.broker.publish.JointConfirm`). Publishes are sent within a credit the
  leader grants per stream (:data:`PUBLISH_WINDOW`, given back as it takes them), so a
  fast publisher is held on its own node, where its queue shows the backlog and the
  channel's flow control slows it.
* consume: the leader attaches a consumer of its own (priority, exclusive and single
  active consumer are the leader's business) or refuses it (403 for an exclusive
  consumer there), and the client's consume-ok waits for that answer
  (:meth:`RemoteQueue.consume_for`, bounded by :data:`ANSWER_TIMEOUT`). It delivers
  only within the credit this
  node grants: the consumer's prefetch (granted again as the client acks or requeues)
  or, without one, :data:`DELIVERY_WINDOW` (granted again as deliveries go out). The
  deliveries wait here in order until the client's channel may take them.
* acks, nack/reject, requeue, channel close: :meth:`settle` / :meth:`reject` /
  :meth:`requeue` send the leader's delivery ids back; the leader settles them,
  dead-letters them (its queue has the dead-letter options) or puts them back in place.
* basic.get, purge, delete: a request on the stream (basic.get's answer comes later,
  through ``Channel.answer_get``).
* counts: a declare-ok asks the leader (:meth:`RemoteQueue.counts_for`); the management
  API shows them as last reported (with each delivery and about once a second).

Node loss: when the link to the leader goes, every consumer of its queues here gets
basic.cancel (of a mirrored queue a mirror can take over only those with
``x-cancel-on-ha-failover``: the others consume again from the promoted mirror once
the catalogue names it, or from this node's new queue if the mirror here is promoted,
in whichever order the link's end and the promotion come; amqpd.cluster.mirror),
publishes waiting for a confirm get a nack, and until the link is back (or a new
leader is known) the queue answers declare (a stream's excepted, as RabbitMQ 3.10.8
answers it: :meth:`RemoteQueue.touch`), basic.get and basic.consume with 404
``home node '<node>' of durable queue '<name>' in vhost '<vhost>' is down or
inaccessible``; the publish pipeline leaves it out of routes (``available`` is False:
the message is unroutable there, as in RabbitMQ 3.10). Delivery ids of the old link
are dead (entries carry them plus a base that grows with every stream): a mirrored
queue's new leader has put those messages back already. A consumer kept across the
failover still has them unacked on its channel, and they count against its prefetch as
the client sees it: the new leader is granted only what that window has left, and a
credit more as each of them is settled (else deliveries would wait here for a channel
that may not take them, and the queue's other consumers would never get them).

A quorum queue's new leader keeps them checked out to this node instead (RabbitMQ
3.10's checkouts survive an election; amqpd.cluster.quorum_group): its leader names
every delivery's store position (DELIVER / GET_OK), and when the queue is opened on
the new leader, RECLAIM names, by the lost leader's positions, what this node's
channels still hold (:class:`_Held`); RECLAIMED gives each the delivery id it has on
the new stream, so the client's ack, nack or reject by the old tag settles it there
(one settled meanwhile is settled at once). The last acks and rejects sent to the lost
leader (:data:`RECENT_SETTLES`) are named too: one it never took is settled on the new
leader, not redelivered. What this node does not name, the new leader returns to the
queue.

Where the parts live: :class:`RemoteQueue` here (declare checks, publish forwarding,
settling, counts, delete) with :mod:`~amqpd.cluster.remote_consume` (consumers,
deliveries, basic.get) and :mod:`~amqpd.cluster.remote_failover` (the stream to the
leader and its loss) over :mod:`~amqpd.cluster.remote_state`; the leader's side
(:class:`Served`) is :mod:`~amqpd.cluster.remote_served`, this node's part in them all
(:class:`ClusterQueues` and its :meth:`~ClusterQueues.materialise`)
:mod:`~amqpd.cluster.cluster_queues`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from amqpd.broker.api import (
    QUEUE_TYPES,
    Consumer,
    Message,
    NotFound,
    NotImplemented_,
    PreconditionFailed,
    QueueEntry,
    check_stream_consumer,
    refuse_stream_return,
)
from amqpd.cluster import link_wire as W
from amqpd.cluster.link_records import add_message, send_unsent
from amqpd.cluster.remote_consume import ANSWER_TIMEOUT, RemoteConsume
from amqpd.cluster.remote_failover import RemoteFailover
from amqpd.cluster.remote_state import (
    LinkLost,
    OnConfirm,
    _Held,
    _RemoteConsumer,
    home_node_down,
    jsonable,
)

log = logging.getLogger("amqpd.cluster.queues")


class RemoteQueue(RemoteConsume, RemoteFailover):
    """A queue whose leader is ``leader`` (module docstring). The class is specialised
    per real type (:func:`remote_class`) so redeclare compares what that type compares."""

    # -- state ---------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.link is not None and not self.gone

    def routable(self) -> bool:
        """Whether the publish pipeline keeps this queue in a route: while its leader is
        reachable, and while a synchronised mirror is about to take it over
        (amqpd.cluster.mirror) -- a publish then gets a nack, not the ack-and-drop of a
        queue whose node is down for good (RabbitMQ 3.10's unroutable case). So is a
        queue whose leader's node is reachable (its link up) but has no stream up for
        it (a 404 of a leader still finishing its promotion, a stream opened again, a
        delete on its way): acking publishes routed nowhere then lost confirmed
        messages (issue 28). And so is a queue whose leader's node the view counts as
        running while its link is down (the node restarted faster than the heartbeat
        timeout, or the link is being dialled again): the node is not down, so its
        queue is not unroutable. In chaos seed 108 a leader killed and back in 1.3 s
        led its queue again with no mirror yet (its links were not up); another node
        then found no failover to expect and acked 20 publishes it dropped."""
        if self.link is not None and not self.gone:  # ``available``, inlined: per publish
            return True
        cluster = self.cluster
        if cluster is None:
            return False
        return cluster.links.link(self.leader) is not None or (
            not self.gone and (cluster.view.is_running(self.leader)
                               or cluster.failover_expected(self)))

    @property
    def message_count(self) -> int:
        return self.ready_count + len(self._unsent)

    def flow_backlog(self) -> int:
        """Credit flow's measure here. A stream's records are kept, not waiting (its
        message count is its length), so what this node weighs is how far its own
        consumers reading the local copy lag behind that copy's committed end; those the
        leader serves cost this node only the relay, and the leader's credit to this
        node's publishes paces them. A stream read by nobody here, or only through the
        leader, is no backlog: before, a publisher here into a long stream slowed down
        as soon as it had any consumer on this node."""
        if self.real_type != "stream":
            return self.message_count
        lag = 0
        for state in self._cons.values():
            read = state.local
            if read is not None:
                lag = max(lag, read.replica.committed - read.offset)
        return lag

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["type"] = self.real_type
        out["messages_unacknowledged"] = self.remote_unacked
        out["messages"] = self.message_count + self.remote_unacked
        out["consumers"] = self.consumer_count()
        return out

    def consumer_count(self) -> int:
        """The consumers the API and declare-ok report: the leader's count as last
        reported (its own and those it serves for other nodes) plus this node's stream
        consumers reading its copy (:mod:`amqpd.cluster.stream_local`), whom the
        leader never sees."""
        return self.remote_consumers + sum(1 for state in self._cons.values()
                                           if state.local is not None)

    def listed_type(self) -> str:
        return self.real_type  # the leader's queue's type

    def type_info(self, node: str) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.leader, "type": self.real_type}
        if self.real_type == "quorum":
            out.update(leader=self.leader, members=[self.leader], online=(
                [self.leader] if self.available else []))
        if not self.available:
            out["state"] = "down"
        if self.real_type == "stream":  # consumers reading this node's copy
            out["local_consumers"] = [
                {"consumer_tag": state.consumer.tag, "offset": state.local.offset,
                 "committed": state.local.replica.committed}
                for state in self._cons.values() if state.local is not None]
        return out

    def _unavailable(self) -> NotFound:
        if self.gone:
            return NotFound(f"no queue '{self.name}' in vhost '{self.vhost.name}'")
        return home_node_down(self.leader, self.name, self.vhost.name, self.durable)

    def touch(self) -> None:
        """Every declare passes here first: 404 while the leader is out of reach,
        except for a stream, whose declare (passive too) RabbitMQ 3.10.8 answers with
        declare-ok while its leader is lost (during the election, and with no majority
        left to elect one); a consume there is still refused (:meth:`check_consume`)."""
        if not self.available and (self.gone or self.real_type != "stream"):
            raise self._unavailable()

    def check_consume(self, arguments: dict[str, Any], global_prefetch: int) -> None:
        if not self.available:
            raise self._unavailable()
        QUEUE_TYPES.get(self.real_type, QUEUE_TYPES["classic"]).validate_consumer_arguments(
            arguments, self.name, self.vhost.name)

    def check_consumer(self, consumer: Consumer) -> None:
        """A stream led elsewhere: its consumer rules are checked here, where the
        channel's prefetch is known (the leader sees only the credit it is given)."""
        if self.real_type == "stream":
            check_stream_consumer(self.name, self.vhost.name, consumer)

    def check_return(self, method: str) -> None:
        if self.real_type == "stream":
            refuse_stream_return(self.name, self.vhost.name, method)

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        if not self.available:
            raise self._unavailable()

    def check_bind(self) -> None:
        if not self.available:
            raise self._unavailable()

    def refreshes_view(self, then: Callable[[], None]) -> bool:
        """A redeclare: this node's view may not have seen a delete made on another
        node yet (issue 28), so the declare goes on once etcd's record of the queue has
        been read again."""
        cluster = self.port.cluster
        if cluster is None:
            return False
        cluster.refresh_queue(self.vhost.name, self.name, then)
        return True

    def confirms_delete(self, answer: OnConfirm) -> bool:
        """Deleted here: the leader deletes it and writes the delete to etcd; delete-ok
        once that is seen here (an error after ``definition_timeout``)."""
        cluster = self.port.cluster
        if cluster is None:
            return False
        cluster.after_queue_gone(self.vhost.name, self.name, answer)
        return True

    def on_frame(self, kind: int, f: list[Any]) -> bool:
        """A frame of its stream from the leader (ClusterQueues hands them over):
        False for the kinds it leaves to its caller (FAILED, CLOSED)."""
        if kind == W.DELIVER:
            self._deliver(*f)
        elif kind == W.DELIVERS:
            self.deliver_many(f[0], f[1])
        elif kind == W.CONFIRM:
            self._confirmed(f[0], bool(f[1]))
        elif kind == W.CREDIT:
            self._got_credit(f[0])
        elif kind in (W.OPENED, W.STATS):
            self.ready_count, self.remote_unacked, self.remote_consumers = f
            if kind == W.OPENED:
                self.reopen_tries = 0
        elif kind == W.GET_OK:
            self._got(*f)
        elif kind == W.GET_EMPTY:
            self._got_empty(f[0])
        elif kind == W.CANCELLED:
            self._cancelled(f[0])
        elif kind == W.CONSUMED:
            self._consumed(*f)
        elif kind == W.RECLAIMED:
            self._reclaimed(*f)
        elif kind == W.COUNTED:
            self._counted(*f)
        elif kind in (W.PURGED, W.DELETED):
            answer = self._requests.pop(f[0], None)
            if answer is not None:
                answer(f[1])
        else:
            return False
        return True

    def _send(self, frame: bytes) -> None:
        if self.link is not None:
            self.link.send(frame)

    # -- publish -------------------------------------------------------------------------
    def enqueue(self, message: Message) -> None:
        """Unconfirmed (dead-lettering, delayed messages falling due)."""
        self.forward(message, None)

    def forward(self, message: Message, on_confirm: OnConfirm | None) -> None:
        # once per message crossing: ``available`` and ``_send`` inlined
        link = self.link
        if link is None or self.gone:
            if on_confirm is not None:
                on_confirm(LinkLost(f"queue '{self.name}': leader {self.leader} unreachable"))
            return
        seq = 0
        if on_confirm is not None:
            deadlines = self.cluster.confirm_deadlines if self.cluster is not None else None
            if deadlines is not None:  # a nack if the leader never answers (issue 28)
                on_confirm = deadlines.track(on_confirm, f"queue '{self.name}' on "
                                                         f"{self.leader}")
            self._pub_seq += 1
            seq = self._pub_seq
            self._confirms[seq] = on_confirm
        self.stat_publish += 1
        body = self.port.publisher.body_of(message)
        if self._credit > 0 and not self._unsent:
            self._credit -= 1
            # joins this stream's PUBLISHES frame while that is the last frame queued on
            # the link (so nothing sent meanwhile is overtaken), else starts one
            self._batch = add_message(self._batch, link, self.stream, seq, message, body)
        else:
            self._unsent.append((seq, message.persistent, message.exchange,
                                 message.routing_key, message.properties, body))

    def refuses_publish(self, message: Message) -> bool:
        return False  # the leader applies its length limits

    def _got_credit(self, n: int) -> None:
        """The leader took ``n`` publishes: as many of those waiting go, batched as
        :meth:`forward` batches them (a waiting publisher's are nearly all of them)."""
        self._credit += n
        link = self.link
        if link is None or not self._unsent:
            return
        self._credit, self._batch = send_unsent(self._unsent, self._credit, self._batch,
                                                link, self.stream)

    def _confirmed(self, seq: int, ok: bool) -> None:
        callback = self._confirms.pop(seq, None)
        if callback is not None:
            callback(None if ok else PreconditionFailed(
                f"queue '{self.name}' on {self.leader} refused the message"))

    def delivered(self, entry: QueueEntry, acked: bool) -> None:
        self.stat_deliver += 1
        if entry.redelivered:
            self.stat_redeliver += 1
        if acked:
            self.stat_ack += 1
        else:
            self.unacked_count += 1

    def _settled(self, entries: list[QueueEntry], how: int) -> list[int]:
        """The live delivery ids among ``entries`` (credit back to their consumers);
        ``how``: SETTLE, REQUEUE or REJECT."""
        ids = []
        owner = self._owner
        grants = self._grants
        renamed = self._renamed
        for entry in entries:
            self.unacked_count -= 1
            seq = entry.seq
            if renamed:
                seq = renamed.pop(seq, seq)
                self._alias.pop(seq, None)
            if seq < 0:  # a stream's record read from this node's copy
                self._local_settled(entry)
                continue
            if seq not in owner:
                # from a link that is gone: the leader put it back already, or a quorum
                # queue's new leader keeps it for this node (_Held)
                held = self._stale.pop(seq, None)
                if held is not None:
                    self._held_settled(held, how)
                continue
            state = owner.pop(seq)
            position = self._pos.pop(seq, None)
            if position is not None and how != W.REQUEUE:
                self._recent.append((position, how))
            ids.append(seq - self._base)
            if state is not None and state.by_settle and state.id in self._cons and \
                    state.local is None:
                grants[state.id] = grants.get(state.id, 0) + 1
        self._send_grants()
        return ids

    def _local_settled(self, entry: QueueEntry) -> None:
        """The client settled a delivery its consumer read from this node's copy
        (nothing to tell the leader); its place in the consumer's prefetch window is
        free again, wherever the consumer reads now. Through the leader (its copy went
        or started again, e.g. for a new leader after an election), it was granted
        there only what its window had left (:meth:`_consume`): the place goes back to
        the leader. In this node's own stream (the copy was promoted here:
        :func:`~amqpd.cluster.cluster_queues.replace_queue`), that queue may deliver
        again. Without either, a consumer whose window was full of the copy's
        deliveries when it moved got nothing more, ever (issue 30: a consumer 702
        records short after a failover, nothing published afterwards)."""
        state = self._local_owner.pop(entry, None)
        if state is None:
            return
        target = state.consumer.queue
        if target is not self:
            if not target.deleted:
                self.vhost.schedule_dispatch(target)
        elif state.local is None and state.by_settle and self._cons.get(state.id) is state:
            self._grants[state.id] = self._grants.get(state.id, 0) + 1

    def _held_settled(self, held: _Held, how: int) -> None:
        """The client settled a delivery of a lost leader: its consumer's window has a
        place again; a quorum queue's new leader is told (now if it answered RECLAIM
        already, else once it does) unless the message went back to the queue."""
        if held.state is not None:
            self._stale_settled(held.state)
        if not held.origin or held.position < 0:
            return
        held.done = how
        if self._reclaiming.get((held.origin, held.position)) is not held and \
                how != W.REQUEUE:  # a requeue: the new leader returns what it is not named
            self._held_done.append(held)

    def _stale_settled(self, state: _RemoteConsumer) -> None:
        """A kept consumer's client settled a delivery of a lost leader: a place in its
        prefetch window is free again. Following a new leader elsewhere, the consumer
        was asked only for what its window had left (:meth:`_consume`), so that leader
        gets a credit back; following a promoted copy on this node
        (:func:`replace_queue`), that queue gets to deliver again."""
        consumer = state.consumer
        target = consumer.queue
        if target is not self:
            if not target.deleted:
                self.vhost.schedule_dispatch(target)
        elif state.by_settle and state.id in self._cons and self.link is not None:
            self._grants[state.id] = self._grants.get(state.id, 0) + 1

    def settle(self, entries: Any) -> None:
        self._to_leader(list(entries), W.SETTLE)

    def requeue(self, entries: Any) -> None:
        self._to_leader(list(entries), W.REQUEUE)

    def reject(self, entries: list[QueueEntry]) -> None:
        """The leader dead-letters them (its queue has the dead-letter options)."""
        self._to_leader(entries, W.REJECT)

    def _to_leader(self, entries: list[QueueEntry], how: int) -> None:
        """Tell the leader what became of ``entries`` (``how``: the SETTLE, REQUEUE or
        REJECT frame). Settled or rejected, they count as acknowledged, and their
        consumers' credit may let this queue deliver again; requeued, the leader
        delivers them again itself."""
        ids = self._settled(entries, how)
        done = how != W.REQUEUE
        if done:
            self.stat_ack += len(entries)
        if ids:
            self._send(W.encode_ids(how, self.stream, ids))
        if done and self._cons:
            self.vhost.schedule_dispatch(self)

    def purge(self) -> int:
        if self.real_type == "stream":  # refused here, as the leader's stream refuses it
            raise NotImplemented_(f"queue.purge not supported by stream queues queue "
                                  f"'{self.name}' in vhost '{self.vhost.name}'")
        if not self.available:
            raise self._unavailable()
        n = self.ready_count
        self.ready_count = 0
        self._request(W.PURGE, lambda count: None)
        return n

    def _request(self, kind: int, answer: Callable[[int], None]) -> None:
        self._next_req += 1
        self._requests[self._next_req] = answer
        self._send(W.encode(kind, self.stream, self._next_req))

    def restore(self, message: Message, redelivered: bool, published: int = 0,
                extra: int = 0) -> None:
        raise NotImplementedError("a remote queue has nothing in this node's store")

    def counts_for(self, answer: Callable[[int, int], None]) -> None:
        """A declare-ok's counts as the leader has them now (the last reported ones if
        the leader is out of reach or does not answer within ANSWER_TIMEOUT); the
        consumers as the API counts them here (:meth:`consumer_count`)."""
        if not self.available:
            answer(self.message_count, self.consumer_count())
            return
        self._next_req += 1
        req = self._next_req
        self._counts[req] = answer
        self._send(W.encode(W.COUNT, self.stream, req))
        asyncio.get_running_loop().call_later(ANSWER_TIMEOUT, self._count_answer, req)

    def _count_answer(self, req: int) -> None:
        answer = self._counts.pop(req, None)
        if answer is not None:
            answer(self.message_count, self.consumer_count())

    def _counted(self, req: int, ready: int, unacked: int, consumers: int) -> None:
        self.ready_count, self.remote_unacked, self.remote_consumers = ready, unacked, consumers
        self._count_answer(req)

    def delete(self) -> None:
        """Deleted here (queue.delete, or the definition went): consumers told, and the
        leader asked to delete it too (it answers 0 if it is gone already)."""
        for consumer in list(self.consumers):
            self.remove_consumer(consumer)
            consumer.channel.consumer_cancelled_by_server(consumer)
        if self.available:
            self._request(W.DELETE, lambda count: None)
        if self.cluster is not None:
            self.cluster.forget(self)


_CLASSES: dict[str, type[RemoteQueue]] = {}


def remote_class(type_name: str) -> type[RemoteQueue]:
    """RemoteQueue for a queue of ``type_name`` on its leader: redeclares compare what
    that type compares."""
    cls = _CLASSES.get(type_name)
    if cls is None:
        real = QUEUE_TYPES.get(type_name, QUEUE_TYPES["classic"])
        cls = type(f"Remote{real.__name__}", (RemoteQueue,), {
            "real_type": type_name, "compared_arguments": real.compared_arguments,
            "__module__": __name__})
        _CLASSES[type_name] = cls
    return cls


__all__ = ["LinkLost", "RemoteQueue", "home_node_down", "jsonable", "remote_class"]
