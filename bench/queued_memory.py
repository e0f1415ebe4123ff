"""RSS per queued message: ``python -m bench.queued_memory [N]``.

Starts a fresh amqpd (compiled or not, as the tree and ``AMQPD_PURE_PYTHON`` decide),
declares one queue, publishes N transient 16 B messages with no consumer (the queue
count is checked) and prints the RSS growth per message and per 100,000 messages.
Memory per queued message must not grow when per-message work is cut: run it on both
sides of a change.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import AmqpdBroker, rss_bytes
from bench.loadgen import PublisherSpec, Target
from bench.runner import declare, run_flow


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 200_000
    with tempfile.TemporaryDirectory(prefix="amqpd-memq-") as tmp:
        broker = AmqpdBroker(Path(tmp))
        broker.start()
        try:
            assert broker.pid is not None
            declare(broker, ["memq"])
            time.sleep(1)  # settle after start-up (no synchronisation depends on it)
            before = rss_bytes(broker.pid)
            run = run_flow(broker, [PublisherSpec(1, [Target("", "memq")], count=n,
                                                  duration=0.0, sync_queue="memq")], [])
            time.sleep(1)
            after = rss_bytes(broker.pid)
        finally:
            broker.stop()
    per = (after - before) / n
    print(f"valid={run.valid} {'; '.join(run.invalid)} queued={n} "
          f"rss {before / 2**20:.1f} -> {after / 2**20:.1f} MiB: {per:.0f} B per message, "
          f"{per * 1e5 / 2**20:.1f} MiB per 100k")
    return 0 if run.valid else 1


if __name__ == "__main__":
    sys.exit(main())
