"""The shovel plugin between two amqpd processes ("sites"): keys, status, headers, life cycle."""

from __future__ import annotations

import datetime
import json
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiormq
import pytest
from pamqp import commands as spec

from plugins.shovel.params import parse, redact
from plugins.shovel.runner import ShovelRunner, _Link
from plugins.shovel.wire import Delivery, decode_properties, encode_properties
from tests.integration._http import Api, q
from tests.integration.test_shovel_helpers import (
    await_for,
    count,
    drain,
    get_one,
    publish,
    publish_fast,
    set_shovel,
    shovel_state,
    shovels,
    wait_for,
)
from tests.support.brokerproc import BrokerProcess

PLUGIN_ENV = {"AMQPD_PLUGINS": "shovel", "AMQPD_CLUSTER_NAME": "site-a"}


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess,
                                                                      BrokerProcess]]:
    """Site A runs the shovels; site B is a plain amqpd."""
    a = BrokerProcess(tmp_path_factory.mktemp("site-a"), env=PLUGIN_ENV).start()
    b = BrokerProcess(tmp_path_factory.mktemp("site-b")).start()
    yield a, b
    a.stop()
    b.stop()


def test_parse_defaults_legacy_keys_and_redaction() -> None:
    """No broker needed: RabbitMQ's defaults, legacy spellings (modern wins), redaction."""
    d = parse("/", "s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": ["amqp://h"]})
    assert (d.prefetch_count, d.delete_after, d.ack_mode, d.reconnect_delay) == \
        (1000, "never", "on-confirm", 1.0)
    assert not d.add_forward_headers and not d.add_timestamp_header
    assert d.publish_properties == {} and d.dest_uris == ["amqp://h"]
    d = parse("/", "s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://",
                         "prefetch-count": 5, "src-prefetch-count": 7, "delete-after": 3,
                         "add-forward-headers": True, "publish-properties": {"priority": 1}})
    assert (d.prefetch_count, d.delete_after, d.add_forward_headers) == (7, 3, True)
    assert d.publish_properties == {"priority": 1}
    assert redact("amqp://user:pw@host:5673/%2F?heartbeat=5") == \
        "amqp://host:5673/%2F?heartbeat=5"
    assert redact("amqp://") == "amqp://"
    with pytest.raises(ValueError, match="Unrecognised terms"):
        parse("/", "s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://",
                         "dest-qeueu": "typo"})
    with pytest.raises(ValueError, match="Unsupported protocol"):
        parse("/", "s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://",
                         "dest-protocol": "amqp10"})


def test_timestamp_header_is_a_long_long() -> None:
    """x-shovelled-timestamp goes out as RabbitMQ's `long` ('l', 64-bit), seconds."""
    defn = parse("/", "s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://",
                            "add-timestamp-header": True})
    runner = ShovelRunner(defn, local_uri=lambda v: "", node="n", cluster_name="c")
    link = _Link(runner, None, None)  # type: ignore[arg-type]
    raw_in = encode_properties(spec.Basic.Properties(headers={"a": 1}))
    _, _, raw = link.route(Delivery(1, False, "", "q", raw_in, b""))
    i = raw.index(b"x-shovelled-timestampl") + len(b"x-shovelled-timestampl")
    assert abs(struct.unpack(">q", raw[i:i + 8])[0] - time.time()) < 60
    assert decode_properties(raw).headers["a"] == 1  # type: ignore[index]


