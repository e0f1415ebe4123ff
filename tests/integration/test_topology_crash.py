"""kill -9 while clients declare durable topology: nothing acknowledged is lost, nothing
is half there (issue 22).

Each round, several clients (one pika connection each, waiting for every -ok) declare
durable queues, bind each to ``amq.topic``, and now and then delete one of their earlier
queues. The broker is killed with SIGKILL at a random moment and restarted on the same
data dir. Then, read back through the management API:

* every queue whose declare-ok arrived is there, unless its delete-ok arrived too;
* every binding whose bind-ok arrived is there (same exception);
* every queue whose delete-ok arrived is gone, and so are its bindings;
* nothing is half there: no queue or binding the clients never asked for; a queue
  whose delete was in flight at the kill is either whole (with its acknowledged
  binding) or gone with it.

Rounds repeat (same data dir, so later rounds recover from earlier recoveries) until
3,000 declares were acknowledged; the last restart is a clean one.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest

from tests.integration._http import Api, q
from tests.support.brokerproc import BrokerProcess

CLIENTS = 4
TARGET_DECLARES = 3000
ROUND_MIN, ROUND_MAX = 200, 600  # acknowledged declares before the kill, per round
MAX_ROUNDS = TARGET_DECLARES // ROUND_MIN


@dataclass
class Client:
    """What one client asked for and what the broker acknowledged."""

    attempted: set[str] = field(default_factory=set)  # declares sent
    declared: set[str] = field(default_factory=set)  # declare-ok received
    bound: set[str] = field(default_factory=set)  # bind-ok received (queue names)
    bind_sent: set[str] = field(default_factory=set)
    delete_sent: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)  # delete-ok received


def _run_client(url: str, prefix: str, c: Client, stop: threading.Event, seed: int) -> None:
    rnd = random.Random(seed)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        i = 0
        while not stop.is_set() and i < 100_000:
            name = f"{prefix}-{i}"
            i += 1
            c.attempted.add(name)
            ch.queue_declare(name, durable=True, arguments={"x-note": name[-3:]})
            c.declared.add(name)
            c.bind_sent.add(name)
            ch.queue_bind(name, "amq.topic", routing_key=f"k.{name}")
            c.bound.add(name)
            if rnd.random() < 0.1:
                victim = rnd.choice(sorted(c.declared - c.delete_sent))
                c.delete_sent.add(victim)
                ch.queue_delete(victim)
                c.deleted.add(victim)
    except Exception:  # the broker was killed under us
        return


def _topology(broker: BrokerProcess) -> tuple[set[str], dict[str, set[str]]]:
    api = Api(broker.http_url)
    queues = api.request("GET", f"/api/queues/{q('/')}?columns=name,durable").json()
    assert all(x["durable"] for x in queues)
    bindings: dict[str, set[str]] = {}
    for b in api.request("GET", f"/api/bindings/{q('/')}").json():
        if b["source"] == "amq.topic":
            bindings.setdefault(b["destination"], set()).add(b["routing_key"])
    return {x["name"] for x in queues}, bindings


def _check(clients: list[Client], queues: set[str], bindings: dict[str, set[str]]) -> None:
    attempted = set().union(*(c.attempted for c in clients))
    for c in clients:
        for name in c.declared - c.deleted:
            if name in c.delete_sent:  # delete in flight at the kill: whole or gone
                if name in queues and name in c.bound:
                    assert bindings.get(name) == {f"k.{name}"}, name
                continue
            assert name in queues, f"acknowledged declare of {name} lost"
        for name in c.bound - c.deleted - c.delete_sent:
            assert bindings.get(name) == {f"k.{name}"}, f"acknowledged bind of {name} lost"
        for name in c.deleted:
            assert name not in queues, f"acknowledged delete of {name} undone"
            assert name not in bindings, f"binding of deleted {name} survived"
    assert queues <= attempted, f"queues nobody declared: {sorted(queues - attempted)[:5]}"
    for name, keys in bindings.items():
        assert name in queues, f"binding to missing queue {name}"
        assert keys == {f"k.{name}"}, (name, keys)
        assert any(name in c.bind_sent for c in clients), f"binding nobody asked for: {name}"


@pytest.mark.timeout(600)
def test_kill9_while_declaring_topology(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    rnd = random.Random()
    clients: list[Client] = []
    total = 0
    try:
        for round_no in range(MAX_ROUNDS):
            stop = threading.Event()
            fresh = [Client() for _ in range(CLIENTS)]
            clients += fresh
            threads = [threading.Thread(
                target=_run_client, args=(broker.url, f"r{round_no}c{n}", c, stop,
                                          rnd.randrange(1 << 30)), daemon=True)
                for n, c in enumerate(fresh)]
            for t in threads:
                t.start()
            # a random moment: once the round's clients together have a random number of
            # declares acknowledged (a count, not a time, so a slow machine only waits
            # longer); the clients are mid-way through their next operations by then
            due = rnd.randrange(ROUND_MIN, ROUND_MAX)
            deadline = time.monotonic() + 300
            while sum(len(c.declared) for c in fresh) < due and \
                    time.monotonic() < deadline:
                time.sleep(0.005)
            assert sum(len(c.declared) for c in fresh) >= due, broker.tail()
            broker.kill()
            stop.set()
            for t in threads:
                t.join(30)
            broker.restart(keep_port=False)
            queues, bindings = _topology(broker)
            _check(clients, queues, bindings)
            total += sum(len(c.declared) for c in fresh)
            if total >= TARGET_DECLARES:
                break
        assert total >= TARGET_DECLARES, f"only {total} declares in {MAX_ROUNDS} rounds"
        broker.stop()
        broker.restart(keep_port=False)
        queues, bindings = _topology(broker)
        _check(clients, queues, bindings)
        assert len(queues) >= TARGET_DECLARES // 2
    finally:
        broker.kill()


def test_old_definitions_file_is_migrated(tmp_path: Path) -> None:
    """A data dir from before issue 22 (definitions.json, no DEFINITION records) starts,
    its topology is moved into the log once, and the file is set aside."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    legacy = {
        "rabbit_version": "3.10.8",
        "users": [{"name": "guest", "password": "guest", "tags": ["administrator"]},
                  {"name": "alice", "password": "secret", "tags": []}],
        "vhosts": [{"name": "/"}, {"name": "tenant"}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "queues": [{"name": "old-q", "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": 5}}],
        "exchanges": [{"name": "old-x", "vhost": "/", "type": "topic", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "old-x", "vhost": "/", "destination": "old-q",
                      "destination_type": "queue", "routing_key": "a.#", "arguments": {}}],
    }
    (data / "definitions.json").write_text(json.dumps(legacy))
    broker = BrokerProcess(data).start()
    try:
        assert not (data / "definitions.json").exists()
        assert (data / "definitions.json.migrated").exists()
        for _ in range(2):  # after the migration, and after a restart from the log alone
            api = Api(broker.http_url)
            assert api.request("GET", f"/api/queues/{q('/')}/old-q").json()["arguments"] == \
                {"x-max-length": 5}
            keys = [b["routing_key"] for b in
                    api.request("GET", f"/api/bindings/{q('/')}").json()
                    if b["source"] == "old-x"]
            assert keys == ["a.#"]
            names = {u["name"] for u in api.request("GET", "/api/users").json()}
            assert "alice" in names
            assert "tenant" in {v["name"] for v in api.request("GET", "/api/vhosts").json()}
            broker.kill()
            broker.restart(keep_port=False)
    finally:
        broker.kill()


