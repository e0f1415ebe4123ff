"""Losing the checkpoint file never resurrects a settled message, through a real broker.

The store's unit tests (tests/unit/store/test_hardening.py) build the case by hand; this
one reaches it the way an operator would: a broker with small segments, traffic until
the log has a hole (segments emptied by acks and deleted by GC, so the SETTLE records of
the oldest surviving segment's messages were carried forward), then kill -9 or a clean
stop, the ``checkpoint`` file deleted, and a restart that has to replay the whole log.

What must hold after the restart:

* no acked message comes back (in either queue);
* every message that was never settled comes back, exactly once;
* a message may come back with redelivered=true without having been delivered only
  because recovery could not rule it out (it lies before the hole), and then the
  start-up log says how many: the count in that log line equals what the client sees.
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pika
import pytest

from tests.support.brokerproc import BrokerProcess

KEEP, SETTLED = "hard.cp.keep", "hard.cp.settled"
PAD = b"x" * 200
# the warning amqpd/store/recovery.py logs when a full replay meets a hole
MARKED = re.compile(r"(\d+) messages stored before it come back marked redelivered")


def _segments(data_dir: Path) -> list[tuple[int, int]]:
    """(base, size) of each log segment, in log order."""
    out = []
    for p in (data_dir / "log").glob("*.log"):
        try:
            out.append((int(p.stem), p.stat().st_size))
        except (ValueError, OSError):  # a segment deleted while we looked
            continue
    return sorted(out)


def _has_hole(data_dir: Path) -> bool:
    segs = _segments(data_dir)
    return any(base + size < after for (base, size), (after, _) in itertools.pairwise(segs))


def _publish(ch: object, queue: str, bodies: list[bytes]) -> None:
    persistent = pika.BasicProperties(delivery_mode=2)
    for body in bodies:
        ch.basic_publish("", queue, body, persistent)  # type: ignore[attr-defined]


def _drain_and_ack(ch: object, queue: str, want: int) -> list[bytes]:
    """basic.get every message (at most ``want``) and ack each one."""
    got = []
    for _ in range(want):
        method, _props, body = ch.basic_get(queue)  # type: ignore[attr-defined]
        if method is None:
            break
        got.append(body)
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
    return got


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_losing_the_checkpoint_never_resurrects_acked_messages(tmp_path: Path,
                                                               how: str) -> None:
    # compaction off: it would copy the oldest segment's unread messages forward and
    # delete that segment, so whether a hole is ever seen would depend on timing
    b = BrokerProcess(tmp_path / "data", env={"AMQPD_SEGMENT_SIZE": str(32 * 1024),
                                              "AMQPD_COMPACT_RATIO": "0"}).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare(KEEP, durable=True)
        ch.queue_declare(SETTLED, durable=True)
        ch.confirm_delivery()
        # the oldest segment: a few messages nobody reads, among many that get acked
        kept = [b"keep-%04d-" % i + PAD for i in range(5)]
        acked: list[bytes] = []
        _publish(ch, KEEP, kept[:3])
        first = [b"acked-%05d-" % i + PAD for i in range(150)]
        _publish(ch, SETTLED, first)
        # rounds of publish + ack roll the log: segments whose messages are all acked
        # (and those holding the acks of the first segment's messages) are deleted once
        # a checkpoint covers them; stop when the surviving segments have a hole
        published = list(first)
        for _round in range(60):
            if _has_hole(b.data_dir):
                break
            batch = [b"acked-%05d-" % (len(published) + i) + PAD for i in range(150)]
            published += batch
            _publish(ch, SETTLED, batch)
            acked += _drain_and_ack(ch, SETTLED, 1000)
        deadline = time.monotonic() + 15
        while not _has_hole(b.data_dir) and time.monotonic() < deadline:
            time.sleep(0.05)  # GC runs from the broker's once-a-second housekeeping
        assert _has_hole(b.data_dir), f"no segment was deleted: {_segments(b.data_dir)}"
        # after the hole: never-delivered messages that may keep redelivered=false
        _publish(ch, KEEP, kept[3:])
        assert sorted(acked) == published, "every message of the settled queue was acked"
        conn.close()

        if how == "kill":
            b.kill()
        else:
            assert b.stop() == 0
        (b.data_dir / "log" / "checkpoint").unlink()
        log_before = b.log_path.read_text(errors="replace")
        b.start()
        startup_log = b.log_path.read_text(errors="replace")[len(log_before):]

        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        back_settled = ch.queue_declare(SETTLED, passive=True).method.message_count
        returned: list[tuple[bytes, bool]] = []
        for _ in range(len(kept) + 10):
            method, _props, body = ch.basic_get(KEEP, auto_ack=True)
            if method is None:
                break
            returned.append((body, bool(method.redelivered)))
        resurrected = [body for body, _ in returned if body in set(acked)]
        conn.close()

        assert back_settled == 0, f"{back_settled} acked messages came back"
        assert not resurrected
        assert sorted(body for body, _ in returned) == sorted(kept), \
            "every unsettled message comes back, once"
        marked = sum(1 for _, redelivered in returned if redelivered)
        named = sum(int(m.group(1)) for m in MARKED.finditer(startup_log))
        # none of these was ever delivered: redelivered=true is only allowed where
        # recovery could not rule a delivery out, and then the start-up log counts it
        assert marked == named, (
            f"{marked} never-delivered messages came back redelivered, the start-up "
            f"log names {named}:\n{startup_log}")
    finally:
        b.kill()
