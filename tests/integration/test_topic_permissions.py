"""Topic permissions are enforced as RabbitMQ 3.10 enforces them (broker/topic_auth.py).

The 403 texts and the cases were recorded against RabbitMQ 3.10.8 (a private node from
devtools/rabbitmq.py, topic permissions set through its management API): write on
publish to a topic exchange, read on queue.bind / queue.unbind / exchange.bind with a
topic exchange as source, ``{username}`` and ``{vhost}`` expanded, ``{client_id}`` not
expanded for AMQP 0-9-1 clients even with a ``client_id`` client property, ``""``
allows only the empty key, and no entry for an exchange allows everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


def refused(rk: str, exchange: str = "amq.topic") -> str:
    return (f"ACCESS_REFUSED - access to topic '{rk}' in exchange '{exchange}' in vhost '/' "
            f"refused for user 'guest'")


@pytest.fixture
def api(broker: BrokerProcess) -> Iterator[Api]:
    a = Api(broker.http_url)
    yield a
    a.delete("/api/topic-permissions/%2F/guest")


def attempt(broker: BrokerProcess, action: Callable[[Any], None],
            client_properties: dict[str, Any] | None = None) -> tuple[int, str] | None:
    params = pika.URLParameters(broker.url)
    if client_properties:
        params.client_properties = client_properties
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        try:
            action(ch)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code, exc.reply_text
        return None
    finally:
        if conn.is_open:
            conn.close()


def publish(rk: str, exchange: str = "amq.topic") -> Callable[[Any], None]:
    return lambda ch: ch.basic_publish(exchange, rk, b"x")


def bind(rk: str, exchange: str = "amq.topic") -> Callable[[Any], None]:
    def run(ch: Any) -> None:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, exchange, rk)
    return run


def unbind(rk: str) -> Callable[[Any], None]:
    def run(ch: Any) -> None:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_unbind(q, "amq.topic", rk)
    return run


def exchange_bind(rk: str) -> Callable[[Any], None]:
    def run(ch: Any) -> None:
        ch.exchange_declare("tp.dst", "fanout")
        ch.exchange_bind("tp.dst", "amq.topic", rk)
    return run


def put(api: Api, write: str, read: str, exchange: str = "amq.topic") -> int:
    return api.put("/api/topic-permissions/%2F/guest",
                   {"exchange": exchange, "write": write, "read": read}).status


def test_write_and_read_with_variables(broker: BrokerProcess, api: Api) -> None:
    assert put(api, r"^{username}\.", r"^r\.{vhost}$") == 201
    assert attempt(broker, publish("guest.a")) is None
    assert attempt(broker, publish("other.a")) == (403, refused("other.a"))
    assert attempt(broker, bind("r./")) is None
    assert attempt(broker, bind("nope")) == (403, refused("nope"))
    assert attempt(broker, unbind("nope")) == (403, refused("nope"))
    assert attempt(broker, exchange_bind("nope")) == (403, refused("nope"))
    # other exchange types and exchanges without an entry are not limited
    assert attempt(broker, publish("other.a", "amq.direct")) is None
    assert attempt(broker, bind("nope", "amq.direct")) is None


def test_client_id_is_not_expanded_for_amqp_clients(broker: BrokerProcess, api: Api) -> None:
    assert put(api, "^{client_id}$", ".*") == 201
    props = {"client_id": "abc"}
    assert attempt(broker, publish("abc"), props) == (403, refused("abc"))
    assert attempt(broker, publish("{client_id}"), props) is None


def test_empty_pattern_allows_only_the_empty_key(broker: BrokerProcess, api: Api) -> None:
    assert put(api, "", "") == 201
    assert put(api, "", "") == 204  # replaced, as RabbitMQ answers
    assert attempt(broker, publish("")) is None
    assert attempt(broker, publish("a")) == (403, refused("a"))


def test_api_shapes(broker: BrokerProcess, api: Api) -> None:
    assert api.get("/api/topic-permissions/%2F/guest").status == 404
    put(api, "^w", "^r")
    entry = {"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": "^w",
             "read": "^r"}
    assert api.get("/api/topic-permissions/%2F/guest").json() == [entry]
    assert entry in api.get("/api/topic-permissions").json()
    assert api.get("/api/users/guest/topic-permissions").json() == [entry]
    assert api.get("/api/vhosts/%2F/topic-permissions").json() == [entry]
    assert api.put("/api/topic-permissions/%2F/guest",
                   {"exchange": "amq.topic", "write": "(", "read": ""}).status == 400
    assert api.delete("/api/topic-permissions/%2F/guest").status == 204
    assert api.get("/api/topic-permissions/%2F/guest").status == 404
    assert attempt(broker, publish("anything")) is None


def test_imported_topic_permissions_are_enforced(broker: BrokerProcess, api: Api) -> None:
    """Before issue 18 they were stored (definitions import) and ignored."""
    r = api.post("/api/definitions", {"topic_permissions": [
        {"user": "guest", "vhost": "/", "exchange": "amq.topic", "write": "^ok$",
         "read": ".*"}]})
    assert r.status in (200, 201, 204)
    assert attempt(broker, publish("ok")) is None
    assert attempt(broker, publish("no")) == (403, refused("no"))


def test_http_publish_and_bindings_obey_topic_permissions(broker: BrokerProcess,
                                                          api: Api) -> None:
    """The management API goes through the same check as basic.publish and queue.bind
    (BrokerAPI.check_topic_permission). Answers recorded against RabbitMQ 3.10.8 (a
    private node from devtools/rabbitmq.py, write "^a", read "^a" on amq.topic):

    * POST /api/exchanges/%2F/amq.topic/publish, routing key "b.x": 400
      ``{"error":"bad_request","reason":"403 ACCESS_REFUSED - access to topic 'b.x' in
      exchange 'amq.topic' in vhost '/' refused for user 'guest'"}``; key "a.x": 200
      ``{"routed":false}``;
    * POST /api/bindings/%2F/e/amq.topic/q/Q, key "b.x": 401 ``{"error":
      "not_authorised","reason":"Access refused."}`` (also when Q does not exist); key
      "a.x": 201; DELETE of a binding whose key read no longer allows: 401, the same;
      a binding from amq.default (AMQP's 403): 401, the same.
    """
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare("tp.http", auto_delete=False)
        ch.queue_bind("tp.http", "amq.topic", "#")  # before read "^a" would refuse it
        assert put(api, "^a", "^a") == 201
        path = "/api/exchanges/%2F/amq.topic/publish"
        r = api.post(path, {"routing_key": "b.x", "payload": "x"})
        assert r.status == 400
        assert r.json() == {"error": "bad_request", "reason": "403 " + refused("b.x")}
        assert ch.queue_declare("tp.http", passive=True).method.message_count == 0
        r = api.post(path, {"routing_key": "a.x", "payload": "x"})
        assert (r.status, r.json()) == (200, {"routed": True})
        bindings = "/api/bindings/%2F/e/amq.topic/q/tp.http"
        refusal = {"error": "not_authorised", "reason": "Access refused."}
        r = api.post(bindings, {"routing_key": "b.x"})
        assert (r.status, r.json()) == (401, refusal)
        r = api.post("/api/bindings/%2F/e/amq.topic/q/tp.nosuch", {"routing_key": "b.x"})
        assert (r.status, r.json()) == (401, refusal)
        assert api.post(bindings, {"routing_key": "a.x"}).status == 201
        r = api.post("/api/bindings/%2F/e/amq.default/q/tp.http", {"routing_key": "x"})
        assert (r.status, r.json()) == (401, refusal)  # RabbitMQ: the same for this 403
        keys = sorted(b["routing_key"] for b in api.get(bindings).json())
        assert keys == ["#", "a.x"]
        r = api.delete(bindings + "/%23")  # read "^a" refuses the removal of "#"
        assert (r.status, r.json()) == (401, refusal)
        assert api.delete(bindings + "/a.x").status == 204
        assert put(api, ".*", ".*") == 204
        assert api.delete(bindings + "/%23").status == 204
    finally:
        if conn.is_open:
            conn.channel().queue_delete("tp.http")
            conn.close()
