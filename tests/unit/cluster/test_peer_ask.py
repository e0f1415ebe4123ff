"""Questions over the inter-node links (amqpd.cluster.peer_ask) between two stand-in
nodes whose links hand each other the frames as bytes: an answer comes back as the
handler's value, an error answer as the same kind of error, a node without the handler
says so; a silent peer is left out after the bound, a link that goes down ends the wait
at once, a node with no link is left out without waiting; a node still starting
answers at once that it is. ``Cluster.ask`` (one node asked: a shovel's restart, a
stream's offsets) goes over the link while it is up and through etcd otherwise."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from amqpd.broker.api import AMQPError, BrokerAPI, NotFound
from amqpd.cluster import link_wire as W
from amqpd.cluster.cluster_queues import ClusterQueues, extension_frame_too_early
from amqpd.cluster.link import Link
from amqpd.cluster.node import Cluster
from amqpd.cluster.peer_ask import PeerAsk


class FakeApi:
    def __init__(self, name: str) -> None:
        self.name = name
        self.handlers: dict[str, Any] = {}

    def node_name(self) -> str:
        return self.name

    def node_request_handler(self, kind: str) -> Any:
        return self.handlers.get(kind)


class FakeLink:
    """One end of a link: what it sends reaches ``far`` (its peer's PeerAsk) as the
    frames a real link would decode, unless ``silent``."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.up = True
        self.closed = False
        self.silent = False
        self.far: PeerAsk | None = None
        self.back: FakeLink | None = None
        self.sent: list[tuple[int, int, list[Any]]] = []

    def send(self, frame: bytes) -> None:
        frames = W.FrameReader().feed(frame)
        self.sent.extend(frames)
        if self.silent or self.far is None:
            return
        for kind, stream, fields in frames:
            self.far.frame(cast(Link, self.back), kind, stream, fields)


class FakeLinks:
    def __init__(self) -> None:
        self.by_peer: dict[str, FakeLink] = {}

    def link(self, peer: str) -> FakeLink | None:
        return self.by_peer.get(peer)


def node(name: str) -> tuple[PeerAsk, FakeApi, FakeLinks]:
    api, links = FakeApi(name), FakeLinks()
    queues = type("Q", (), {"links": links})()
    return PeerAsk(cast(BrokerAPI, api), cast(ClusterQueues, queues)), api, links


def linked(a_name: str, b_name: str) -> tuple[PeerAsk, FakeApi, PeerAsk, FakeApi,
                                              FakeLink, FakeLink]:
    a, a_api, a_links = node(a_name)
    b, b_api, b_links = node(b_name)
    a_to_b, b_to_a = FakeLink(b_name), FakeLink(a_name)
    a_to_b.far, a_to_b.back = b, b_to_a
    b_to_a.far, b_to_a.back = a, a_to_b
    a_links.by_peer[b_name] = a_to_b
    b_links.by_peer[a_name] = b_to_a
    return a, a_api, b, b_api, a_to_b, b_to_a


def test_an_answer_comes_back_as_the_handlers_value() -> None:
    async def run() -> None:
        a, _a_api, _b, b_api, _ab, _ba = linked("a", "b")

        async def part(args: dict[str, Any]) -> Any:
            return [{"asked": args, "node": "b"}]

        b_api.handlers["part"] = part
        got = await a.ask("b", "part", {"path": "/api/connections"}, timeout=1)
        assert got == [{"asked": {"path": "/api/connections"}, "node": "b"}]
        assert a._waiting == {}
    asyncio.run(run())


def test_an_error_answer_is_raised_as_its_kind_and_no_handler_is_540() -> None:
    async def run() -> None:
        a, _a_api, _b, b_api, _ab, _ba = linked("a", "b")

        async def missing(args: dict[str, Any]) -> Any:
            raise NotFound("no such thing there")

        b_api.handlers["missing"] = missing
        with pytest.raises(NotFound, match="no such thing there"):
            await a.ask("b", "missing", {}, timeout=1)
        with pytest.raises(AMQPError) as exc:
            await a.ask("b", "unknown-kind", {}, timeout=1)
        assert exc.value.reply_code == 540
    asyncio.run(run())


def test_ask_every_leaves_out_a_silent_node_after_the_bound_and_logs_it(
        caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> tuple[dict[str, Any], dict[str, str], float]:
        a, _a_api, _b, b_api, _ab, _ba = linked("a", "b")
        _c, c_api, _c_links = node("c")
        a_to_c, c_to_a = FakeLink("c"), FakeLink("a")
        a_to_c.far, a_to_c.back, a_to_c.silent = _c, c_to_a, True  # stopped: no answer
        cast(FakeLinks, a.queues.links).by_peer["c"] = a_to_c

        async def part(args: dict[str, Any]) -> Any:
            return ["from b"]

        b_api.handlers["part"] = part
        c_api.handlers["part"] = part
        loop = asyncio.get_running_loop()
        started = loop.time()
        answers, missing = await a.ask_every(["b", "c", "d"], "part", {}, timeout=0.2)
        return answers, missing, loop.time() - started

    with caplog.at_level(logging.WARNING, logger="amqpd.cluster"):
        answers, missing, took = asyncio.run(run())
    assert answers == {"b": ["from b"]}
    assert set(missing) == {"c", "d"}
    assert "within 0.2s" in missing["c"] and "no link" in missing["d"]
    assert took < 2
    assert "node c left out of 'part'" in caplog.text
    assert "node d left out of 'part'" in caplog.text


def test_a_link_going_down_ends_the_wait_at_once() -> None:
    async def run() -> None:
        a, _a_api, _b, _b_api, a_to_b, _ba = linked("a", "b")
        a_to_b.silent = True
        asking = asyncio.ensure_future(a.ask("b", "part", {}, timeout=30))
        await asyncio.sleep(0.01)
        a.link_down(cast(Link, a_to_b))
        with pytest.raises(ConnectionError, match="went down"):
            await asyncio.wait_for(asking, 1)
        assert a._waiting == {}
    asyncio.run(run())


def test_a_node_still_starting_answers_at_once_that_it_is() -> None:
    link = FakeLink("a")
    extension_frame_too_early(cast(Link, link), W.ASK, 0, [7, "part", {}])
    assert link.sent == [(W.ANSWER, 0, [7, {"ok": False, "code": 503,
                                            "error": "this node is starting"}])]


def test_ask_and_answer_frames_round_trip() -> None:
    frame = W.encode(W.ASK, 0, 3, "http-local-part", {"path": "/api/channels"})
    assert W.FrameReader().feed(frame) == [
        (W.ASK, 0, [3, "http-local-part", {"path": "/api/channels"}])]
    frame = W.encode(W.ANSWER, 0, 3, {"ok": True, "value": [1, 2]})
    assert W.FrameReader().feed(frame) == [(W.ANSWER, 0, [3, {"ok": True, "value": [1, 2]}])]


class EtcdRequests:
    """Stands in for NodeRequests: records that the question went through etcd."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def ask(self, node: str, kind: str, args: dict[str, Any], timeout: float) -> Any:
        self.asked.append((node, kind))
        return "through etcd"


def test_one_node_is_asked_over_the_link_while_it_is_up_else_through_etcd() -> None:
    async def run() -> None:
        a, _a_api, _b, b_api, a_to_b, _ba = linked("a", "b")

        async def part(args: dict[str, Any]) -> Any:
            return {"offset": args["n"] + 1}

        b_api.handlers["part"] = part
        running = {"a", "b"}
        etcd = EtcdRequests()
        cluster = SimpleNamespace(peer_ask=a, node_name="a", requests=etcd,
                                  is_running=running.__contains__)
        ask = Cluster.ask
        assert await ask(cast(Cluster, cluster), "b", "part", {"n": 4}, 5) == {"offset": 5}
        assert etcd.asked == []
        assert [k for k, _s, _f in a_to_b.sent] == [W.ASK]
        a_to_b.up = False  # the link not up (yet, or again)
        assert await ask(cast(Cluster, cluster), "b", "part", {"n": 4}, 5) == "through etcd"
        a_to_b.up = True
        running.discard("b")  # not running: etcd's path says 404 (NodeRequests.ask)
        assert await ask(cast(Cluster, cluster), "b", "part", {"n": 4}, 5) == "through etcd"
        cluster.peer_ask = None  # the links' extensions not started yet
        running.add("b")
        assert await ask(cast(Cluster, cluster), "b", "part", {"n": 4}, 5) == "through etcd"
        assert etcd.asked == [("b", "part")] * 3
    asyncio.run(run())


def test_a_link_going_down_before_the_answer_is_a_timeout_for_one_node_asked() -> None:
    async def run() -> None:
        a, _a_api, _b, _b_api, a_to_b, _ba = linked("a", "b")
        a_to_b.silent = True
        cluster = SimpleNamespace(peer_ask=a, node_name="a", requests=EtcdRequests(),
                                  is_running=lambda node: True)
        asking = asyncio.ensure_future(
            Cluster.ask(cast(Cluster, cluster), "b", "part", {}, 30))
        await asyncio.sleep(0.01)
        a.link_down(cast(Link, a_to_b))
        with pytest.raises(TimeoutError, match=r"did not answer 'part'.*went down"):
            await asyncio.wait_for(asking, 1)
        assert cluster.requests.asked == []  # not asked again: it may have been done
    asyncio.run(run())