def test_validation_uses_rabbitmq_texts(sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    api = Api(sites[0].http_url)
    cases = [
        ({"src-queue": "a", "dest-uri": "amqp://"}, 'Key "src-uri" not found in bad'),
        ({"src-uri": "amqp://", "dest-uri": "amqp://"},
         "Must specify 'src-exchange' or 'src-queue'"),
        ({"src-uri": "amqp://", "src-queue": "a", "src-exchange": "x", "dest-uri": "amqp://"},
         "Cannot specify 'src-exchange' and 'src-queue'"),
        ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
          "dest-exchange": "x"}, "Cannot specify 'dest-exchange' and 'dest-queue'"),
        ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "no-ack",
          "src-delete-after": 5}, "Cannot specify 'no-ack' and numerical 'delete-after'"),
        ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "x"},
         "ack-mode should be one of"),
        ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
          "src-delete-after": "soon"}, 'should be number, "never" or "queue-length"'),
        ({"src-uri": "amqp://", "src-queue": 5, "dest-uri": "amqp://"},
         "src-queue should be a string, actually was 5"),
    ]
    for value, text in cases:
        r = api.put("/api/parameters/shovel/%2F/bad", {"value": value})
        assert r.status == 400, (value, r.text)
        assert text in r.json()["reason"], (value, r.json())
    assert api.get("/api/parameters/shovel/%2F/bad").status == 404


async def test_dynamic_shovel_forwards_exactly(sites: tuple[BrokerProcess,
                                                            BrokerProcess]) -> None:
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    props = spec.Basic.Properties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=2,
        priority=3, correlation_id="corr", reply_to="replies", expiration="600000",
        message_id="mid-1", timestamp=datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
        message_type="kind", app_id="app", headers={"h": "v", "n": 7})
    await publish(a.url, src, 1, properties=props)
    # legacy spellings for the forward and timestamp headers
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                           "dest-queue": dest, "add-forward-headers": True,
                           "add-timestamp-header": True})
    msg = await get_one(b.url, dest)
    p = msg.header.properties
    assert msg.body == b"0"
    assert msg.delivery.routing_key == dest  # type: ignore[union-attr]
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                 "message_type", "app_id"):
        assert getattr(p, attr) == getattr(props, attr), attr
    # the decoded field table (any AMQP field type): the assertions below check the values
    headers: dict[str, Any] = p.headers or {}
    assert headers["h"] == "v" and headers["n"] == 7
    assert abs(headers["x-shovelled-timestamp"] - time.time()) < 60  # seconds
    (table,) = headers["x-shovelled"]
    host = f"127.0.0.1:{b.port}"
    assert table == {
        "shovelled-by": "site-a", "shovel-type": "dynamic", "shovel-name": name,
        "shovel-vhost": "/", "src-uri": "amqp://", "src-queue": src,
        "dest-uri": f"amqp://{host}/%2F", "dest-queue": dest,
    }
    (status,) = [s for s in shovels(api) if s["name"] == name]
    assert status["state"] == "running" and status["type"] == "dynamic"
    assert status["vhost"] == "/" and status["src_queue"] == src
    assert status["dest_uri"] == f"amqp://{host}/%2F"  # no credentials
    assert "guest" not in str(status)
    assert {s["name"] for s in shovels(api, "/")} >= {name}
    # more messages flow while it runs; delete stops it cleanly
    await publish(a.url, src, 500, start=1)
    bodies = await drain(b.url, dest, 500)
    assert set(bodies) == {str(i).encode() for i in range(1, 501)}
    assert api.delete(f"/api/parameters/shovel/%2F/{q(name)}").status == 204
    wait_for(lambda: shovel_state(api, name) is None, 10, "shovel gone")
    await publish(a.url, src, 10, start=1000)
    assert await count(a.url, src) == 10  # nobody consumes any more


async def test_exchange_source_and_original_routing(sites: tuple[BrokerProcess,
                                                                  BrokerProcess]) -> None:
    """src-exchange binds a server-named queue; without dest-* the route is kept."""
    a, b = sites
    api = Api(a.http_url)
    name, dest = uid("sh"), uid("dest")
    await publish(b.url, dest, 0)  # declare the destination queue on site B, bind it
    r = Api(b.http_url).post(f"/api/bindings/%2F/e/amq.direct/q/{dest}", {"routing_key": dest})
    assert r.status == 201, r.text
    set_shovel(api, name, {"src-uri": "amqp://", "src-exchange": "amq.direct",
                           "src-exchange-key": dest, "dest-uri": b.url,
                           "ack-mode": "on-publish", "prefetch-count": 10})
    wait_for(lambda: shovel_state(api, name) == "running", 10, "running")
    # to amq.direct with routing key `dest` on A -> amq.direct/`dest` on B -> queue dest
    await publish(a.url, "", 50, exchange="amq.direct", routing_key=dest, declare=False)
    bodies = await drain(b.url, dest, 50)
    assert sorted(bodies, key=int) == [str(i).encode() for i in range(50)]
    (status,) = [s for s in shovels(api) if s["name"] == name]
    assert status["src_exchange"] == "amq.direct" and status["src_exchange_key"] == dest
    assert api.delete(f"/api/shovels/vhost/%2F/{q(name)}").status == 204
    assert api.get(f"/api/parameters/shovel/%2F/{q(name)}").status == 404


