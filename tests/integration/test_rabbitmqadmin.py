"""RabbitMQ's own rabbitmqadmin (3.10.8, from Debian's rabbitmq-server) pointed at amqpd."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


def find_rabbitmqadmin() -> str | None:
    found = shutil.which("rabbitmqadmin")
    if found:
        return found
    candidates = glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/"
                           "rabbitmq_management-*/priv/www/cli/rabbitmqadmin")
    return sorted(candidates)[-1] if candidates else None


ADMIN = find_rabbitmqadmin()
pytestmark = pytest.mark.skipif(ADMIN is None, reason="rabbitmqadmin not installed "
                                "(Debian package rabbitmq-server)")


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess):  # type: ignore[no-untyped-def]
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert ADMIN is not None
        cmd = [sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port),
               "-u", "guest", "-p", "guest", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r
    return run


def test_declare_publish_get_list_delete(admin, broker: BrokerProcess) -> None:  # type: ignore[no-untyped-def]
    api = Api(broker.http_url)
    admin("declare", "exchange", "name=admin-x", "type=topic")
    admin("declare", "queue", "name=admin-q", "durable=true")
    admin("declare", "binding", "source=admin-x", "destination=admin-q", "routing_key=a.*")
    out = admin("publish", "exchange=admin-x", "routing_key=a.b", "payload=hello admin").stdout
    assert out.strip() == "Message published"
    queues = json.loads(admin("-f", "raw_json", "list", "queues").stdout)
    assert next(q for q in queues if q["name"] == "admin-q")["messages"] == 1
    assert "admin-q" in admin("list", "queues").stdout
    assert "admin-x" in admin("list", "exchanges").stdout
    assert "a.*" in admin("list", "bindings").stdout
    for kind in ("connections", "channels", "consumers", "users", "vhosts", "nodes",
                 "permissions", "policies", "parameters"):
        admin("list", kind)
    assert "3.10.8" in admin("show", "overview").stdout
    got = json.loads(admin("-f", "raw_json", "get", "queue=admin-q",
                           "ackmode=ack_requeue_false").stdout)
    assert got[0]["payload"] == "hello admin" and got[0]["routing_key"] == "a.b"
    assert api.get("/api/queues/%2F/admin-q").json()["messages"] == 0
    admin("purge", "queue", "name=admin-q")
    admin("delete", "binding", "source=admin-x", "destination=admin-q",
          "destination_type=queue", "properties_key=a.*")
    admin("delete", "queue", "name=admin-q")
    admin("delete", "exchange", "name=admin-x")
    assert api.get("/api/queues/%2F/admin-q").status == 404
    assert api.get("/api/exchanges/%2F/admin-x").status == 404


def test_users_vhosts_policies_and_definitions(admin, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    admin("declare", "vhost", "name=admin-vh")
    admin("declare", "user", "name=admin-bob", "password=x", "tags=management")
    admin("declare", "permission", "vhost=admin-vh", "user=admin-bob", "configure=.*",
          "write=.*", "read=.*")
    admin("declare", "policy", "name=admin-p", "pattern=^a", 'definition={"max-length":5}')
    assert "admin-p" in admin("list", "policies").stdout
    path = tmp_path / "defs.json"
    admin("export", str(path))
    defs = json.loads(path.read_text())
    assert any(u["name"] == "admin-bob" for u in defs["users"])
    admin("import", str(path))
    admin("delete", "policy", "name=admin-p")
    admin("delete", "user", "name=admin-bob")
    admin("delete", "vhost", "name=admin-vh")
    r = admin("delete", "queue", "name=never-declared-anywhere", "--vhost=no-such-vhost",
              check=False)
    assert r.returncode != 0 and "Not found" in r.stdout + r.stderr


# what RabbitMQ 3.10.8 answered for these routing keys (the private node of
# devtools/rabbitmq.py, GET /api/bindings/%2F/e/amq.topic/q/<queue>, issue 33)
RABBITMQ_PROPERTIES_KEYS = {"a.#": "a.%23", "x y/z*~+\u00e9%": "x+y%2Fz%2A%7E%2B%C3%A9%25",
                            "": "~", "plain-key_1.2": "plain-key_1.2"}


def test_properties_key_is_percent_encoded_as_rabbitmq(admin, broker: BrokerProcess) -> None:  # type: ignore[no-untyped-def]
    api = Api(broker.http_url)
    admin("declare", "queue", "name=pk-q")
    try:
        for key, expected in RABBITMQ_PROPERTIES_KEYS.items():
            r = api.post("/api/bindings/%2F/e/amq.topic/q/pk-q", {"routing_key": key})
            assert r.status == 201
            # the Location names the binding by its properties key, quoted once more
            assert r.headers["Location"] == "pk-q/" + urllib.parse.quote(expected, safe="")
        listed = api.get("/api/bindings/%2F/e/amq.topic/q/pk-q").json()
        assert {b["routing_key"]: b["properties_key"] for b in listed} == \
            RABBITMQ_PROPERTIES_KEYS
        # rabbitmqadmin deletes by the properties key RabbitMQ would give
        admin("delete", "binding", "source=amq.topic", "destination=pk-q",
              "destination_type=queue", "properties_key=a.%23")
        left = {b["routing_key"] for b in api.get("/api/bindings/%2F/e/amq.topic/q/pk-q").json()}
        assert left == set(RABBITMQ_PROPERTIES_KEYS) - {"a.#"}
        # a key that names no binding is a 404, and so rabbitmqadmin fails
        r = admin("delete", "binding", "source=amq.topic", "destination=pk-q",
                  "destination_type=queue", "properties_key=a.%23", check=False)
        assert r.returncode != 0 and "Not found" in r.stdout + r.stderr
        # the form earlier amqpd versions used (the key as it is) still names it
        quoted = urllib.parse.quote("x y/z*~+\u00e9%", safe="")
        assert api.request("DELETE", f"/api/bindings/%2F/e/amq.topic/q/pk-q/{quoted}"
                           ).status == 204
        left = {b["routing_key"] for b in api.get("/api/bindings/%2F/e/amq.topic/q/pk-q").json()}
        assert left == {"", "plain-key_1.2"}
    finally:
        admin("delete", "queue", "name=pk-q")
