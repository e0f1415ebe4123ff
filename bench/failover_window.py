"""What a client on a surviving node sees right after a replicated queue's leader is
killed: how long publishes are nacked and passive declares answer 404 (issue 28).

Per run: a private etcd and three fresh amqpd nodes (``tests/integration``'s cluster
helpers, heartbeat timeout 1 s as the product's default); one queue led by node-a,
either mirrored by ``ha-mode: all`` (both mirrors synchronised first) or a quorum queue
of three members. On node-b and node-c two probes each run from before the kill to
``--after`` seconds after it: a publisher with confirms (one persistent message at a
time, the next one ``--interval`` after the answer) and a passive queue.declare (every
``--interval``, a new channel after a 404). Then node-a is killed with kill -9. The
clock starts at the kill. Reported per surviving node: the last 404 and the last nack
after the kill, the first declare-ok and the first confirm after them, and the window
this module is about: from that declare-ok to the last nack after it (publishes nacked
while the queue already answers a declare: the node's stream to the new leader not
open yet). A connection the node closed (a pause) is counted and opened again.

    AMQPD_PURE_PYTHON=1 python -m bench.failover_window --runs 5 --kind mirrored

This measures, it asserts nothing (docs/clustering.md quotes the figures). Its probes
are one message at a time; bench.cluster_gap measures the same kill under a publisher
sending without pause (the gap a loaded publisher sees).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header

from bench.loadgen import Conn, ProtocolError
from tests.integration.cluster_support import (
    ClusterNode,
    declare_durable,
    private_etcd,
    three_nodes,
    wait_for,
)

QUEUE = "window"


@dataclass
class Probe:
    """What one probe saw: (seconds since the kill, outcome) pairs."""

    node: str
    kind: str
    events: list[tuple[float, str]] = field(default_factory=list)

    def after(self, outcome: str) -> list[float]:
        return [t for t, o in self.events if t >= 0 and o.startswith(outcome)]


def _publish_once(conn: Conn, ch: int) -> str:
    data = b"x"
    conn.sock.sendall(b"".join((
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=QUEUE), ch),
        frame.marshal(header.ContentHeader(0, len(data), commands.Basic.Properties(
            delivery_mode=2)), ch),
        frame.marshal(pbody.ContentBody(data), ch))))
    while True:
        _c, fr = conn.read_frame()
        if isinstance(fr, commands.Basic.Ack):
            return "ack"
        if isinstance(fr, commands.Basic.Nack):
            return "nack"
        if isinstance(fr, commands.Channel.Close | commands.Connection.Close):
            raise ProtocolError(f"closed {fr.reply_code} {fr.reply_text}")


def _publisher(node: ClusterNode, probe: Probe, kill: list[float],
               stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            conn = Conn(node.url, timeout=10)
            ch = conn.open_channel(1)
            conn.rpc(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
            while not stop.is_set():
                outcome = _publish_once(conn, ch)
                probe.events.append((time.monotonic() - kill[0], outcome))
                time.sleep(interval)
            conn.sock.close()
        except (OSError, ProtocolError) as exc:
            probe.events.append((time.monotonic() - kill[0], f"conn {exc}"))
            time.sleep(0.1)


def _declarer(node: ClusterNode, probe: Probe, kill: list[float],
              stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            conn = Conn(node.url, timeout=10)
            ch = 1
            conn.open_channel(ch)
            while not stop.is_set():
                try:
                    conn.rpc(ch, commands.Queue.Declare(queue=QUEUE, passive=True),
                             commands.Queue.DeclareOk)
                    probe.events.append((time.monotonic() - kill[0], "ok"))
                except ProtocolError as exc:
                    if "channel.close" not in str(exc):
                        raise
                    probe.events.append((time.monotonic() - kill[0], f"404 {exc}"))
                    ch += 1
                    conn.open_channel(ch)
                time.sleep(interval)
            conn.sock.close()
        except (OSError, ProtocolError) as exc:
            probe.events.append((time.monotonic() - kill[0], f"conn {exc}"))
            time.sleep(0.1)


def _leader(node: ClusterNode) -> str:
    r = node.api.get(f"/api/queues/%2F/{QUEUE}")
    return str(r.json().get("node", "")) if r.status == 200 else ""


def one_run(root: Path, kind: str, after: float, interval: float) -> dict[str, Any]:
    env = {"AMQPD_CLUSTER_HEARTBEAT_TIMEOUT": "1"}
    with private_etcd(root) as etcd, three_nodes(root, etcd.url, env) as nodes:
        a, b, c = nodes
        if kind == "mirrored":
            r = a.api.put("/api/policies/%2F/ha-all", {
                "pattern": f"^{QUEUE}$", "apply-to": "queues",
                "definition": {"ha-mode": "all"}})
            assert r.status in (201, 204), r.text
            declare_durable(a, QUEUE)

            def synced() -> bool:
                r = b.api.get(f"/api/queues/%2F/{QUEUE}")
                return r.status == 200 and len(
                    r.json().get("synchronised_mirror_nodes") or []) == 2
            wait_for(synced, 30, "both mirrors synchronised", a.tail)
        else:
            declare_durable(a, QUEUE, {"x-queue-type": "quorum"})
            wait_for(lambda: _leader(b) == a.name and _leader(c) == a.name, 30,
                     "the quorum queue known everywhere", a.tail)
        kill = [time.monotonic() + 1.0]
        stop = threading.Event()
        probes = [Probe(n.name, k) for n in (b, c) for k in ("publish", "declare")]
        threads = [threading.Thread(target=_publisher if p.kind == "publish" else _declarer,
                                    args=(b if p.node == b.name else c, p, kill, stop,
                                          interval),
                                    daemon=True) for p in probes]
        for t in threads:
            t.start()
        time.sleep(max(0.0, kill[0] - time.monotonic()))
        kill[0] = time.monotonic()
        a.kill()
        time.sleep(after)
        stop.set()
        for t in threads:
            t.join(30)
        leader = _leader(b)
        out: dict[str, Any] = {"leader": leader, "nodes": {}}
        for n in (b, c):
            pub = next(p for p in probes if p.node == n.name and p.kind == "publish")
            dec = next(p for p in probes if p.node == n.name and p.kind == "declare")
            nacks, refused = pub.after("nack"), dec.after("404")
            last_nack = max(nacks, default=None)
            acks = [t for t in pub.after("ack") if last_nack is None or t > last_nack]
            last_404 = max(refused, default=None)
            oks = [t for t in dec.after("ok") if last_404 is None or t > last_404]
            first_ok = min(oks, default=None)
            late = [t for t in nacks if first_ok is not None and t > first_ok]
            out["nodes"]["leader" if n.name == leader else "other"] = {
                "node": n.name, "nacks": len(nacks), "last_nack": last_nack,
                "first_ack_after": min(acks, default=None),
                "404s": len(refused), "last_404": last_404, "first_declare_ok": first_ok,
                "nacks_after_declare_ok": len(late),
                "window": (max(late) - first_ok) if late and first_ok is not None else 0.0,
                "404_texts": sorted({o for _t, o in dec.events if o.startswith("404")}),
                "reconnects": len(pub.after("conn")) + len(dec.after("conn"))}
        return out


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kind", choices=("mirrored", "quorum"), default="mirrored")
    ap.add_argument("--after", type=float, default=15.0,
                    help="seconds of probing after the kill")
    ap.add_argument("--interval", type=float, default=0.005,
                    help="seconds between one probe's requests")
    args = ap.parse_args()
    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="amqpd-window-") as tmp:
            res = one_run(Path(tmp), args.kind, args.after, args.interval)
        results.append(res)
        print(f"run {i}: {res}", flush=True)
    print(f"\n{args.kind}, {args.runs} runs (seconds after kill -9 of the leader)")
    print("| node | last 404 | first declare-ok after it | last nack | first confirm "
          "after it | nacks after the declare-ok (window) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for role in ("leader", "other"):
        rows = [r["nodes"][role] for r in results if role in r["nodes"]]
        for row in rows:
            print(f"| {role} ({row['node']}) | {_fmt(row['last_404'])} | "
                  f"{_fmt(row['first_declare_ok'])} | {_fmt(row['last_nack'])} | "
                  f"{_fmt(row['first_ack_after'])} | {row['nacks_after_declare_ok']} "
                  f"({row['window'] * 1000:.0f} ms) |")
        firsts = [r["first_ack_after"] for r in rows if r["first_ack_after"] is not None]
        if firsts:
            print(f"| {role}: median first confirm | {statistics.median(firsts):.2f} s |")
    texts = sorted({t for r in results for n in r["nodes"].values() for t in n["404_texts"]})
    print("404 texts seen:", texts)


if __name__ == "__main__":
    main()
