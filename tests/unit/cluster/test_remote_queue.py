"""Queues led by another node (amqpd.cluster.remote_queue), two brokers in one process.

Both brokers run in the test's event loop with real AMQP listeners on ephemeral ports and
a real link between them; a small fixed view stands for the cluster's membership (etcd,
amqpd.cluster.view) and the queue is made known on B through the definitions hook
(``ClusterQueues.materialise``), as the cluster's definitions applier does. Clients are aio-pika
over real sockets; the queue's leader is A, the clients talk to B.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aio_pika
import aiormq
import pamqp.commands
import pytest

from amqpd.broker.channel import FLOW_BACKLOG
from amqpd.broker.queue import Queue
from amqpd.cluster import cluster_queues, remote_failover, remote_served
from amqpd.cluster import link_wire as W
from amqpd.cluster.cluster_queues import ClusterQueues
from amqpd.cluster.remote_queue import RemoteQueue
from amqpd.cluster.remote_state import PUBLISH_WINDOW
from amqpd.config import Settings
from amqpd.server import Broker


@dataclass(frozen=True)
class NodeInfo:
    name: str
    link: tuple[str, int] | None
    amqp_port: int
    http_port: int
    running: bool


class FakeView:
    """The ClusterView interface of docs/clustering.md over a dict the test controls."""

    def __init__(self, node_name: str, shared: dict[str, NodeInfo]) -> None:
        self.node_name = node_name
        self.shared = shared
        self.callbacks: list[Callable[[str, bool], None]] = []
        self.catalogue: dict[tuple[str, str], str] = {}  # no leaders known: none named
        self.queues: Any = None

    def nodes(self) -> dict[str, NodeInfo]:
        return dict(self.shared)

    def is_running(self, node: str) -> bool:
        info = self.shared.get(node)
        return info is not None and info.running

    def subscribe(self, callback: Callable[[str, bool], None]) -> None:
        self.callbacks.append(callback)

    def serving(self) -> bool:
        return True

    def node_lost(self, node: str) -> None:
        """No non-durable queues of other nodes here."""

    def when_applied(self, watch: int, revision: int, answer: Callable[[], None]) -> None:
        """No watches here: nothing to wait for."""
        answer()


@dataclass
class Node:
    broker: Broker
    cluster: ClusterQueues
    view: FakeView

    @property
    def url(self) -> str:
        port = next(p for proto, _h, p in self.broker.listeners if proto == "amqp")
        return f"amqp://guest:guest@127.0.0.1:{port}/"


async def until(cond: Callable[[], Any], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def start_node(name: str, tmp: Path, shared: dict[str, NodeInfo]) -> Node:
    broker = Broker(Settings(data_dir=str(tmp / name), port=0, management=False,
                             node_name=name))
    await broker.start()
    view = FakeView(name, shared)
    cluster = await cluster_queues.start(broker.api, view, b"secret", "127.0.0.1", 0)
    assert cluster.links.address is not None
    shared[name] = NodeInfo(name, cluster.links.address, 0, 0, True)
    return Node(broker, cluster, view)


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    shared: dict[str, NodeInfo] = {}
    a = await start_node("a@test", tmp_path, shared)
    b = await start_node("b@test", tmp_path, shared)
    a.cluster.links.want("b@test")  # a sorts first: it dials
    await until(lambda: a.cluster.links.link("b@test") and b.cluster.links.link("a@test"))
    yield a, b
    for node in (b, a):
        await node.cluster.stop()
        await node.broker.stop()


def lead(a: Node, b: Node, name: str, **arguments: Any) -> RemoteQueue:
    """Declare ``name`` on A (its leader) and make it known on B."""
    a.broker.api.declare_queue("/", name, durable=True, arguments=arguments)
    q = b.cluster.materialise("/", {"name": name, "durable": True,
                                                     "arguments": arguments}, "a@test")
    assert isinstance(q, RemoteQueue)
    return q


async def test_publish_on_b_confirmed_after_a_stored_it_then_consumed_in_order(
        nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    rq = lead(a, b, "q1")
    await until(lambda: rq.available)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        for i in range(500):
            await ch.default_exchange.publish(
                aio_pika.Message(str(i).encode(), delivery_mode=2), routing_key="q1")
        local = a.broker.vhosts["/"].queues["q1"]
        assert local.message_count == 500  # on the leader, before anyone consumed
        assert local.stat_publish == 500
        await until(lambda: rq.message_count == 500)  # the leader's count, reported
        declared = await ch.declare_queue("q1", durable=True)
        assert declared.declaration_result.message_count == 500
        cch = await conn.channel()
        await cch.set_qos(prefetch_count=10)
        queue = await cch.get_queue("q1", ensure=False)
        got: list[int] = []
        async with queue.iterator() as it:
            async for message in it:
                got.append(int(message.body))
                await message.ack()
                if len(got) == 500:
                    break
        assert got == list(range(500))
        await until(lambda: local.message_count == 0 and local.unacked_count == 0)
    finally:
        await conn.close()


async def test_prefetch_bounds_what_the_leader_hands_out(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    rq = lead(a, b, "q2")
    await until(lambda: rq.available)
    for i in range(50):
        a.broker.api.publish("/", "", _msg("q2", i), None)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=3)
        queue = await ch.get_queue("q2", ensure=False)
        received: list[aio_pika.abc.AbstractIncomingMessage] = []
        await queue.consume(_collect(received))
        local = a.broker.vhosts["/"].queues["q2"]
        await until(lambda: len(received) == 3)
        await asyncio.sleep(0.2)  # more would have come by now if the limit leaked
        assert len(received) == 3
        assert local.unacked_count == 3 and local.message_count == 47
        await received[0].ack()
        await until(lambda: len(received) == 4)
        assert [int(m.body) for m in received] == [0, 1, 2, 3]
    finally:
        await conn.close()
    # the channel went: its unacked messages are back on the leader, in place
    await until(lambda: local.message_count == 49 and local.unacked_count == 0)
    assert isinstance(local, Queue)
    assert local.ready[0].redelivered


async def test_nack_requeue_get_and_reject(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    a.broker.api.declare_queue("/", "q3-dead", durable=True)
    rq = lead(a, b, "q3", **{"x-dead-letter-exchange": "",
                             "x-dead-letter-routing-key": "q3-dead"})
    await until(lambda: rq.available)
    for i in range(3):
        a.broker.api.publish("/", "", _msg("q3", i), None)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        queue = await ch.get_queue("q3", ensure=False)
        first = await queue.get(timeout=5)
        assert first.body == b"0" and not first.redelivered
        await first.nack(requeue=True)
        again = await queue.get(timeout=5)
        assert again.body == b"0" and again.redelivered  # back in its place
        await again.reject(requeue=False)
        dead = a.broker.vhosts["/"].queues["q3-dead"]
        await until(lambda: dead.message_count == 1)  # dead-lettered by the leader
        second = await queue.get(no_ack=True, timeout=5)
        assert second.body == b"1"
        local = a.broker.vhosts["/"].queues["q3"]
        await until(lambda: local.message_count == 1 and local.unacked_count == 0)
        third = await queue.get(timeout=5)
        await third.ack()
        assert await queue.get(fail=False, timeout=5) is None  # get-empty
        await until(lambda: local.unacked_count == 0 and local.message_count == 0)
    finally:
        await conn.close()


async def test_queue_deleted_on_the_leader_cancels_consumers_on_b(
        nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    rq = lead(a, b, "q4")
    await until(lambda: rq.available)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        queue = await ch.get_queue("q4", ensure=False)
        tag = await queue.consume(_ignore)
        await until(lambda: len(a.broker.vhosts["/"].queues["q4"].consumers) == 1)
        raw = cast(aiormq.Channel, await ch.get_underlay_channel())
        assert tag in raw.consumers
        a.broker.api.delete_queue("/", "q4")
        await until(lambda: not rq.consumers)
        await until(lambda: tag not in raw.consumers)  # basic.cancel reached the client
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity) as info:
            await ch.declare_queue("q4", durable=True, passive=True)
        assert "no queue 'q4'" in str(info.value)
    finally:
        await conn.close()


async def test_node_loss_cancels_consumers_nacks_and_answers_404(
        nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    rq = lead(a, b, "q5")
    await until(lambda: rq.available)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        queue = await ch.get_queue("q5", ensure=False)
        tag = await queue.consume(_ignore)
        raw = cast(aiormq.Channel, await ch.get_underlay_channel())
        await until(lambda: len(a.broker.vhosts["/"].queues["q5"].consumers) == 1)
        # A is cut off: B's view stops seeing it (its heartbeats stop) and the link
        # goes silent (no more pings from A), so B closes the link after LINK_SILENCE
        pinger = a.cluster.links._pinger
        assert pinger is not None
        pinger.cancel()
        b.view.shared["a@test"] = NodeInfo("a@test", None, 0, 0, False)
        for cb in b.view.callbacks:
            cb("a@test", False)
        await until(lambda: not rq.available and not rq.consumers)
        await until(lambda: tag not in raw.consumers)  # basic.cancel reached the client
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity) as info:
            await ch.declare_queue("q5", durable=True)
        assert ("home node 'a@test' of durable queue 'q5' in vhost '/' is down or "
                "inaccessible") in str(info.value)
        ch = await conn.channel()  # queue.bind: the same 404, as RabbitMQ 3.10.8's
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity) as info:
            await (await ch.get_queue("q5", ensure=False)).bind("amq.direct", "k")
        assert "home node 'a@test' of durable queue 'q5'" in str(info.value)
        # as RabbitMQ 3.10: routed nowhere (the queue's node is down), so the confirm is
        # an ack and a mandatory message comes back (312 NO_ROUTE)
        ch2 = await conn.channel(publisher_confirms=True, on_return_raises=True)
        await ch2.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2),
                                           routing_key="q5", mandatory=False)
        with pytest.raises(aiormq.exceptions.PublishError) as returned:
            await ch2.default_exchange.publish(
                aio_pika.Message(b"x", delivery_mode=2, message_id="m1"), routing_key="q5",
                mandatory=True)
        frame = returned.value.frame
        assert isinstance(frame, pamqp.commands.Basic.Return)
        assert frame.reply_code == 312
    finally:
        await conn.close()
    # A is back: the queue works again, its messages where they were
    a.cluster.links._ping()
    b.view.shared["a@test"] = NodeInfo("a@test", a.cluster.links.address, 0, 0, True)
    for cb in a.view.callbacks:
        cb("b@test", True)
    await until(lambda: rq.available)
    conn = await aio_pika.connect(b.url)
    try:
        await _round_trip(await conn.channel(publisher_confirms=True), "q5", b"y")
    finally:
        await conn.close()


async def _round_trip(ch: Any, queue: str, body: bytes) -> None:
    """A confirmed persistent publish to ``queue``, then a basic.get of it, acked."""
    await ch.default_exchange.publish(aio_pika.Message(body, delivery_mode=2),
                                      routing_key=queue)
    got = await (await ch.get_queue(queue, ensure=False)).get(timeout=5)
    assert got.body == body
    await got.ack()


async def _nacked(ch: Any, queue: str) -> None:
    """A persistent publish to ``queue`` (not mandatory) gets a nack."""
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await ch.default_exchange.publish(aio_pika.Message(b"x", delivery_mode=2),
                                          routing_key=queue, mandatory=False)


async def test_a_publish_while_the_running_leader_answers_404_is_nacked_not_acked(
        nodes: tuple[Node, Node]) -> None:
    """issue 28: the publisher's node got ``404 no queue`` from the node the catalogue
    names (a mirror 3 ms from finishing its promotion) and then acked publishes to the
    queue as routed nowhere: lost. Here A drops the queue without B's definitions
    knowing yet (as during a promotion, or before a delete reaches B): while A runs, a
    publish on B is nacked (the client re-sends), never acked and dropped."""
    a, b = nodes
    rq = lead(a, b, "q404")
    await until(lambda: rq.available)
    a.broker.vhosts["/"].delete_queue(a.broker.vhosts["/"].queues["q404"])
    await until(lambda: not rq.available)
    assert b.broker.vhosts["/"].queues.get("q404") is rq  # B still routes to it
    conn = await aio_pika.connect(b.url)
    try:
        await _nacked(await conn.channel(publisher_confirms=True), "q404")
    finally:
        await conn.close()


async def test_a_publish_while_the_running_leaders_link_is_down_is_nacked_not_acked(
        nodes: tuple[Node, Node]) -> None:
    """issue 28, chaos seed 108: the leader's node was killed and back within the
    heartbeat timeout, so the view never counted it down; it led its queue again with
    no mirror yet (no link up), and the publisher's node, finding no failover to
    expect and no link, acked 20 publishes as routed nowhere and dropped them. A node
    the view counts as running is not down: while its link is being dialled again, a
    publish to its queue is nacked (the client re-sends), never acked and dropped."""
    a, b = nodes
    rq = lead(a, b, "qlink")
    await until(lambda: rq.available)
    # the link goes and A (the dialler) cannot dial it again for now; both nodes
    # still see each other running
    b_info = b.view.shared["b@test"]
    b.view.shared["b@test"] = NodeInfo("b@test", None, 0, 0, True)
    link = a.cluster.links.link("b@test")
    assert link is not None
    link.close()
    await until(lambda: not rq.available and b.cluster.links.link("a@test") is None)
    assert b.view.is_running("a@test")
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await _nacked(ch, "qlink")
        b.view.shared["b@test"] = b_info  # A dials again: the publish goes through
        await until(lambda: rq.available)
        await _round_trip(ch, "qlink", b"y")
    finally:
        await conn.close()
    assert a.broker.vhosts["/"].queues["qlink"].message_count == 0


def _msg(queue: str, i: int) -> Any:
    from amqpd.broker.api import Message, codec

    return Message("", queue, codec.encode_properties({"delivery_mode": 2}), str(i).encode())


async def test_min_masters_locator_places_the_queue_on_the_other_node(
        nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    b.broker.api.declare_queue("/", "led-by-b", durable=True)  # B leads one, A none
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("placed", durable=True,
                               arguments={"x-queue-master-locator": "min-masters"})
        here = b.broker.vhosts["/"].queues["placed"]
        assert isinstance(here, RemoteQueue) and here.leader == "a@test"
        await until(lambda: "placed" in a.broker.vhosts["/"].queues)
        there = a.broker.vhosts["/"].queues["placed"]
        assert not there.forwards_publish and there.durable
        await ch.default_exchange.publish(aio_pika.Message(b"m", delivery_mode=2),
                                          routing_key="placed")
        assert there.message_count == 1
        # client-local (the default) keeps the next one here
        await ch.declare_queue("local", durable=True)
        assert not b.broker.vhosts["/"].queues["local"].forwards_publish
    finally:
        await conn.close()


def _collect(into: list[Any]) -> Callable[[Any], Any]:
    async def on_message(message: Any) -> None:
        into.append(message)
    return on_message


async def _ignore(message: Any) -> None:
    return None


async def test_a_busy_link_survives_a_late_heartbeat(nodes: tuple[Node, Node]) -> None:
    """The view flips A to down for a moment (its heartbeats were late) while the link
    still carries pings: nothing is closed, nobody is cancelled."""
    a, b = nodes
    rq = lead(a, b, "q6")
    await until(lambda: rq.available)
    link = b.cluster.links.link("a@test")
    b.view.shared["a@test"] = NodeInfo("a@test", a.cluster.links.address, 0, 0, False)
    for cb in b.view.callbacks:
        cb("a@test", False)
    await asyncio.sleep(3.0)  # longer than LINK_SILENCE
    assert b.cluster.links.link("a@test") is link and rq.available


async def test_tx_commit_ok_waits_for_the_leaders_group_commit(
        nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """A transactional channel on B publishing to a queue led by A: tx.commit-ok comes
    only once A's group commit has the messages (as a confirm would); a message the
    leader refuses fails the transaction (406 "partial tx completion", RabbitMQ 3.10)."""
    a, b = nodes
    rq = lead(a, b, "q7")
    full = lead(a, b, "q7-full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    await until(lambda: rq.available and full.available)
    held: list[tuple[Callable[[BaseException | None], None], BaseException | None]] = []
    real = remote_served._confirmer

    def slow_commit(link: Any, stream: int, seq: int) -> Callable[[BaseException | None],
                                                                   None]:
        """A's group commit, held until the test lets it finish: the confirm of a
        forwarded publish (a PUBLISHES record) is made by this callback."""
        on_confirm = real(link, stream, seq)
        return lambda error: held.append((on_confirm, error))

    monkeypatch.setattr(remote_served, "_confirmer", slow_commit)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel(publisher_confirms=False)
        raw = await ch.get_underlay_channel()
        await raw.tx_select()
        for i in range(3):
            await raw.basic_publish(str(i).encode(), routing_key="q7",
                                    properties=aiormq.spec.Basic.Properties(delivery_mode=2))
        commit = asyncio.ensure_future(raw.tx_commit())
        local = a.broker.vhosts["/"].queues["q7"]
        await until(lambda: len(held) == 3)
        await asyncio.sleep(0.2)  # commit-ok would have come by now
        assert not commit.done(), "tx.commit-ok before the leader's group commit"
        assert local.message_count == 3
        for callback, error in held:
            callback(error)
        held.clear()
        await asyncio.wait_for(commit, 5)
        monkeypatch.setattr(remote_served, "_confirmer", real)
        # the leader refuses a message (its length limit): the transaction fails
        await raw.basic_publish(b"x", routing_key="q7-full")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
            await raw.tx_commit()
        assert "partial tx completion" in str(info.value)
    finally:
        await conn.close()


async def test_federation_links_run_on_one_node(nodes: tuple[Node, Node],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A federated queue's link runs on its leader only (B holds a remote stand-in and
    runs none); a federated exchange's link runs on the node runs_here picks."""
    from plugins.federation import create_plugin

    a, b = nodes
    supervisors = {}
    for node in (a, b):
        api = node.broker.api
        supervisors[node.view.node_name] = create_plugin(api).supervisor
        api.parameters.set("federation-upstream", "/", "up", {"uri": "amqp://127.0.0.1:1"})
        api.set_policy("/", "fed", "^f", {"federation-upstream": "up"})
        api.declare_exchange("/", "fx", "fanout", durable=True)
    lead(a, b, "fq")
    on_a = supervisors["a@test"].desired()
    on_b = supervisors["b@test"].desired()
    assert ("queue", "/", "fq", "up") in on_a
    assert ("queue", "/", "fq", "up") not in on_b  # led by A: its link runs there
    assert ("exchange", "/", "fx", "up") in on_b  # a single node runs every one
    monkeypatch.setattr(b.broker.api, "runs_here", lambda key: key != "federation///fx")
    assert ("exchange", "/", "fx", "up") not in supervisors["b@test"].desired()


