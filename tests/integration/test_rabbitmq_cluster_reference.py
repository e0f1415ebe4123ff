"""What RabbitMQ 3.10 does when a node of a cluster is lost: the reference amqpd's
cluster (issue 15) is matched against.

One private three-node RabbitMQ cluster (devtools/rabbitmq_cluster.py) serves both
scenarios below, one after the other: starting a cluster is most of their time. In the
first, node 3 stands by and takes no part (RabbitMQ answers it as a two-node cluster
does: docs/clustering.md). Node 1 leads a
durable classic queue holding persistent messages and a non-durable one; node 2 leads
a durable queue of its own; two clients on node 2 consume node 1's durable queue (one
announcing consumer_cancel_notify, one not). A publisher with confirms on node 2 streams
persistent messages to node 1's durable queue, and once node 1 has confirmed some of
them, node 1's Erlang VM is killed with kill -9; then a client on node 2 tries every
operation on node 1's queues. Every answer is recorded with its exact reply code and text
(raw frames: nothing a client library would retry or translate), checked here, and
written up in docs/clustering.md ("RabbitMQ 3.10 as measured"). Node 1 is then
restarted and what its durable queue holds is counted, by message.

Then, once node 1 is back, the same cluster answers what becomes of a quorum queue
consumer's unacked deliveries when the leader's node is killed: two quorum queues led
by node 1 hold 50 confirmed persistent messages each; one is consumed from nodes 2 and
3, the other from nodes 1 and 2 (prefetch 10, no acks); node 1 is killed with kill -9
and what each surviving consumer gets is recorded, before and after it acks its held
deliveries by their old tags.

Set RABBITMQ_CLUSTER_REFERENCE_OUT=file.json to keep every answer recorded.

Skipped, with the reason, when RabbitMQ is not installed or the cluster cannot start.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from devtools.rabbitmq import RabbitInfo, RabbitMQError, RabbitMQNotInstalled, ctl, find_server
from devtools.rabbitmq_cluster import (
    CTL_TIMEOUT,
    ClusterInfo,
    kill_node,
    queue_leaders,
    restart_node,
    running_nodes,
    start_cluster,
    stop_cluster,
    wait_running,
)

# a RabbitMQ cluster's start, two kills and a restart: minutes on a loaded machine
pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow, pytest.mark.timeout(900)]

HDR = struct.Struct(">BHI")
WAIT = 15.0  # how long an answer may take on a loaded machine


class Endpoint(Protocol):
    """A node as :class:`Raw` reaches it (a RabbitInfo, or anything with the port)."""

    @property
    def amqp_port(self) -> int: ...


class Raw:
    """A blocking AMQP client on raw frames that returns the broker's answer as sent:
    the reply method, or the channel.close / connection.close with its code and text."""

    def __init__(self, node: Endpoint, capabilities: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", node.amqp_port), WAIT)
        self.buf = bytearray()
        self.frames: list[tuple[int, Any]] = []  # read but not yet asked for
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._wait(0, commands.Connection.Start)
        caps: dict[str, Any] = {"publisher_confirms": True, "basic.nack": True,
                                "consumer_cancel_notify": True} if capabilities else {}
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "cluster-reference", "capabilities": caps},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        tune = self._wait(0, commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                frame_max=tune.frame_max, heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self._wait(0, commands.Connection.OpenOk)
        self.next_channel = 1

    def send(self, channel: int, *frames: Any) -> None:
        self.sock.sendall(b"".join(frame.marshal(f, channel) for f in frames))

    def _read(self, deadline: float) -> tuple[int, Any] | None:
        while True:
            if len(self.buf) >= 7:
                size = HDR.unpack_from(self.buf, 0)[2]
                if len(self.buf) >= size + 8:
                    n, ch, fr = frame.unmarshal(bytes(self.buf[: size + 8]))
                    del self.buf[:n]
                    return ch, fr
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                return 0, "socket closed"
            self.buf += data

    def _wait(self, channel: int, *kinds: type, timeout: float = WAIT) -> Any:
        """The first frame on *channel* of one of *kinds*, or a close; None on timeout.
        Frames of other kinds are kept for :meth:`take`."""
        deadline = time.monotonic() + timeout
        for i, (ch, fr) in enumerate(self.frames):
            if ch == channel and isinstance(fr, kinds):
                del self.frames[i]
                return fr
        while True:
            got = self._read(deadline)
            if got is None:
                return None
            ch, fr = got
            if isinstance(fr, str | commands.Connection.Close):
                return fr
            if ch == channel and isinstance(fr, (*kinds, commands.Channel.Close)):
                if isinstance(fr, commands.Channel.Close):
                    self.send(ch, commands.Channel.CloseOk())
                return fr
            self.frames.append((ch, fr))

    def take(self, channel: int, kind: type, timeout: float = WAIT) -> Any:
        return self._wait(channel, kind, timeout=timeout)

    def channel(self) -> int:
        ch = self.next_channel
        self.next_channel += 1
        self.send(ch, commands.Channel.Open())
        assert isinstance(self._wait(ch, commands.Channel.OpenOk), commands.Channel.OpenOk)
        return ch

    def call(self, ch: int, method: Any, reply: type) -> Any:
        self.send(ch, method)
        return self._wait(ch, reply)

    def publish(self, ch: int, queue: str, body: bytes, mandatory: bool = False,
                persistent: bool = True) -> None:
        props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
        self.send(ch, commands.Basic.Publish(exchange="", routing_key=queue,
                                             mandatory=mandatory),
                  ContentHeader(0, len(body), props), ContentBody(body))

    def confirm_outcome(self, ch: int, timeout: float = WAIT) -> list[str]:
        """Everything the broker says about the last publish on a confirm channel, in
        order, up to and including its ack or nack (or a close)."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fr = self._wait(ch, commands.Basic.Ack, commands.Basic.Nack,
                            commands.Basic.Return, timeout=deadline - time.monotonic())
            if fr is None:
                seen.append("nothing")
                return seen
            seen.append(describe(fr))
            if not isinstance(fr, commands.Basic.Return):
                return seen
        return seen

    def drain(self, ch: int, queue: str, n: int) -> dict[str, int]:
        """Consume *n* messages without acks; count them by kind of body: "before"
        (before-N), "s" (the streamed ones, all "sss..."), "during" (during, during-m...)."""
        self.call(ch, commands.Basic.Consume(queue=queue, no_ack=True),
                  commands.Basic.ConsumeOk)
        counts: dict[str, int] = {}
        got = 0
        deadline = time.monotonic() + 120
        while got < n:
            fr = self._wait(ch, ContentBody, timeout=deadline - time.monotonic())
            if not isinstance(fr, ContentBody):
                counts["error: " + describe(fr)] = 1
                break
            body = bytes(fr.value)
            key = "s" if body.startswith(b"sss") else body.split(b"-", 1)[0].decode()
            counts[key] = counts.get(key, 0) + 1
            got += 1
        return counts

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def describe(fr: Any) -> str:
    """A frame as the table in docs/clustering.md shows it."""
    if fr is None:
        return "nothing"
    if isinstance(fr, str):
        return fr
    if isinstance(fr, commands.Channel.Close | commands.Connection.Close):
        return f"{fr.name} {fr.reply_code} {fr.reply_text}"
    if isinstance(fr, commands.Basic.Return):
        return f"Basic.Return {fr.reply_code} {fr.reply_text}"
    if isinstance(fr, commands.Basic.Cancel):
        return "Basic.Cancel"
    if isinstance(fr, commands.Queue.DeclareOk):
        return f"Queue.DeclareOk messages={fr.message_count} consumers={fr.consumer_count}"
    if isinstance(fr, commands.Basic.GetOk):
        return "Basic.GetOk"
    return str(fr.name)


