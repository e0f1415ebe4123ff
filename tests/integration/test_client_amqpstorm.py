"""AMQPStorm's management client (``amqpstorm.management``) against amqpd and RabbitMQ 3.10.

Every test runs twice: against an amqpd process and against a private RabbitMQ 3.10.8
with the management plugin (skipped when rabbitmq-server is not installed). The calls
are the client library's own, so what passes here on RabbitMQ must pass on amqpd: the
3.x node health check, bulk user deletion, answers RabbitMQ leaves empty (bindings,
vhosts, connection close), paginated listings (an empty one included), finding a
connection by its client properties and closing it, and connecting to a vhost created a
moment before. RabbitMQ lists connections and channels only with its next statistics
(every 5 s), so lookups poll with a deadline.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import pytest

amqpstorm = pytest.importorskip("amqpstorm")
pytest.importorskip("requests")  # amqpstorm.management needs it (amqpstorm[management])

from amqpstorm.management import ApiError, ManagementApi  # noqa: E402

from devtools.rabbitmq import RabbitMQNotInstalled, find_server, running_rabbitmq  # noqa: E402
from tests.support.brokerproc import BrokerProcess  # noqa: E402

LISTED_WITHIN = 20.0


@dataclass
class Target:
    name: str
    api: ManagementApi
    host: str
    port: int

    def connect(self, **kw: Any) -> Any:
        return amqpstorm.Connection(self.host, "guest", "guest", port=self.port, timeout=10,
                                    **kw)


@pytest.fixture(scope="module")
def rabbit_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    try:
        find_server()
    except RabbitMQNotInstalled as exc:
        pytest.skip(str(exc))
    with running_rabbitmq(tmp_path_factory.mktemp("rabbitmq"),
                          plugins=("rabbitmq_management",)) as info:
        assert info.http_url is not None
        yield Target("rabbitmq", ManagementApi(info.http_url, "guest", "guest"), "127.0.0.1",
                     info.amqp_port)


@pytest.fixture(params=["amqpd", "rabbitmq"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "rabbitmq":
        return request.getfixturevalue("rabbit_target")  # type: ignore[no-any-return]
    broker: BrokerProcess = request.getfixturevalue("broker")
    u = urlsplit(broker.url)
    return Target("amqpd", ManagementApi(broker.http_url, "guest", "guest"),
                  u.hostname or "127.0.0.1", broker.port)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def poll(what: str, find: Callable[[], Any], within: float = LISTED_WITHIN) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = find()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: nothing within {within:.0f} s"
        time.sleep(0.25)


def test_node_health_checks(target: Target) -> None:
    api = target.api
    assert api.healthchecks.get() == {"status": "ok"}
    node = api.overview()["node"]
    assert api.healthchecks.get(node=node) == {"status": "ok"}
    with pytest.raises(ApiError) as err:
        api.healthchecks.get(node="nosuch@nowhere")
    assert err.value.error_code == 404
    assert api.aliveness_test("/") == {"status": "ok"}
    assert api.whoami()["name"] == "guest"
    assert [n["name"] for n in api.nodes()] == [node]


def test_users_bulk_delete(target: Target) -> None:
    api = target.api
    names = [uid("user"), uid("user")]
    for name in names:
        # cast(object, ...): amqpstorm annotates create/bind/unbind/purge/close as -> None,
        # yet they return the answer's parsed body, which these checks require to be empty
        assert cast(object, api.user.create(name, "pw", tags="management")) is None
    assert {u["name"] for u in api.user.list()} >= set(names)
    assert api.user.delete(names) is None  # POST /api/users/bulk-delete: 204, no body
    for name in names:
        with pytest.raises(ApiError) as err:
            api.user.get(name)
        assert err.value.error_code == 404
    with pytest.raises(ApiError) as err:
        api.user.delete([uid("nouser")])
    assert err.value.error_code == 400


def test_vhost_created_and_connected_to_at_once(target: Target) -> None:
    api = target.api
    vhost = uid("vh")
    assert api.virtual_host.create(vhost) is None
    try:
        assert api.user.get_permission("guest", vhost)["configure"] == ".*"
        # annotated dict[str, Any] in amqpstorm; the answer is the JSON list of permissions
        permissions = cast(list[dict[str, Any]], api.virtual_host.get_permissions(vhost))
        assert [p["user"] for p in permissions] == ["guest"]
        conn = target.connect(virtual_host=vhost)
        try:
            ch = conn.channel()
            ch.queue.declare("in-new-vhost")
            ch.basic.publish(b"hello", "in-new-vhost")
            msg = ch.basic.get("in-new-vhost", no_ack=True)
            assert msg is not None and msg.body == "hello"
        finally:
            conn.close()
        assert api.virtual_host.get(vhost)["name"] == vhost
    finally:
        assert api.virtual_host.delete(vhost) is None


def test_bindings_publish_get_and_empty_answers(target: Target) -> None:
    api = target.api
    x, x2, q = uid("x"), uid("x"), uid("q")
    assert api.exchange.declare(x, "direct") is None
    assert api.exchange.declare(x2, "fanout") is None
    assert api.queue.declare(q) is None
    try:
        assert cast(object, api.queue.bind(q, x, "rk")) is None  # 201, empty body, Location
        assert cast(object, api.exchange.bind(x2, x, "rk2")) is None
        assert [b["routing_key"] for b in api.queue.bindings(q) if b["source"] == x] == ["rk"]
        assert [b["destination"] for b in api.exchange.bindings(x)] == sorted([q, x2])
        assert api.basic.publish("over http", "rk", exchange=x) == {"routed": True}
        # amqpstorm annotates list[Message] | list[dict]; to_dict=True is always the dicts
        got = cast(list[dict[str, Any]], api.basic.get(q, to_dict=True))
        assert [m["payload"] for m in got] == ["over http"]
        assert cast(object, api.queue.unbind(q, x, "rk")) is None
        assert cast(object, api.exchange.unbind(x2, x, "rk2")) is None
        assert api.queue.bindings(q) == [b for b in api.queue.bindings(q) if b["source"] == ""]
        assert cast(object, api.queue.purge(q)) is None
    finally:
        api.queue.delete(q)
        api.exchange.delete(x)
        api.exchange.delete(x2)


def test_paginated_lists(target: Target) -> None:
    api = target.api
    stem = uid("pg")
    names = [f"{stem}-{i}" for i in range(3)]
    for name in names:
        api.queue.declare(name)
    try:
        assert api.queue.list(name=uid("nothing")) == []  # page_count 0
        assert sorted(q["name"] for q in api.queue.list(name=stem, page_size=1)) == names
        assert sorted(q["name"] for q in api.queue.list(show_all=True, name=stem.upper(),
                                                          page_size=2)) == names
        assert "amq.direct" in [x["name"] for x in api.exchange.list(name="amq.")]
    finally:
        for name in names:
            api.queue.delete(name)


def test_connection_found_by_client_properties_and_closed(target: Target) -> None:
    api = target.api
    tag = uid("storm")
    conn = target.connect(client_properties={"connection_name": tag})
    try:
        conn.channel()

        def mine() -> list[dict[str, Any]]:
            return [c for c in api.connection.list()
                    if c.get("client_properties", {}).get("connection_name") == tag]

        (found,) = poll("the connection listed", mine)
        name = found["name"]
        assert api.connection.get(name)["client_properties"]["connection_name"] == tag
        channels = poll("its channel listed", lambda: [
            c for c in api.channel.list()
            if c.get("connection_details", {}).get("name") == name])
        assert [c["number"] for c in channels] == [1]
        assert api.channel.get(channels[0]["name"])["number"] == 1
        assert cast(object, api.connection.close(name, reason="closed by the test")) is None
        poll("the client told", lambda: conn.is_closed, 10)
        with pytest.raises(amqpstorm.AMQPConnectionError, match="CONNECTION_FORCED"):
            conn.check_for_errors()
        # RabbitMQ's management database drops a closed connection's record a moment
        # after the client has been told (CI, loaded: still listed right after), so the
        # 404 is waited for; amqpd answers it at once
        def gone() -> int:
            try:
                api.connection.get(name)
            except ApiError as exc:
                return exc.error_code or -1
            return 0

        assert poll("the connection's record gone", gone) == 404
    finally:
        if not conn.is_closed:
            conn.close()


def test_quorum_queue_through_the_api(target: Target) -> None:
    api = target.api
    q = uid("qq")
    assert api.queue.declare(q, durable=True, arguments={"x-queue-type": "quorum"}) is None
    try:
        info = poll("the quorum queue listed", lambda: [
            x for x in api.queue.list(name=q) if x["name"] == q])[0]
        assert info["type"] == "quorum"
        with pytest.raises(ApiError) as err:
            api.queue.declare(uid("qq"), durable=False, arguments={"x-queue-type": "quorum"})
        assert err.value.error_code == 400
    finally:
        api.queue.delete(q)