async def test_locators_policy_key_config_and_random(nodes: tuple[Node, Node]) -> None:
    """The other leader locators (RabbitMQ 3.10's names and order): the
    ``queue-master-locator`` policy key, ``cluster.queue_leader_locator`` (the
    ClusterQueues' ``locator``), and ``random`` over the running nodes."""
    a, b = nodes
    b.broker.api.declare_queue("/", "led-by-b", durable=True)  # B leads one, A none
    b.broker.api.set_policy("/", "place", "^pol-", {"queue-master-locator": "min-masters"},
                            apply_to="queues")
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        await ch.declare_queue("pol-q", durable=True)  # the policy's min-masters: A
        here = b.broker.vhosts["/"].queues["pol-q"]
        assert isinstance(here, RemoteQueue) and here.leader == "a@test"
        # the argument wins over the policy
        await ch.declare_queue("pol-local", durable=True,
                               arguments={"x-queue-master-locator": "client-local"})
        assert not b.broker.vhosts["/"].queues["pol-local"].forwards_publish
        # the node's configured locator, without argument or policy
        b.cluster.locator = "min-masters"
        await ch.declare_queue("conf-q", durable=True)  # A leads 1, B 2
        assert b.broker.vhosts["/"].queues["conf-q"].forwards_publish
        b.cluster.locator = "client-local"
        await ch.declare_queue("conf-local", durable=True)
        assert not b.broker.vhosts["/"].queues["conf-local"].forwards_publish
        # random: over both running nodes (all 24 on one node: p = 2 ** -23)
        placed: dict[str, str] = {}
        for i in range(24):
            await ch.declare_queue(f"rnd-{i}", durable=True,
                                   arguments={"x-queue-master-locator": "random"})
            q = b.broker.vhosts["/"].queues[f"rnd-{i}"]
            placed[q.name] = q.leader if isinstance(q, RemoteQueue) else "b@test"
        assert set(placed.values()) == {"a@test", "b@test"}
        # the chosen leader created it
        await until(lambda: all(name in a.broker.vhosts["/"].queues
                                for name, leader in placed.items() if leader == "a@test"))
        # a node not seen running is never chosen
        b.view.shared["a@test"] = NodeInfo("a@test", a.cluster.links.address, 0, 0, False)
        for i in range(8):
            await ch.declare_queue(f"rnd-down-{i}", durable=True,
                                   arguments={"x-queue-master-locator": "random"})
            assert not b.broker.vhosts["/"].queues[f"rnd-down-{i}"].forwards_publish
    finally:
        await conn.close()