def test_acknowledged_http_and_amqp_changes_survive_kill9_and_vhost_delete_is_whole(
        tmp_path: Path) -> None:
    """Users, permissions, policies, vhosts (HTTP) and exchanges, queues, bindings and
    messages (AMQP) acknowledged before a kill -9 are back after it; a deleted vhost takes
    all of its topology with it, so re-creating it finds nothing left over."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        api = Api(broker.http_url)
        assert api.put("/api/vhosts/t").status == 201
        assert api.put("/api/users/bob", {"password": "pw", "tags": ""}).status == 201
        assert api.put("/api/permissions/t/bob",
                       {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
        # guest created the vhost, so (as in RabbitMQ) it already has full permissions
        # there: this is an update (204), recorded like any other change
        assert api.put("/api/permissions/t/guest",
                       {"configure": ".*", "write": ".*", "read": ".*"}).status == 204
        assert api.put("/api/policies/t/lim", {"pattern": "^q", "definition":
                                               {"max-length": 7}}).status == 201
        url = broker.url.rsplit("/", 1)[0] + "/t"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.exchange_declare("x1", "topic", durable=True)
        ch.exchange_declare("x2", "fanout", durable=True)
        ch.exchange_bind("x2", "x1", routing_key="#")
        for i in range(20):
            ch.queue_declare(f"q{i}", durable=True)
            ch.queue_bind(f"q{i}", "x2")
        ch.confirm_delivery()
        ch.basic_publish("x1", "a", b"m", pika.BasicProperties(delivery_mode=2))
        ch.queue_delete("q19")
        broker.kill()
        broker.restart(keep_port=False)

        api = Api(broker.http_url)
        assert {v["name"] for v in api.get("/api/vhosts").json()} >= {"/", "t"}
        assert "bob" in {u["name"] for u in api.get("/api/users").json()}
        assert api.get("/api/permissions/t/bob").json()["configure"] == ".*"
        assert api.get("/api/policies/t/lim").json()["definition"] == {"max-length": 7}
        queues = {x["name"]: x for x in api.get("/api/queues/t").json()}
        assert set(queues) == {f"q{i}" for i in range(19)}
        assert queues["q0"]["messages"] == 1
        bindings = api.get("/api/bindings/t").json()
        assert sum(1 for b in bindings if b["source"] == "x2") == 19
        assert any(b["source"] == "x1" and b["destination"] == "x2" for b in bindings)

        assert api.delete("/api/vhosts/t").status == 204
        broker.kill()
        broker.restart(keep_port=False)
        api = Api(broker.http_url)
        assert "t" not in {v["name"] for v in api.get("/api/vhosts").json()}
        assert api.put("/api/vhosts/t").status == 201
        broker.kill()  # nothing of the old vhost may come back with the new one
        broker.restart(keep_port=False)
        api = Api(broker.http_url)
        assert api.get("/api/queues/t").json() == []
        assert {x["name"] for x in api.get("/api/exchanges/t").json()} == {
            "", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"}
        assert api.get("/api/permissions/t/bob").status == 404
        assert api.get("/api/policies/t/lim").status == 404
    finally:
        broker.kill()
