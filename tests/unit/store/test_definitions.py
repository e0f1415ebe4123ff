"""DefinitionsStore: atomic save, load, clear errors on corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqpd.store.definitions import SECTIONS, DefinitionsError, DefinitionsStore


def test_missing_file_loads_empty(tmp_path: Path) -> None:
    defs = DefinitionsStore(tmp_path / "definitions.json").load()
    assert set(defs) == {"rabbit_version", *SECTIONS}
    assert all(defs[k] == [] for k in SECTIONS)


def test_save_then_load(tmp_path: Path) -> None:
    store = DefinitionsStore(tmp_path / "sub" / "definitions.json")
    defs = store.load()
    defs["vhosts"].append({"name": "/"})
    defs["queues"].append(
        {"name": "q", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
    )
    store.save(defs)
    assert store.load() == defs
    assert not list((tmp_path / "sub").glob("*.tmp"))


def test_rabbitmq_export_shape_loads(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"rabbit_version": "3.12.1", "queues": [], "bindings": []}))
    defs = DefinitionsStore(path).load()
    assert defs["rabbit_version"] == "3.12.1"
    assert defs["users"] == []


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"queues": 3}', b"\xff\xfe"])
def test_corrupt_file_names_the_path(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "definitions.json"
    path.write_bytes(content)
    with pytest.raises(DefinitionsError, match=r"definitions\.json"):
        DefinitionsStore(path).load()


def test_a_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "definitions.json"
    store = DefinitionsStore(path)
    store.save({"rabbit_version": "x", "queues": [{"name": "old"}]})

    def boom(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(DefinitionsError, match="No space"):
        store.save({"rabbit_version": "x", "queues": [{"name": "new"}]})
    monkeypatch.undo()
    assert store.load()["queues"] == [{"name": "old"}]
