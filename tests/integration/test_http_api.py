"""The management API against a running amqpd: RabbitMQ's paths, JSON shapes and errors."""

from __future__ import annotations

import time
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration._http import Api, q
from tests.support.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http_url)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_user(api: Api, tags: str, vhost: str | None = "/", perms: tuple[str, str, str] = (
        ".*", ".*", ".*")) -> tuple[str, str]:
    name, password = uid("u"), "pw-" + uuid.uuid4().hex[:6]
    assert api.put(f"/api/users/{name}", {"password": password, "tags": tags}).status == 201
    if vhost is not None:
        body = dict(zip(("configure", "write", "read"), perms, strict=True))
        assert api.put(f"/api/permissions/{q(vhost)}/{name}", body).status == 201
    return name, password


# ---------------------------------------------------------------------------- auth
def test_no_credentials_gives_401_with_realm(api: Api) -> None:
    r = api.as_user(None).get("/api/overview")
    assert r.status == 401
    assert r.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    assert r.json()["error"] == "not_authorized"


def test_wrong_password_and_non_management_user(api: Api) -> None:
    assert api.as_user("guest", "nope").get("/api/overview").status == 401
    name, pw = make_user(api, "")
    r = api.as_user(name, pw).get("/api/overview")
    assert r.status == 401
    assert r.json() == {"error": "not_authorised", "reason": "Not management user"}


def test_management_user_cannot_administer(api: Api) -> None:
    name, pw = make_user(api, "management")
    user = api.as_user(name, pw)
    assert user.get("/api/overview").status == 200
    assert user.get("/api/whoami").json() == {"name": name, "tags": ["management"]}
    for path in ("/api/users", "/api/permissions", "/api/definitions", "/api/nodes"):
        assert user.get(path).status == 401, path
    assert user.put("/api/vhosts/" + uid("vh")).status == 401
    assert user.put("/api/policies/%2F/p", {"pattern": ".*", "definition": {"x": 1}}).status \
        == 401


def test_monitoring_user_reads_everything_but_cannot_write(api: Api) -> None:
    vhost = uid("vh")
    assert api.put(f"/api/vhosts/{vhost}").status == 201
    api.put(f"/api/queues/{vhost}/mq", {"durable": False})
    name, pw = make_user(api, "monitoring", vhost=None)
    mon = api.as_user(name, pw)
    assert mon.get("/api/nodes").status == 200
    assert any(x["name"] == "mq" for x in mon.get(f"/api/queues/{vhost}").json())
    assert mon.put(f"/api/queues/{vhost}/other").status == 401


def test_user_without_vhost_access_is_refused(api: Api) -> None:
    vhost = uid("vh")
    api.put(f"/api/vhosts/{vhost}")
    name, pw = make_user(api, "management")
    user = api.as_user(name, pw)
    assert user.get(f"/api/queues/{vhost}").status == 401
    assert vhost not in [v["name"] for v in user.get("/api/vhosts").json()]


def test_permission_regex_refusal_over_http(api: Api) -> None:
    name, pw = make_user(api, "management", perms=("^allowed-", ".*", ".*"))
    user = api.as_user(name, pw)
    assert user.put("/api/queues/%2F/allowed-" + name, {"durable": False}).status == 201
    r = user.put("/api/queues/%2F/denied-" + name, {"durable": False})
    assert r.status == 403
    assert r.json()["error"] == "access_refused"


# ---------------------------------------------------------------------------- overview, nodes
def test_overview_shape(api: Api, broker: BrokerProcess) -> None:
    body = api.get("/api/overview").json()
    for key in ("rabbitmq_version", "cluster_name", "node", "message_stats", "queue_totals",
                "object_totals", "listeners", "exchange_types", "management_version"):
        assert key in body, key
    assert {"connections", "channels", "queues", "exchanges", "consumers"} <= set(
        body["object_totals"])
    assert any(lst["port"] == broker.port and lst["protocol"] == "amqp"
               for lst in body["listeners"])


def test_nodes(api: Api) -> None:
    nodes = api.get("/api/nodes").json()
    assert len(nodes) == 1 and nodes[0]["running"] is True
    assert nodes[0]["mem_used"] > 0
    assert api.get(f"/api/nodes/{q(nodes[0]['name'])}").status == 200
    assert api.get("/api/nodes/rabbit@nowhere").status == 404


