"""A message store whose commits answer only when the test says so: what a store
commit held up elsewhere (replicas that do not acknowledge, an fsync under load) looks
like to whoever waits for it. Everything else is the wrapped store's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OnCommit = Callable[[BaseException | None], None]


class DeferredCommitStore:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.on_disk = False
        self.waiting: list[OnCommit] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append_definition(self, kind: int, key: str, body: bytes) -> None:
        pass  # the journal's records: only their commit matters here

    def commit(self, callback: OnCommit) -> None:
        self.waiting.append(callback)

    def release(self) -> None:
        """Answer every commit asked for so far (successfully)."""
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback(None)