async def test_no_ack_publish_properties_and_dest_exchange_key(
        sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """no-ack mode; dest-exchange + dest-exchange-key; publish-properties override; a
    message without message_id arrives without one (aiormq would add one)."""
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    await publish(b.url, dest, 0)
    r = Api(b.http_url).post(f"/api/bindings/%2F/e/amq.topic/q/{dest}", {"routing_key": "k.#"})
    assert r.status == 201, r.text
    await publish_fast(a.url, src, 1, properties=spec.Basic.Properties(content_type="x/y"))
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                           "dest-exchange": "amq.topic", "dest-exchange-key": "k.1",
                           "ack-mode": "no-ack",
                           "publish-properties": {"delivery_mode": 2, "app_id": "shovel"}})
    msg = await get_one(b.url, dest)
    p = msg.header.properties
    assert msg.delivery.routing_key == "k.1"  # type: ignore[union-attr]
    assert msg.delivery.exchange == "amq.topic"  # type: ignore[union-attr]
    assert p.content_type == "x/y" and p.message_id is None
    assert p.delivery_mode == 2 and p.app_id == "shovel"
    assert not p.headers  # no forward headers unless asked for
    await publish(a.url, src, 300)
    assert len(set(await drain(b.url, dest, 300))) == 300
    r = api.put(f"/api/parameters/shovel/%2F/{q(name)}", {"value": {
        "src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
        "dest-publish-properties": {"headers": {"a": 1}}}})
    assert r.status == 400 and "headers are not supported" in r.json()["reason"]
    api.delete(f"/api/parameters/shovel/%2F/{q(name)}")


