"""amqpctl against a running amqpd: every command, tables, --json, and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pytest

from tests.integration._http import Api
from tests.support.brokerproc import BrokerProcess


@pytest.fixture(scope="module")
def ctl(broker: BrokerProcess):  # type: ignore[no-untyped-def]
    def run(*args: str, user: str = "guest", password: str = "guest",
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "amqpd.ctl", "--url", broker.http_url, "-u", user,
               "--password", password, *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, input=stdin,
                              check=False)
    return run


@pytest.fixture(scope="module")
def api(broker: BrokerProcess) -> Api:
    return Api(broker.http_url)


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_status(ctl) -> None:  # type: ignore[no-untyped-def]
    r = ctl("status")
    assert r.returncode == 0, r.stderr
    assert "node: " in r.stdout and "listeners: amqp:" in r.stdout
    data = json.loads(ctl("status", "--json").stdout)
    assert data["queues"] >= 0 and "memory_used" in data


def test_list_queues_columns_table_and_json(ctl, api: Api) -> None:  # type: ignore[no-untyped-def]
    name = uid("q")
    api.put(f"/api/queues/%2F/{name}", {"durable": False})
    api.post("/api/exchanges/%2F/amq.default/publish", {"routing_key": name, "payload": "x"})
    r = ctl("list_queues", "name", "messages", "consumers")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["name", "messages", "consumers"]
    assert [name, "1", "0"] in [line.split() for line in lines[1:]]
    rows = json.loads(ctl("list_queues", "--json", "name", "messages").stdout)
    assert {"name": name, "messages": 1} in rows
    r = ctl("list_queues", "-s", "name")
    assert "name" not in r.stdout.split()
    assert ctl("list_queues", "no_such_column").returncode == 64


def test_list_other_objects(ctl, api: Api, broker: BrokerProcess) -> None:  # type: ignore[no-untyped-def]
    x, queue = uid("x"), uid("q")
    api.put(f"/api/exchanges/%2F/{x}", {"type": "fanout"})
    api.put(f"/api/queues/%2F/{queue}", {"durable": False})
    api.post(f"/api/bindings/%2F/e/{x}/q/{queue}", {"routing_key": "k"})
    assert [x, "fanout"] in [line.split() for line in ctl("list_exchanges").stdout.splitlines()]
    bindings = json.loads(ctl("list_bindings", "--json").stdout)
    assert {"source_name": x, "source_kind": "exchange", "destination_name": queue,
            "destination_kind": "queue", "routing_key": "k", "arguments": {}} in bindings
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.basic_consume(queue, lambda *a: None, consumer_tag="ctl-" + queue)
    try:
        conns = json.loads(ctl("list_connections", "--json", "name", "user").stdout)
        assert any(c["user"] == "guest" for c in conns)
        chans = json.loads(ctl("list_channels", "--json").stdout)
        assert any(c["consumer_count"] == 1 for c in chans)
        consumers = json.loads(ctl("list_consumers", "--json", "queue_name",
                                   "consumer_tag").stdout)
        assert {"queue_name": queue, "consumer_tag": "ctl-" + queue} in consumers
    finally:
        conn.close()
    assert ctl("list_users").returncode == 0
    assert ctl("list_vhosts").returncode == 0
    assert ctl("list_permissions").returncode == 0


def test_users_vhosts_permissions(ctl, api: Api, broker: BrokerProcess) -> None:  # type: ignore[no-untyped-def]
    user, vhost = uid("user"), uid("vh")
    assert ctl("add_user", user, "pw1").returncode == 0
    assert ctl("add_user", user, "pw1").returncode == 65  # exists
    assert ctl("set_user_tags", user, "management", "policymaker").returncode == 0
    assert api.get(f"/api/users/{user}").json()["tags"] == ["management", "policymaker"]
    assert ctl("add_vhost", vhost).returncode == 0
    assert ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*").returncode == 0
    r = ctl("set_permissions", "-p", "no-such-vhost", user, ".*", ".*", ".*")
    assert (r.returncode, r.stderr.strip()) == (
        1, "Error: Virtual host no-such-vhost does not exist")
    r = ctl("set_permissions", "-p", vhost, "no-such-user", ".*", ".*", ".*")
    assert (r.returncode, r.stderr.strip()) == (1, "Error: User no-such-user does not exist")
    assert ctl("set_permissions", "-p", vhost, user, "(", ".*", ".*").returncode == 65
    perms = json.loads(ctl("list_permissions", "-p", vhost, "--json").stdout)
    # the vhost was created over the API by guest, who got full permissions in it
    assert sorted(perms, key=lambda p: p["user"] != user) == [
        {"user": user, "configure": ".*", "write": ".*", "read": ".*"},
        {"user": "guest", "configure": ".*", "write": ".*", "read": ".*"}]
    assert ctl("change_password", user, "pw2").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://{user}:pw2@127.0.0.1:{broker.port}/{vhost}"))
    conn.close()
    # the user's tags survive a password change
    assert api.get(f"/api/users/{user}").json()["tags"] == ["management", "policymaker"]
    # a management user may not administer: exit 77
    r = ctl("add_vhost", uid("vh"), user=user, password="pw2")
    assert r.returncode == 77, r.stderr
    assert ctl("status", user="guest", password="wrong").returncode == 77
    assert ctl("clear_permissions", "-p", vhost, user).returncode == 0
    assert ctl("delete_vhost", vhost).returncode == 0
    assert ctl("delete_vhost", vhost).returncode == 1
    assert ctl("delete_user", user).returncode == 0
    assert ctl("delete_user", user).returncode == 1


def test_policies_and_parameters(ctl, api: Api) -> None:  # type: ignore[no-untyped-def]
    name = uid("pol")
    r = ctl("set_policy", name, "^x", '{"max-length": 10}', "--priority", "3",
            "--apply-to", "queues")
    assert r.returncode == 0, r.stderr
    got = api.get(f"/api/policies/%2F/{name}").json()
    assert got["priority"] == 3 and got["definition"] == {"max-length": 10}
    assert ctl("set_policy", uid("p"), "^x", "{not json").returncode == 65
    assert any(p["name"] == name for p in json.loads(ctl("list_policies", "--json").stdout))
    assert ctl("clear_policy", name).returncode == 0
    assert ctl("clear_policy", name).returncode == 1
    assert ctl("set_parameter", "no-such-component", "p", '{"a": 1}').returncode == 65
    assert ctl("set_parameter", "shovel", "p", "{bad").returncode == 65
    assert ctl("clear_parameter", "shovel", "missing").returncode == 1


def test_definitions_round_trip(ctl, api: Api, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name = uid("q")
    api.put(f"/api/queues/%2F/{name}", {"durable": True})
    path = tmp_path / "defs.json"
    assert ctl("export_definitions", str(path)).returncode == 0
    defs = json.loads(path.read_text())
    assert any(q["name"] == name for q in defs["queues"])
    api.delete(f"/api/queues/%2F/{name}")
    assert ctl("import_definitions", str(path)).returncode == 0
    assert api.get(f"/api/queues/%2F/{name}").status == 200
    stdout = ctl("export_definitions", "-").stdout
    assert json.loads(stdout)["queues"]
    assert ctl("import_definitions", "-", stdin="{broken").returncode == 65
    assert ctl("import_definitions", str(tmp_path / "missing.json")).returncode == 66
    bad = tmp_path / "bad.json"
    bad.write_text('{"queues": [{"name": "q", "vhost": "nope"}]}')
    r = ctl("import_definitions", str(bad), "--json")
    assert r.returncode == 65
    assert json.loads(r.stdout)["result"] == "error"


def test_purge_delete_queue_and_close_connection(ctl, api: Api,  # type: ignore[no-untyped-def]
                                                 broker: BrokerProcess) -> None:
    name = uid("q")
    api.put(f"/api/queues/%2F/{name}", {"durable": False})
    api.post("/api/exchanges/%2F/amq.default/publish", {"routing_key": name, "payload": "x"})
    assert ctl("delete_queue", name, "--if-empty").returncode == 65
    assert ctl("purge_queue", name).returncode == 0
    assert api.get(f"/api/queues/%2F/{name}").json()["messages"] == 0
    assert ctl("delete_queue", name).returncode == 0
    missing = ctl("delete_queue", name)
    assert missing.returncode == 1
    assert missing.stderr == f"Error: queue '{name}' in vhost '/' not found\n"
    missing = ctl("purge_queue", "-p", "no-such-vhost", name)
    assert missing.returncode == 1
    assert missing.stderr == f"Error: queue '{name}' in vhost 'no-such-vhost' not found\n"
    assert ctl("purge_queue", name).returncode == 1
    params = pika.URLParameters(broker.url)
    params.client_properties = {"connection_name": "ctl-close"}
    conn = pika.BlockingConnection(params)
    cname = next(c["name"] for c in api.get("/api/connections").json()
                 if c["client_properties"].get("connection_name") == "ctl-close")
    assert ctl("close_connection", cname, "maintenance").returncode == 0
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        for _ in range(50):
            conn.process_data_events(0.1)
    assert ctl("close_connection", cname).returncode == 1


def test_usage_and_unavailable_exit_codes(ctl) -> None:  # type: ignore[no-untyped-def]
    assert ctl("no_such_command").returncode == 64
    assert ctl("add_user").returncode == 64
    r = subprocess.run([sys.executable, "-m", "amqpd.ctl", "--url", "http://127.0.0.1:9",
                        "status"], capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 69 and "cannot connect" in r.stderr
