"""Warren failover time: from kill -9 of the active to the first confirmed publish
through HAProxy (issue 14; docs/warren.md).

    python -m bench.failover [--runs 5] [--lease-ttl 3.0] [--modes sync,sync1,async] [--json]

Per run: a private etcd (shared by the runs, a fresh key prefix each), two fresh amqpd
nodes electing through it, HAProxy in front checking ``/health/active`` every 200 ms as
etc/haproxy.cfg does. One publisher with confirms publishes persistent messages through
HAProxy, one at a time, reconnecting at once whenever its connection fails. Once it
runs steadily the active is killed with SIGKILL and the clock starts. Figures per run:

- ``takeover``: until the standby's ``/health/active`` answers 200 (polled every 10 ms);
- ``first_confirm``: until the first confirm on a connection opened after the kill.

Modes: ``sync`` (the default settings: synchronous, ``min_insync_standbys = 0``): the
new active confirms alone, so the killed node stays dead (a lost machine). ``sync1``
(``min_insync_standbys = 1``): a confirm needs an in-sync standby, so the killed node is
restarted at once, as systemd's Restart= would, and the first confirm also waits for it
to rejoin and catch up. ``async``: not restarted. The median of the runs is reported for
each mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from tests.support.etcdproc import EtcdProcess, find_etcd
from tests.support.haproxyproc import HAProxyProcess, find_haproxy
from tests.support.warren import WarrenNode, wait_active, wait_insync_standby

ERRORS = (pika.exceptions.AMQPError, OSError)


class Publisher(threading.Thread):
    """Publishes with confirms; records (confirm time, time its connection opened)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.confirms: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        params = pika.URLParameters(self.url)
        params.socket_timeout = 1.0
        params.heartbeat = 5
        while not self.halt.is_set():
            try:
                conn = pika.BlockingConnection(params)
            except ERRORS:
                time.sleep(0.02)
                continue
            opened = time.monotonic()
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare("failover-bench", durable=True)
                while not self.halt.is_set():
                    try:
                        ch.basic_publish("", "failover-bench", b"x" * 64,
                                         pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.NackError:
                        continue
                    self.confirms.append((time.monotonic(), opened))
            except ERRORS:
                pass
            finally:
                try:
                    conn.close()
                except ERRORS:
                    pass


def one_run(work: Path, etcd: EtcdProcess, run: int, mode: str, ttl: float) -> dict[str, Any]:
    prefix = f"/bench/failover/{mode}-{run}-{time.time_ns()}"
    extra = (["--replication-mode", "sync", "--replication-min-insync-standbys", "1"]
             if mode == "sync1" else ["--replication-mode", mode])
    a = WarrenNode("a", work / f"{mode}{run}" / "a", [etcd.url], prefix, lease_ttl=ttl,
                   extra=extra)
    b = WarrenNode("b", work / f"{mode}{run}" / "b", [etcd.url], prefix, lease_ttl=ttl,
                   extra=extra)
    a.peers, b.peers = [b.repl_addr], [a.repl_addr]
    hap = None
    pub = None
    try:
        a.start()
        wait_active(a)
        b.start()
        wait_insync_standby(a, b, etcd.url)
        hap = HAProxyProcess(work / f"{mode}{run}" / "haproxy",
                             [(n.name, n.amqp_port, n.http_port) for n in (a, b)]).start()
        pub = Publisher(f"amqp://guest:guest@127.0.0.1:{hap.port}/%2F")
        pub.start()
        deadline = time.monotonic() + 30
        while len(pub.confirms) < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(pub.confirms) < 300:
            raise RuntimeError("publisher did not get going")
        killed = time.monotonic()
        a.kill()
        if mode == "sync1":
            a.start()  # as a supervisor would; confirms need an in-sync standby
        takeover = None
        first = None
        deadline = killed + 60
        while time.monotonic() < deadline and (takeover is None or first is None):
            if takeover is None and b.health("active", timeout=0.2)[0] == 200:
                takeover = time.monotonic() - killed
            if first is None:
                after = [t for t, opened in pub.confirms[-50:] if opened > killed]
                if after:
                    first = min(after) - killed
            time.sleep(0.01)
        return {"mode": mode, "run": run, "takeover_s": takeover, "first_confirm_s": first}
    finally:
        if pub is not None:
            pub.halt.set()
            pub.join(10)
        if hap is not None:
            hap.kill()
        for n in (a, b):
            n.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--lease-ttl", type=float, default=3.0)
    p.add_argument("--modes", default="sync,sync1,async")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if find_etcd() is None or find_haproxy() is None:
        print("needs etcd and haproxy (Debian's etcd-server and haproxy)", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        work = Path(tmp)
        etcd = EtcdProcess(work / "etcd").start()
        try:
            for mode in args.modes.split(","):
                for run in range(args.runs):
                    r = one_run(work, etcd, run, mode, args.lease_ttl)
                    results.append(r)
                    if not args.json:
                        print(f"{mode} run {run}: takeover {r['takeover_s']:.2f}s, first "
                              f"confirm {r['first_confirm_s']:.2f}s", flush=True)
        finally:
            etcd.kill()
    summary = {}
    for mode in args.modes.split(","):
        rs = [r for r in results if r["mode"] == mode]
        summary[mode] = {k: statistics.median(r[k] for r in rs if r[k] is not None)
                         for k in ("takeover_s", "first_confirm_s")}
    if args.json:
        json.dump({"lease_ttl": args.lease_ttl, "runs": results, "median": summary},
                  sys.stdout, indent=1)
        print()
    else:
        for mode, m in summary.items():
            print(f"median over {args.runs} runs, {mode}: takeover {m['takeover_s']:.2f}s, "
                  f"kill -9 to first confirmed publish {m['first_confirm_s']:.2f}s "
                  f"(lease_ttl {args.lease_ttl}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