async def test_large_and_empty_bodies(sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Bodies larger than a frame are split again; an empty body stays empty."""
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    big = bytes(range(256)) * 4096 + b"end"  # 1 MiB + 3 bytes: several frames
    conn = await aiormq.connect(a.url)
    ch = await conn.channel()
    await ch.queue_declare(src, durable=True)
    await ch.basic_publish(big, routing_key=src)
    await ch.basic_publish(b"", routing_key=src)
    await conn.close()
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                           "dest-queue": dest})
    bodies = await drain(b.url, dest, 2)
    assert sorted(bodies, key=len) == [b"", big]
    api.delete(f"/api/parameters/shovel/%2F/{q(name)}")


async def test_delete_after_queue_length_removes_the_parameter(
        sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    await publish(a.url, src, 300)
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                           "dest-queue": dest, "src-delete-after": "queue-length",
                           "src-prefetch-count": 50})
    wait_for(lambda: api.get(f"/api/parameters/shovel/%2F/{q(name)}").status == 404, 20,
             "parameter cleared after queue-length")
    await publish(a.url, src, 5, start=300)  # after the end: stays at the source
    assert await count(b.url, dest) == 300
    assert await count(a.url, src) == 5


async def test_delete_after_n_and_restart(sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    await publish(a.url, src, 100)
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": [b.url],
                           "dest-queue": dest, "delete-after": 40})
    wait_for(lambda: api.get(f"/api/parameters/shovel/%2F/{q(name)}").status == 404, 20,
             "parameter cleared after 40")
    assert await count(b.url, dest) == 40
    assert await count(a.url, src) == 60
    # restart: a running shovel comes back running
    name2 = uid("sh")
    set_shovel(api, name2, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                            "dest-queue": dest})
    wait_for(lambda: shovel_state(api, name2) == "running", 10, "running")
    assert api.delete(f"/api/shovels/vhost/%2F/{q(name2)}/restart").status == 204
    wait_for(lambda: shovel_state(api, name2) == "running", 10, "running again")
    assert api.delete(f"/api/shovels/vhost/%2F/{q(name2)}/restart2").status in (404, 405)
    assert api.delete(f"/api/shovels/vhost/%2F/{q(uid('none'))}/restart").status == 404
    await drain(b.url, dest, 100)
    api.delete(f"/api/parameters/shovel/%2F/{q(name2)}")


async def test_source_queue_deleted_shovel_recovers(sites: tuple[BrokerProcess,
                                                                  BrokerProcess]) -> None:
    """The broker cancels the consumer: the shovel starts over (re-declaring the queue)."""
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                           "dest-queue": dest, "reconnect-delay": 0.1})
    wait_for(lambda: shovel_state(api, name) == "running", 10, "running")
    assert api.delete(f"/api/queues/%2F/{src}").status == 204
    wait_for(lambda: api.get(f"/api/queues/%2F/{src}").status == 200, 10, "re-declared")
    wait_for(lambda: shovel_state(api, name) == "running", 10, "running again")
    await publish(a.url, src, 20)
    assert len(set(await drain(b.url, dest, 20))) == 20
    # setting the same definition again leaves it running (no restart)
    value = api.get(f"/api/parameters/shovel/%2F/{q(name)}").json()["value"]
    before = shovels(api)
    set_shovel(api, name, value)
    assert [s["timestamp"] for s in shovels(api) if s["name"] == name] == \
        [s["timestamp"] for s in before if s["name"] == name]
    api.delete(f"/api/parameters/shovel/%2F/{q(name)}")


async def test_destination_nack_requeues_at_the_source(
        sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """A full destination (reject-publish) nacks: those messages go back to the source."""
    a, b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    conn = await aiormq.connect(b.url)
    ch = await conn.channel()
    await ch.queue_declare(dest, durable=True, arguments={"x-max-length": 10,
                                                         "x-overflow": "reject-publish"})
    await conn.close()
    await publish(a.url, src, 25)
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                           "dest-queue": dest, "src-prefetch-count": 5})

    async def ten_at_b() -> bool:
        return await count(b.url, dest) == 10
    await await_for(ten_at_b, 15, "destination full")
    assert api.delete(f"/api/parameters/shovel/%2F/{q(name)}").status == 204
    wait_for(lambda: shovel_state(api, name) is None, 10, "gone")

    async def rest_at_a() -> bool:
        return await count(a.url, src) == 15
    await await_for(rest_at_a, 15, "the 15 refused are back at the source")


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
async def test_local_destination_in_each_ack_mode(
        sites: tuple[BrokerProcess, BrokerProcess], ack_mode: str) -> None:
    """``dest-uri`` ``amqp://`` is this node, published to through the broker API: every
    message arrives once in each ack-mode, properties as published, and a missing
    ``dest-queue`` is declared durable (as over AMQP)."""
    a, _b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("sh")
    props = spec.Basic.Properties(delivery_mode=2, message_id="mid", headers={"h": "v"})
    await publish(a.url, src, 300, properties=props)
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://",
                           "dest-queue": dest, "ack-mode": ack_mode,
                           "src-prefetch-count": 50})
    msg = await get_one(a.url, dest)
    assert msg.header.properties.message_id == "mid"
    assert msg.header.properties.headers == {"h": "v"}
    bodies = await drain(a.url, dest, 299)
    assert sorted([msg.body, *bodies]) == sorted(str(i).encode() for i in range(300))
    r = api.get(f"/api/queues/%2F/{q(dest)}")
    assert r.status == 200 and r.json()["durable"], r.text

    async def settled() -> bool:
        return await count(a.url, src) == 0
    await await_for(settled, 15, "the source settled")
    (status,) = [s for s in shovels(api) if s["name"] == name]
    assert status["state"] == "running" and status["dest_uri"] == "amqp://", status
    assert api.delete(f"/api/parameters/shovel/%2F/{q(name)}").status == 204


async def test_local_destination_moves_transient_messages_and_ends(
        sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """The web UI's "Move messages": transient messages, ``on-confirm``,
    ``src-delete-after: queue-length``, both ends this node. A destination on this node
    confirms a transient message inside the publish, before the shovel's settling task
    first waited: that confirm was cleared unseen, so the source was never acked (CI:
    the destination held 4, the source still 4)."""
    a, _b = sites
    api = Api(a.http_url)
    src, dest, name = uid("src"), uid("dest"), uid("mv")
    await publish(a.url, src, 20, properties=spec.Basic.Properties())
    set_shovel(api, name, {"src-uri": "amqp:///%2F", "src-queue": src,
                           "src-delete-after": "queue-length", "dest-uri": "amqp:///%2F",
                           "dest-queue": dest, "ack-mode": "on-confirm",
                           "src-prefetch-count": 1000})

    async def moved() -> bool:
        return await count(a.url, src) == 0 and await count(a.url, dest) == 20
    await await_for(moved, 15, "every message moved and settled at the source")
    wait_for(lambda: shovel_state(api, name) in (None, "terminated"), 15,
             "the shovel done after its queue-length")
    api.delete(f"/api/parameters/shovel/%2F/{q(name)}")


async def test_local_destination_exchange_missing_fails_the_attempt(
        sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    """A ``dest-exchange`` that does not exist on this node is never declared: the
    shovel reports the 404 and tries again (RabbitMQ's behaviour over AMQP)."""
    a, _b = sites
    api = Api(a.http_url)
    src, name = uid("src"), uid("sh")
    await publish(a.url, src, 3)
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp:///",
                           "dest-exchange": uid("nosuch-x")})

    def failed() -> dict[str, Any] | None:
        return next((s for s in shovels(api) if s["name"] == name
                     and s["state"] == "terminated"), None)

    status = wait_for(failed, 15, "the shovel to fail on the missing exchange")
    assert "NotFound" in status["reason"] and "nosuch-x" in status["reason"], status
    assert await count(a.url, src) == 3  # nothing taken
    assert api.delete(f"/api/parameters/shovel/%2F/{q(name)}").status == 204