# ---------------------------------------------------------------------------- vhosts
def test_vhost_lifecycle(api: Api) -> None:
    vhost = uid("vh/with slash")
    assert api.put(f"/api/vhosts/{q(vhost)}", {"description": "d"}).status == 201
    assert api.put(f"/api/vhosts/{q(vhost)}").status == 204
    got = api.get(f"/api/vhosts/{q(vhost)}").json()
    assert got["name"] == vhost and got["description"] == "d"
    assert api.put(f"/api/queues/{q(vhost)}/q1", {"durable": True}).status == 201
    assert api.delete(f"/api/vhosts/{q(vhost)}").status == 204
    assert api.get(f"/api/vhosts/{q(vhost)}").status == 404
    assert api.delete(f"/api/vhosts/{q(vhost)}").status == 404


def test_unknown_vhost_is_404_everywhere(api: Api) -> None:
    """As RabbitMQ 3.10.8 (private node) answered each of these for vhost 'nope'."""
    plain = {"error": "Object Not Found", "reason": "Not Found"}
    for method, path, body, status, answer in (
            ("GET", "/api/queues/nope", None, 404, plain),
            ("GET", "/api/exchanges/nope", None, 404, plain),
            ("GET", "/api/bindings/nope", None, 404, plain),
            ("GET", "/api/aliveness-test/nope", None, 404, plain),
            ("GET", "/api/policies/nope", None, 404, plain),
            ("GET", "/api/permissions/nope/guest", None, 404, plain),
            ("PUT", "/api/queues/nope/x", {"durable": True}, 404,
             {"error": "not_found", "reason": "vhost_not_found"}),
            ("PUT", "/api/exchanges/nope/x", {"type": "direct"}, 404,
             {"error": "not_found", "reason": "vhost_not_found"}),
            ("PUT", "/api/permissions/nope/guest",
             {"configure": ".*", "write": ".*", "read": ".*"}, 400,
             {"error": "bad_request", "reason": "vhost_or_user_not_found"}),
            ("POST", "/api/exchanges/nope/amq.default/publish",
             {"routing_key": "x", "properties": {}, "payload": "a",
              "payload_encoding": "string"}, 401,
             {"error": "not_authorised", "reason": "Access refused."})):
        r = api.request(method, path, body)
        assert (r.status, r.json()) == (status, answer), (method, path)