async def test_exclusive_consumer_conflict_is_403_at_consume_counts_are_the_leaders(
        nodes: tuple[Node, Node]) -> None:
    """As RabbitMQ 3.10 (a two-node cluster asked, docs/clustering.md): a consume on B of
    a queue led by A where A has an exclusive consumer is refused at basic.consume with
    403 ACCESS_REFUSED (no consume-ok, then basic.cancel), and B's declare-ok counts
    the leader's consumers and messages as they are now, not B's own or a stale report."""
    a, b = nodes
    rq = lead(a, b, "q-excl")
    await until(lambda: rq.available)
    ca = await aio_pika.connect(a.url)
    cb = await aio_pika.connect(b.url)
    try:
        cha = await ca.channel()
        qa = await cha.get_queue("q-excl", ensure=False)
        await qa.consume(_ignore, exclusive=True)
        a.broker.api.publish("/", "", _msg("q-excl", 0), None)
        a.broker.api.publish("/", "", _msg("q-excl", 1), None)
        cha2 = await ca.channel()
        await cha2.declare_queue("q-excl", durable=True, passive=True)
        # at once on B (no STATS report in between can have told B): the leader's
        leader = a.broker.vhosts["/"].queues["q-excl"]
        rq.remote_consumers = 0  # what B last heard, say
        chb = await cb.channel()
        declared = await chb.declare_queue("q-excl", durable=True, passive=True)
        assert declared.declaration_result.consumer_count == len(leader.consumers) == 1
        assert declared.declaration_result.message_count == leader.message_count
        qb = await chb.get_queue("q-excl", ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
            await qb.consume(_ignore)
        assert "queue 'q-excl' in vhost '/' in exclusive use" in str(info.value)
        assert not rq.consumers and len(leader.consumers) == 1
        # and the other way round: an exclusive consume on B while A has a consumer
        await cha.close()
        await until(lambda: not leader.consumers)
        cha = await ca.channel()
        await (await cha.get_queue("q-excl", ensure=False)).consume(_ignore)
        chb = await cb.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await (await chb.get_queue("q-excl", ensure=False)).consume(_ignore,
                                                                        exclusive=True)
        # a consume the leader accepts gets consume-ok, then its deliveries
        chb = await cb.channel()
        got: list[Any] = []
        await (await chb.get_queue("q-excl", ensure=False)).consume(_collect(got),
                                                                     no_ack=True)
        await cha.close()  # A's consumer goes: the messages come to B's
        await until(lambda: len(got) == 2)
    finally:
        await ca.close()
        await cb.close()


async def test_publishes_waiting_for_credit_are_nacked_when_the_leader_goes(
        nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A publisher on B whose messages wait beyond the leader's credit (A grants none
    any more: its loop took them but gives nothing back) is not left hanging when A
    goes away: every one of them is nacked, with a log line, and the channel goes on."""
    a, b = nodes
    rq = lead(a, b, "q-credit")
    await until(lambda: rq.available)
    monkeypatch.setattr(a.cluster, "_schedule_credit", lambda: None)  # no more credit
    rq._credit = 3  # three more may go; the rest waits on B
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        sends = [asyncio.ensure_future(ch.default_exchange.publish(
            aio_pika.Message(str(i).encode(), delivery_mode=2), routing_key="q-credit"))
            for i in range(10)]
        await until(lambda: len(rq._unsent) == 7)
        await until(lambda: sum(s.done() for s in sends) == 3)  # the three A took
        assert all(s.exception() is None for s in sends if s.done())
        await asyncio.sleep(0.2)
        assert sum(s.done() for s in sends) == 3  # the rest really waits
        # A goes away: its pings stop, the view stops seeing it, B closes the link
        pinger = a.cluster.links._pinger
        assert pinger is not None
        pinger.cancel()
        b.view.shared["a@test"] = NodeInfo("a@test", None, 0, 0, False)
        caplog.set_level("WARNING", logger="amqpd.cluster.queues")
        for cb in b.view.callbacks:
            cb("a@test", False)
        _done, pending = await asyncio.wait(sends, timeout=15)
        assert not pending, "a publish waiting for credit was left hanging"
        nacked = [s for s in sends if isinstance(s.exception(), aiormq.exceptions.DeliveryError)]
        assert len(nacked) == 7
        assert not rq._unsent and rq.message_count == rq.ready_count
        assert "7 publish(es) waiting for its credit dropped, 7 confirm(s) nacked" in \
            caplog.text
        # the channel is still usable (a nack is no channel error)
        await ch.declare_queue("local-on-b", durable=True)
    finally:
        await conn.close()


async def test_a_declare_on_b_counts_as_use_of_the_queue_on_its_leader(
        nodes: tuple[Node, Node]) -> None:
    """x-expires: a declare on B (which asks A for its counts) keeps the queue on A
    from expiring, as a declare on A does; without them it expires."""
    a, b = nodes
    rq = lead(a, b, "q-exp", **{"x-expires": 3000})
    await until(lambda: rq.available)
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        loop = asyncio.get_running_loop()
        end = loop.time() + 5.0  # longer than x-expires
        while loop.time() < end:
            await ch.declare_queue("q-exp", durable=True, passive=True)
            await asyncio.sleep(0.2)
        assert "q-exp" in a.broker.vhosts["/"].queues
        await until(lambda: "q-exp" not in a.broker.vhosts["/"].queues)  # unused: gone
    finally:
        await conn.close()


async def _consumers_on_b(b: Node, name: str) -> tuple[Any, list[bytes], str, str, Any]:
    """A keeper (follows a failover) and a leaver (``x-cancel-on-ha-failover``) on B,
    consuming ``name`` through its leader; what the keeper receives lands in the list."""
    conn = await aio_pika.connect(b.url)
    ch = await conn.channel()
    queue = await ch.get_queue(name, ensure=False)
    got: list[bytes] = []

    async def keep(message: Any) -> None:
        got.append(message.body)
        await message.ack()

    keeper = await queue.consume(keep)
    leaver = await queue.consume(_ignore, arguments={"x-cancel-on-ha-failover": True})
    return conn, got, keeper, leaver, await ch.get_underlay_channel()


async def test_consumers_follow_a_promotion_here_while_the_old_leaders_link_is_up(
        nodes: tuple[Node, Node]) -> None:
    """B takes the queue over (a mirror promoted: replace_queue) before it has seen its
    link to A go (or while A, deposed, still runs): B's consumers consume on from B's
    new queue, as after the link's end; only x-cancel-on-ha-failover ones are
    cancelled."""
    from amqpd.broker.queue import Queue

    a, b = nodes
    rq = lead(a, b, "qp")
    await until(lambda: rq.available)
    conn, got, keeper, leaver, raw = await _consumers_on_b(b, "qp")
    try:
        await until(lambda: len(a.broker.vhosts["/"].queues["qp"].consumers) == 2)
        assert rq.link is not None
        vh = b.broker.vhosts["/"]
        promoted = Queue(vh, "qp", durable=True)
        cluster_queues.replace_queue(b.cluster, vh, rq, promoted)
        await until(lambda: leaver not in raw.consumers)  # basic.cancel: it asked for it
        assert [c.tag for c in promoted.consumers] == [keeper]
        await until(lambda: not a.broker.vhosts["/"].queues["qp"].consumers)  # stream closed
        ch = await conn.channel(publisher_confirms=True)
        await ch.default_exchange.publish(aio_pika.Message(b"after", delivery_mode=2),
                                          routing_key="qp")
        await until(lambda: got == [b"after"])
        assert keeper in raw.consumers
    finally:
        await conn.close()


async def test_consumers_follow_a_new_leader_while_the_old_leaders_link_is_up(
        nodes: tuple[Node, Node], tmp_path: Path) -> None:
    """The catalogue names a new leader (C) while B's link to the old one (A) is still
    up and B's mirror records (failover_expected) say nothing of a failover, as when
    they already name C with no mirror of its own: B's consumers consume from C; only
    x-cancel-on-ha-failover ones are cancelled."""
    a, b = nodes
    c = await start_node("c@test", tmp_path, a.view.shared)
    try:
        a.cluster.links.want("c@test")
        b.cluster.links.want("c@test")
        await until(lambda: a.cluster.links.link("c@test") and b.cluster.links.link("c@test"))
        rq = lead(a, b, "qf")
        await until(lambda: rq.available)
        conn, got, keeper, leaver, raw = await _consumers_on_b(b, "qf")
        try:
            await until(lambda: len(a.broker.vhosts["/"].queues["qf"].consumers) == 2)
            assert not b.cluster.failover_expected(rq)
            c.broker.api.declare_queue("/", "qf", durable=True)  # the promoted mirror
            same = b.cluster.materialise("/", {
                "name": "qf", "durable": True, "arguments": {}}, "c@test")
            assert same is rq and rq.leader == "c@test"
            await until(lambda: leaver not in raw.consumers)
            on_c = c.broker.vhosts["/"].queues["qf"]
            await until(lambda: len(on_c.consumers) == 1)
            assert on_c.consumers[0].tag == keeper
            pub = await aio_pika.connect(c.url)
            try:
                pch = await pub.channel(publisher_confirms=True)
                await pch.default_exchange.publish(
                    aio_pika.Message(b"from c", delivery_mode=2), routing_key="qf")
            finally:
                await pub.close()
            await until(lambda: got == [b"from c"])
            assert keeper in raw.consumers
        finally:
            await conn.close()
    finally:
        await c.cluster.stop()
        await c.broker.stop()


async def test_kept_consumers_wait_while_a_mirror_can_still_take_over(
        nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """The link to the leader went and a failover is expected: the kept consumers are
    not cancelled when FAILOVER_WAIT passes while a mirror can still take over (a slow
    election), only once none can (qk1), or after FAILOVER_LIMIT (qk2)."""
    monkeypatch.setattr(remote_failover, "FAILOVER_WAIT", 0.2)
    a, b = nodes
    expected = [True]
    kept_checks: list[Any] = []  # the queues failover_kept was given
    b.cluster.failover_expected = lambda queue: expected[0]
    b.cluster.failover_kept = kept_checks.append
    for name, limit in (("qk1", 60.0), ("qk2", 3.0)):
        monkeypatch.setattr(remote_failover, "FAILOVER_LIMIT", limit)
        expected[0] = True
        rq = lead(a, b, name)
        await _kept_then_cancelled(a, b, rq, expected if limit > 5 else None)
        assert kept_checks[-1] is rq  # the mirrors were asked to check etcd's record


async def _kept_then_cancelled(a: Node, b: Node, rq: RemoteQueue,
                               expected: list[bool] | None) -> None:
    await until(lambda: rq.available)
    conn, _got, keeper, leaver, raw = await _consumers_on_b(b, rq.name)
    try:
        await until(lambda: len(a.broker.vhosts["/"].queues[rq.name].consumers) == 2)
        rq.detach()  # as when the link goes (the leader lost)
        await until(lambda: leaver not in raw.consumers)
        assert keeper in raw.consumers
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.8  # four FAILOVER_WAITs
        while loop.time() < end:
            assert keeper in raw.consumers and rq.consumers
            await asyncio.sleep(0.05)
        if expected is not None:
            expected[0] = False  # the record shows no mirror can take over any more
        await until(lambda: keeper not in raw.consumers, 10)  # basic.cancel
        assert not rq.consumers
    finally:
        await conn.close()


async def _kept_across_a_new_stream(a: Node, b: Node, name: str, prefetch: int) -> tuple[
        RemoteQueue, Any, list[aio_pika.abc.AbstractIncomingMessage]]:
    """A consumer on B with ``prefetch`` holds that many deliveries unacked when B loses
    the queue's stream and keeps the consumer (as for a quorum queue whose leader is
    lost: amqpd.cluster.quorum_group)."""
    rq = lead(a, b, name)
    await until(lambda: rq.available)
    for i in range(10):
        a.broker.api.publish("/", "", _msg(name, i), None)
    conn = await aio_pika.connect(b.url)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=prefetch)
    received: list[aio_pika.abc.AbstractIncomingMessage] = []
    await (await ch.get_queue(name, ensure=False)).consume(_collect(received))
    await until(lambda: len(received) == prefetch)
    rq.detach(keep_consumers=True)
    assert rq.consumers  # kept, waiting for a leader
    return rq, conn, received


async def test_a_kept_consumer_following_a_new_leader_gets_only_its_free_prefetch(
        nodes: tuple[Node, Node]) -> None:
    """Issue 16, the quorum kill test's "20 missing" when node-c won: the new leader
    requeues what the lost one had handed out (redelivered), while the client still holds
    those deliveries unacked; the consumer's prefetch counts them, so the new leader must
    not hand it a full prefetch more: those deliveries would wait on B for ever, lost to
    the queue's other consumers."""
    a, b = nodes
    rq, conn, received = await _kept_across_a_new_stream(a, b, "q-kept", 3)
    try:
        link = b.cluster.links.link("a@test")
        assert link is not None
        # the stream opened again stands for the new leader: A drops the old stream's
        # stand-in and puts its 3 deliveries back in place, redelivered
        rq.attach(link, rq.stream)
        local = a.broker.vhosts["/"].queues["q-kept"]
        await until(lambda: local.consumers)
        await asyncio.sleep(0.2)  # anything handed out by now would show
        assert local.unacked_count == 0, "a full prefetch on top of 3 unacked deliveries"
        assert local.message_count == 10 and len(received) == 3
        # each old delivery settled frees one place in the window: one more comes
        await received[0].ack()
        await until(lambda: len(received) == 4)
        assert received[3].body == b"0" and received[3].redelivered
        await received[1].nack(requeue=True)
        await until(lambda: len(received) == 5)
        assert received[4].body == b"1" and received[4].redelivered
        await asyncio.sleep(0.2)
        assert len(received) == 5 and local.unacked_count == 2
        await received[2].reject(requeue=False)
        await received[3].ack()
        await until(lambda: len(received) == 7)
        assert [int(m.body) for m in received[5:]] == [2, 3]
    finally:
        await conn.close()
    # settling an old delivery settles nothing on the leader (it holds that message
    # again): only the ack of message 0's redelivery took one away
    await until(lambda: local.unacked_count == 0 and local.message_count == 9)


