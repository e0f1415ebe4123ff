"""A plain queue that took messages with an expiration of their own carries the TTL
extension only while such a message is in it: once it is empty it drops the extension
and later messages take the fast path again. An unacknowledged expiring message that is
requeued after that brings the extension back, and still expires."""

from __future__ import annotations

import time

import pytest
from pamqp import commands as C

from amqpd.broker.queue import Queue
from amqpd.broker.queue_entry import TimedEntry
from tests.support import wire
from tests.unit.protocol.peer import Pair, real_broker


def plain_queue() -> tuple[Pair, Queue]:
    pair = Pair(broker=real_broker())
    pair.open()
    pair.open_channel(1)
    pair.call(1, C.Queue.Declare(queue="q"))
    assert pair.session is not None
    q = pair.session.vhost.queues["q"]
    assert isinstance(q, Queue)  # no x-queue-type: a classic queue
    return pair, q


def got(out: list) -> list[type]:
    return [type(o.value) for o in out if not isinstance(o.value, (bytes, C.Basic.Properties))
            and hasattr(o.value, "name")]


def test_the_extension_leaves_when_the_last_expiring_message_does() -> None:
    pair, q = plain_queue()
    pair.send(wire.publish(1, "", "q", b"a", expiration="60000"),
              wire.publish(1, "", "q", b"b"))
    assert q.ext is not None
    pair.call(1, C.Basic.Get(queue="q", no_ack=True))
    assert q.ext is not None  # "b" is still there
    pair.call(1, C.Basic.Get(queue="q", no_ack=True))
    assert q.ext is None and q.message_count == 0
    pair.send(wire.publish(1, "", "q", b"c"))
    assert q.ext is None and q.message_count == 1  # the fast path again


def test_a_queue_with_its_own_ttl_keeps_the_extension() -> None:
    pair, _q = plain_queue()
    pair.call(1, C.Queue.Declare(queue="t", arguments={"x-message-ttl": 60000}))
    assert pair.session is not None
    t = pair.session.vhost.queues["t"]
    pair.send(wire.publish(1, "", "t", b"a"))
    pair.call(1, C.Basic.Get(queue="t", no_ack=True))
    assert t.ext is not None and t.message_count == 0


def test_expired_messages_that_empty_the_queue_take_the_extension_along(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pair, q = plain_queue()
    pair.send(wire.publish(1, "", "q", b"a", expiration="1000"))
    assert q.ext is not None
    later = time.monotonic() + 5
    monkeypatch.setattr(time, "monotonic", lambda: later)
    out = pair.call(1, C.Basic.Get(queue="q", no_ack=True))
    assert C.Basic.GetEmpty in got(out)
    assert q.ext is None


def test_a_requeued_expiring_message_brings_the_extension_back_and_expires(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pair, q = plain_queue()
    pair.send(wire.publish(1, "", "q", b"a", expiration="1000"))
    out = pair.call(1, C.Basic.Get(queue="q", no_ack=False))
    assert C.Basic.GetOk in got(out)
    assert q.ext is None  # empty: one unacknowledged, nothing ready
    pair.call(1, C.Basic.Recover(requeue=True))
    assert q.ext is not None and q.message_count == 1
    entry = q.ready[0]
    assert isinstance(entry, TimedEntry) and entry.expires is not None
    assert q.ext.expiry_armed == entry.expires
    later = entry.expires + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    out = pair.call(1, C.Basic.Get(queue="q", no_ack=True))
    assert C.Basic.GetEmpty in got(out)
    assert q.message_count == 0 and q.ext is None
