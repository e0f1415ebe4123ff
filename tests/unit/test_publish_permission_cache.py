"""Publishing remembers the exchange it was last allowed to write to, but a permission
change is seen by the very next publish."""

from __future__ import annotations

from pamqp import commands as C

from tests.support import wire
from tests.unit.protocol.peer import Pair, last_close, real_broker


def test_revoked_write_permission_refuses_the_next_publish() -> None:
    broker = real_broker()
    pair = Pair(broker=broker)
    pair.open()
    pair.open_channel(1)
    pair.call(1, C.Queue.Declare(queue="q"))
    assert pair.send(wire.publish(1, "", "q", b"one")) == []
    assert pair.send(wire.publish(1, "", "q", b"two")) == []
    broker.auth.set_permissions("guest", "/", ".*", "^nothing$", ".*")
    out = pair.send(wire.publish(1, "", "q", b"three"))
    close = last_close(out)
    assert close.reply_code == 403 and "amq.default" in close.reply_text
    assert pair.session is not None
    assert pair.session.vhost.queues["q"].message_count == 2


def test_an_allowed_exchange_after_a_refused_one_is_checked_again() -> None:
    broker = real_broker()
    broker.auth.set_permissions("guest", "/", ".*", "^amq\\.direct$", ".*")
    pair = Pair(broker=broker)
    pair.open()
    pair.open_channel(1)
    pair.open_channel(2)
    assert pair.send(wire.publish(1, "amq.direct", "x", b"ok")) == []
    out = pair.send(wire.publish(2, "amq.fanout", "x", b"no"))
    assert last_close(out).reply_code == 403
    assert pair.send(wire.publish(1, "amq.direct", "x", b"ok again")) == []
