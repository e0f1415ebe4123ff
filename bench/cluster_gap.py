"""The publish gap after a replicated queue's leader is killed (issue 28), three amqpd
nodes on this machine.

Per run: fresh etcd and three nodes (bench.side_by_side.amqpd_cluster), one durable
queue declared on node-a (so led by it): ``quorum`` (``x-queue-type: quorum``, three
members) or ``mirrored`` (a classic queue under ``{"ha-mode": "all", "ha-sync-mode":
"automatic"}``, run started once both mirrors are synchronised). One publisher on node-b
(a node that survives) sends persistent messages with confirms in a window, without
pause. The nodes detect a dead peer after ``--heartbeat-timeout`` seconds of silence
(default 1 s, the product's default; the tests use 3 s on loaded machines). After
``--warmup`` seconds node-a is killed with kill -9 and not started again.

The **gap** is the time from the kill to the first confirm of a message *published
after the kill*: how long a confirming publisher sees nothing new succeed. Messages
nacked meanwhile (the broker's answer while the new leader is not reachable yet) are
counted and sent again, as a client does. The run ends ``--after`` seconds after the
gap closed. Every figure is checked: the queue, asked on the new leader after the
publisher stopped, must hold at least every confirmed message (a re-sent message may be
there twice); a run where it holds fewer says ``LOST`` and is not counted.

RabbitMQ is not run side by side here: its nodes' failure detection (net_ticktime) is
60 s by default, a different setting from amqpd's heartbeat timeout, so a ratio would
compare configurations, not designs. Timings are reported, never asserted.

bench.failover_window measures the same kill with light probes on both survivors (when
nacks and 404s end on each node); this one measures a loaded publisher's gap.

Usage: ``python -m bench.cluster_gap [--runs 5] [--kinds quorum,mirrored]
[--out bench/RESULTS-cluster-gap.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands

from bench.loadgen import Conn
from bench.side_by_side import amqpd_cluster
from tests.integration._http import Api, q
from tests.integration.cluster_support import ConfirmPublisher, wait_for

POLICY = {"pattern": "^gap-mirrored", "apply-to": "queues",
          "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}}


class TimedPublisher(ConfirmPublisher):
    """ConfirmPublisher that notes when each message was sent and confirmed."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(url, queue, window=200, batch=20)
        self.sent_at: dict[int, float] = {}
        self.confirmed_at: dict[int, float] = {}
        self.nacks = 0

    def publish(self, first: int, count: int) -> None:
        now = time.monotonic()
        for number in range(first, first + count):
            self.sent_at[number] = now
        super().publish(first, count)

    def publish_numbers(self, numbers: list[int]) -> None:
        """Send ``numbers`` again (nacked before), then read answers as publish does."""
        out = bytearray()
        for number in numbers:
            self.seq += 1
            self.outstanding[self.seq] = number
            out += self._frames(number)
            self.sent_at[number] = time.monotonic()
        self.conn.sock.sendall(out)
        while len(self.outstanding) > self.window - self.batch:
            self._answer(self.conn.read_frame()[1])

    def _answer(self, fr: Any) -> None:
        before = len(self.confirmed)
        nacked = len(self.nacked)
        super()._answer(fr)
        if len(self.confirmed) != before:
            now = time.monotonic()
            for number in self.confirmed:
                self.confirmed_at.setdefault(number, now)
        self.nacks += len(self.nacked) - nacked


def _declare(url: str, name: str, kind: str) -> None:
    conn = Conn(url)
    try:
        args = {"x-queue-type": "quorum"} if kind == "quorum" else {}
        conn.declare_queue(conn.open_channel(1), name, durable=True, arguments=args)
    finally:
        conn.close()


def _replicated(api: Api, name: str, kind: str) -> bool:
    r = api.get(f"/api/queues/%2F/{q(name)}")
    if r.status != 200:
        return False
    info = r.json()
    if kind == "quorum":
        return len(info.get("online") or []) == 3
    return len(info.get("synchronised_slave_nodes") or []) == 2


def _count(url: str, name: str) -> int:
    conn = Conn(url)
    try:
        ch = conn.open_channel(1)
        ok = conn.rpc(ch, commands.Queue.Declare(queue=name, passive=True),
                      commands.Queue.DeclareOk)
        return int(ok.message_count)
    finally:
        conn.close()


def one_run(root: Path, kind: str, warmup: float, after: float,
            heartbeat_timeout: float) -> dict[str, Any]:
    name = f"gap-{kind}"
    with amqpd_cluster(root, ("a", "b", "c"), heartbeat_timeout) as nodes:
        a, b, c = nodes
        if kind == "mirrored":
            r = a.api.put("/api/policies/%2F/gap", POLICY)
            assert r.status in (201, 204), r.text
        _declare(a.url, name, kind)
        wait_for(lambda: _replicated(a.api, name, kind), 60, f"{kind} queue replicated")
        pub = TimedPublisher(b.url, name)
        number = 0
        resend: list[int] = []
        t0 = time.monotonic()
        t_kill: float | None = None
        gap: float | None = None
        deadline = t0 + warmup + 120
        while time.monotonic() < deadline:
            if t_kill is None and time.monotonic() - t0 >= warmup:
                t_kill = time.monotonic()
                a.kill()
            if resend:
                batch, resend = resend[:20], resend[20:]
                pub.publish_numbers(batch)  # sent again under its own number
            else:
                pub.publish(number, 20)
                number += 20
            if pub.nacked:
                resend += sorted(pub.nacked)
                pub.nacked.clear()
            if t_kill is not None and gap is None:
                after_kill = [t for m, t in pub.confirmed_at.items()
                              if pub.sent_at.get(m, 0) > t_kill]
                if after_kill:
                    gap = min(after_kill) - t_kill
            if t_kill is not None and gap is not None and time.monotonic() > t_kill + gap + after:
                break
        pub.drain(30)
        confirmed = len(pub.confirmed)
        wait_for(lambda: any(_leads(n, name) for n in (b, c)), 60, "a new leader listed")
        leader = next(n for n in (b, c) if _leads(n, name))
        held = _count(leader.url, name)
        pub.conn.close()
        return {"kind": kind, "gap_s": round(gap, 3) if gap is not None else None,
                "confirmed": confirmed, "nacks": pub.nacks, "held": held,
                "valid": gap is not None and held >= confirmed,
                "heartbeat_timeout_s": heartbeat_timeout,
                "why": "" if held >= confirmed else f"LOST {confirmed - held}"}


def _leads(node: Any, name: str) -> bool:
    r = node.api.get(f"/api/queues/%2F/{q(name)}")
    return r.status == 200 and r.json().get("node") == node.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kinds", default="quorum,mirrored")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--after", type=float, default=2.0)
    ap.add_argument("--heartbeat-timeout", type=float, default=1.0,
                    help="the nodes' failure detection (the product's default: 1 s)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    results: dict[str, Any] = {"runs": []}
    for kind in args.kinds.split(","):
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="amqpd-gap-") as tmp:
                res = one_run(Path(tmp), kind, args.warmup, args.after,
                              args.heartbeat_timeout)
            res["run"] = i
            print(json.dumps(res), flush=True)
            results["runs"].append(res)
        gaps = [r["gap_s"] for r in results["runs"] if r["kind"] == kind and r["valid"]]
        results[f"{kind}_median_gap_s"] = round(statistics.median(gaps), 3) if gaps else None
        print(f"{kind}: median gap {results[f'{kind}_median_gap_s']} s over {len(gaps)} "
              f"valid runs of {args.runs}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
