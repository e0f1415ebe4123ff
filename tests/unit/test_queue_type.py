"""The queue-type seam (amqpd.broker.queue_type), driven through its interface only.

The classic queue is exercised the way the channel and the API use any queue type:
enqueue, take, delivered, settle/requeue, consumers, dispatch, purge, delete. A second
type registered by name shows that ``x-queue-type`` picks the implementation. No
sockets; the broker is built but never started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpd.broker.api import (
    QUEUE_TYPES,
    AMQPError,
    BrokerAPI,
    Consumer,
    Message,
    QueueType,
    codec,
    register_queue_type,
)
from amqpd.config import Settings
from amqpd.server import Broker


@pytest.fixture
def api(tmp_path: Path) -> BrokerAPI:
    return Broker(Settings(data_dir=str(tmp_path), persistence=False)).api


def message(body: bytes) -> Message:
    return Message("", "q", codec.encode_properties({}), body)


class Channel:
    """A ConsumerChannel with an open/blocked switch. Deliveries go to a shared log in
    the order the queue made them; acknowledging consumers use up their prefetch credit
    as the AMQP channel's would."""

    def __init__(self, log: list[str], open_: bool = True) -> None:
        self.log = log
        self.open = open_
        self.cancelled: list[str] = []

    def can_deliver(self, consumer: Consumer) -> bool:
        return self.open

    def deliver(self, consumer: Consumer, queue: QueueType, entry: Any) -> None:
        self.log.append(consumer.tag)
        if not consumer.no_ack:
            consumer.unacked += 1
        queue.delivered(entry, acked=consumer.no_ack)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer.tag)


def classic(api: BrokerAPI, **kw: Any) -> QueueType:
    q = api.declare_queue("/", "q", **kw)
    assert isinstance(q, QueueType) and q.type_name == "classic"
    return q


def consumer(q: QueueType, ch: Channel, tag: str, no_ack: bool = False, prefetch: int = 0,
             priority: int = 0) -> Consumer:
    args = {"x-priority": priority} if priority else {}
    c = Consumer(ch, q, tag, no_ack, False, prefetch, args)
    q.add_consumer(c)
    return c


def test_the_default_type_is_classic_and_registered() -> None:
    assert QUEUE_TYPES["classic"].type_name == "classic"


# enqueue n, take k (acknowledging mode) then do something: (ready, unacked) after
LIFECYCLE: list[tuple[str, int, int, str, int, int]] = [
    ("take all, settle", 3, 3, "settle", 0, 0),
    ("take some, settle", 3, 2, "settle", 1, 0),
    ("take some, requeue", 3, 2, "requeue", 3, 0),
    ("take none, purge", 3, 0, "purge", 0, 0),
    ("take some, purge", 3, 2, "purge", 0, 2),  # purge drops ready ones only
    ("take all, keep", 2, 2, "keep", 0, 2),
]


@pytest.mark.parametrize(("n", "k", "then", "ready", "unacked"),
                         [row[1:] for row in LIFECYCLE], ids=[row[0] for row in LIFECYCLE])
def test_message_lifecycle_counts(api: BrokerAPI, n: int, k: int, then: str, ready: int,
                                  unacked: int) -> None:
    q = classic(api)
    for i in range(n):
        q.enqueue(message(b"%d" % i))
    assert q.message_count == n
    taken = []
    for _ in range(k):
        entry = q.take()
        assert entry is not None
        q.delivered(entry, acked=False)
        taken.append(entry)
    if then == "settle":
        q.settle(taken)
    elif then == "requeue":
        q.requeue(taken)
    elif then == "purge":
        assert q.purge() == n - k
    assert (q.message_count, q.unacked_count) == (ready, unacked)


