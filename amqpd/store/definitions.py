"""DefinitionsStore: durable topology (users, vhosts, queues, exchanges, bindings...).

Since issue 22 durable topology lives in the shared log (``defs.py``); this file format
is what data dirs from before hold, read once to migrate them (``broker/journal.py``).

Kept in RabbitMQ's definitions JSON shape, so ``rabbitmqctl export_definitions`` output
can be loaded and ours can be fed to RabbitMQ. Topology changes rarely and is small, so
the whole document is rewritten on every change, atomically: write a temp file, fsync
it, rename it over the old one, fsync the directory. A crash leaves either the old or
the new file, never a mix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from amqpd.store.api import StoreError
from amqpd.store.segment import fsync_directory

SECTIONS = (
    "users",
    "vhosts",
    "permissions",
    "topic_permissions",
    "parameters",
    "global_parameters",
    "policies",
    "queues",
    "exchanges",
    "bindings",
)


def empty_definitions(version: str = "3.12.0") -> dict[str, Any]:
    """A definitions document with every section present and empty."""
    defs: dict[str, Any] = {"rabbit_version": version}
    for key in SECTIONS:
        defs[key] = []
    return defs


class DefinitionsError(StoreError):
    """The definitions file exists but cannot be used; the message names the path."""


class DefinitionsStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Any]:
        """The stored definitions; an empty document if the file does not exist yet.

        Missing sections are filled with ``[]`` so callers need not check each key."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return empty_definitions()
        except OSError as exc:
            raise DefinitionsError(f"cannot read definitions file {self.path}: {exc}") from None
        try:
            defs = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DefinitionsError(f"corrupt definitions file {self.path}: {exc}") from None
        if not isinstance(defs, dict):
            raise DefinitionsError(
                f"corrupt definitions file {self.path}: top level is not a JSON object"
            )
        for key in SECTIONS:
            value = defs.setdefault(key, [])
            if not isinstance(value, list):
                raise DefinitionsError(
                    f"corrupt definitions file {self.path}: {key!r} is not a list"
                )
        defs.setdefault("rabbit_version", empty_definitions()["rabbit_version"])
        return defs

    def save(self, defs: dict[str, Any]) -> None:
        """Replace the file atomically (tmp + fsync + rename + fsync dir)."""
        data = json.dumps(defs, indent=2, sort_keys=True).encode() + b"\n"
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_directory(directory)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DefinitionsError(f"cannot write definitions file {self.path}: {exc}") from None
