"""DefinitionState: the durable topology as the log knows it, kept current in memory.

Why it exists (issue 22): durable topology used to be one ``definitions.json`` rewritten
whole on every change, so a declare cost grew with everything already declared. Now
every change is a DEFINITION record in the shared log (``format.py``), written through
the same group commit as messages, and this object is the result of applying them: one
entry per object, keyed by ``(kind, key)``, holding the object's JSON body as bytes.
Applying a change is one dict operation, whatever exists.

A checkpoint carries a snapshot of this state (``checkpoint.py``), so recovery loads
the snapshot and replays only the DEFINITION records after it, and segments holding old
DEFINITION records can be deleted like any other once a checkpoint lies past them.

The store does not interpret bodies. The one thing it knows about kinds: deleting a
``DEF_QUEUE`` entry also settles what the queue still holds in the log (the caller does
that with the keys :meth:`apply` returns), so "delete a durable queue" is one record
that takes its definition, its bindings and its messages together, or nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from amqpd.store import format as fmt


class DefinitionState:
    def __init__(self) -> None:
        self.entries: dict[tuple[int, str], bytes] = {}
        self.nbytes = 0  # about what a snapshot of the entries costs

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, changes: Iterable[fmt.DefinitionChange]) -> list[str]:
        """Apply changes in order; return the keys of deleted queues."""
        entries = self.entries
        dropped: list[str] = []
        for kind, key, body in changes:
            ident = (kind, key)
            old = entries.get(ident)
            if old is not None:
                self.nbytes -= len(old) + len(key) + 9
            if body:
                entries[ident] = body
                self.nbytes += len(body) + len(key) + 9
            elif old is not None:
                del entries[ident]
                if kind == fmt.DEF_QUEUE:
                    dropped.append(key)
        return dropped

    def snapshot(self) -> list[fmt.DefinitionChange]:
        """Every entry as a put (a copy: the caller may encode it on another thread)."""
        return [(kind, key, body) for (kind, key), body in self.entries.items()]

    def of_kind(self, kind: int) -> list[tuple[str, bytes]]:
        return [(key, body) for (k, key), body in self.entries.items() if k == kind]