def test_requeue_restores_order_and_marks_redelivered(api: BrokerAPI) -> None:
    q = classic(api)
    for body in (b"a", b"b", b"c"):
        q.enqueue(message(body))
    a, b = q.take(), q.take()
    assert a is not None and b is not None
    for entry in (a, b):
        q.delivered(entry, acked=False)
    q.requeue([b, a])  # any order in, queue order out
    out = []
    while (e := q.take()) is not None:
        out.append((e.message.body, e.redelivered))
    assert out == [(b"a", True), (b"b", True), (b"c", False)]


# (consumers as (tag, no_ack, prefetch, priority, channel open), messages, deliveries)
DISPATCH: list[tuple[str, list[tuple[str, bool, int, int, bool]], int, list[str]]] = [
    ("round-robin", [("a", True, 0, 0, True), ("b", True, 0, 0, True)], 4,
     ["a", "b", "a", "b"]),
    ("priority first", [("lo", True, 0, 0, True), ("hi", True, 0, 5, True)], 3,
     ["hi", "hi", "hi"]),
    ("prefetch limits", [("a", False, 1, 0, True), ("b", False, 2, 0, True)], 5,
     ["a", "b", "b"]),
    ("blocked channel skipped", [("a", True, 0, 0, False), ("b", True, 0, 0, True)], 2,
     ["b", "b"]),
    ("nobody can take", [("a", True, 0, 0, False)], 2, []),
]


@pytest.mark.parametrize(("consumers", "n", "tags"), [row[1:] for row in DISPATCH],
                         ids=[row[0] for row in DISPATCH])
def test_dispatch(api: BrokerAPI, consumers: list[tuple[str, bool, int, int, bool]], n: int,
                  tags: list[str]) -> None:
    q = classic(api)
    log: list[str] = []
    for tag, no_ack, prefetch, priority, open_ in consumers:
        consumer(q, Channel(log, open_), tag, no_ack=no_ack, prefetch=prefetch,
                 priority=priority)
    for i in range(n):
        q.enqueue(message(b"%d" % i))
    q.dispatch()
    assert log == tags
    assert q.message_count == n - len(tags)


def test_auto_delete_goes_with_its_last_consumer(api: BrokerAPI) -> None:
    q = classic(api, auto_delete=True)
    c = consumer(q, Channel([]), "a", no_ack=True)
    q.remove_consumer(c)
    assert q.deleted and api.find_queue("/", "q") is None


def test_delete_cancels_consumers_and_drops_messages(api: BrokerAPI) -> None:
    q = classic(api)
    ch = Channel([], open_=False)
    consumer(q, ch, "a", no_ack=True)
    q.enqueue(message(b"x"))
    assert api.delete_queue("/", "q") == 1
    assert ch.cancelled == ["a"] and q.deleted and q.message_count == 0


def test_touch_restarts_the_expiry_clock(api: BrokerAPI) -> None:
    classic(api).touch()  # no x-expires: nothing to restart
    q = api.declare_queue("/", "exp", arguments={"x-expires": 60_000})
    ext = q.ext
    assert ext is not None
    ext.last_used = 0.0
    q.touch()
    assert ext.last_used > 0.0


class CountingQueue(QueueType):
    """A minimal second queue type: proves x-queue-type picks the implementation and that
    the channel-facing calls reach it."""

    type_name = "x-counting"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.items: list[Message] = []

    @classmethod
    def validate_arguments(cls, arguments: dict[str, Any], name: str, vhost: str) -> None:
        if "x-max-priority" in arguments:
            from amqpd.broker.api import PreconditionFailed

            raise PreconditionFailed(f"invalid arg 'x-max-priority' for queue '{name}' in "
                                     f"vhost '{vhost}' of queue type x-counting")

    @property
    def message_count(self) -> int:
        return len(self.items)

    def enqueue(self, message: Message) -> None:
        self.items.append(message)

    def delete(self) -> None:
        self.items.clear()


@pytest.fixture
def counting() -> Any:
    register_queue_type(CountingQueue)
    try:
        yield CountingQueue
    finally:
        QUEUE_TYPES.pop(CountingQueue.type_name, None)


