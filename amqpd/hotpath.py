"""The compiled hot path: which modules mypyc compiles, and when the sources run instead.

Every message crosses the same few modules (frame splitting, the publish fast path,
routing, queues, deliveries, acks). Pure Python pays an interpreter dispatch and a
dictionary lookup for every call and attribute there; mypyc compiles these modules,
type annotations and all, into C extension modules whose classes are native structs and
whose calls between one another are direct C calls. The profile is what picked them:
together they were ~90 % of the broker's CPU under load.

The Python sources stay the reference and run unchanged when:

* nothing was compiled (no C compiler at install time, or ``AMQPD_PURE_PYTHON=1`` then);
* ``AMQPD_PURE_PYTHON=1`` is set when the broker starts (compare the two, debug in pure);
* a compiled module's source changed since the build (the build records a digest of
  every source it compiled), or some modules are missing: a developer edited a file
  without re-installing. A stale build must never run, and the compiled modules
  call each other directly, so it is all of them or none.

This module imports nothing outside the standard library: ``setup.py`` reads
:data:`COMPILED_MODULES` from it before any dependency is installed.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Compiled together as one mypyc group. A class defined here cannot be subclassed from
# an interpreted module unless it says so (``mypyc_attr(allow_interpreted_subclasses)``),
# and compiled code reads attributes of these classes straight from their structs, so
# every attribute must be declared in ``__init__`` (no attributes set from outside).
COMPILED_MODULES: tuple[str, ...] = (
    "amqpd.protocol.constants",
    "amqpd.protocol.frames",
    "amqpd.protocol.codec",
    "amqpd.protocol.connection",
    "amqpd.session",
    "amqpd.transport",
    "amqpd.server",
    "amqpd.broker.channel",
    "amqpd.broker.publish",
    "amqpd.broker.queue_type",
    "amqpd.broker.queue",
    "amqpd.broker.queue_entry",
    "amqpd.broker.message",
    "amqpd.broker.persist",
    "amqpd.broker.reply_to",
    "amqpd.broker.stream_records",
    "amqpd.broker.ready",
    "amqpd.broker.vhost",
    "amqpd.broker.exchange",
    "amqpd.broker.exchanges.direct",
    "amqpd.broker.exchanges.fanout",
    "amqpd.broker.exchanges.topic",
    "amqpd.store.format",
    "amqpd.store.index",
    "amqpd.store.log",
    "amqpd.store.stream_log",
    "amqpd.streamproto.codec",
    "amqpd.streamproto.chunks",
    "amqpd.streamproto.connection",
    "amqpd.streamproto.transport",
    # the cluster link's frame codec: every message that crosses to another node (or
    # another worker of a node: docs/workers.md) is encoded and read by it once
    "amqpd.cluster.link_wire",
    # its batches read into the broker's Messages and QueueEntries, and the loops over
    # their records (a crossing message is one record each way)
    "amqpd.cluster.link_records",
)

PURE_ENV = "AMQPD_PURE_PYTHON"
STAMP = "_compiled_sources.json"  # beside the compiled package: {module: sha256 of source}
_ROOT = Path(__file__).resolve().parent  # the amqpd package directory


def source_path(module: str, root: Path = _ROOT) -> Path:
    """``amqpd.broker.queue`` -> ``<package dir>/broker/queue.py``."""
    return root.joinpath(*module.split(".")[1:]).with_suffix(".py")


def _extension_path(module: str, root: Path = _ROOT) -> Path | None:
    src = source_path(module, root)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = src.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def source_digest(module: str, root: Path = _ROOT) -> str:
    """What the build compiled, recorded by setup.py in :data:`STAMP` (file times are no
    use: pip extracts a wheel's files in any order, with new times)."""
    return hashlib.sha256(source_path(module, root).read_bytes()).hexdigest()


def write_stamp(package_dir: Path, modules: Sequence[str] = COMPILED_MODULES,
                sources: Path = _ROOT) -> None:
    """Called by setup.py after a successful build: the digest of every compiled source."""
    stamp = {m: source_digest(m, sources) for m in modules}
    (package_dir / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")


def leftovers(modules: Sequence[str] = COMPILED_MODULES, root: Path = _ROOT) -> list[str]:
    """Modules with a compiled file that the current list does not compile: left by an
    older build. Python would load them instead of their sources, compiled or not."""
    listed = set(modules)
    suffixes = importlib.machinery.EXTENSION_SUFFIXES  # the most specific first
    found = set()
    for ext in root.rglob(f"*{suffixes[-1]}"):
        suffix = next((x for x in suffixes if ext.name.endswith(x)), None)
        if suffix is None:
            continue
        rel = ext.relative_to(root).with_name(ext.name[: -len(suffix)])
        name = ".".join(("amqpd", *rel.parts))
        if name not in listed and (root / rel).with_suffix(".py").exists():
            found.add(name)
    return sorted(found)


def decide(modules: Sequence[str] = COMPILED_MODULES,
           environ: dict[str, str] | None = None, root: Path = _ROOT) -> tuple[bool, str]:
    """Whether the compiled modules may be used, and why (for the startup log)."""
    env = os.environ if environ is None else environ
    if env.get(PURE_ENV, "") not in ("", "0"):
        return False, f"pure Python ({PURE_ENV} is set)"
    stale = leftovers(modules, root)
    if stale:
        return False, (f"pure Python (compiled files left by an older build: "
                       f"{', '.join(stale)}; re-install)")
    built = {m: _extension_path(m, root) for m in modules}
    missing = [m for m, p in built.items() if p is None]
    if len(missing) == len(modules):
        return False, "pure Python (not compiled at install)"
    if missing:
        return False, f"pure Python (partial build: {', '.join(missing)} not compiled)"
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return False, f"pure Python (the build left no readable {STAMP}: re-install)"
    for module in modules:
        if not source_path(module, root).exists():
            continue
        if stamp.get(module) != source_digest(module, root):
            return False, (f"pure Python (the source of {module} changed since it was "
                           "compiled: re-install to rebuild)")
    return True, "compiled (mypyc)"


class _SourceFinder:
    """Loads the listed modules from their ``.py`` files even where an extension exists
    (the default finder prefers extension modules). A meta path finder needs only
    ``find_spec``; not deriving from ``importlib.abc.MetaPathFinder`` keeps that module
    out, and with it importlib.resources and tempfile (~260 KB allocated at every
    start; shutil, random, bz2 and lzma come in through other imports anyway)."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        src = source_path(fullname)
        return importlib.util.spec_from_file_location(fullname, src) if src.exists() else None


COMPILED = False
MODE = "pure Python (not decided)"


def install() -> None:
    """Called once from ``amqpd/__init__.py``, before any compiled module can load."""
    global COMPILED, MODE
    COMPILED, MODE = decide()
    if not COMPILED:
        shadowed = [m for m in COMPILED_MODULES if _extension_path(m)] + leftovers()
        if shadowed:
            sys.meta_path.insert(0, _SourceFinder(shadowed))
