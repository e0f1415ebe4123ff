"""amqpd/cluster/node_requests.py against a real private etcd: a request reaches the node
it names and its answer comes back; an error answer keeps its reply code; no answer in
time, or a node that is not running, fails at once and leaves no key behind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from amqpd.broker.api import AMQPError, NotFound
from amqpd.cluster.node import Cluster
from amqpd.cluster.node_requests import NodeRequests
from amqpd.coord.etcd import EtcdClient
from tests.support.etcdproc import SKIP_REASON, EtcdProcess, find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason=SKIP_REASON)


def fake_cluster(name: str, running: set[str], handlers: dict[str, Any]) -> Cluster:
    """What NodeRequests reads of its cluster: the node's name, who runs, the lease
    (0: none, keys live until deleted) and the API's handlers."""
    api = SimpleNamespace(node_request_handler=handlers.get)
    return cast(Cluster, SimpleNamespace(
        node_name=name, is_running=lambda node: node in running,
        membership=SimpleNamespace(lease_id=0), api=api))


@pytest.fixture
async def pair(etcd: EtcdProcess) -> AsyncIterator[tuple[NodeRequests, NodeRequests,
                                                          list[dict[str, Any]], str]]:
    """node-a asks, node-b answers (its ``restart`` handler records its args; an id
    ``missing`` is a 404, ``broken`` raises a plain exception, ``slow`` never ends in
    time)."""
    root = f"/t/{uuid.uuid4().hex}"
    seen: list[dict[str, Any]] = []

    async def restart(args: dict[str, Any]) -> Any:
        seen.append(args)
        if args["id"] == "missing":
            raise NotFound(f"no link '{args['id']}' here")
        if args["id"] == "broken":
            raise RuntimeError("boom")
        if args["id"] == "slow":
            await asyncio.sleep(5)
        return {"restarted": args["id"]}

    running = {"node-a", "node-b"}
    a = NodeRequests(fake_cluster("node-a", running, {}), EtcdClient([etcd.url]), root)
    b = NodeRequests(fake_cluster("node-b", running, {"restart": restart}),
                     EtcdClient([etcd.url]), root)
    b.start()
    try:
        yield a, b, seen, root
    finally:
        await b.stop()
        await a.etcd.close()
        await b.etcd.close()


async def leftovers(client: EtcdClient, root: str) -> list[bytes]:
    return [kv.key for kv in await client.get_prefix(root + "/")]


async def test_the_named_node_answers(pair: Any) -> None:
    a, _b, seen, root = pair
    answer = await a.ask("node-b", "restart", {"id": "5be0c2a1"}, timeout=10)
    assert answer == {"restarted": "5be0c2a1"}
    assert seen == [{"id": "5be0c2a1"}]
    assert await leftovers(a.etcd, root) == []


async def test_an_error_answer_keeps_its_reply_code(pair: Any) -> None:
    a, _b, _seen, root = pair
    with pytest.raises(NotFound, match="no link 'missing' here"):
        await a.ask("node-b", "restart", {"id": "missing"}, timeout=10)
    with pytest.raises(AMQPError, match="RuntimeError: boom") as info:
        await a.ask("node-b", "restart", {"id": "broken"}, timeout=10)
    assert info.value.reply_code == 541
    with pytest.raises(AMQPError, match="no handler for 'other'") as info:
        await a.ask("node-b", "other", {}, timeout=10)
    assert info.value.reply_code == 540
    assert await leftovers(a.etcd, root) == []


async def test_no_answer_in_time_is_a_timeout(pair: Any) -> None:
    a, _b, _seen, root = pair
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match=r"did not answer 'restart' within 0\.5s"):
        await a.ask("node-b", "restart", {"id": "slow"}, timeout=0.5)
    assert loop.time() - started < 3  # bounded by the timeout, not the handler
    # the request is gone; the late answer, if written, is under the answerer's lease
    assert not [k for k in await leftovers(a.etcd, root) if b"/requests/" in k]


async def test_a_node_that_is_not_running_is_not_asked(pair: Any) -> None:
    a, _b, seen, root = pair
    for node in ("node-zz", "node-a"):  # unknown, and the asker itself
        with pytest.raises(NotFound, match="not another running node"):
            await a.ask(node, "restart", {"id": "x"}, timeout=10)
    assert seen == [] and await leftovers(a.etcd, root) == []
