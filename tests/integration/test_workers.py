"""``workers = 2`` (issue 35, docs/workers.md): one port, two processes, one broker.

Each test starts a real node (supervisor + two workers) on free loopback ports and
talks to it with pika through the node's one AMQP port; connections are forced onto a
chosen worker as tests/integration/workers_support.py says. Every message is counted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.workers_support import (
    connect_on,
    drain,
    kill_node,
    node_api,
    read_ready,
    wait_for,
    wait_restarted,
    worker_api,
    worker_info,
    workers_node,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = pytest.mark.timeout(240)

N = 2000


def on_each_worker(node: BrokerProcess) -> tuple[pika.BlockingConnection, ...]:
    """A connection on worker 0 and one on worker 1, through the node's port."""
    return connect_on(node, 0), connect_on(node, 1)


def owner_of(node: BrokerProcess, queue: str) -> str:
    """The worker whose API lists ``queue`` with its own node name (the owner)."""
    for w in read_ready(node)["workers"]:
        for q in worker_api(node, w["index"], "/api/queues"):
            if q["name"] == queue and q.get("node", "").endswith(f"-w{w['index']}"):
                return str(q["node"])
    raise AssertionError(f"no worker owns {queue}")


def test_one_port_two_workers_definitions_and_cross_worker_publish(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        ca, cb = a.channel(), b.channel()
        # declared through worker 0: exchange, queue, binding
        ca.exchange_declare("x.orders", "direct", durable=True)
        ca.queue_declare("orders", durable=True)
        ca.queue_bind("orders", "x.orders", "eu")
        assert owner_of(node, "orders").endswith("-w0")
        # visible through worker 1: a passive declare of each and its routing
        cb.exchange_declare("x.orders", passive=True)
        cb.queue_declare("orders", passive=True)
        cb.confirm_delivery()
        for i in range(N):  # published on worker 1, owned by worker 0
            cb.basic_publish("x.orders", "eu", b"%06d" % i,
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
        # every publish was confirmed (BlockingChannel raises on nack or return)
        assert cb.queue_declare("orders", passive=True).method.message_count == N
        got = drain(ca, "orders", N, prefetch=200)
        assert got == [b"%06d" % i for i in range(N)]  # all, once, in publish order
        # an unknown exchange is still 404 through either worker
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            cb.basic_publish("nope", "k", b"x")
            cb.queue_declare("orders", passive=True)
        assert err.value.reply_code == 404
        a.close()
        b.close()


def test_consumer_on_the_worker_that_does_not_own_the_queue(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        ca, cb = a.channel(), b.channel()
        ca.queue_declare("work", durable=True)
        ca.confirm_delivery()
        cb.confirm_delivery()
        for i in range(N // 2):  # both workers publish, both confirmed
            ca.basic_publish("", "work", b"a%05d" % i, pika.BasicProperties(delivery_mode=2))
            cb.basic_publish("", "work", b"b%05d" % i, pika.BasicProperties(delivery_mode=2))
        consumer = b.channel()  # on worker 1; the queue is worker 0's
        got = drain(consumer, "work", N, prefetch=200)
        assert len(got) == N and len(set(got)) == N
        # per publisher, order is kept
        assert [m for m in got if m[:1] == b"a"] == [b"a%05d" % i for i in range(N // 2)]
        assert [m for m in got if m[:1] == b"b"] == [b"b%05d" % i for i in range(N // 2)]
        assert ca.queue_declare("work", passive=True).method.message_count == 0
        a.close()
        b.close()


def test_kill_9_of_one_worker(tmp_path: Path) -> None:
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        ca, cb = a.channel(), b.channel()
        ca.queue_declare("on-w0", durable=True)
        cb.queue_declare("on-w1", durable=True)
        ca.confirm_delivery()
        cb.confirm_delivery()
        for i in range(500):
            ca.basic_publish("", "on-w0", b"%d" % i, pika.BasicProperties(delivery_mode=2))
            cb.basic_publish("", "on-w1", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        victim = worker_info(node, 1)["pid"]
        import os
        import signal

        os.kill(victim, signal.SIGKILL)
        # its client is disconnected ...
        def b_closed() -> bool:
            try:
                b.process_data_events(0.1)
            except pika.exceptions.AMQPConnectionError:
                return True
            return b.is_closed
        wait_for(b_closed, 15, "worker 1's client to be disconnected")
        # ... the other worker's is not: it keeps publishing and consuming its queue
        for i in range(500, 600):
            ca.basic_publish("", "on-w0", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        # and what it publishes meanwhile into the dead worker's queue is nacked or,
        # once that worker is back, confirmed: never confirmed and dropped
        confirmed: list[bytes] = []
        nacked = 0

        def back() -> bool:
            nonlocal nacked
            body = b"%d" % (500 + len(confirmed) + nacked)
            try:
                ca.basic_publish("", "on-w1", body, pika.BasicProperties(delivery_mode=2))
                confirmed.append(body)
            except pika.exceptions.NackError:
                nacked += 1
            return len(confirmed) >= 20
        wait_for(back, 60, "publishes into the restarted worker's queue to be confirmed")
        wait_restarted(node, 1, victim)
        assert a.is_open
        got = drain(a.channel(), "on-w0", 600, prefetch=200)
        assert got == [b"%d" % i for i in range(600)]
        # the restarted worker recovered its queue: every confirmed message is there
        b2 = connect_on(node, 1)
        got1 = drain(b2.channel(), "on-w1", 500 + len(confirmed), prefetch=200)
        assert got1 == [b"%d" % i for i in range(500)] + confirmed
        # and the node port keeps working for new connections through both workers
        assert read_ready(node)["amqp_port"] == node.port
        a.close()
        b2.close()


def test_kill_9_of_the_whole_node(tmp_path: Path) -> None:
    node = BrokerProcess(tmp_path / "node", extra_args=["--workers", "2"])
    node.start(timeout=60)
    try:
        a, b = on_each_worker(node)
        ca, cb = a.channel(), b.channel()
        ca.exchange_declare("fan", "fanout", durable=True)
        ca.queue_declare("q0", durable=True)
        cb.queue_declare("q1", durable=True)
        ca.queue_bind("q0", "fan")
        cb.queue_bind("q1", "fan")
        cb.confirm_delivery()
        for i in range(300):  # through worker 1 into both workers' queues
            cb.basic_publish("fan", "", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        kill_node(node)
        node.start(timeout=60)
        expect = [b"%d" % i for i in range(300)]
        for index, queue in ((0, "q0"), (1, "q1"), (1, "q0"), (0, "q1")):
            conn = connect_on(node, index)
            ch = conn.channel()
            assert ch.queue_declare(queue, passive=True).method.message_count == 300
            conn.close()
        conn = connect_on(node, 1)
        # q0 is owned by w0, consumed via w1
        assert drain(conn.channel(), "q0", 300, prefetch=200) == expect
        assert drain(conn.channel(), "q1", 300, prefetch=200) == expect
        # the binding survived too: a new publish reaches both queues again
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("fan", "", b"after", pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare("q0", passive=True).method.message_count == 1
        assert ch.queue_declare("q1", passive=True).method.message_count == 1
        conn.close()
    finally:
        node.stop()


def test_exclusive_queue_belongs_to_its_connection_on_every_worker(tmp_path: Path) -> None:
    """RabbitMQ 3.10: another connection's exclusive queue is 405 RESOURCE_LOCKED for
    a declare or a consume, wherever that other connection is; it goes with its
    connection (then 404)."""
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        a.channel().queue_declare("mine", exclusive=True)
        # the other worker learns of the queue through the private cluster, after the
        # declare-ok (a gap docs/workers.md names: 404 there until then)
        wait_for(lambda: any(q["name"] == "mine" for q in worker_api(node, 1, "/api/queues")),
                 15, "worker 1 to know the exclusive queue")
        for attempt in ("declare", "consume"):
            ch = b.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                if attempt == "declare":
                    ch.queue_declare("mine", passive=True)
                else:
                    ch.basic_consume("mine", lambda *_: None)
            assert err.value.reply_code == 405, (attempt, err.value)
        a.close()

        def gone() -> bool:
            ch = b.channel()
            try:
                ch.queue_declare("mine", passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404, exc
                return True
            ch.close()
            return False
        wait_for(gone, 15, "the exclusive queue to go with its connection")
        b.close()


def test_workers_1_is_one_process(tmp_path: Path) -> None:
    """The default runs no supervisor: the ready file's pid serves AMQP itself, has no
    workers, and the data directory has no workers/ part."""
    node = BrokerProcess(tmp_path / "one").start()
    try:
        info = read_ready(node)
        assert node.proc is not None and info["pid"] == node.proc.pid
        assert "workers" not in info
        assert not (node.data_dir / "workers").exists()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
        assert conn.channel().queue_declare("", exclusive=True).method.queue
        conn.close()
    finally:
        node.stop()


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "-1"], "setting 'workers' must be 0 (one per core) or 1-256, not -1"),
    (["--workers", "2", "--stream-port", "0"],
     "setting 'workers' = 2: the stream protocol (stream) cannot run with more than one "
     "worker yet"),
])
def test_refused_settings_say_why(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "amqpd", "--data-dir", str(tmp_path),
                           "--port", "0", *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_a_worker_that_cannot_start_stops_the_node(tmp_path: Path) -> None:
    """Worker 1's data directory is a file: it exits before serving, three times, and
    the node exits 1 saying so (and stops worker 0), as a broker that cannot start."""
    data = tmp_path / "node"
    (data / "workers").mkdir(parents=True)
    (data / "workers" / "w1").write_text("not a directory")
    proc = subprocess.run([sys.executable, "-m", "amqpd", "--data-dir", str(data),
                           "--bind", "127.0.0.1", "--port", "0", "--http-port", "0",
                           "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "is not a directory" in proc.stderr
    assert "worker 1 exited 3 times without serving" in proc.stderr


def test_a_non_durable_queue_is_known_on_the_other_worker_once_declared(
        tmp_path: Path) -> None:
    """RabbitMQ answers queue.declare-ok once every node has the queue: another
    connection, wherever it is, consumes it at once (no 404), is refused its exclusive
    name (405, not a second queue of that name), and a consumer there gets basic.cancel
    when the queue is deleted. Worker 1 learns of worker 0's non-durable queues through
    the private cluster; before the declare-ok waited for it, it often did not know yet
    (the conformance suite's consumer_cancel_notify and exclusive cases with two
    workers)."""
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        ca = a.channel()
        for i in range(20):
            plain, mine = f"plain-{i}", f"mine-{i}"
            ca.queue_declare(plain)
            ca.queue_declare(mine, exclusive=True)
            cb = b.channel()
            cancelled: list[str] = []
            cb.add_on_cancel_callback(
                lambda frame, into=cancelled: into.append(frame.method.consumer_tag))
            tag = cb.basic_consume(plain, lambda *_: None, auto_ack=True)  # no 404
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                b.channel().queue_declare(mine, exclusive=True)
            assert err.value.reply_code == 405, (i, err.value)
            ca.queue_delete(plain)
            wait_for(lambda into=cancelled: (b.process_data_events(0), into)[1], 10,
                     "basic.cancel of the deleted queue's consumer")
            assert cancelled == [tag]
            cb.close()
        a.close()
        b.close()


def test_fanout_bound_on_one_worker_routes_the_next_publish_on_the_other(
        tmp_path: Path) -> None:
    """queue.bind-ok on worker 0 means a publish on worker 1 the moment after reaches
    the queue: every message, in order, in every queue (the conformance suite's
    fanout-to-50-queues case lost the first messages with two workers: the binding
    reached worker 1 after the publisher's first messages)."""
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        ca = a.channel()
        ca.exchange_declare("fan", "fanout")
        cb = b.channel()
        cb.confirm_delivery()
        queues = []
        for i in range(20):
            q = f"fan-{i}"
            ca.queue_declare(q)
            ca.queue_bind(q, "fan")
            queues.append(q)
            cb.basic_publish("fan", "", b"%d" % i)  # confirmed (raises on a nack)
        for i, q in enumerate(queues):
            got = [int(m) for m in drain(ca, q, len(queues) - i, timeout=10, prefetch=200)]
            assert got == list(range(i, len(queues))), (q, got)
        a.close()
        b.close()


def test_binding_made_on_the_worker_that_does_not_own_the_queue_routes_everywhere(
        tmp_path: Path) -> None:
    """RabbitMQ's bindings are cluster-wide wherever they were made: a non-durable
    queue declared on worker 1, bound from worker 0, gets the messages published
    through worker 1 (its owner) as well as through worker 0; unbound from worker 0,
    neither routes to it. Before, the binding stayed on worker 0 (docs/workers.md)."""
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        ca, cb = a.channel(), b.channel()
        ca.confirm_delivery()
        cb.confirm_delivery()
        ca.exchange_declare("bx", "direct")
        for i in range(10):
            q = f"nd-{i}"
            cb.queue_declare(q)  # owned by worker 1
            ca.queue_bind(q, "bx", routing_key=q)  # bound through worker 0
            for ch in (cb, ca):
                ch.basic_publish("bx", q, b"m", mandatory=True)  # 312 raises
            assert len(drain(cb, q, 2, timeout=10, prefetch=200)) == 2, q
            ca.queue_unbind(q, "bx", routing_key=q)
            for ch in (cb, ca):
                with pytest.raises(pika.exceptions.UnroutableError):
                    ch.basic_publish("bx", q, b"m", mandatory=True)
        assert {x["destination"] for x in worker_api(node, 1, "/api/bindings/%2F")
                if x["source"] == "bx"} == set()
        a.close()
        b.close()


def test_direct_reply_to_across_workers(tmp_path: Path) -> None:
    """A reply published on another worker than the requester's reaches it, each one,
    in order (RabbitMQ routes direct replies across a cluster's nodes; with two
    workers it was dropped)."""
    with workers_node(tmp_path / "node") as node:
        server, client = on_each_worker(node)
        sch, cch = server.channel(), client.channel()
        sch.queue_declare("rpc")
        sch.confirm_delivery()
        replies: list[bytes] = []
        cch.basic_consume("amq.rabbitmq.reply-to", lambda _c, _m, _p, body: replies.append(
            body), auto_ack=True)
        for i in range(5):
            cch.basic_publish("", "rpc", b"ping-%d" % i,
                              pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))

            def request() -> tuple[object, pika.BasicProperties, bytes] | None:
                got = sch.basic_get("rpc", auto_ack=True)
                return got if got[0] is not None else None
            _m, props, body = wait_for(request, 10, "the request")
            assert body == b"ping-%d" % i
            assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
            sch.basic_publish("", props.reply_to, b"pong-%d" % i)  # confirmed
        wait_for(lambda: (client.process_data_events(0), len(replies) >= 5)[1], 10,
                 "the replies")
        assert replies == [b"pong-%d" % i for i in range(5)]
        server.close()
        client.close()


def test_stream_purge_through_the_other_worker_is_540(tmp_path: Path) -> None:
    """queue.purge of a stream closes the connection with 540 NOT_IMPLEMENTED, as on
    one worker, when the stream is owned by the other worker (it was answered
    purge-ok and nothing was purged)."""
    with workers_node(tmp_path / "node") as node:
        a, b = on_each_worker(node)
        a.channel().queue_declare("s", durable=True,
                                  arguments={"x-queue-type": "stream"})
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
            b.channel().queue_purge("s")
        assert err.value.reply_code == 540, err.value
        assert "NOT_IMPLEMENTED" in err.value.reply_text
        a.close()


# a bound on one basic.get of a quorum queue whose group is getting its majority back:
# the leader holds the get for up to GET_WAIT (10 s; amqpd.cluster.quorum_leading)
GET_BOUND = 15.0


def get_within(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str
               ) -> tuple[bytes | None, float]:
    """One basic.get (manual ack, then nack with requeue): its body (None for
    get-empty) and how long the answer took."""
    t0 = time.monotonic()
    method, _props, body = ch.basic_get(queue, auto_ack=False)
    took = time.monotonic() - t0
    if method is None:
        return None, took
    ch.basic_nack(method.delivery_tag, requeue=True)
    return body, took


def _two_in_a_quorum_queue(node: BrokerProcess) -> pika.BlockingConnection:
    """Quorum queue qq1 declared through worker 0 with two confirmed persistent
    messages (b"a", b"b"); the connection that did it."""
    conn = connect_on(node, 0)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("qq1", durable=True, arguments={"x-queue-type": "quorum"})
    for payload in (b"a", b"b"):
        ch.basic_publish("", "qq1", payload, pika.BasicProperties(delivery_mode=2))
    return conn


def test_quorum_queue_basic_get_after_a_restart_finds_its_messages(tmp_path: Path) -> None:
    """Issue 35: after a restart, a quorum queue's group (its two workers) may not have
    its majority back for a while; a basic.get on either worker meanwhile answered
    get-empty while the declare-ok counted the messages. Now the get waits for it."""
    node = BrokerProcess(tmp_path / "node", extra_args=["--workers", "2"])
    node.start(timeout=60)
    try:
        a = _two_in_a_quorum_queue(node)
        a.close()
        node.stop()
        node.start(timeout=60)
        for index in (0, 1, 0, 1):
            conn = connect_on(node, index)
            ch = conn.channel()
            ok = ch.queue_declare("qq1", durable=True,
                                  arguments={"x-queue-type": "quorum"})
            assert ok.method.message_count == 2
            body, took = get_within(ch, "qq1")
            assert body in (b"a", b"b"), f"worker {index}: get-empty after {took:.2f}s"
            assert took < GET_BOUND
            conn.close()
    finally:
        node.stop()


def test_a_quorum_queue_has_one_member_the_owning_worker(tmp_path: Path) -> None:
    """Whatever x-quorum-initial-group-size asks, a quorum queue of a multi-worker node
    has one member, the worker that owns it (cluster.quorum_max_members = 1): members on
    one machine's workers gave no availability (a majority of two needs both) and made
    every commit of the node wait for the other worker, which under load left whole
    nodes nacking every commit for as long as one copy stayed incomplete. Each worker's
    private API shows the group's members by worker name (the node's front would show
    the node's name once, either way). The queue then serves through both workers, and
    confirms keep coming while the other worker is killed and restarts."""
    import os
    import signal

    with workers_node(tmp_path / "node") as node:
        a = connect_on(node, 0)
        ch = a.channel()
        ch.confirm_delivery()
        for name, args in (("qq-default", {}), ("qq-three", {"x-quorum-initial-group-size": 3})):
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", **args})
            assert owner_of(node, name).endswith("-w0")
        def one_member(index: int) -> bool:
            members = {q["name"]: q.get("members") or [] for q in
                       worker_api(node, index, "/api/queues") if q["name"].startswith("qq-")}
            return sorted(members) == ["qq-default", "qq-three"] and all(
                len(m) == 1 and str(m[0]).endswith("-w0") for m in members.values())
        for index in (0, 1):
            wait_for(lambda index=index: one_member(index), 20,
                     f"worker {index} to list each quorum queue with one member, worker 0")
        victim = worker_info(node, 1)["pid"]
        os.kill(victim, signal.SIGKILL)
        for n in range(20):  # each confirmed (pika raises on a nack) while w1 restarts
            ch.basic_publish("", "qq-three", str(n).encode(),
                             pika.BasicProperties(delivery_mode=2))
        wait_restarted(node, 1, victim)
        b = connect_on(node, 1)
        got = [get_within(b.channel(), "qq-three")[0] for _ in range(20)]
        assert got == [str(n).encode() for n in range(20)]
        a.close()
        b.close()


def test_quorum_queue_basic_get_while_its_other_member_restarts(tmp_path: Path) -> None:
    """kill -9 of the other worker while a basic.get on the owner's worker asks a quorum
    queue: it finds the messages. (When a quorum queue had a member on each worker, the
    owner's group had no majority until the other was back and its copy complete: the
    get had to wait for it, and got-empty at once before that was mended. Since the
    queue has one member, the owner, the other worker's restart does not touch it.)"""
    import os
    import signal

    with workers_node(tmp_path / "node") as node:
        a = _two_in_a_quorum_queue(node)
        ch = a.channel()
        assert owner_of(node, "qq1").endswith("-w0")
        victim = worker_info(node, 1)["pid"]
        os.kill(victim, signal.SIGKILL)
        # the supervisor saw it exit (its link to worker 0 went with it): worker 1 is
        # down for the ~2-3 s of its restart from here
        wait_for(lambda: node_api(node, "/api/workers")[1]["restarts"] >= 1, 10,
                 "the supervisor to see worker 1 exit")
        assert ch.queue_declare("qq1", passive=True).method.message_count == 2
        body, took = get_within(ch, "qq1")
        assert body in (b"a", b"b"), f"get-empty after {took:.2f}s while w1 restarts"
        assert took < GET_BOUND
        wait_restarted(node, 1, victim)
        body, _ = get_within(ch, "qq1")
        assert body in (b"a", b"b")
        a.close()