def test_amqpctl_set_parameter_and_shovel_status(sites: tuple[BrokerProcess,
                                                              BrokerProcess]) -> None:
    a, b = sites
    name, src = uid("sh"), uid("src")

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", a.http_url,
                               "-u", "guest", "--password", "guest", *args],
                              capture_output=True, text=True, timeout=30, check=False)

    value = json.dumps({"src-uri": "amqp://", "src-queue": src, "dest-uri": b.url,
                        "dest-queue": src})
    r = ctl("set_parameter", "shovel", name, value)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: shovel_state(Api(a.http_url), name) == "running", 10, "running")
    r = ctl("shovel_status")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if name in ln)
    assert "dynamic" in line and "running" in line
    r = ctl("--json", "shovel_status")
    (row,) = [s for s in json.loads(r.stdout) if s["name"] == name]
    assert row["state"] == "running"
    assert ctl("restart_shovel", name).returncode == 0
    assert ctl("restart_shovel", uid("none")).returncode == 1
    assert ctl("clear_parameter", "shovel", name).returncode == 0
    wait_for(lambda: shovel_state(Api(a.http_url), name) is None, 10, "gone")


async def test_unreachable_destination_is_reported_then_recovers(tmp_path: Path) -> None:
    """A destination that is down: terminated with a reason, retried, then running."""
    b = BrokerProcess(tmp_path / "b").start()
    port = b.port
    b.stop()
    a = BrokerProcess(tmp_path / "a", env=PLUGIN_ENV).start()
    try:
        api = Api(a.http_url)
        src = uid("src")
        await publish(a.url, src, 20)
        set_shovel(api, "s", {"src-uri": "amqp://", "src-queue": src,
                              "dest-uri": f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                              "dest-queue": src, "reconnect-delay": 0.2})
        status = wait_for(lambda: [s for s in shovels(api) if s["state"] == "terminated"],
                          10, "terminated with a reason")[0]
        assert status["reason"] and "guest" not in status["reason"]
        b.restart(keep_port=True)
        wait_for(lambda: shovel_state(api, "s") == "running", 15, "running after restart")
        await drain(b.url, src, 20)
    finally:
        a.stop()
        b.stop()


