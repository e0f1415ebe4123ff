"""Definitions: RabbitMQ-format export and import over HTTP, and loading a file at boot."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from pathlib import Path

import pika
import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


def rabbit_hash(password: str, salt: bytes = b"\x90\x1a\x2b\x3c") -> str:
    """rabbit_password_hashing_sha256, computed independently of amqpd's code."""
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def rabbitmq_export(suffix: str) -> dict:
    """The shape `rabbitmqctl export_definitions` writes (RabbitMQ 3.10)."""
    vhost = f"imported-{suffix}"
    return {
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "product_name": "RabbitMQ",
        "product_version": "3.10.8",
        "users": [
            {"name": f"alice-{suffix}", "password_hash": rabbit_hash("alice-pw"),
             "hashing_algorithm": "rabbit_password_hashing_sha256",
             "tags": ["management"], "limits": {}},
            {"name": f"bob-{suffix}", "password_hash": rabbit_hash("bob-pw"),
             "hashing_algorithm": "rabbit_password_hashing_sha256",
             "tags": "monitoring,policymaker", "limits": {}},
        ],
        "vhosts": [{"name": vhost, "limits": [],
                    "metadata": {"description": "from rabbit", "tags": ["x"]}}],
        "permissions": [{"user": f"alice-{suffix}", "vhost": vhost, "configure": ".*",
                         "write": ".*", "read": ".*"}],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [{"name": "internal_cluster_id",
                               "value": "rabbitmq-cluster-id-abc"}],
        "policies": [{"vhost": vhost, "name": "ttl", "pattern": "^orders$",
                      "apply-to": "queues", "definition": {"message-ttl": 60000},
                      "priority": 0}],
        "queues": [{"name": "orders", "vhost": vhost, "durable": True, "auto_delete": False,
                    "arguments": {"x-queue-type": "classic"}}],
        "exchanges": [{"name": "events", "vhost": vhost, "type": "topic", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "events", "vhost": vhost, "destination": "orders",
                      "destination_type": "queue", "routing_key": "order.*",
                      "arguments": {}}],
    }


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http_url)


def test_import_rabbitmq_export_then_use_it(api: Api, broker: BrokerProcess) -> None:
    suffix = uuid.uuid4().hex[:6]
    defs = rabbitmq_export(suffix)
    vhost = defs["vhosts"][0]["name"]
    assert api.post("/api/definitions", defs).status == 204
    assert api.get(f"/api/queues/{vhost}/orders").status == 200
    assert api.get(f"/api/exchanges/{vhost}/events").json()["type"] == "topic"
    assert api.get(f"/api/users/bob-{suffix}").json()["tags"] == ["monitoring", "policymaker"]
    assert api.get(f"/api/policies/{vhost}/ttl").json()["pattern"] == "^orders$"
    assert api.get(f"/api/vhosts/{vhost}").json()["description"] == "from rabbit"
    # the RabbitMQ password hash works for AMQP login and routing follows the bindings
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://alice-{suffix}:alice-pw@127.0.0.1:{broker.port}/{vhost}"))
    ch = conn.channel()
    ch.basic_publish("events", "order.created", b"hello")
    conn.close()
    got = api.post(f"/api/queues/{vhost}/orders/get", {"count": 1,
                                                      "ackmode": "ack_requeue_false"}).json()
    assert got[0]["payload"] == "hello"


def test_export_has_rabbitmq_shape_and_round_trips(api: Api) -> None:
    suffix = uuid.uuid4().hex[:6]
    defs = rabbitmq_export(suffix)
    vhost = defs["vhosts"][0]["name"]
    api.post("/api/definitions", defs)
    exported = api.get("/api/definitions").json()
    for key in ("users", "vhosts", "permissions", "topic_permissions", "parameters",
                "global_parameters", "policies", "queues", "exchanges", "bindings",
                "rabbit_version"):
        assert key in exported, key
    user = next(u for u in exported["users"] if u["name"] == f"alice-{suffix}")
    assert user["password_hash"] == defs["users"][0]["password_hash"]
    assert {"name": "orders", "vhost": vhost, "durable": True, "auto_delete": False,
            "arguments": {"x-queue-type": "classic"}} in exported["queues"]
    assert any(b["source"] == "events" and b["vhost"] == vhost for b in exported["bindings"])
    assert not any(x["name"].startswith("amq.") or x["name"] == ""
                   for x in exported["exchanges"])
    # per-vhost export omits the vhost field, like RabbitMQ's
    per_vhost = api.get(f"/api/definitions/{vhost}").json()
    assert [q["name"] for q in per_vhost["queues"]] == ["orders"]
    assert "vhost" not in per_vhost["queues"][0]
    # importing the export again is a no-op, not an error
    assert api.post("/api/definitions", exported).status == 204


