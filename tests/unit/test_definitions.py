"""Definitions import/export on an in-process Broker (no listeners)."""

from __future__ import annotations

from typing import Any

import pytest

from amqpd.broker.definitions import DefinitionsError, export_definitions, import_definitions
from amqpd.broker.parameters import ParameterStore, UnknownComponent
from amqpd.config import Settings
from amqpd.server import Broker


@pytest.fixture
def broker(tmp_path: Any) -> Broker:
    return Broker(Settings(data_dir=str(tmp_path), persistence=False))


def test_round_trip(broker: Broker) -> None:
    defs = {
        "users": [{"name": "a", "password": "pw", "tags": "management,monitoring"}],
        "vhosts": [{"name": "v"}],
        "permissions": [{"user": "a", "vhost": "v", "configure": ".*", "write": "", "read": "x"}],
        "queues": [{"name": "q", "vhost": "v", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": 5}}],
        "exchanges": [{"name": "e", "vhost": "v", "type": "fanout", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "e", "vhost": "v", "destination": "q",
                      "destination_type": "queue", "routing_key": "", "arguments": {}}],
    }
    import_definitions(broker, defs)
    out = export_definitions(broker)
    assert {"name": "q", "vhost": "v", "durable": True, "auto_delete": False,
            "arguments": {"x-max-length": 5}} in out["queues"]
    assert [b["source"] for b in out["bindings"] if b["vhost"] == "v"] == ["e"]
    user = next(u for u in out["users"] if u["name"] == "a")
    assert user["tags"] == ["management", "monitoring"] and user["password_hash"]
    assert {"user": "a", "vhost": "v", "configure": ".*", "write": "", "read": "x"} in \
        out["permissions"]
    fresh = Broker(Settings(data_dir=broker.settings.data_dir, persistence=False))
    import_definitions(fresh, out)
    assert export_definitions(fresh)["queues"] == out["queues"]
    assert fresh.auth.authenticate("a", "pw", peer_is_loopback=True) is not None


def test_transient_objects_are_exported_exclusive_queues_are_not(broker: Broker) -> None:
    """What RabbitMQ 3.10.8's GET /api/definitions held for the same topology (issue 33,
    a private node): transient queues and exchanges with "durable": false, no exclusive
    queue, and the bindings between what is exported."""
    vh = broker.vhosts["/"]
    vh.declare_queue("transient", durable=False)
    vh.declare_queue("durable", durable=True)
    owner = object()
    vh.declare_queue("gone-with-its-connection", exclusive_owner=owner, owner=owner)
    vh.declare_exchange("t-x", "topic", durable=False)
    vh.bind("queue", "transient", "t-x", "a.#")
    vh.bind("queue", "gone-with-its-connection", "t-x", "b.#", owner=owner)
    vh.bind("queue", "transient", "amq.topic", "c")
    out = export_definitions(broker)
    assert [(q["name"], q["durable"]) for q in out["queues"]] == [
        ("durable", True), ("transient", False)]
    assert [(x["name"], x["durable"]) for x in out["exchanges"]] == [("t-x", False)]
    assert sorted((b["source"], b["destination"], b["routing_key"])
                  for b in out["bindings"]) == [("amq.topic", "transient", "c"),
                                                ("t-x", "transient", "a.#")]
    fresh = Broker(Settings(data_dir=broker.settings.data_dir, persistence=False))
    import_definitions(fresh, out)
    assert fresh.vhosts["/"].queues["transient"].durable is False


@pytest.mark.parametrize("defs", [
    [],
    {"queues": "nope"},
    {"queues": [{"name": "q", "vhost": "missing"}]},
    {"queues": [{"name": "", "vhost": "/"}]},
    {"exchanges": [{"name": "e", "vhost": "/", "type": "bogus"}]},
    {"bindings": [{"source": "a", "destination": "b", "vhost": "/",
                   "destination_type": "table"}]},
    {"policies": [{"name": "p", "vhost": "/", "pattern": "(", "definition": {"a": 1}}]},
    {"users": [{"name": "u", "password_hash": "x", "hashing_algorithm": "md4"}]},
    {"permissions": [{"user": "ghost", "vhost": "/", "configure": "", "write": "",
                      "read": ""}]},
])
def test_bad_documents_change_nothing(broker: Broker, defs: Any) -> None:
    before = export_definitions(broker)
    with pytest.raises(DefinitionsError):
        import_definitions(broker, defs)
    assert export_definitions(broker) == before


def test_inequivalent_redeclare_is_a_definitions_error(broker: Broker) -> None:
    broker.vhosts["/"].declare_queue("q", durable=True)
    with pytest.raises(DefinitionsError, match="inequivalent"):
        import_definitions(broker, {"queues": [{"name": "q", "vhost": "/", "durable": False}]})


def test_parameters_registry() -> None:
    store = ParameterStore()
    with pytest.raises(UnknownComponent):
        store.set("shovel", "/", "s", {})
    seen: list[tuple[str, str, Any]] = []

    def validate(vhost: str, name: str, value: Any) -> None:
        if "src-uri" not in value:
            raise ValueError("src-uri is required")

    store.register("shovel", validate, on_set=lambda *a: seen.append(a),
                   on_clear=lambda *a: seen.append(a))
    with pytest.raises(ValueError, match="src-uri"):
        store.set("shovel", "/", "s", {})
    assert store.set("shovel", "/", "s", {"src-uri": "amqp://"}) is True
    assert store.set("shovel", "/", "s", {"src-uri": "amqp://x"}) is False
    assert store.list() == [{"component": "shovel", "vhost": "/", "name": "s",
                             "value": {"src-uri": "amqp://x"}}]
    assert store.clear("shovel", "/", "s") and not store.clear("shovel", "/", "s")
    assert len(seen) == 3