def attempt(node: Endpoint, method: Any, reply: type, *, confirm: bool = False,
            publish: dict[str, Any] | None = None) -> str:
    """One operation on a fresh channel of a fresh connection to *node*."""
    c = Raw(node)
    try:
        ch = c.channel()
        if confirm:
            c.call(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        if publish is not None:
            c.publish(ch, **publish)
            return " then ".join(c.confirm_outcome(ch))
        return describe(c.call(ch, method, reply))
    finally:
        c.close()


class Streaming:
    """A confirm-mode publisher that sends persistent messages in batches from one
    thread while another reads every ack and nack, until stopped (bounded)."""

    BATCH = 100
    LIMIT = 30_000

    def __init__(self, node: Endpoint, queue: str) -> None:
        self.c = Raw(node)
        self.ch = self.c.channel()
        self.c.call(self.ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.queue = queue
        self.sent = 0
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.closed = ""
        self.at_kill: dict[str, int] = {}
        self._stop = threading.Event()
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._sender.start()

    def _send(self) -> None:
        body = b"s" * 1024
        props = commands.Basic.Properties(delivery_mode=2)
        batch = b"".join(frame.marshal(f, self.ch) for f in (
            commands.Basic.Publish(exchange="", routing_key=self.queue),
            ContentHeader(0, len(body), props), ContentBody(body)))
        while not self._stop.is_set() and self.sent < self.LIMIT:
            try:
                self.c.sock.sendall(batch * self.BATCH)
            except OSError as exc:
                self.closed = f"send: {exc}"
                return
            self.sent += self.BATCH

    def _read(self) -> None:
        floor = 1  # the lowest publish not yet acked or nacked
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self._stop.is_set() and self.sent and floor > self.sent:
                return
            got = self.c._read(time.monotonic() + 1)
            if got is None:
                continue
            _, fr = got
            if isinstance(fr, commands.Basic.Ack | commands.Basic.Nack):
                into = self.acked if isinstance(fr, commands.Basic.Ack) else self.nacked
                tags = range(floor, fr.delivery_tag + 1) if fr.multiple else \
                    [fr.delivery_tag]
                for t in tags:
                    if t not in self.acked and t not in self.nacked:
                        into.add(t)
                while floor in self.acked or floor in self.nacked:
                    floor += 1
            elif not isinstance(fr, commands.Basic.Return):
                self.closed = describe(fr)
                return

    def wait_acked(self, n: int, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(self.acked) >= n

    def mark(self) -> None:
        """Note what was sent and confirmed just before the node is killed."""
        self.at_kill = {"sent": self.sent, "acked": len(self.acked),
                        "nacked": len(self.nacked)}

    def stop(self) -> None:
        self._stop.set()
        self._sender.join(30)

    def outcome(self) -> dict[str, Any]:
        self._reader.join(60)
        self.c.close()
        return {"published": self.sent, "acked": len(self.acked),
                "nacked": len(self.nacked), "closed": self.closed,
                "at_kill": self.at_kill}


def rabbitmq_cluster(tmp_path_factory: pytest.TempPathFactory, nodes: int,
                     ) -> Iterator[ClusterInfo]:
    """A private RabbitMQ cluster of ``nodes`` nodes, stopped on the way out; the tests
    that use it are skipped, with the reason, where RabbitMQ is not installed or such a
    cluster cannot be started here. The module fixtures below are made of it."""
    try:
        find_server()
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    d = tmp_path_factory.mktemp(f"rabbitmq-cluster{nodes}")
    try:
        c = start_cluster(d, nodes=nodes)
    except RabbitMQError as exc:
        pytest.skip(f"a {nodes}-node RabbitMQ cluster could not be started here: {exc}")
    try:
        yield c
    finally:
        stop_cluster(d)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    """Three nodes for both scenarios: the quorum one needs a majority to survive a
    node's loss; the node-loss one uses nodes 1 and 2, and leaves node 1 restarted."""
    yield from rabbitmq_cluster(tmp_path_factory, 3)


DQ, TQ, XQ = "ref-durable-on-1", "ref-transient-on-1", "ref-exclusive-on-1"
DQ2 = "ref-durable-on-2"


class Pair(Protocol):
    """Two nodes of a cluster of some broker, as :func:`observe` drives them."""

    @property
    def n1(self) -> Endpoint: ...

    @property
    def n2(self) -> Endpoint: ...

    name1: str
    name2: str

    def leaders(self) -> dict[str, str]:
        """Queue name -> the name of the node that leads it."""

    def wait_known(self, queue: str) -> None:
        """Until node 2 can use node 1's durable *queue*."""

    def kill1(self) -> None:
        """kill -9 of node 1."""

    def wait_down(self) -> None:
        """Until node 2 sees node 1 down."""

    def states_on_2(self) -> dict[str, str]:
        """Queue name -> state, as node 2 lists its queues."""

    def restart1(self) -> None:
        """Start node 1 again with its data; return once node 2 sees it running.
        ``n1`` is node 1 as restarted."""


def observe(pair: Pair) -> dict[str, Any]:
    """Set up, kill node 1, and record node 2's answers to every operation."""
    n1, n2 = pair.n1, pair.n2
    out: dict[str, Any] = {"node1": pair.name1, "node2": pair.name2}
    setup = Raw(n1)
    ch = setup.channel()
    # RabbitMQ 3.10's default locator is client-local: declared on node 1, led by it
    assert isinstance(setup.call(ch, commands.Queue.Declare(queue=DQ, durable=True),
                                 commands.Queue.DeclareOk), commands.Queue.DeclareOk)
    assert isinstance(setup.call(ch, commands.Queue.Declare(queue=TQ, durable=False),
                                 commands.Queue.DeclareOk), commands.Queue.DeclareOk)
    # an exclusive queue of a connection to node 1 (kept open until node 1 dies)
    assert isinstance(setup.call(ch, commands.Queue.Declare(queue=XQ, exclusive=True),
                                 commands.Queue.DeclareOk), commands.Queue.DeclareOk)
    setup.call(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
    for i in range(3):
        setup.publish(ch, DQ, b"before-%d" % i)
        assert setup.confirm_outcome(ch) == ["Basic.Ack"]
    setup.publish(ch, TQ, b"transient")
    assert setup.confirm_outcome(ch) == ["Basic.Ack"]
    other = Raw(n2)
    ch = other.channel()
    assert isinstance(other.call(ch, commands.Queue.Declare(queue=DQ2, durable=True),
                                 commands.Queue.DeclareOk), commands.Queue.DeclareOk)
    other.close()
    pair.wait_known(DQ)
    out["leaders"] = pair.leaders()

    # consumers on node 2 of node 1's durable queue: one with consumer_cancel_notify,
    # one without
    watchers = {}
    for name, caps in (("with_notify", True), ("without_notify", False)):
        c = Raw(n2, capabilities=caps)
        wch = c.channel()
        c.call(wch, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
        ok = c.call(wch, commands.Basic.Consume(queue=DQ, consumer_tag=f"ctag-{name}"),
                    commands.Basic.ConsumeOk)
        assert isinstance(ok, commands.Basic.ConsumeOk), describe(ok)
        watchers[name] = (c, wch)
    # the one with notify holds one unacked delivery from node 1's queue
    first = watchers["with_notify"][0].take(watchers["with_notify"][1],
                                           commands.Basic.Deliver)
    assert isinstance(first, commands.Basic.Deliver)
    out["unacked_delivery_tag"] = first.delivery_tag

    # a publisher with confirms on node 2 streams persistent messages to node 1's
    # queue while node 1 is killed: what happens to those in flight?
    stream = Streaming(n2, DQ)
    stream.start()
    assert stream.wait_acked(1000), "the streaming publisher did not get going"
    stream.mark()
    pair.kill1()
    stream.stop()
    setup.close()
    pair.wait_down()

    out["in_flight"] = stream.outcome()
    for name, (c, wch) in watchers.items():
        out[f"consumer_{name}"] = describe(c.take(wch, commands.Basic.Cancel, timeout=10))
    # the consumer's channel afterwards: acking the delivery that came from node 1
    c, wch = watchers["with_notify"]
    c.send(wch, commands.Basic.Ack(delivery_tag=out["unacked_delivery_tag"]))
    out["ack_after_loss"] = describe(c.call(wch, commands.Basic.Qos(prefetch_count=1),
                                            commands.Basic.QosOk))
    for c, _ in watchers.values():
        c.close()

    out["declare_passive_durable"] = attempt(
        n2, commands.Queue.Declare(queue=DQ, passive=True), commands.Queue.DeclareOk)
    out["declare_active_durable"] = attempt(
        n2, commands.Queue.Declare(queue=DQ, durable=True), commands.Queue.DeclareOk)
    out["declare_active_nondurable_args"] = attempt(
        n2, commands.Queue.Declare(queue=DQ, durable=False), commands.Queue.DeclareOk)
    out["publish_confirm"] = attempt(n2, None, object, confirm=True,
                                     publish={"queue": DQ, "body": b"during"})
    out["publish_confirm_mandatory"] = attempt(
        n2, None, object, confirm=True,
        publish={"queue": DQ, "body": b"during-m", "mandatory": True})
    out["publish_confirm_transient_msg"] = attempt(
        n2, None, object, confirm=True,
        publish={"queue": DQ, "body": b"during-t", "persistent": False})
    out["basic_get"] = attempt(n2, commands.Basic.Get(queue=DQ), commands.Basic.GetOk)
    out["basic_consume"] = attempt(n2, commands.Basic.Consume(queue=DQ),
                                   commands.Basic.ConsumeOk)
    out["queue_purge"] = attempt(n2, commands.Queue.Purge(queue=DQ), commands.Queue.PurgeOk)
    out["queue_bind"] = attempt(n2, commands.Queue.Bind(queue=DQ, exchange="amq.direct",
                                                        routing_key="k"),
                                commands.Queue.BindOk)
    out["nondurable_passive"] = attempt(
        n2, commands.Queue.Declare(queue=TQ, passive=True), commands.Queue.DeclareOk)
    out["exclusive_passive"] = attempt(
        n2, commands.Queue.Declare(queue=XQ, passive=True), commands.Queue.DeclareOk)
    out["nondurable_publish_mandatory"] = attempt(
        n2, None, object, confirm=True,
        publish={"queue": TQ, "body": b"x", "mandatory": True})
    out["own_queue_publish"] = attempt(n2, None, object, confirm=True,
                                       publish={"queue": DQ2, "body": b"fine"})
    out["own_queue_passive"] = attempt(
        n2, commands.Queue.Declare(queue=DQ2, passive=True), commands.Queue.DeclareOk)
    out["queues_listed_on_2"] = pair.states_on_2()

    # node 1 comes back with its data
    pair.restart1()
    pair.wait_known(DQ)
    back = Raw(n2)
    bch = back.channel()
    ok = back.call(bch, commands.Queue.Declare(queue=DQ, passive=True),
                   commands.Queue.DeclareOk)
    out["after_restart_passive_durable"] = describe(ok)
    # what the queue holds, by body: "before-N", "s" (streamed), "during..."
    out["after_restart_bodies"] = back.drain(bch, DQ, ok.message_count)
    back.close()
    out["in_flight"]["found_after_restart"] = out["after_restart_bodies"].get("s", 0)
    out["after_restart_nondurable"] = attempt(
        n2, commands.Queue.Declare(queue=TQ, passive=True), commands.Queue.DeclareOk)
    return out


class RabbitPair:
    """Nodes 1 and 2 of the private RabbitMQ cluster as a :class:`Pair`."""

    def __init__(self, cluster: ClusterInfo) -> None:
        self.cluster = cluster
        self.n1, self.n2 = cluster.nodes[:2]
        self.name1, self.name2 = self.n1.nodename, self.n2.nodename

    def leaders(self) -> dict[str, str]:
        return queue_leaders(self.n2)

    def wait_known(self, queue: str) -> None:
        pass  # a declare-ok means every node's Mnesia holds the queue

    def kill1(self) -> None:
        kill_node(self.n1)

    def wait_down(self) -> None:
        deadline = time.monotonic() + 300  # one rabbitmqctl call: up to 35 s under load
        while self.name1 in running_nodes(self.n2):
            assert time.monotonic() < deadline, "node 2 still sees node 1 running"
            time.sleep(0.2)

    def states_on_2(self) -> dict[str, str]:
        rows = json.loads(ctl(self.n2, "list_queues", "name", "state", "--formatter",
                              "json", timeout=CTL_TIMEOUT))
        return {r["name"]: r["state"] for r in rows}

    def restart1(self) -> None:
        self.n1 = restart_node(self.cluster, 0)
        wait_running(self.n2, [self.name1, self.name2])


@pytest.fixture(scope="module")
def seen(cluster: ClusterInfo) -> dict[str, Any]:
    out = observe(RabbitPair(cluster))
    report = os.environ.get("RABBITMQ_CLUSTER_REFERENCE_OUT")
    if report:
        Path(report).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


def home_node_down(node: str, queue: str) -> str:
    return (f"Channel.Close 404 NOT_FOUND - home node '{node}' of durable queue "
            f"'{queue}' in vhost '/' is down or inaccessible")


def no_queue(queue: str) -> str:
    return f"Channel.Close 404 NOT_FOUND - no queue '{queue}' in vhost '/'"


def test_queues_are_led_by_the_node_they_were_declared_on(seen: dict[str, Any]) -> None:
    # RabbitMQ 3.10's default queue_leader_locator is client-local
    assert seen["leaders"] == {DQ: seen["node1"], TQ: seen["node1"], XQ: seen["node1"],
                               DQ2: seen["node2"]}


def test_consumers_of_the_lost_nodes_queue_are_cancelled(seen: dict[str, Any]) -> None:
    assert seen["consumer_with_notify"] == "Basic.Cancel"
    # a client that did not announce consumer_cancel_notify is told nothing
    assert seen["consumer_without_notify"] == "nothing"
    # acking a delivery that came from the lost node is not an error on the channel
    assert seen["ack_after_loss"] == "Basic.QosOk"


def test_durable_queue_of_the_lost_node_answers_404_naming_it(seen: dict[str, Any]) -> None:
    want = home_node_down(seen["node1"], DQ)
    for op in ("declare_passive_durable", "declare_active_durable",
               "declare_active_nondurable_args", "basic_get", "basic_consume",
               "queue_purge", "queue_bind"):
        assert seen[op] == want, op
    assert seen["queues_listed_on_2"][DQ] == "down"


def test_publish_to_the_lost_nodes_queue_is_confirmed_and_dropped(
        seen: dict[str, Any]) -> None:
    # Not a nack: the message is routed to no live queue, which a confirm acks; a
    # mandatory publish is returned first, as unroutable.
    assert seen["publish_confirm"] == "Basic.Ack"
    assert seen["publish_confirm_transient_msg"] == "Basic.Ack"
    assert seen["publish_confirm_mandatory"] == "Basic.Return 312 NO_ROUTE then Basic.Ack"


def test_nondurable_and_exclusive_queues_of_the_lost_node_are_gone(
        seen: dict[str, Any]) -> None:
    assert seen["nondurable_passive"] == no_queue(TQ)
    assert seen["exclusive_passive"] == no_queue(XQ)
    assert seen["nondurable_publish_mandatory"] == "Basic.Return 312 NO_ROUTE then Basic.Ack"
    assert TQ not in seen["queues_listed_on_2"] and XQ not in seen["queues_listed_on_2"]


def test_publishes_in_flight_when_the_node_dies_are_all_answered(
        seen: dict[str, Any]) -> None:
    got = seen["in_flight"]
    assert got["closed"] == ""
    assert got["published"] > 0
    assert got["acked"] + got["nacked"] == got["published"]
    # what was confirmed before the kill is back when node 1 returns (what was acked
    # after it is another matter: see docs/clustering.md)
    assert got["found_after_restart"] >= got["at_kill"]["acked"] > 0


def test_everything_else_keeps_working(seen: dict[str, Any]) -> None:
    assert seen["own_queue_publish"] == "Basic.Ack"
    assert seen["own_queue_passive"] == "Queue.DeclareOk messages=1 consumers=0"
    assert seen["queues_listed_on_2"][DQ2] == "running"


def test_the_node_returns_with_its_persistent_messages(seen: dict[str, Any]) -> None:
    # the three persistent messages published before (the two delivered to node 2's
    # consumers were unacked when node 1 died: back in the queue), the streamed ones
    # node 1 had confirmed before it died, and nothing published to it while it was down
    found = seen["in_flight"]["found_after_restart"]
    assert seen["after_restart_passive_durable"] == \
        f"Queue.DeclareOk messages={3 + found} consumers=0"
    assert seen["after_restart_bodies"] == {"before": 3, "s": found}
    assert seen["after_restart_nondurable"] == no_queue(TQ)


# --- quorum queue consumers when the leader's node is killed (a three-node cluster) ---

QQ_FAR, QQ_NEAR = "ref-qq-consumers-elsewhere", "ref-qq-consumer-on-leader"
QQ_COUNT, QQ_PREFETCH = 50, 10


def qq_leaders(node: RabbitInfo) -> dict[str, str]:
    """This scenario's quorum queue name -> its leader's node name, as rabbitmqctl on
    *node* lists it (the node-loss scenario's classic queues share the cluster)."""
    out = ctl(node, "list_queues", "--no-table-headers", "name", "leader",
              timeout=CTL_TIMEOUT)
    rows = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return {name: leader for name, leader in rows.items() if name in (QQ_FAR, QQ_NEAR)}


def collect(c: Raw, seconds: float) -> list[dict[str, Any]]:
    """Every delivery, cancel or close *c* gets within *seconds*, in order."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    pending: dict[str, Any] | None = None
    while True:
        if c.frames:
            got: tuple[int, Any] | None = c.frames.pop(0)
        else:
            got = c._read(deadline)
        if got is None:
            return events
        ch, fr = got
        if isinstance(fr, commands.Basic.Deliver):
            pending = {"ch": ch, "tag": fr.delivery_tag, "redelivered": fr.redelivered,
                       "ctag": fr.consumer_tag}
        elif isinstance(fr, ContentHeader) and pending is not None:
            headers = fr.properties.headers or {}
            pending["count"] = headers.get("x-delivery-count")
        elif isinstance(fr, ContentBody) and pending is not None:
            pending["body"] = bytes(fr.value).decode()
            events.append(pending)
            pending = None
        elif isinstance(fr, str):
            events.append({"event": fr})
            return events
        else:
            events.append({"event": describe(fr), "ch": ch})
            if isinstance(fr, commands.Connection.Close):
                return events


def qq_consumer(node: Endpoint, queue: str) -> tuple[Raw, int, list[dict[str, Any]]]:
    """A consumer with prefetch QQ_PREFETCH and manual acks, once it holds that many."""
    c = Raw(node)
    ch = c.channel()
    c.call(ch, commands.Basic.Qos(prefetch_count=QQ_PREFETCH), commands.Basic.QosOk)
    ok = c.call(ch, commands.Basic.Consume(queue=queue, consumer_tag=f"ctag-{queue}"),
                commands.Basic.ConsumeOk)
    assert isinstance(ok, commands.Basic.ConsumeOk), describe(ok)
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < QQ_PREFETCH and time.monotonic() < deadline:
        got += collect(c, min(1.0, deadline - time.monotonic()))
    return c, ch, got


def observe_quorum_leader_loss(cluster: ClusterInfo) -> dict[str, Any]:
    """Two quorum queues led by node 1: one consumed from nodes 2 and 3, one from
    nodes 1 and 2; kill -9 node 1 and record what every surviving consumer gets."""
    n1, n2, n3 = cluster.nodes
    out: dict[str, Any] = {"nodes": [n.nodename for n in cluster.nodes]}
    setup = Raw(n1)
    ch = setup.channel()
    setup.call(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
    for q in (QQ_FAR, QQ_NEAR):
        ok = setup.call(ch, commands.Queue.Declare(
            queue=q, durable=True, arguments={"x-queue-type": "quorum"}),
            commands.Queue.DeclareOk)
        assert isinstance(ok, commands.Queue.DeclareOk), describe(ok)
        for i in range(QQ_COUNT):
            setup.publish(ch, q, b"m-%02d" % i)
            assert setup.confirm_outcome(ch) == ["Basic.Ack"]
    setup.close()
    out["leaders_before"] = qq_leaders(n2)
    consumers = {
        "far_on_2": qq_consumer(n2, QQ_FAR), "far_on_3": qq_consumer(n3, QQ_FAR),
        "near_on_1": qq_consumer(n1, QQ_NEAR), "near_on_2": qq_consumer(n2, QQ_NEAR)}
    out["before"] = {k: [d["body"] for d in v[2]] for k, v in consumers.items()}
    kill_node(n1)
    # what the survivors get, unasked, while a new leader is elected
    survivors = {k: v for k, v in consumers.items() if k != "near_on_1"}
    out["after_kill"] = {k: collect(c, 8 if k == "far_on_2" else 2)
                         for k, (c, _, _) in survivors.items()}
    out["leaders_after"] = qq_leaders(n2)
    # ack every delivery of before the kill by its old tag, then see what follows
    out["after_ack"] = {}
    for k, (c, ch, held) in survivors.items():
        c.send(ch, commands.Basic.Ack(delivery_tag=held[-1]["tag"], multiple=True))
        out["after_ack"][k] = collect(c, 3)
    # then ack as they come until nothing more does: every message the queues still hold
    out["rest"] = {}
    for k, (c, ch, _) in survivors.items():
        got = out["after_ack"][k]
        rest: list[dict[str, Any]] = []
        for _ in range(QQ_COUNT // QQ_PREFETCH):
            if not got or "tag" not in got[-1]:
                break
            c.send(ch, commands.Basic.Ack(delivery_tag=got[-1]["tag"], multiple=True))
            got = collect(c, 2)
            rest += got
        out["rest"][k] = rest
    for q in (QQ_FAR, QQ_NEAR):
        out[f"left_in_{q}"] = attempt(n2, commands.Queue.Declare(queue=q, passive=True),
                                      commands.Queue.DeclareOk)
    for c, _, _ in consumers.values():
        c.close()
    return out


@pytest.fixture(scope="module")
def qq_seen(cluster: ClusterInfo) -> dict[str, Any]:
    # after the node-loss scenario (when it ran first): node 1 restarted and running
    wait_running(cluster.nodes[1], [n.nodename for n in cluster.nodes])
    out = observe_quorum_leader_loss(cluster)
    report = os.environ.get("RABBITMQ_CLUSTER_REFERENCE_OUT")
    if report:
        Path(report).with_suffix(".quorum.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e.get("body", e.get("event", "?")) for e in events]


def names(first: int, last: int) -> list[str]:
    return [f"m-{i:02d}" for i in range(first, last + 1)]


def test_quorum_queue_gets_a_new_leader_among_the_survivors(qq_seen: dict[str, Any]) -> None:
    n1 = qq_seen["nodes"][0]
    assert qq_seen["leaders_before"] == {QQ_FAR: n1, QQ_NEAR: n1}
    for q in (QQ_FAR, QQ_NEAR):
        assert qq_seen["leaders_after"][q] in qq_seen["nodes"][1:], q
    assert qq_seen["before"]["far_on_2"] == names(0, 9)
    assert qq_seen["before"]["far_on_3"] == names(10, 19)


def test_quorum_consumers_on_survivors_keep_their_checkouts(qq_seen: dict[str, Any]) -> None:
    # no basic.cancel, nothing redelivered: the deliveries stay checked out to them
    for k in ("far_on_2", "far_on_3", "near_on_2"):
        assert qq_seen["after_kill"][k] == [], k
    # acked with the old delivery tags, they are gone; the next ones follow, never
    # one of the held messages again
    after = qq_seen["after_ack"]
    assert bodies(after["far_on_2"]) == names(20, 29)
    assert bodies(after["far_on_3"]) == names(30, 39)
    for k in ("far_on_2", "far_on_3"):
        assert [e["tag"] for e in after[k]] == list(range(11, 21))
        assert not any(e["redelivered"] or e["count"] is not None for e in after[k])
    rest = qq_seen["rest"]
    assert sorted(bodies(rest["far_on_2"]) + bodies(rest["far_on_3"])) == names(40, 49)
    assert qq_seen[f"left_in_{QQ_FAR}"] == "Queue.DeclareOk messages=0 consumers=2"


def test_quorum_consumer_on_the_lost_node_has_its_deliveries_returned(
        qq_seen: dict[str, Any]) -> None:
    assert qq_seen["before"]["near_on_1"] == names(0, 9)
    assert qq_seen["before"]["near_on_2"] == names(10, 19)
    # the lost consumer's ten come back first, redelivered, x-delivery-count 1, to the
    # survivor once it has room
    back = qq_seen["after_ack"]["near_on_2"]
    assert bodies(back) == names(0, 9)
    assert all(e["redelivered"] and e["count"] == 1 for e in back), back
    rest = qq_seen["rest"]["near_on_2"]
    assert bodies(rest) == names(20, 49)
    assert not any(e["redelivered"] or e["count"] is not None for e in rest)
    # the lost node's consumer is still counted (3.10.8 as measured)
    assert qq_seen[f"left_in_{QQ_NEAR}"] == "Queue.DeclareOk messages=0 consumers=2"
