"""standby_ack: with "fsync" a confirm waits for the standby's fsync; with "write" it
waits only for the standby to have written and checked the records, while the fsync is
still running (durable_seq says what a power loss would leave)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from amqpd.config import ConfigError, ReplicationConfig, check_replication
from amqpd.replication import syncer
from amqpd.replication.epochs import EpochHistory
from amqpd.replication.follower import ReplicationFollower
from tests.unit.replication.test_shipping import _active, _cfg, _committed, _msg, until


class _HeldFsync:
    """Stands in for ``os`` in syncer.py: fdatasync blocks while ``hold`` is set."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.released = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if self.hold.is_set():
            self.released.wait(10)
        os.fdatasync(fd)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.parametrize("ack", ["write", "fsync"])
async def test_a_confirm_waits_for_the_standbys_fsync_only_with_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ack: str) -> None:
    held = _HeldFsync()
    monkeypatch.setattr(syncer, "os", held)
    store, src = await _active(tmp_path / "a", insync_timeout=30.0)
    d = tmp_path / "b"
    f = ReplicationFollower(d, _cfg("b", role="standby", standby_ack=ack), EpochHistory(d))
    try:
        for i in range(50):
            store.append_enqueue(["q"], _msg(i))
        store.sync()
        f.start(f"127.0.0.1:{src.port}")
        await until(lambda: src.gate is not None and src.gate.members == {"b"}
                    and f.durable_seq == store.last_sequence)
        held.hold.set()  # the standby's fsyncs from now on block
        got = await _committed(store, 50)
        if ack == "write":
            await until(lambda: got == [None])
            # confirmed while the standby's copy is written, not yet durable
            assert f.last_seq == store.last_sequence > f.durable_seq
        else:
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                assert got == [], "confirmed before the standby's fsync"
                await asyncio.sleep(0.02)
            assert f.last_seq < store.last_sequence
        held.released.set()
        await until(lambda: got == [None] and f.durable_seq == store.last_sequence)
        assert f.last_seq == store.last_sequence
    finally:
        held.released.set()
        await f.stop()
        await src.stop()
        store.close()


def test_standby_ack_takes_fsync_or_write_only() -> None:
    base = {"secret": "s", "role": "active"}
    for ok in ("fsync", "write"):
        check_replication(ReplicationConfig(standby_ack=ok, **base))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'replication\.standby_ack' must be 'fsync' or "
                                          r"'write', not 'memory'"):
        check_replication(ReplicationConfig(standby_ack="memory", **base))  # type: ignore[arg-type]
