"""A queue that came back from a restart with messages is handled by the extension layer
(their TTLs count from recovery) only until those messages have left it."""

from __future__ import annotations

from pamqp import commands as C

from amqpd.broker.message import Message
from amqpd.broker.priority import PriorityReady
from amqpd.broker.queue import Queue
from tests.support import wire
from tests.unit.protocol.peer import Pair, real_broker

PLAIN = b"\x00\x00"  # no properties
EXPIRING = b"\x01\x00\x05" + b"60000"  # expiration = "60000"


def recovered_queue(props: bytes = PLAIN, n: int = 3) -> tuple[Pair, Queue]:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    pair.call(1, C.Queue.Declare(queue="rq"))
    assert pair.session is not None
    q = pair.session.vhost.queues["rq"]
    assert isinstance(q, Queue)  # no x-queue-type: a classic queue
    for i in range(n):
        q.restore(Message("", "rq", props, b"m%d" % i), False)
    return pair, q


def test_the_extension_leaves_once_the_recovered_messages_have_left() -> None:
    pair, q = recovered_queue()
    assert q.ext is not None
    for _ in range(2):
        pair.call(1, C.Basic.Get(queue="rq", no_ack=True))
    assert q.ext is not None  # one recovered message is still there
    pair.send(b"".join(wire.publish(1, "", "rq", b"new%d" % i) for i in range(2)))
    pair.call(1, C.Basic.Get(queue="rq", no_ack=True))  # the last recovered one
    pair.call(1, C.Basic.Get(queue="rq", no_ack=True))  # a new one: head is past them
    assert q.ext is None
    assert q.message_count == 1


def test_a_recovered_message_with_a_ttl_keeps_the_extension_while_it_is_there() -> None:
    pair, q = recovered_queue(EXPIRING, n=2)
    pair.call(1, C.Basic.Get(queue="rq", no_ack=True))
    assert q.ext is not None and q.ext.ttl_seen  # the other one still has its TTL
    pair.call(1, C.Basic.Get(queue="rq", no_ack=True))  # empty now
    assert q.ext is None



class _NoReads:
    """A store that must not be read: recovery has to manage with the record's meta."""

    def read(self, position: int) -> None:
        raise AssertionError(f"recovery read message {position}")


def test_a_priority_queue_recovers_without_reading_any_message() -> None:
    import time

    from amqpd.broker.message import LoggedMessage

    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    pair.call(1, C.Queue.Declare(queue="pq", arguments={"x-max-priority": 5,
                                                         "x-message-ttl": 60000}))
    assert pair.session is not None
    q = pair.session.vhost.queues["pq"]
    assert isinstance(q, Queue) and isinstance(q.ready, PriorityReady)
    now_ms = int(time.time() * 1000)
    store = _NoReads()
    for position, priority in ((8, 1), (16, 9), (24, 0)):
        q.restore(LoggedMessage(store, position, 10), False, now_ms - 30_000, priority)
    levels = [[e.message.position for e in level] for level in q.ready.levels]
    assert levels == [[24], [8], [], [], [], [16]], "priority capped at x-max-priority"
    head = q.ready[0]
    assert 25 < head.expires - time.monotonic() < 31, "TTL counts from the publish time"


def test_a_recovered_message_expires_from_its_publish_time() -> None:
    import time

    from amqpd.broker.message import LoggedMessage

    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    pair.call(1, C.Queue.Declare(queue="tq", arguments={"x-message-ttl": 60000}))
    assert pair.session is not None
    q = pair.session.vhost.queues["tq"]
    assert isinstance(q, Queue)
    now_ms = int(time.time() * 1000)
    store = _NoReads()
    q.restore(LoggedMessage(store, 8, 10), False, now_ms - 61_000, 0)  # expired
    q.restore(LoggedMessage(store, 16, 10), False, now_ms - 1_000, 0)
    q.restore(LoggedMessage(store, 24, 10), False, now_ms - 1_000, (now_ms - 1) << 8)
    assert q.ext is not None
    q.ext.drop_expired_head()
    assert [e.message.position for e in q.ready] == [16, 24]