def test_refused_credentials_reported_without_password(
        sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = sites
    api = Api(a.http_url)
    name = uid("sh")
    set_shovel(api, name, {"src-uri": "amqp://", "src-queue": uid("src"),
                           "dest-uri": f"amqp://guest:s3cr3t-pw@127.0.0.1:{b.port}/%2F",
                           "dest-queue": "x", "reconnect-delay": 0.2})
    status = wait_for(lambda: next((s for s in shovels(api) if s["name"] == name
                                    and s["state"] == "terminated"), None), 15, "terminated")
    assert "s3cr3t-pw" not in json.dumps(status)
    assert "403" in status["reason"] and "ACCESS_REFUSED" in status["reason"], status
    api.delete(f"/api/parameters/shovel/%2F/{q(name)}")


async def test_static_shovel_from_config(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b").start()
    cfg = tmp_path / "amqpd.toml"
    cfg.write_text(
        'plugins = ["shovel"]\n\n[[shovels]]\nname = "static-one"\nsrc-uri = "amqp://"\n'
        f'src-queue = "outbox"\ndest-uri = "{b.url}"\ndest-queue = "inbox"\n'
        'ack-mode = "on-confirm"\nprefetch-count = 100\n'
        # reconnect-delay 0: a static shovel stops at its first failure
        '\n[[shovels]]\nname = "static-dead"\nsrc-uri = "amqp://"\nsrc-queue = "x"\n'
        'dest-uri = "amqp://guest:guest@127.0.0.1:1/%2F"\nreconnect-delay = 0\n')
    a = BrokerProcess(tmp_path / "a", extra_args=["--config", str(cfg)]).start()
    try:
        api = Api(a.http_url)
        wait_for(lambda: shovel_state(api, "static-one") == "running", 15, "running")
        status = next(s for s in shovels(api) if s["name"] == "static-one")
        assert status["type"] == "static" and status["src_queue"] == "outbox"
        wait_for(lambda: shovel_state(api, "static-dead") == "terminated", 15, "terminated")
        dead = next(s for s in shovels(api) if s["name"] == "static-dead")
        assert dead["reason"] and dead["type"] == "static"
        time_terminated = dead["timestamp"]
        assert api.delete("/api/shovels/vhost/%2F/static-one").status == 404  # not a param
        await publish(a.url, "outbox", 100)
        bodies = await drain(b.url, "inbox", 100)
        assert len(set(bodies)) == 100
        # still terminated: never retried
        dead = next(s for s in shovels(api) if s["name"] == "static-dead")
        assert dead["state"] == "terminated" and dead["timestamp"] == time_terminated
    finally:
        a.stop()
        b.stop()


async def test_definitions_import_and_boot_restore(tmp_path: Path) -> None:
    """A shovel from a definitions import runs, and runs again after the broker restarts."""
    b = BrokerProcess(tmp_path / "b").start()
    a = BrokerProcess(tmp_path / "a", env=PLUGIN_ENV).start()
    try:
        api = Api(a.http_url)
        defs = {"parameters": [{"component": "shovel", "vhost": "/", "name": "imported",
                                "value": {"src-uri": "amqp://", "src-queue": "outq",
                                          "dest-uri": b.url, "dest-queue": "inq"}}]}
        r = api.post("/api/definitions", defs)
        assert r.status in (200, 201, 204), r.text
        wait_for(lambda: shovel_state(api, "imported") == "running", 15, "running")
        exported = api.get("/api/definitions").json()["parameters"]
        assert [p["name"] for p in exported if p["component"] == "shovel"] == ["imported"]
        a.stop()
        a.start()
        api = Api(a.http_url)
        wait_for(lambda: shovel_state(api, "imported") == "running", 15, "running after boot")
        await publish(a.url, "outq", 50)
        assert len(set(await drain(b.url, "inq", 50))) == 50
    finally:
        a.stop()
        b.stop()
