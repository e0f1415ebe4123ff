"""Offsets and publisher sequences asked of a stream's leader's node
(amqpd/streamproto/forwarding.py), the asking side over a fake cluster that answers
node requests in memory: coalescing, read-your-writes, and every failure's answer and
log line. tests/integration/test_cluster_stream_protocol.py runs it on three nodes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from amqpd.protocol.errors import AMQPError, NotFound
from amqpd.streamproto import codec as c
from amqpd.streamproto.forwarding import QUERY, SEQUENCE, STORE, TrackingForwarder


class FakeCluster:
    def __init__(self, leader: str | None) -> None:
        self.leader = leader

    def queue_leader(self, vhost: str, name: str) -> str | None:
        return self.leader


class FakeAPI:
    """Node requests answered by a dict of offsets, each after ``gate`` opens."""

    def __init__(self, leader: str | None = "node-a") -> None:
        self._cluster = FakeCluster(leader)
        self.asked: list[tuple[str, str, dict[str, Any]]] = []
        self.offsets: dict[str, int] = {}
        self.sequences: dict[str, int] = {"producer": 7}
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: BaseException | None = None
        self.handlers: dict[str, Any] = {}

    def cluster(self) -> FakeCluster:
        return self._cluster

    def node_name(self) -> str:
        return "node-c"

    def serve_node_requests(self, kind: str, handler: Any) -> None:
        self.handlers[kind] = handler

    async def ask_node(self, node: str, kind: str, args: dict[str, Any],
                       timeout: float = 5.0) -> Any:
        self.asked.append((node, kind, dict(args)))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if kind == STORE:
            self.offsets[args["reference"]] = args["offset"]
            return None
        if kind == QUERY:
            return self.offsets.get(args["reference"])
        return self.sequences.get(args["reference"], 0)


class FakeBroker:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.vhosts: dict[str, Any] = {}


def forwarder(api: FakeAPI) -> TrackingForwarder:
    f = TrackingForwarder(FakeBroker(api))  # type: ignore[arg-type]
    f.serve()
    return f


async def test_stores_coalesce_latest_wins_and_a_query_reads_them_back() -> None:
    api = FakeAPI()
    f = forwarder(api)
    assert sorted(api.handlers) == sorted([STORE, QUERY, SEQUENCE])
    api.gate.clear()  # the first request hangs: the others wait behind it
    f.store_offset("/", "s", "app", 0, "conn")
    await asyncio.sleep(0.01)
    assert len(api.asked) == 1
    for offset in range(1, 100):
        f.store_offset("/", "s", "app", offset, "conn")
    query = asyncio.create_task(f.query_offset("/", "s", "app", "conn"))
    await asyncio.sleep(0.01)
    assert not query.done()  # waits for the store under way
    api.gate.set()
    assert await query == (c.OK, 99)
    stores = [a for a in api.asked if a[1] == STORE]
    assert [a[2]["offset"] for a in stores] == [0, 99]  # one in flight, then the latest
    assert stores[0][0] == "node-a"
    assert f._sending == {}


async def test_query_answers_no_offset_and_the_sequence() -> None:
    api = FakeAPI()
    f = forwarder(api)
    assert await f.query_offset("/", "s", "nobody", "conn") == (c.NO_OFFSET, 0)
    assert await f.query_sequence("/", "s", "producer", "conn") == (c.OK, 7)
    assert await f.query_sequence("/", "s", "other", "conn") == (c.OK, 0)


@pytest.mark.parametrize("fail", [NotFound("not led there"), TimeoutError("no answer"),
                                  AMQPError("no handler")])
async def test_failures_are_0x06_for_queries_and_a_warning_for_stores(
        fail: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    api = FakeAPI()
    api.fail = fail
    f = forwarder(api)
    caplog.set_level(logging.WARNING, "amqpd.streamproto")
    assert await f.query_offset("/", "s", "app", "conn") == (c.STREAM_NOT_AVAILABLE, 0)
    assert await f.query_sequence("/", "s", "p", "conn") == (c.STREAM_NOT_AVAILABLE, 0)
    f.store_offset("/", "s", "app", 5, "conn")
    task = f._sending[("/", "s", "app")]
    await task
    text = caplog.text
    assert "query-offset for stream 's' answered 'stream not available'" in text
    assert "query-publisher-sequence for stream 's'" in text
    assert "store-offset 5 for reference 'app' of stream 's' not stored" in text
    assert str(fail) in text


async def test_no_known_leader_asks_nobody(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeAPI(leader=None)
    f = forwarder(api)
    caplog.set_level(logging.WARNING, "amqpd.streamproto")
    assert await f.query_offset("/", "s", "app", "conn") == (c.STREAM_NOT_AVAILABLE, 0)
    assert api.asked == []
    assert "no known leader for stream 's'" in caplog.text


async def test_the_leader_refuses_a_stream_it_does_not_lead() -> None:
    api = FakeAPI()
    forwarder(api)
    for kind in (STORE, QUERY, SEQUENCE):
        with pytest.raises(NotFound, match="not led on node 'node-c'"):
            await api.handlers[kind]({"vhost": "/", "stream": "s", "reference": "r",
                                      "offset": 1})


async def test_answer_sends_once_the_query_is_answered() -> None:
    api = FakeAPI()
    f = forwarder(api)
    api.offsets["app"] = 42
    got: list[tuple[int, int]] = []
    done = asyncio.Event()

    def send(code: int, value: int) -> None:
        got.append((code, value))
        done.set()

    f.answer(f.query_offset("/", "s", "app", "conn"), send)
    await asyncio.wait_for(done.wait(), 5)
    assert got == [(c.OK, 42)]


async def test_close_drops_what_is_under_way_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeAPI()
    f = forwarder(api)
    api.gate.clear()
    caplog.set_level(logging.WARNING, "amqpd.streamproto")
    f.store_offset("/", "s", "app", 1, "conn")
    await asyncio.sleep(0.01)
    f.store_offset("/", "s", "app", 2, "conn")
    task = f._sending[("/", "s", "app")]
    f.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [a[2]["offset"] for a in api.asked] == [1]
    assert f._sending == {} and f._latest == {}
    assert "store-offsets of 1 references not (all) passed on" in caplog.text
