"""``python -m tests.chaos --seed N --duration SECONDS [--partition netns|proxy]
[--workdir DIR]``: one long
seeded run of the randomized fault test (tests/chaos/driver.py); prints its report and
exits 1 if a check failed. ``make chaos SEEDS="1 2 3" DURATION=180`` runs several."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.chaos.driver import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, action="append", required=True,
                        help="the fault schedule's seed (repeat for several runs)")
    parser.add_argument("--duration", type=float, default=180.0,
                        help="seconds of faults (default 180)")
    parser.add_argument("--gap", type=float, nargs=2, default=(8.0, 20.0),
                        metavar=("MIN", "MAX"), help="seconds between faults (8 20)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="messages a second per publisher (100)")
    parser.add_argument("--partition", choices=("netns", "proxy"), default="netns",
                        help="how a partition is cut: network namespaces (default; "
                             "needs root) or the etcd proxy and heartbeat relays")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the nodes' data and logs go (default: a temp dir, kept)")
    args = parser.parse_args(argv)
    failed = 0
    for seed in args.seed:
        base = args.workdir or Path(tempfile.mkdtemp(prefix="amqpd-chaos-"))
        result = run(seed, args.duration, base / f"seed-{seed}", gap=tuple(args.gap),
                     rate=args.rate, partition=args.partition)
        print(result.report(), flush=True)
        failed += bool(result.failures())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
