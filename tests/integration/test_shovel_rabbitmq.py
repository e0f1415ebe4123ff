"""Interop: amqpd's shovel with a real RabbitMQ 3.10 at either end, and RabbitMQ's shovel
plugin using amqpd as its source and destination.

The node is Debian's rabbitmq-server, started by the test on free loopback ports
(devtools.rabbitmq); the module skips where it is not installed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiormq
import pytest
from pamqp import commands as spec

from devtools.rabbitmq import RabbitInfo, RabbitMQNotInstalled, ctl, running_rabbitmq
from tests.integration._http import Api
from tests.integration.test_shovel_helpers import (
    await_for,
    count,
    drain,
    get_one,
    publish,
    set_shovel,
    shovel_state,
    wait_for,
)
from tests.support.brokerproc import BrokerProcess

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitInfo]:
    try:
        with running_rabbitmq(tmp_path_factory.mktemp("rabbit"),
                              plugins=("rabbitmq_shovel",)) as info:
            yield info
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def amqpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("amqpd"),
                         env={"AMQPD_PLUGINS": "shovel", "AMQPD_CLUSTER_NAME": "amqpd-site"})
    proc.start()
    yield proc
    proc.stop()


def _rabbit_url(info: RabbitInfo) -> str:
    return f"amqp://guest:guest@127.0.0.1:{info.amqp_port}/%2F"


async def test_amqpd_shovel_to_rabbitmq(rabbit: RabbitInfo, amqpd: BrokerProcess) -> None:
    api = Api(amqpd.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    rurl = _rabbit_url(rabbit)
    props = spec.Basic.Properties(delivery_mode=2, content_type="text/plain",
                                  message_id="m-1", headers={"k": "v"})
    await publish(amqpd.url, src, 1, properties=props)
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": rurl,
                           "dest-queue": dest, "dest-add-forward-headers": True})
    msg = await get_one(rurl, dest)
    p = msg.header.properties
    assert msg.body == b"0" and p.content_type == "text/plain" and p.message_id == "m-1"
    headers: dict[str, Any] = p.headers or {}  # the decoded field table
    (table,) = headers["x-shovelled"]
    assert table["shovelled-by"] == "amqpd-site" and table["dest-queue"] == dest
    assert "guest" not in table["dest-uri"]
    await publish(amqpd.url, src, 2000, start=1)
    bodies = await drain(rurl, dest, 2000)
    assert {int(b) for b in bodies} == set(range(1, 2001))
    assert shovel_state(api, name) == "running"
    assert api.delete(f"/api/parameters/shovel/%2F/{name}").status == 204


async def test_amqpd_shovel_from_rabbitmq(rabbit: RabbitInfo, amqpd: BrokerProcess) -> None:
    api = Api(amqpd.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    rurl = _rabbit_url(rabbit)
    await publish(rurl, src, 3000)
    set_shovel(api, name, {"src-uri": [rurl], "src-queue": src, "dest-uri": "amqp://",
                           "dest-queue": dest, "src-delete-after": "queue-length"})
    wait_for(lambda: api.get(f"/api/parameters/shovel/%2F/{name}").status == 404, 60,
             "delete-after reached")
    bodies = await drain(amqpd.url, dest, 3000)
    assert sorted(int(b) for b in bodies) == list(range(3000))
    assert await count(rurl, src) == 0


async def test_rabbitmq_shovel_between_amqpd_queues(rabbit: RabbitInfo,
                                                    amqpd: BrokerProcess) -> None:
    """RabbitMQ's own shovel plugin, with amqpd at both ends (amqpd as a shovel peer)."""
    src, dest = uid("src"), uid("dest")
    await publish(amqpd.url, src, 2000)
    value = {"src-uri": amqpd.url, "src-queue": src, "dest-uri": amqpd.url,
             "dest-queue": dest, "ack-mode": "on-confirm",
             "dest-add-forward-headers": True}
    ctl(rabbit, "set_parameter", "shovel", "rmq-sh", json.dumps(value))
    bodies = await drain(amqpd.url, dest, 2000, timeout=90)
    assert {int(b) for b in bodies} == set(range(2000))
    ctl(rabbit, "clear_parameter", "shovel", "rmq-sh")



async def test_rabbitmq_destination_retries_through_the_whole_route(
        rabbit: RabbitInfo, amqpd: BrokerProcess) -> None:
    """RabbitMQ offers no ``publish_retry_of``: a retry of a message one queue of the
    route refused goes through the exchange again, and the healthy queue takes one more
    copy per retry round, flagged ``x-shovel-retry`` (docs/shovel.md: what a remote
    amqpd avoids)."""
    api = Api(amqpd.http_url)
    src, name, p = uid("src"), uid("sh"), uid("rt")
    rurl = _rabbit_url(rabbit)
    conn = await aiormq.connect(rurl)
    try:
        assert "publish_retry_of" not in conn.server_capabilities
        ch = await conn.channel()
        await ch.exchange_declare(f"{p}.x", exchange_type="fanout")
        await ch.queue_declare(f"{p}.healthy")
        await ch.queue_declare(f"{p}.full", arguments={"x-max-length": 1,
                                                        "x-overflow": "reject-publish"})
        for queue in (f"{p}.healthy", f"{p}.full"):
            await ch.queue_bind(queue, f"{p}.x")
        await ch.basic_publish(b"filler", routing_key=f"{p}.full")
        await publish(amqpd.url, src, 3)
        set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": rurl,
                               "dest-exchange": f"{p}.x"})
        # each message: a first copy, then one per retry round (50 ms doubling)
        async def copies() -> bool:
            return await count(rurl, f"{p}.healthy") >= 9

        await await_for(copies, 30, "retry copies in the healthy queue")
        assert api.delete(f"/api/parameters/shovel/%2F/{name}").status == 204
        got: list[dict[str, Any]] = []
        for _ in range(200):
            msg = await ch.basic_get(f"{p}.healthy", no_ack=True)
            if msg.body is None or not msg.delivery_tag:
                break
            got.append(dict(msg.header.properties.headers or {}))
        assert any(int(h.get("x-shovel-retry", 0)) >= 2 for h in got), got
        assert not any("x-publish-retry-of" in h for h in got)
    finally:
        await conn.close()

