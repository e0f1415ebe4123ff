"""The whole conformance suite against a ``workers = 2`` node (docs/workers.md).

As test_conformance_vs_amqpd.py does for one process, with the same hooks (the memory
alarm through amqpctl, restarts through devtools.amqpdproc, which keeps ``--workers``
across a restart), every case is run against one node of two workers, the durability
(restart) and alarm cases included. Phase 1 does not yet pass them all: the cases that
fail are in :data:`KNOWN_DIFFERENCES`, each with its reason, or answer as
:data:`LATE_DEFINITION` says; any other failure fails the test.

None of them fails on every run: whether a case crosses workers depends on where the
supervisor's round robin puts each of its connections, which depends on the other
cases running at the same time (``jobs=4``), and most are races with the private
cluster's propagation (one worker hears of what another did a moment later). The
count after each reason is how many of the whole-suite runs measured the case failed
in (:data:`KNOWN_DIFFERENCES`' comment says which runs). So the test cannot demand
that every known case fail; it says which of them passed, and a case that never shows
up again must leave the set.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.framework import Settings
from conformance.runner import run_all, select
from devtools import amqpdproc

ROOT = Path(__file__).resolve().parents[2]

# A case that declares a queue or an exchange on one connection and uses it on another
# meets a worker that has not heard of it yet when the two connections landed on
# different workers: "404 NOT_FOUND - no queue 'conf-q-...'" for the case's own object.
# (in the failure or in what the case observed). Which cases meet it is down to
# placement and timing (seen in 7 of 7 runs, each time in other cases:
# messages-survive-in-queue-without-consumers,
# x-single-active-consumer/unacked-requeued-to-next-consumer,
# frame/interleaved-content-on-two-channels, x-consistent-hash/spreads-keys-over-queues,
# confirms-under-load/pika-confirmed-publish-with-consumer-running, ...), so it is
# known by its answer rather than by case; the test prints which cases met it.
LATE_DEFINITION = re.compile(r"NOT_FOUND - no (queue|exchange) 'conf-[qx]-")
_GONE_LATE = "the other worker hears of an exclusive queue's removal asynchronously"

# What fails with workers = 2 (passes with one worker and against RabbitMQ 3.10.8). The
# counts: in how many of 11 whole-suite runs on main after the merge of branches amqp35
# and http35 (2026-12-07, pure Python, load 1-10) the case failed. Cases branch amqp35
# mended (declare-ok / bind-ok wait until every worker has applied the change; reply-to
# across workers; a stream's purge refused with 540) failed in none of them and left
# the set: fanout-to-50 in order, consumer_cancel_notify, direct reply-to, streams
# purge-540, and the exclusive-queue 405 cases of another connection; so did
# access/queue-bind-allowed-with-write-queue-and-read-exchange (7/11) once branch bind28
# carried a binding made on another worker to the queue's owner (10 of 10 runs alone).
KNOWN_DIFFERENCES: dict[str, str] = {
    # an exclusive queue of a closed connection, declared again from a connection on
    # the other worker: it still sees the old one (removed asynchronously)
    "queue.declare/exclusive-queue-gone-at-close-ok": f"{_GONE_LATE} (2/11)",
    "queue.declare/exclusive-queues-gone-after-pika-teardown": f"{_GONE_LATE} (1/11)",
    "queue.declare/exclusive-queue-gone-when-the-broker-closes-the-connection":
        f"{_GONE_LATE} (1/11)",
    "queue.declare/exclusive-consumed-queues-gone-at-close-on-two-channels":
        f"{_GONE_LATE} (0/11; seen before amqp35)",
    "basic.consume/unacked-requeued-on-connection-close":
        "unacked messages of the other worker's queue are requeued asynchronously at "
        "connection close: the next declare may not count them (0/11; 3/7 before)",
    "guarantees/competing-consumers-get-each-message-exactly-once":
        "deliveries from the other worker still in flight at the case's deadline "
        "(0/11; 1/7 before)",
}


@pytest.fixture(scope="module")
def amqpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("amqpd-conformance-workers")
    info = amqpdproc.start(d, timeout=120, workers=2)
    info["dir"] = str(d)
    try:
        yield info
    finally:
        amqpdproc.stop(d)


def test_known_differences_are_real_cases() -> None:
    """A renamed or removed case must leave the set too."""
    assert set(KNOWN_DIFFERENCES) - {c.id for c in select(None)} == set()


# hundreds of cases with restarts of a two-worker node: minutes on a loaded machine
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_suite_against_two_workers_fails_only_the_known_differences(
        amqpd: dict[str, Any]) -> None:
    py = shlex.quote(sys.executable)
    ctl = f"{py} -m amqpd.ctl --url {amqpd['http_url']} set_vm_memory_high_watermark"
    restart = (f"cd {shlex.quote(str(ROOT))} && {py} -m devtools.amqpdproc restart "
               f"--dir {shlex.quote(amqpd['dir'])}")
    cases = select(None)
    assert len(cases) >= 250
    settings = Settings(url=str(amqpd["amqp_url"]), http_url=str(amqpd["http_url"]),
                        alarm_cmd=f"{ctl} 0.000001", clear_alarm_cmd=f"{ctl} 0.4",
                        restart_cmd=restart)
    results = run_all(cases, settings, jobs=4)
    failed = {r.id: r.detail for r in results if r.result == "fail"}
    answers = {r.id: " ".join([r.detail, *map(str, r.observed)]) for r in results}
    skipped = [r.id for r in results if r.result == "skip"]
    assert skipped == []
    late = sorted(k for k in failed
                  if k not in KNOWN_DIFFERENCES and LATE_DEFINITION.search(answers[k]))
    print(f"a definition not yet known to the other worker ({len(late)}): {late}")
    new = {k: v for k, v in failed.items() if k not in KNOWN_DIFFERENCES and k not in late}
    assert not new, "new failures with workers = 2 (not in KNOWN_DIFFERENCES):\n" + "\n".join(
        f"{k}: {v[:200]}" for k, v in sorted(new.items()))
    passed = sorted(set(KNOWN_DIFFERENCES) - set(failed))
    print(f"known differences that passed this run ({len(passed)} of "
          f"{len(KNOWN_DIFFERENCES)}): {passed}")
