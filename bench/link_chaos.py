"""How long links take to recover from network faults: a shovel and a federation link.

    python -m bench.link_chaos [--rounds 3] [--only shovel|federation] [--blackhole 4]
                               [--rate 300] [--json]

The scenarios are tests/integration/test_link_chaos.py's (tests/support/linkchaos.py):
amqpd brokers on loopback, the links' connections through TCP proxies, heartbeats of
1 s, ``reconnect-delay`` 0.5 s, ``ack-mode`` on-confirm, a publisher confirming messages
at the source throughout. Each round injects, per proxy, a 300 ms delay (3 s), a reset of
every connection, and a blackhole (``--blackhole`` seconds). Recovery time is from the
end of the fault (the delay lifted, the reset, the blackhole restored) until the link's
status is ``running`` again *and* a new message has reached the destination queue (both
polled every 20 ms, so figures carry up to ~50 ms of polling and HTTP latency). At the
end the destination is drained and counted: confirmed messages lost (must be 0) and
duplicates (at-least-once) are reported beside the times.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.support.linkchaos import (
    Scenario,
    drain_all,
    federation_scenario,
    inject,
    poll,
    shovel_scenario,
    standard_faults,
)


def run(scenario: Scenario, rounds: int, blackhole: float, rate: float) -> dict[str, Any]:
    times: dict[str, list[float]] = collections.defaultdict(list)
    publisher = scenario.publisher(rate).start()
    try:
        poll(lambda: scenario.delivered() > 0, 30, "the link carrying messages")
        for _ in range(rounds):
            for fault in standard_faults(scenario.proxies, blackhole_s=blackhole):
                r = inject(fault, scenario.status, scenario.delivered)
                times[r.fault].append(r.seconds)
                print(f"  {scenario.kind}: {r.fault}: recovered in {r.seconds:.3f} s",
                      flush=True)
    finally:
        publisher.stop()
    poll(scenario.source_settled, 120, "the source drained and acked")
    bodies = drain_all(scenario.dest_url, scenario.dest_queue, timeout=120)
    got = collections.Counter(int(b) for b in bodies)
    lost = len(set(publisher.confirmed) - set(got))
    return {
        "link": scenario.kind, "rounds": rounds, "confirmed": len(publisher.confirmed),
        "received": len(bodies), "lost": lost,
        "duplicates": sum(n - 1 for n in got.values()), "publisher_error": publisher.error,
        "recovery_s": {k: {"median": round(statistics.median(v), 3),
                           "max": round(max(v), 3), "all": [round(x, 3) for x in v]}
                       for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.link_chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=["shovel", "federation"])
    p.add_argument("--blackhole", type=float, default=4.0, help="seconds per blackhole")
    p.add_argument("--rate", type=float, default=300.0, help="confirmed msg/s at the source")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="link-chaos-") as tmp:
        for kind, make in (("shovel", shovel_scenario), ("federation", federation_scenario)):
            if args.only not in (None, kind):
                continue
            with make(Path(tmp) / kind) as scenario:
                results.append(run(scenario, args.rounds, args.blackhole, args.rate))
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    for r in results:
        print(f"{r['link']}: {r['confirmed']} confirmed, {r['received']} received, "
              f"lost {r['lost']}, duplicates {r['duplicates']}"
              + (f", publisher error {r['publisher_error']}" if r["publisher_error"] else ""))
        for fault, t in r["recovery_s"].items():
            print(f"  {fault:40s} median {t['median']:.3f} s  max {t['max']:.3f} s")
    return 0 if all(r["lost"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