async def test_a_kept_consumer_following_a_copy_here_gets_deliveries_as_it_settles(
        nodes: tuple[Node, Node]) -> None:
    """The other side of a failover: the queue's new leader is B itself (its copy is
    promoted, replace_queue moves the kept consumer onto it); settling the lost
    leader's deliveries frees the consumer's window, and the new queue delivers at once,
    not at its next publish."""
    from amqpd.broker.queue_type import QUEUE_TYPES

    a, b = nodes
    rq, conn, received = await _kept_across_a_new_stream(a, b, "q-here", 2)
    try:
        vh = b.broker.vhosts["/"]
        new = QUEUE_TYPES["classic"](vh, "q-here", durable=False)
        cluster_queues.replace_queue(b.cluster, vh, rq, new)
        new.enqueue(_msg("q-here", 100))
        new.enqueue(_msg("q-here", 101))
        await asyncio.sleep(0.2)
        assert len(received) == 2 and new.message_count == 2  # the window is full
        await received[0].ack()
        await until(lambda: len(received) == 3)
        assert received[2].body == b"100"
        await received[1].ack()
        await until(lambda: len(received) == 4)
        assert received[3].body == b"101"
    finally:
        await conn.close()


async def test_a_long_stream_read_through_its_leader_puts_no_publisher_here_in_flow(
        nodes: tuple[Node, Node]) -> None:
    """Credit flow on a node without the stream's leader weighs what its own consumers of
    the local copy lag, not the stream's length: a stream of more than FLOW_BACKLOG
    records with a consumer here served by the leader is no backlog (before, any
    consumer here put a publisher here into a long stream in flow)."""
    a, b = nodes
    rq = lead(a, b, "s1", **{"x-queue-type": "stream"})
    await until(lambda: rq.available)
    count = FLOW_BACKLOG + 100
    conn_a = await aio_pika.connect(a.url)
    conn_b = await aio_pika.connect(b.url)
    try:
        ch = await conn_a.channel(publisher_confirms=False)
        for i in range(count):
            await ch.default_exchange.publish(aio_pika.Message(str(i).encode()),
                                              routing_key="s1")
        await until(lambda: rq.message_count >= count)  # the leader's count, reported
        cch = await conn_b.channel()
        await cch.set_qos(prefetch_count=10)
        queue = await cch.get_queue("s1", ensure=False)
        await queue.consume(_ignore, arguments={"x-stream-offset": "next"})
        await until(lambda: rq.consumers)
        assert rq.flow_backlog() == 0
        # a consumer reading this node's copy 5,000 records behind its committed end
        # (stand-in for a LocalRead: stream_local's own tests cover reading the copy)
        copy = SimpleNamespace(committed=count)
        rq._cons[-1] = cast(Any, SimpleNamespace(local=SimpleNamespace(
            replica=copy, offset=count - 5000)))
        try:
            assert rq.flow_backlog() == 5000
        finally:
            del rq._cons[-1]
    finally:
        await conn_b.close()
        await conn_a.close()