# ---------------------------------------------------------------------------- users, permissions
def test_user_lifecycle_and_amqp_login(api: Api, broker: BrokerProcess) -> None:
    name = uid("user")
    assert api.put(f"/api/users/{name}", {"password": "s3cret", "tags": "management"}).status \
        == 201
    got = api.get(f"/api/users/{name}").json()
    assert got["tags"] == ["management"]
    assert got["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert api.put(f"/api/users/{name}", {"tags": ["monitoring"]}).status == 204
    assert api.get(f"/api/users/{name}").json()["tags"] == ["monitoring"]
    api.put(f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://{name}:s3cret@127.0.0.1:{broker.port}/%2F"))
    conn.close()
    assert api.delete(f"/api/users/{name}").status == 204
    assert api.get(f"/api/users/{name}").status == 404
    assert api.delete(f"/api/users/{name}").status == 404


def test_user_bad_input(api: Api) -> None:
    assert api.put("/api/users/" + uid("u"), {"tags": ""}).status == 400
    assert api.put("/api/users/" + uid("u"), raw=b"{not json").status == 400
    assert api.put("/api/users/" + uid("u"), {"password": "x",
                                              "hashing_algorithm": "rot13"}).status == 400
    assert api.put("/api/users/" + uid("u"), {"password": 5}).status == 400


def test_permissions(api: Api) -> None:
    name, _ = make_user(api, "management", vhost=None)
    body = {"configure": "^a", "write": "^b", "read": "^c"}
    assert api.put(f"/api/permissions/%2F/{name}", body).status == 201
    got = api.get(f"/api/permissions/%2F/{name}").json()
    assert got == {"user": name, "vhost": "/", **body}
    assert any(p["user"] == name for p in api.get("/api/permissions").json())
    assert any(p["user"] == name for p in api.get("/api/vhosts/%2F/permissions").json())
    assert api.put(f"/api/permissions/%2F/{name}", {**body, "read": "("}).status == 400
    # RabbitMQ 3.10.8 (private node): setting for an unknown user or vhost is 400
    # {"error":"bad_request","reason":"vhost_or_user_not_found"}, plain and topic
    # permissions alike; reading or deleting them is 404
    unknown = {"error": "bad_request", "reason": "vhost_or_user_not_found"}
    topic = {"exchange": "amq.topic", "write": ".*", "read": ".*"}
    for path in ("%2F/nobody-here", f"no-such-vhost/{name}"):
        r = api.put(f"/api/permissions/{path}", body)
        assert (r.status, r.json()) == (400, unknown)
        r = api.put(f"/api/topic-permissions/{path}", topic)
        assert (r.status, r.json()) == (400, unknown)
        for kind in ("permissions", "topic-permissions"):
            assert api.get(f"/api/{kind}/{path}").status == 404
            assert api.delete(f"/api/{kind}/{path}").status == 404
    assert api.delete(f"/api/permissions/%2F/{name}").status == 204
    assert api.get(f"/api/permissions/%2F/{name}").status == 404


def test_amqp_permission_refused_with_403(api: Api, broker: BrokerProcess) -> None:
    name, pw = make_user(api, "management", perms=("^$", ".*", ".*"))
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://{name}:{pw}@127.0.0.1:{broker.port}/%2F"))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(uid("refused"))
    assert err.value.reply_code == 403
    conn.close()


def test_failed_login_closes_with_403(broker: BrokerProcess) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as err:
        pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:wrong@127.0.0.1:{broker.port}/%2F"))
    # pika advertises authentication_failure_close, so it gets connection.close 403
    assert "403" in str(err.value) and "ACCESS_REFUSED" in str(err.value)


# ---------------------------------------------------------------------------- queues
def test_queue_lifecycle_and_counts(api: Api, broker: BrokerProcess) -> None:
    name = uid("q")
    assert api.put(f"/api/queues/%2F/{name}", {"durable": "true", "auto_delete": "false",
                                              "arguments": {}}).status == 201
    assert api.put(f"/api/queues/%2F/{name}", {"durable": True}).status == 204
    for i in range(3):
        r = api.post("/api/exchanges/%2F/amq.default/publish",
                     {"routing_key": name, "payload": f"m{i}", "payload_encoding": "string",
                      "properties": {"delivery_mode": 2, "headers": {"h": 1}}})
        assert r.json() == {"routed": True}
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    method, _, body = ch.basic_get(name)
    assert body == b"m0"
    info = api.get(f"/api/queues/%2F/{name}").json()
    assert (info["messages"], info["messages_ready"], info["messages_unacknowledged"]) == (3, 2, 1)
    assert info["consumers"] == 0
    assert "publish" in info["message_stats"]
    assert "rate" in info["message_stats"]["publish_details"]
    ch.basic_ack(method.delivery_tag)
    conn.close()
    listed = api.get("/api/queues/%2F?columns=name,messages").json()
    assert {"name": name, "messages": 2} in listed
    assert api.delete(f"/api/queues/%2F/{name}?if-empty=true").status == 400
    assert api.delete(f"/api/queues/%2F/{name}/contents").status == 204
    assert api.get(f"/api/queues/%2F/{name}").json()["messages"] == 0
    assert api.delete(f"/api/queues/%2F/{name}").status == 204
    assert api.get(f"/api/queues/%2F/{name}").status == 404


def test_queue_bad_input(api: Api) -> None:
    name = uid("q")
    assert api.put(f"/api/queues/%2F/{name}", raw=b"[1,").status == 400
    assert api.put(f"/api/queues/%2F/{name}", {"durable": "maybe"}).status == 400
    assert api.put(f"/api/queues/%2F/{name}", {"arguments": {"x-max-length": -1}}).status == 400
    api.put(f"/api/queues/%2F/{name}", {"durable": True})
    r = api.put(f"/api/queues/%2F/{name}", {"durable": False})
    assert r.status == 400 and "inequivalent arg 'durable'" in r.json()["reason"]
    assert api.put("/api/queues/%2F/amq.reserved", {}).status == 403
    assert api.post(f"/api/queues/%2F/{name}/get", {"count": 1, "ackmode": "bogus"}).status == 400
    assert api.post(f"/api/queues/%2F/{name}/get", {"count": "x"}).status == 400
    assert api.request("PATCH", f"/api/queues/%2F/{name}").status == 405


def test_get_messages_ackmodes(api: Api) -> None:
    name = uid("q")
    api.put(f"/api/queues/%2F/{name}", {"durable": False})
    api.post("/api/exchanges/%2F/amq.default/publish",
             {"routing_key": name, "payload": "/wD+", "payload_encoding": "base64",
              "properties": {"content_type": "application/octet-stream"}})
    got = api.post(f"/api/queues/%2F/{name}/get",
                   {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"}).json()
    assert len(got) == 1
    assert got[0]["payload_encoding"] == "base64" and got[0]["payload"] == "/wD+"
    assert got[0]["properties"]["content_type"] == "application/octet-stream"
    again = api.post(f"/api/queues/%2F/{name}/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                    "encoding": "base64"}).json()
    assert again[0]["redelivered"] is True
    assert api.get(f"/api/queues/%2F/{name}").json()["messages"] == 0
    assert api.post(f"/api/queues/%2F/{name}/get", {"count": 1}).json() == []


def test_publish_bad_input(api: Api) -> None:
    path = "/api/exchanges/%2F/amq.default/publish"
    assert api.post(path, {"payload": "x"}).status == 400  # no routing_key
    assert api.post(path, {"routing_key": "k", "payload": "%%",
                           "payload_encoding": "base64"}).status == 400
    assert api.post(path, {"routing_key": "k", "payload": "x",
                           "properties": {"delivery_mode": "two"}}).status == 400
    assert api.post(path, raw=b"not json").status == 400
    assert api.post("/api/exchanges/%2F/no-such-exchange/publish",
                    {"routing_key": "k", "payload": "x"}).status == 404
    assert api.post(path, {"routing_key": "nowhere-" + uid("k"), "payload": "x"}).json() == {
        "routed": False}


# ---------------------------------------------------------------------------- exchanges, bindings
def test_exchange_lifecycle(api: Api) -> None:
    name = uid("x")
    assert api.put(f"/api/exchanges/%2F/{name}", {"type": "topic", "durable": True}).status == 201
    got = api.get(f"/api/exchanges/%2F/{name}").json()
    assert (got["name"], got["type"], got["durable"]) == (name, "topic", True)
    assert api.get("/api/exchanges/%2F/amq.default").json()["name"] == ""
    assert any(x["name"] == name for x in api.get("/api/exchanges/%2F").json())
    assert api.put(f"/api/exchanges/%2F/{name}", {"type": "fanout"}).status == 400
    assert api.put(f"/api/exchanges/%2F/{uid('x')}", {"type": "no-such-type"}).status == 400
    assert api.put(f"/api/exchanges/%2F/{uid('x')}", {}).status == 400
    assert api.delete("/api/exchanges/%2F/amq.direct").status == 403
    assert api.delete(f"/api/exchanges/%2F/{name}").status == 204
    assert api.get(f"/api/exchanges/%2F/{name}").status == 404


def test_bindings(api: Api) -> None:
    x, queue = uid("x"), uid("q")
    api.put(f"/api/exchanges/%2F/{x}", {"type": "direct"})
    api.put(f"/api/queues/%2F/{queue}", {"durable": False})
    r = api.post(f"/api/bindings/%2F/e/{x}/q/{queue}", {"routing_key": "rk",
                                                       "arguments": {"a": 1}})
    assert r.status == 201 and r.text == ""  # RabbitMQ: no body, a relative Location
    assert r.headers["Location"].startswith(f"{queue}/rk~")
    location = f"/api/bindings/%2F/e/{x}/q/{r.headers['Location']}"
    listed = api.get(f"/api/bindings/%2F/e/{x}/q/{queue}").json()
    assert len(listed) == 1 and listed[0]["routing_key"] == "rk"
    assert api.get(location).json()["arguments"] == {"a": 1}
    assert any(b["source"] == x for b in api.get(f"/api/queues/%2F/{queue}/bindings").json())
    assert len(api.get(f"/api/exchanges/%2F/{x}/bindings/source").json()) == 1
    r = api.post("/api/exchanges/%2F/" + x + "/publish", {"routing_key": "rk", "payload": "p"})
    assert r.json()["routed"] is True
    assert api.post(f"/api/bindings/%2F/e/{x}/q/missing", {}).status == 404
    assert api.post(f"/api/bindings/%2F/e/{x}/z/{queue}", {}).status == 404
    assert api.delete(location).status == 204
    assert api.get(location).status == 404


# ---------------------------------------------------------------------------- connections etc
def test_connections_channels_consumers_and_close(api: Api, broker: BrokerProcess) -> None:
    queue = uid("q")
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": "http-test"}
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.basic_consume(queue, lambda *a: None, consumer_tag="ctag-" + queue)
    conns = [c for c in api.get("/api/connections").json()
             if c["client_properties"].get("connection_name") == "http-test"]
    assert len(conns) == 1
    c = conns[0]
    assert c["user"] == "guest" and c["vhost"] == "/" and c["channels"] == 1
    assert api.get(f"/api/connections/{q(c['name'])}").json()["name"] == c["name"]
    chans = api.get(f"/api/connections/{q(c['name'])}/channels").json()
    assert chans[0]["consumer_count"] == 1
    assert any(x["name"] == chans[0]["name"] for x in api.get("/api/channels").json())
    assert api.get(f"/api/channels/{q(chans[0]['name'])}").status == 200
    consumers = api.get("/api/consumers/%2F").json()
    assert any(x["consumer_tag"] == "ctag-" + queue and x["queue"]["name"] == queue
               for x in consumers)
    assert api.get(f"/api/queues/%2F/{queue}").json()["consumers"] == 1
    r = api.delete(f"/api/connections/{q(c['name'])}", headers={"X-Reason": "bye"})
    assert r.status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.process_data_events(0.1)
    assert err.value.reply_code == 320
    assert api.get(f"/api/connections/{q(c['name'])}").status == 404
    assert api.delete("/api/connections/no-such-connection").status == 404


def test_management_user_sees_only_own_connections(api: Api, broker: BrokerProcess) -> None:
    name, pw = make_user(api, "management")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))  # guest's
    try:
        assert api.as_user(name, pw).get("/api/connections").json() == []
        assert api.get("/api/connections").json() != []
    finally:
        conn.close()


# ---------------------------------------------------------------------------- policies, params
def test_policies(api: Api) -> None:
    name = uid("pol")
    body = {"pattern": "^ttl\\.", "definition": {"message-ttl": 1000}, "priority": 1,
            "apply-to": "queues"}
    assert api.put(f"/api/policies/%2F/{name}", body).status == 201
    got = api.get(f"/api/policies/%2F/{name}").json()
    assert got["definition"] == {"message-ttl": 1000} and got["apply-to"] == "queues"
    assert any(p["name"] == name for p in api.get("/api/policies").json())
    assert api.put(f"/api/policies/%2F/{name}", {**body, "priority": 2}).status == 204
    api.put("/api/queues/%2F/ttl." + name, {"durable": False})
    queue = api.get("/api/queues/%2F/ttl." + name).json()
    assert queue["policy"] == name
    assert queue["effective_policy_definition"] == {"message-ttl": 1000}
    assert api.put(f"/api/policies/%2F/{uid('p')}", {"pattern": "(", "definition": {}}).status \
        == 400
    assert api.put(f"/api/policies/%2F/{uid('p')}", {"pattern": ".*",
                                                    "apply-to": "everything",
                                                    "definition": {"x": 1}}).status == 400
    assert api.delete(f"/api/policies/%2F/{name}").status == 204
    assert api.get(f"/api/policies/%2F/{name}").status == 404
    assert api.delete(f"/api/policies/%2F/{name}").status == 404


def test_parameters(api: Api) -> None:
    r = api.put("/api/parameters/no-such-component/%2F/p", {"value": {"a": 1}})
    assert r.status == 400 and "component" in r.json()["reason"]
    assert api.put("/api/parameters/shovel/nope/p", {"value": {}}).status == 404
    assert api.get("/api/parameters/shovel/%2F/missing").status == 404
    assert api.get("/api/parameters").json() == []
    name = uid("g")
    assert api.put(f"/api/global-parameters/{name}", {"value": {"k": [1, 2]}}).status == 201
    assert api.get(f"/api/global-parameters/{name}").json()["value"] == {"k": [1, 2]}
    assert api.put(f"/api/global-parameters/{name}", {"nothing": 1}).status == 400
    assert api.delete(f"/api/global-parameters/{name}").status == 204
    assert api.delete(f"/api/global-parameters/{name}").status == 404


# ---------------------------------------------------------------------------- robustness
def test_garbage_never_gives_500(api: Api) -> None:
    paths = ["/api/queues/%2F/g", "/api/exchanges/%2F/g", "/api/users/g", "/api/vhosts/g",
             "/api/policies/%2F/g", "/api/permissions/%2F/guest", "/api/definitions",
             "/api/bindings/%2F/e/amq.direct/q/g", "/api/queues/%2F/g/get",
             "/api/exchanges/%2F/amq.default/publish", "/api/parameters/x/%2F/g",
             "/api/global-parameters/g"]
    bodies = [b"", b"null", b"[]", b"\"str\"", b"{\"arguments\": 5}", b"\xff\xfe",
              b"{\"type\": 7, \"tags\": 3, \"password_hash\": \"!!\", \"value\": null}"]
    for path in paths:
        for raw in bodies:
            for method in ("PUT", "POST"):
                r = api.request(method, path, raw=raw)
                assert r.status < 500, (method, path, raw, r.status, r.text)
                if r.status >= 400:
                    assert "error" in r.json()
    assert api.get("/api/no/such/path").status == 404
    assert api.get("/api/queues/%2F?sort=name&page=zero").status == 400
