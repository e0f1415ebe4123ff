"""bench.core_cost drives the broker's internals sans-IO (a Broker with the shared log
open, two Sessions): this keeps the tool working as those internals change. It checks
the loop's bookkeeping (every message published, delivered and acked), never a timing."""

from __future__ import annotations

from bench.core_cost import run_loop


def test_every_message_is_delivered_and_acked() -> None:
    for body in (16, 1024):
        results = run_loop(body, messages=300, batch=60, repeat=2)
        assert len(results) == 2  # run_loop raises if any message was left in the queue


def test_confirms_shape_confirms_delivers_and_acks_every_message() -> None:
    from bench.core_cost import run_confirms

    for fsync in (True, False):
        results = run_confirms(16, messages=300, batch=60, repeat=2, fsync=fsync)
        assert len(results) == 2  # run_confirms raises unless every message was confirmed


def test_stream_shape_confirms_every_message() -> None:
    from bench.core_cost import run_stream

    results = run_stream(1024, messages=480, batch=60, tick_reads=2, repeat=2)
    assert len(results) == 2  # run_stream raises unless the stream holds every confirmed one