def test_import_into_one_vhost(api: Api) -> None:
    vhost = "target-" + uuid.uuid4().hex[:6]
    api.put(f"/api/vhosts/{vhost}")
    body = {"queues": [{"name": "q-in-vhost", "durable": True, "auto_delete": False,
                        "arguments": {}}]}
    assert api.post(f"/api/definitions/{vhost}", body).status == 204
    assert api.get(f"/api/queues/{vhost}/q-in-vhost").status == 200
    assert api.post("/api/definitions/no-such-vhost", body).status == 404


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "Malformed JSON"),
    (b"[]", "JSON object"),
    (json.dumps({"queues": {"name": "x"}}).encode(), "'queues' must be a list"),
    (json.dumps({"queues": [{"name": "x", "vhost": "no-such-vhost"}]}).encode(),
     "does not exist"),
    (json.dumps({"exchanges": [{"name": "x", "vhost": "/", "type": "nope"}]}).encode(),
     "unknown exchange type"),
    (json.dumps({"users": [{"name": "u", "password_hash": "!!",
                            "hashing_algorithm": "rabbit_password_hashing_sha256"}]}).encode(),
     "base64"),
    (json.dumps({"permissions": [{"user": "nobody", "vhost": "/", "configure": ".*",
                                  "write": ".*", "read": ".*"}]}).encode(), "nobody"),
])
def test_bad_definitions_are_400_and_change_nothing(api: Api, body: bytes, fragment: str) -> None:
    before = api.get("/api/definitions").json()
    r = api.post("/api/definitions", raw=body)
    assert r.status == 400, r.text
    assert r.json()["error"] == "bad_request"
    assert fragment in r.json()["reason"]
    after = api.get("/api/definitions").json()
    assert before["queues"] == after["queues"] and before["users"] == after["users"]


def test_definitions_need_administrator(api: Api) -> None:
    api.put("/api/users/defs-mon", {"password": "pw", "tags": "monitoring"})
    mon = api.as_user("defs-mon", "pw")
    assert mon.get("/api/definitions").status == 401
    assert mon.post("/api/definitions", {}).status == 401


def test_definitions_file_loaded_at_boot(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    defs = rabbitmq_export("boot")
    path = tmp_path / "defs.json"
    path.write_text(json.dumps(defs))
    fresh_broker.env["AMQPD_DEFINITIONS_FILE"] = str(path)
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    assert api.get("/api/queues/imported-boot/orders").status == 200
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://alice-boot:alice-pw@127.0.0.1:{fresh_broker.port}/imported-boot"))
    conn.close()


def test_bad_definitions_file_fails_boot(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    path = tmp_path / "defs.json"
    path.write_text('{"queues": [{"name": "q", "vhost": "missing"}]}')
    fresh_broker.env["AMQPD_DEFINITIONS_FILE"] = str(path)
    with pytest.raises(RuntimeError, match="exited with 1"):
        fresh_broker.start()


def test_api_changes_survive_restart(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    api.put("/api/users/carol", {"password": "pw", "tags": "management"})
    api.put("/api/vhosts/v9", {"description": "nine"})
    api.put("/api/permissions/v9/carol", {"configure": ".*", "write": ".*", "read": ".*"})
    api.put("/api/queues/v9/dq", {"durable": True})
    api.put("/api/policies/v9/p", {"pattern": "^d", "definition": {"max-length": 3}})
    api.put("/api/global-parameters/gp", {"value": 1})
    fresh_broker.stop()
    fresh_broker.start()
    api = Api(fresh_broker.http_url)
    assert api.get("/api/vhosts/v9").json()["description"] == "nine"
    for path in ("/api/users/carol", "/api/permissions/v9/carol", "/api/queues/v9/dq",
                 "/api/policies/v9/p", "/api/global-parameters/gp"):
        assert api.get(path).status == 200, path