def _frames_seen(node: Node) -> list[tuple[int, int]]:
    """Every frame ``node`` reads on its links from now on, as (kind, messages in it)."""
    seen: list[tuple[int, int]] = []
    real = node.cluster.frame

    def frame(link: Any, kind: int, stream: int, f: list[Any]) -> None:
        seen.append((kind, len(f[-1]) if kind in (W.PUBLISHES, W.DELIVERS) else 1))
        real(link, kind, stream, f)

    node.cluster.frame = frame  # type: ignore[method-assign]
    return seen


async def test_a_ticks_publishes_and_deliveries_cross_batched_and_in_order(
        nodes: tuple[Node, Node]) -> None:
    """The publishes made on B in one tick to a queue A leads cross as one PUBLISHES
    frame, and A's deliveries to B's consumer come back as DELIVERS frames, not a
    frame per message. A request made between two runs of publishes (a purge) reaches
    A between them: a batch grows only while it is the last frame queued, so nothing
    overtakes anything. A message requeued by B's client comes back redelivered."""
    a, b = nodes
    rq = lead(a, b, "qbatch")
    await until(lambda: rq.available)
    at_a = _frames_seen(a)
    at_b = _frames_seen(b)
    for i in range(10):
        b.broker.api.publish("/", "", _msg("qbatch", i), None)
    rq.purge()
    for i in range(10, 15):
        b.broker.api.publish("/", "", _msg("qbatch", i), None)
    local = a.broker.vhosts["/"].queues["qbatch"]
    await until(lambda: local.stat_publish == 15 and local.message_count == 5)
    assert [seen for seen in at_a if seen[0] in (W.PUBLISH, W.PUBLISHES, W.PURGE)] == [
        (W.PUBLISHES, 10), (W.PURGE, 1), (W.PUBLISHES, 5)]
    conn = await aio_pika.connect(b.url)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=100)
        queue = await ch.get_queue("qbatch", ensure=False)
        received: list[aio_pika.abc.AbstractIncomingMessage] = []
        await queue.consume(_collect(received))
        await until(lambda: len(received) == 5)
        assert [int(m.body) for m in received] == [10, 11, 12, 13, 14]
        assert not any(m.redelivered for m in received)
        deliveries = [seen for seen in at_b if seen[0] in (W.DELIVER, W.DELIVERS)]
        assert {kind for kind, _ in deliveries} == {W.DELIVERS}
        assert sum(n for _, n in deliveries) == 5 and len(deliveries) < 5
        await received[0].nack(requeue=True)
        await until(lambda: len(received) == 6)
        assert int(received[5].body) == 10 and received[5].redelivered
        for m in received[1:]:
            await m.ack()
        await until(lambda: local.message_count == 0 and local.unacked_count == 0)
    finally:
        await conn.close()


async def test_publishes_waiting_for_credit_go_batched_and_in_order(
        nodes: tuple[Node, Node]) -> None:
    """More publishes in one tick than the stream's credit: the first PUBLISH_WINDOW
    cross at once, the rest wait on B and cross batched as the leader's credit comes
    back, in order."""
    a, b = nodes
    rq = lead(a, b, "qcredit")
    await until(lambda: rq.available)
    at_a = _frames_seen(a)
    n = PUBLISH_WINDOW + 700
    for i in range(n):
        b.broker.api.publish("/", "", _msg("qcredit", i), None)
    assert len(rq._unsent) == 700  # beyond the credit: waiting here
    local = a.broker.vhosts["/"].queues["qcredit"]
    await until(lambda: local.message_count == n)
    publishes = [seen for seen in at_a if seen[0] in (W.PUBLISH, W.PUBLISHES)]
    assert {kind for kind, _ in publishes} == {W.PUBLISHES}
    assert sum(k for _, k in publishes) == n and len(publishes) <= 4
    assert isinstance(local, Queue)
    assert [int(e.message.body) for e in local.ready] == list(range(n))
