"""kill -9 of a queue's leader at a random moment, with traffic running (issue 15).

Three amqpd nodes and one etcd on loopback. A publisher with confirms on node B and a
consumer on node C use a durable queue led by node A; A is killed with SIGKILL at a
moment drawn from a seeded generator (the seed is printed; ``AMQPD_KILL_SEED`` replays
one). Then, as RabbitMQ 3.10 without mirroring: C's consumer gets basic.cancel, the
queue answers declare with 404 and RabbitMQ's home-node text on B and C until A
restarts; what B publishes (mandatory) once it sees A down comes back with
basic.return (RabbitMQ 3.10 routes nothing to a queue whose node is down); after the
restart every message B saw confirmed and not returned is consumed on C (counting what
C had consumed before the kill); a message seen twice comes the second time with
redelivered=true; unconfirmed messages may or may not be there.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from bench.loadgen import Conn, ProtocolError
from tests.integration.cluster_support import (
    ClusterNode,
    wait_counted_down,
    wait_for,
)
from tests.integration.test_cluster_queues import (
    declare_on,
    queue_info,
    usable,
    wait_known_everywhere,
)
from tests.support import etcdproc

pytestmark = [
    pytest.mark.skipif(etcdproc.find_etcd() is None, reason=etcdproc.SKIP_REASON),
    pytest.mark.timeout(300),
]

TEXT = ("NOT_FOUND - home node 'node-a' of durable queue 'hot' in vhost '/' is down "
        "or inaccessible")
WINDOW = 64  # publishes in flight before the publisher waits for confirms


@dataclass
class Published:
    sent: int = 0
    confirmed: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    returned: set[int] = field(default_factory=set)  # basic.return: routed nowhere
    error: str | None = None


def publish(url: str, stop: threading.Event, out: Published) -> None:
    """Persistent mandatory messages numbered from 1, confirms tracked one by one
    (multiple=true covers every tag up to it), returns recorded; goes on after the
    leader died (in flight then: nacks; later: returned and acked, as RabbitMQ 3.10
    routes nothing to a queue whose node is down)."""
    conn = Conn(url, timeout=10)
    try:
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        props = commands.Basic.Properties(delivery_mode=2)
        pending: set[int] = set()
        while not stop.is_set():
            while len(pending) < WINDOW:
                out.sent += 1
                body = str(out.sent).encode()
                conn.send(ch, commands.Basic.Publish(exchange="", routing_key="hot",
                                                     mandatory=True),
                          ContentHeader(0, len(body), props), ContentBody(body))
                pending.add(out.sent)
            while len(pending) >= WINDOW // 2:
                _ch, fr = conn.read_frame()
                if isinstance(fr, commands.Basic.Ack | commands.Basic.Nack):
                    tags = ({t for t in pending if t <= fr.delivery_tag} if fr.multiple
                            else {fr.delivery_tag} & pending)
                    pending -= tags
                    (out.nacked if isinstance(fr, commands.Basic.Nack)
                     else out.confirmed).update(tags)
                elif isinstance(fr, ContentBody):  # the body of a basic.return
                    out.returned.add(int(fr.value))
                elif isinstance(fr, commands.Channel.Close | commands.Connection.Close):
                    raise ProtocolError(f"{fr.reply_code} {fr.reply_text}")
    except (OSError, ProtocolError) as exc:
        out.error = repr(exc)
    finally:
        conn.close()


@dataclass
class Consumed:
    got: list[tuple[int, bool]] = field(default_factory=list)  # (number, redelivered)
    cancelled: bool = False
    error: str | None = None


def consume(url: str, stop: threading.Event, out: Consumed, prefetch: int = 50) -> None:
    """Consume ``hot`` with manual acks (each acked once its body is in) until stopped
    or cancelled by the broker."""
    conn = Conn(url, timeout=1)
    try:
        ch = conn.open_channel(1)
        conn.rpc(ch, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        conn.rpc(ch, commands.Basic.Consume(queue="hot", consumer_tag="c"),
                 commands.Basic.ConsumeOk)
        deliver: commands.Basic.Deliver | None = None
        while not stop.is_set():
            try:
                _ch, fr = conn.read_frame()
            except TimeoutError:
                continue
            if isinstance(fr, commands.Basic.Deliver):
                deliver = fr
            elif isinstance(fr, ContentBody) and deliver is not None:
                out.got.append((int(fr.value), bool(deliver.redelivered)))
                assert deliver.delivery_tag is not None  # always set on a decoded Deliver
                conn.send(ch, commands.Basic.Ack(delivery_tag=deliver.delivery_tag))
                deliver = None
            elif isinstance(fr, commands.Basic.Cancel):
                out.cancelled = True
                return
            elif isinstance(fr, commands.Channel.Close | commands.Connection.Close):
                raise ProtocolError(f"{fr.reply_code} {fr.reply_text}")
    except (OSError, ProtocolError) as exc:
        out.error = repr(exc)
    finally:
        conn.close()


def assert_404_on(node: ClusterNode) -> None:
    conn = Conn(node.url)
    try:
        with pytest.raises(ProtocolError) as info:
            conn.declare_queue(conn.open_channel(1), "hot", durable=True)
        assert str(info.value) == f"channel.close 404 {TEXT}"
    finally:
        conn.close()


@pytest.mark.slow
def test_kill_9_at_a_random_moment_under_traffic(nodes: list[ClusterNode]) -> None:
    seed = int(os.environ.get("AMQPD_KILL_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"AMQPD_KILL_SEED={seed}")
    rng = random.Random(seed)
    a, b, c = nodes
    declare_on(a, "hot")
    wait_known_everywhere(nodes, "hot", a.name)
    stop_pub, stop_cons = threading.Event(), threading.Event()
    pub, before = Published(), Consumed()
    threads = [threading.Thread(target=publish, args=(b.url, stop_pub, pub)),
               threading.Thread(target=consume, args=(c.url, stop_cons, before))]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(pub.confirmed) >= 200 and len(before.got) >= 50, 60,
                 "traffic through node-a", a.tail)
        time.sleep(rng.uniform(0.0, 2.0))  # the random moment
        a.kill()  # SIGKILL
        wait_for(lambda: before.cancelled or before.error is not None, 15,
                 "basic.cancel on node-c", c.tail)
        # the publisher goes on a little: what it routes to the lost queue is nacked
        # while node-b still counts node-a running, then comes back unroutable
        wait_counted_down([b], a.name)
        sent = pub.sent
        wait_for(lambda: pub.sent > sent + WINDOW, 15, "publishes after the kill", b.tail)
    finally:
        stop_pub.set()
        stop_cons.set()
        for t in threads:
            t.join(30)
    print(f"sent {pub.sent}, confirmed {len(pub.confirmed)}, nacked {len(pub.nacked)}, "
          f"returned {len(pub.returned)}, consumed before the kill {len(before.got)}")
    assert pub.error is None, pub.error
    assert before.error is None, before.error
    assert before.cancelled
    # what was published once node-b saw the queue's node down came back unroutable
    assert pub.returned, "publishes to the lost queue must come back (mandatory)"
    for n in (b, c):
        assert_404_on(n)
    a.start()
    wait_for(lambda: usable(b, "hot") and usable(c, "hot"), 60,
             "hot usable on b and c after node-a restarted", a.tail)
    after = Consumed()
    stop = threading.Event()
    t = threading.Thread(target=consume, args=(c.url, stop, after))
    t.start()
    try:
        seen = {n for n, _ in before.got}
        wanted = pub.confirmed - pub.returned
        wait_for(lambda: wanted <= seen | {n for n, _ in after.got}, 60,
                 "every confirmed message consumed", a.tail)
        # and whatever else the queue holds (unconfirmed ones that made it): drained
        wait_for(lambda: (queue_info(a, "hot") or {}).get("messages") == 0, 30,
                 "hot drained on its leader", a.tail)
    finally:
        stop.set()
        t.join(30)
    assert after.error is None, after.error
    everything = before.got + after.got
    missing = wanted - {n for n, _ in everything}
    assert not missing, f"confirmed but lost: {sorted(missing)[:20]} (seed {seed})"
    assert {n for n, _ in everything} <= set(range(1, pub.sent + 1)) - pub.returned
    counted: set[int] = set()
    for num, redelivered in everything:
        assert num not in counted or redelivered, \
            f"message {num} delivered twice, the second time without redelivered (seed {seed})"
        counted.add(num)
