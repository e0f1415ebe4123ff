"""DefinitionJournal: what becomes a DEFINITION change, and recovery from the changes."""

from __future__ import annotations

from typing import Any

import pytest

from amqpd.broker.definitions import export_definitions
from amqpd.config import Settings
from amqpd.server import Broker
from amqpd.store import format as fmt
from amqpd.store.memory import MemoryStore


class CountingStore(MemoryStore):
    """A MemoryStore that also remembers every change handed to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[tuple[int, str, bytes]] = []

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        self.changes.append((kind, key, body))
        super().append_definition(kind, key, body)


def _broker() -> tuple[Broker, CountingStore]:
    settings = Settings()
    settings.persistence = False
    b = Broker(settings)
    store = CountingStore()
    store.open()
    b.store = store
    b.definitions.attach(store)
    return b, store


def test_only_what_outlives_a_restart_is_recorded() -> None:
    b, store = _broker()
    vh = b.vhosts["/"]
    vh.declare_queue("transient")
    vh.declare_queue("mine", durable=True, exclusive_owner=object())
    vh.declare_exchange("tx", "direct")
    vh.bind("queue", "transient", "amq.direct", "k")
    assert store.changes == []
    vh.declare_queue("d", durable=True)
    vh.bind("queue", "d", "amq.direct", "k")
    vh.bind("queue", "d", "tx", "k")  # a transient source: not recorded
    assert [(k, key) for k, key, _ in store.changes] == [
        (fmt.DEF_QUEUE, "/\x00d"), (fmt.DEF_BINDING, "/\x00amq.direct\x00queue\x00d\x00k\x00")]


def test_a_queue_delete_takes_its_bindings_in_one_stretch() -> None:
    b, store = _broker()
    vh = b.vhosts["/"]
    vh.declare_queue("d", durable=True)
    for key in ("a", "b", "c"):
        vh.bind("queue", "d", "amq.topic", key)
    store.changes.clear()
    vh.delete_queue_named("d")
    kinds = [(k, body) for k, _key, body in store.changes]
    assert kinds == [(fmt.DEF_BINDING, b"")] * 3 + [(fmt.DEF_QUEUE, b"")]
    assert store.definitions() == {}


def test_small_sections_are_diffed_not_rewritten() -> None:
    b, store = _broker()
    b.definitions_changed()  # first boot: defaults recorded once
    first = len(store.changes)
    assert first > 0
    b.definitions_changed()
    assert len(store.changes) == first  # nothing changed, nothing written
    b.auth.add_user("bob", "pw", [])
    b.definitions_changed()
    assert [(k, key) for k, key, _ in store.changes[first:]] == [(fmt.DEF_USER, "bob")]
    b.auth.delete_user("bob")
    b.definitions_changed()
    assert store.changes[-1] == (fmt.DEF_USER, "bob", b"")


def _comparable(defs: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in defs.items() if k not in ("product_version",)}
    for section in ("queues", "exchanges", "bindings", "users", "permissions", "policies"):
        out[section] = sorted(out[section], key=repr)
    return out


def test_restore_rebuilds_the_same_definitions() -> None:
    b, store = _broker()
    vh = b.vhosts["/"]
    b.auth.add_user("bob", "pw", ["monitoring"])
    b.auth.set_permissions("bob", "/", "^a", ".*", "")
    b.policies.set("/", "p1", "^d", {"max-length": 3}, priority=2)
    b.definitions_changed()
    vh.declare_exchange("x", "topic", durable=True, arguments={"alternate-exchange": "ae"})
    vh.declare_exchange("ae", "fanout", durable=True)
    for i in range(5):
        vh.declare_queue(f"d{i}", durable=True, arguments={"x-max-priority": i + 1})
        vh.bind("queue", f"d{i}", "x", f"k.{i}.#", {"x-any": i})
    vh.bind("exchange", "ae", "x", "#")
    vh.declare_queue("amq.gen-abc", durable=True, server_named=True)
    expected = export_definitions(b)

    b2, _ = _broker()
    b2.definitions.restore(store.definitions())
    assert _comparable(export_definitions(b2)) == _comparable(expected)


def test_restore_skips_an_entry_it_cannot_apply(caplog: pytest.LogCaptureFixture) -> None:
    b, store = _broker()
    b.vhosts["/"].declare_queue("d", durable=True)
    entries = store.definitions()
    entries[(fmt.DEF_BINDING, "bad")] = (
        b'{"source":"amq.topic","vhost":"/","destination":"gone","destination_type":"queue",'
        b'"routing_key":"k","arguments":{}}')
    b2, _ = _broker()
    b2.definitions.restore(entries)
    assert "d" in b2.vhosts["/"].queues
    assert "binding" in caplog.text and "gone" in caplog.text
