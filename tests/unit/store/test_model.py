"""Randomised model check: SharedLog against a plain-dict model through enqueues,
settles, drops, checkpoints, compaction, clean restarts and crash restarts."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from amqpd.store.log import SharedLog

from .conftest import msg

QUEUES = ["/\x00a", "/\x00b", "v\x00a"]


def _open(
    directory: Path, ratio: float
) -> tuple[SharedLog, dict[str, list[int]], dict[str, set[int]]]:
    s = SharedLog(
        directory,
        segment_size=2048,
        checkpoint_every_bytes=3000,
        body_cache_bytes=2048,
        compact_ratio=ratio,
    )
    state = s.open()
    return (
        s,
        {k: list(v.positions) for k, v in state.queues.items()},
        {k: set(v.redelivered) for k, v in state.queues.items()},
    )


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_match_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "log"
    model: dict[str, list[int]] = {q: [] for q in QUEUES}
    marks: dict[str, set[int]] = {q: set() for q in QUEUES}
    bodies: dict[int, int] = {}
    ratio = 0.1 if seed % 2 else 0.6  # 0.6: compaction copies a lot
    relocations = 0
    s, got, got_marks = _open(directory, ratio)
    for step in range(600):
        op = rng.random()
        if op < 0.45:
            qs = rng.sample(QUEUES, rng.randint(1, 3))
            p = s.append_enqueue(qs, msg(step, size=rng.choice([0, 16, 200])))
            bodies[p] = step
            for q in qs:
                model[q].append(p)
        elif op < 0.80:
            q = rng.choice(QUEUES)
            if model[q]:
                k = rng.randint(1, min(5, len(model[q])))
                # mostly from the head, sometimes anywhere
                pick = model[q][:k] if rng.random() < 0.7 else rng.sample(model[q], k)
                s.append_settle(q, pick)
                model[q] = [p for p in model[q] if p not in pick]
                marks[q] -= set(pick)
        elif op < 0.88:
            q = rng.choice(QUEUES)
            if model[q]:
                p = rng.choice(model[q])
                s.append_delivered(q, p)
                marks[q].add(p)
        elif op < 0.90:
            q = rng.choice(QUEUES)
            s.drop_queue(q)
            model[q] = []
            marks[q] = set()
        elif op < 0.95:
            s.checkpoint()
        else:
            # restart: clean, or a crash (files as they are after a sync)
            relocations += s.stats()["relocations_total"]
            if rng.random() < 0.5:
                s.close()
            else:
                s.sync()
                crashed = tmp_path / f"crash{step}"
                shutil.copytree(directory, crashed)
                s.close()
                shutil.rmtree(directory)
                crashed.rename(directory)
            s, got, got_marks = _open(directory, ratio)
            for q in QUEUES:
                assert got.get(q, []) == model[q], f"step {step} queue {q!r}"
                assert got_marks.get(q, set()) == marks[q], f"step {step} marks {q!r}"
        for q in QUEUES:  # spot-check reads (cache, buffer, disk, relocated)
            if model[q]:
                p = rng.choice(model[q])
                assert s.read(p) == msg(bodies[p], size=len(s.read(p).body))
    live = sum(len(v) for v in model.values())
    stats = s.stats()
    assert stats["live_messages"] == live
    s.close()
    relocations += stats["relocations_total"]
    if ratio > 0.5:
        assert relocations > 0, "compaction was exercised"
