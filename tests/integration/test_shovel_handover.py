"""Issue 29: a shovel that stops on purpose hands over what it holds without copies.

A dynamic shovel stops and another runner takes its place when its definition changes,
when it moves to another node of a cluster (its node came back and the placement returns
to it), and on a restart. Before, the old runner was cancelled on the spot: the source
requeued every delivery it had published but not yet acked (up to the prefetch count),
and the runner that took over, with no memory of them, published them again: a second
copy in the destination queue for each (flagged ``x-shovel-redelivered``, but a copy).
Now a planned stop drains first, as a federation link's does: it cancels its consumer
at the source, lets what it holds be confirmed and acked (at most
``plugins.shovel.runner.DRAIN_TIMEOUT``), then closes.

Messages here have no ``message_id``, so the shovel's per-queue record (which keeps a
redelivered message with an id out of queues that had it) cannot hide a copy: what is
counted is the handover itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from pamqp import commands as spec

from tests.integration.fed_support import api, channel, get_all, site
from tests.integration.test_shovel_helpers import publish, set_shovel, shovel_state, wait_for
from tests.support.brokerproc import BrokerProcess

N = 20_000


@contextlib.contextmanager
def _node(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = site(tmp_path, "handover", {"AMQPD_PLUGINS": "shovel"})
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _depth(node: BrokerProcess, queue: str) -> int:
    with channel(node.url) as ch:
        return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_changed_definition_hands_over_without_copies(tmp_path: Path) -> None:
    with _node(tmp_path) as node:
        with channel(node.url) as ch:
            ch.queue_declare("ho.dest", durable=True)
        asyncio.run(publish(node.url, "ho.src", N,
                            properties=spec.Basic.Properties(delivery_mode=2)))
        value = {"src-uri": "amqp://", "src-queue": "ho.src", "dest-uri": "amqp://",
                 "dest-queue": "ho.dest", "src-prefetch-count": 1000}
        set_shovel(api(node), "ho", value)
        wait_for(lambda: _depth(node, "ho.dest") >= N // 20, 60, "the shovel under way")
        # a new definition: the running shovel stops, the new one starts at once
        set_shovel(api(node), "ho", {**value, "reconnect-delay": 2})
        wait_for(lambda: _depth(node, "ho.src") == 0, 120, "the source drained")
        wait_for(lambda: shovel_state(api(node), "ho") == "running", 30, "running")
        wait_for(lambda: _depth(node, "ho.dest") >= N, 60, "every message at the destination")
        got = get_all(node.url, "ho.dest", 3 * N)  # at most every copy of each
        counts = Counter(body for _p, body in got)
        assert set(counts) == {str(i).encode() for i in range(N)}  # nothing lost
        copies = sum(counts.values()) - N
        flagged = sum(1 for p, _b in got if (p.headers or {}).get("x-shovel-redelivered"))
        assert copies == 0, f"{copies} second copies ({flagged} flagged) after the handover"
        with contextlib.suppress(Exception):
            api(node).request("DELETE", "/api/parameters/shovel/%2F/ho")