def test_x_queue_type_picks_a_registered_implementation(api: BrokerAPI, counting: Any) -> None:
    q = api.declare_queue("/", "cq", arguments={"x-queue-type": "x-counting"})
    assert isinstance(q, CountingQueue)
    api.publish("/", "", Message("", "cq", codec.encode_properties({}), b"hi"), None)
    assert q.message_count == 1 and q.items[0].body == b"hi"
    assert q.info()["type"] == "x-counting"
    with pytest.raises(AMQPError) as info:  # its own argument rules apply
        api.declare_queue("/", "cq2", arguments={"x-queue-type": "x-counting",
                                                 "x-max-priority": 5})
    assert info.value.reply_code == 406
    with pytest.raises(AMQPError) as info:  # a redeclare as another type is inequivalent
        api.declare_queue("/", "cq")
    assert info.value.reply_code == 406
    api.delete_queue("/", "cq")
    assert q.deleted and q.items == []


def test_unknown_type_is_refused_with_rabbitmqs_text(api: BrokerAPI) -> None:
    with pytest.raises(AMQPError) as info:
        api.declare_queue("/", "u", arguments={"x-queue-type": "stream-ish"})
    assert info.value.reply_code == 406
    assert "unsupported queue type 'stream-ish'" in info.value.text


def test_a_replicated_queue_keeps_every_message_while_it_is_replicated(
        api: BrokerAPI) -> None:
    """QueueType.replicated (a mirrored classic queue's leader, amqpd.cluster.mirror):
    while on, a transient message routed to the queue is written to the store like a
    persistent one (so it reaches the mirrors) and the pipeline counts one keeping
    queue; a repeated call counts nothing twice; off again, transient ones stay in
    memory."""
    publisher = api.cluster_port().publisher
    q = classic(api, durable=True)
    assert not q.keeps_all and publisher.keeping_queues == 0
    api.publish("/", "", message(b"before"), None)
    assert q.take().message.persistent is False  # type: ignore[union-attr]
    q.replicated(True)
    q.replicated(True)
    assert q.keeps_all and publisher.keeping_queues == 1
    api.publish("/", "", message(b"mirrored"), None)
    entry = q.take()
    assert entry is not None and entry.message.persistent
    assert entry.message.position >= 0  # written to the store
    q.replicated(False)
    q.replicated(False)
    assert not q.keeps_all and publisher.keeping_queues == 0
    api.publish("/", "", message(b"after"), None)
    assert q.take().message.persistent is False  # type: ignore[union-attr]


def test_a_type_that_keeps_every_message_is_unchanged_by_replication(
        api: BrokerAPI) -> None:
    publisher = api.cluster_port().publisher
    q = api.declare_queue("/", "qq", durable=True, arguments={"x-queue-type": "quorum"})
    assert q.keeps_all and publisher.keeping_queues == 1
    q.replicated(True)
    q.replicated(False)
    assert q.keeps_all and publisher.keeping_queues == 1


def test_a_held_queue_is_not_dispatched_nor_fetched_until_released(tmp_path: Path) -> None:
    """``deliveries_held`` (set by the cluster while this node's leadership of the queue
    is unconfirmed: amqpd.cluster.delivery_hold): the dispatch scheduler skips the queue
    and basic.get answers empty; once cleared, a dispatch delivers as before."""
    broker = Broker(Settings(data_dir=str(tmp_path), persistence=False))
    q = classic(broker.api)
    log: list[str] = []
    consumer(q, Channel(log), "a")
    q.deliveries_held = True
    for i in range(3):
        q.enqueue(message(b"%d" % i))  # marks the queue for the scheduler
    broker._run_dispatch()  # the end of the tick (no loop runs here: peer.py does so too)
    assert log == [] and q.fetch() is None and q.message_count == 3
    q.deliveries_held = False
    broker.schedule_dispatch(q)  # what the hold's release does (through the vhost)
    broker._run_dispatch()
    assert log == ["a", "a", "a"] and q.message_count == 0
